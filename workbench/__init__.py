"""The workbench API shared by notebooks and the app: queries, figures, structural diffs."""

from workbench.core import Workbench
from workbench.diff import Change, json_diff

__all__ = ["Change", "Workbench", "json_diff"]
