"""What every tab shares: errors as messages, run pickers, display formatting, and one empty-state rule."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import gradio as gr
import pandas as pd

from envace.errors import UsageError

# What fills each kind of view, said the same way on every tab.
FILL = {
    "runs": "`envace rollout --limit 2 --mode real+shadow` (or `make demo`), or start a job in the **Launch** tab",
    "episodes": "`envace rollout --limit 2` or `envace eval CHECKPOINT --limit 2`",
    "pairs": "`envace rollout --limit 2 --mode real+shadow` (the real environment answers, the policy rehearses "
             "beside it), or train with `--set rollout.shadow_fraction=1.0`",
    "train": "`envace train experiments/smoke.toml` (seconds on the tiny model)",
    "sweep": "`envace sweep --name s --models base=tiny --budgets 0,1 --config experiments/smoke.toml`",
    "memories": "`envace eval default --private parallel --budget 1 --config experiments/smoke.toml`",
    "ladder": "`envace private-ladder --name ladder --models base=tiny --config experiments/smoke.toml --limit 1`",
}


def empty_note(what: str, fill: str) -> str:
    """The one empty-state text: what is missing, and the command that produces it."""
    return f"**No {what} yet.** Produce some with {FILL[fill]}; this page picks it up as it is written."


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


def linked(request: gr.Request | None, key: str = "run") -> str | None:
    """`?run=NAME` (or `?episode=ID`) in the page's address: what a shared link opens first."""
    value = request.query_params.get(key) if request is not None else None
    return value or None


def skipped(value: Any) -> bool:
    """Whether an event's output is `gr.skip()` (nothing sent): a dict compared as a dict, never against a list or
    a frame, whose `==` would compare element by element."""
    return isinstance(value, dict) and value == gr.skip()


def kept_unless_changed(choices: list[str], current: Any, known: list[str] | None, multiselect: bool = False,
                        pick_first: bool = True) -> tuple[Any, Any]:
    """A run picker's update, keeping the user's pick while it is still among `choices` (else the newest; a
    multiselect without `pick_first` may stay empty), and the choices it now holds (for a `gr.State`); or two skips
    while its choices are those it holds and its pick is among them.
    The timer's tick must not send a picker what it holds: the value it read when it fired may be older than the
    user's pick, and a multiselect's list, sent again, fires its `.change` (which redrew the Training tab's curves,
    resetting their zoom, and the Runs tab's config diff every 5 s)."""
    if multiselect:
        kept = [c for c in current or [] if c in choices]
        if choices == known and kept == list(current or []) and (kept or not pick_first or not choices):
            return gr.skip(), gr.skip()
        picked = kept or (choices[:1] if pick_first else [])
        return gr.Dropdown(choices=choices, value=picked, multiselect=True), choices
    if choices == known and current in choices:
        return gr.skip(), gr.skip()
    newest = choices[0] if choices else None
    return gr.Dropdown(choices=choices, value=current if current in choices else newest), choices


def first_draw(update: Any, current: Any, outputs: int, draw: Callable[..., Any], *rest: Any) -> tuple:
    """A tab's draw at page load, sent with its picker's update (so it never lands before the pick): none when
    the update moves the pick, whose `.change` draws it then (a second draw doubled the tab's first paint), else
    `draw(current, *rest)`, since Gradio fires no `.change` for a value sent again unchanged."""
    sent = update.constructor_args if isinstance(update, gr.components.Component) else {}  # what the event sends
    moves = "value" in sent and sent["value"] != current
    return (gr.skip(),) * outputs if moves else tuple(draw(current, *rest))


def rounded(frame: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """Float columns rounded for display; other columns (timestamps, text) as they are."""
    floats = frame.select_dtypes("float").columns
    return frame.assign(**{c: frame[c].round(digits) for c in floats})


def percent(value: Any) -> str:
    return "" if value is None or pd.isna(value) else f"{float(value):.1%}"


def score(value: Any) -> str:
    return "" if value is None or pd.isna(value) else f"{float(value):.3f}"
