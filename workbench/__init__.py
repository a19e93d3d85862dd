"""The API notebooks and the app share: queries, figures, structural diffs and background launches."""

from workbench.core import Workbench
from workbench.diff import Change, json_diff
from workbench.launch import RunHandle, launch

__all__ = ["Change", "RunHandle", "Workbench", "json_diff", "launch"]
