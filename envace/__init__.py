"""EnvACE workbench core: environments, rollouts, rehearsal, rewards, training and the run store.

This package never imports gradio or plotly; `workbench/` and `apps/` build on it.
"""

__version__ = "0.1.0"
