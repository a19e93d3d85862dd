"""What every tab shares: turning a bad selection into a message instead of a crashed page."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gradio as gr
import pandas as pd

from envace.errors import UsageError


def shown_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A `UsageError` (bad run name, missing file, …) becomes a message in the page."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UsageError as exc:
            raise gr.Error(str(exc)) from None
    return wrapper


def run_choices(runs: Any, kinds: tuple[str, ...] | None = None, having: set[str] | None = None) -> list[str]:
    """Run ids from `Workbench.runs()`, newest first; optionally of some kinds, or among `having`."""
    return [r for r, kind in zip(runs["run_id"], runs["kind"], strict=True)
            if (kinds is None or kind in kinds) and (having is None or r in having)]


def keep_choice(choices: list[str], current: str | None) -> gr.Dropdown:
    """New choices for a run picker, keeping the user's pick while it is still there (else the newest)."""
    return gr.Dropdown(choices=choices, value=current if current in choices else (choices[0] if choices else None))


def rounded(frame: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Float columns rounded for display; other columns (timestamps, text) as they are."""
    floats = frame.select_dtypes("float").columns
    return frame.assign(**{c: frame[c].round(digits) for c in floats})
