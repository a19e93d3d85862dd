"""Inspector tab: pick a run and an episode (filtered and sorted), read it turn by turn with each call's
real and rehearsed responses side by side, and export it."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from html import escape
from pathlib import Path

import gradio as gr
import pandas as pd

from apps.common import empty_note, kept_unless_changed, linked, rounded, run_choices, shown_errors, skipped
from apps.render import episode_html, tokens_html
from apps.ticks import Ticks
from envace.errors import UsageError
from workbench import Workbench

EPISODE_COLUMNS = ["episode_id", "phase", "step", "task_uid", "success", "checklist", "fidelity", "termination",
                   "n_calls", "n_parse_errors", "n_rehearsal_errors"]
_ANY = "any"


def _flag(choice: str) -> bool | None:
    return None if choice == _ANY else choice == "yes"


def _step(text: str | int | None) -> int | None:
    """The step filter: empty is any step; anything but a whole number ≥ 0 is a message."""
    text = "" if text is None else str(text).strip()
    if not text:
        return None
    if not text.isdigit():
        raise UsageError(f"step: a whole number from 0 (empty: any step), not {text!r}")
    return int(text)


def filtered(wb: Workbench, run_id: str, success: str, lo: float, hi: float, tool: str | None, ended: str,
             bucket: str, error: str | None, order: str, phase: str | None, at: str | None) -> pd.DataFrame:
    """A run's episodes as the Inspector's filters (their widgets' values: `any` is no filter) keep them."""
    return wb.episodes(run_id, success=_flag(success), min_checklist=lo, max_checklist=hi,
                       tool=(tool or "").strip() or None, termination=None if ended == _ANY else ended,
                       fidelity=None if bucket == _ANY else bucket,
                       error_kind=None if error in (None, _ANY) else error, worst_first=order == "worst first",
                       phase=None if phase in (None, "", _ANY) else phase, step=_step(at))


def exported(wb: Workbench, run_id: str | None, episode_id: str | None) -> gr.File:
    """One episode's calls as JSONL in a fresh temporary folder, offered for download."""
    if not run_id or not episode_id:
        raise gr.Error("pick an episode first")
    path = Path(tempfile.mkdtemp(prefix="envace-export-")) / f"{run_id}-{episode_id}.jsonl"
    wb.export(wb.calls(run_id, episode_id), path)
    return gr.File(value=str(path), visible=True)


def view_html(wb: Workbench, run_id: str, episode_id: str, roles: list[str], tokens: str | None) -> str:
    """One episode as a transcript (with what private rehearsal imagined before each turn it rehearsed), and the
    token view below it when asked for; marked with its run (`data-run`: runs share episode ids)."""
    steps = wb.steps(run_id, episode_id)
    body = episode_html(steps, wb.calls(run_id, episode_id), tuple(roles), episode_id,
                        wb.private_turns(run_id, episode_id))
    if tokens not in (None, "off", False):
        shown = steps[steps["role"].isin(roles)] if roles else steps
        body += tokens_html(shown, wb.tokenizer(run_id), "advantage" if tokens == "advantage" else "logprob")
    return f'<div data-run="{escape(run_id)}">{body}</div>'



def step(frame: pd.DataFrame | None, current: str | None, by: int) -> str | None:
    """The episode `by` rows away from `current` in the listed order (filters and sort as shown), kept in range."""
    ids = list(frame["episode_id"]) if frame is not None and len(frame) else []
    if not ids:
        return current
    at = ids.index(current) if current in ids else 0
    return ids[max(0, min(len(ids) - 1, at + by))]


def build(app: gr.Blocks, wb: Workbench, ticks: Ticks) -> Opened:
    note = gr.Markdown(elem_id="inspector-note")
    with gr.Row():
        run = gr.Dropdown(label="run", choices=[], value=None, allow_custom_value=True, scale=2,
                          elem_id="inspector-run")
        success = gr.Dropdown(label="success", choices=[_ANY, "yes", "no"], value=_ANY, scale=1)
        min_checklist = gr.Slider(0, 1, value=0, step=0.05, label="checklist ≥", scale=1)
        max_checklist = gr.Slider(0, 1, value=1, step=0.05, label="checklist ≤", scale=1)
    with gr.Row():
        tool = gr.Textbox(label="uses tool", placeholder="e.g. cd", scale=1)
        termination = gr.Dropdown(label="ended by", choices=[_ANY, "completed", "step_limit", "context_exceeded",
                                                             "parse_error", "rehearsal_error"], value=_ANY, scale=1)
        fidelity = gr.Dropdown(label="fidelity bucket", choices=[_ANY, "low", "mid", "high", "none"], value=_ANY,
                               scale=1)
        error_kind = gr.Dropdown(label="has error", choices=[_ANY], value=_ANY, allow_custom_value=True, scale=1)
        order = gr.Radio(["best first", "worst first"], value="best first", label="sort", scale=1)
        phase = gr.Dropdown(label="phase", choices=[_ANY, "grpo", "eval", "rollout"], value=_ANY,
                            allow_custom_value=True, scale=1, elem_id="inspector-phase")
        at_step = gr.Textbox(label="step (empty: any)", placeholder="e.g. 0", scale=1, elem_id="inspector-step")
    episodes = gr.Dataframe(label="episodes (click a row to open it)", interactive=False, max_height=260,
                            elem_id="inspector-episodes")
    with gr.Row():
        episode = gr.Dropdown(label="episode", choices=[], value=None, allow_custom_value=True, scale=3,
                              elem_id="inspector-episode")
        roles = gr.CheckboxGroup(["caller", "rehearser"], value=["caller", "rehearser"], label="roles", scale=2)
        token_view = gr.Radio(["off", "log-prob", "advantage"], value="off", label="token view, coloured by",
                              scale=2)
        previous = gr.Button("← previous", scale=1, elem_id="inspector-previous")
        following = gr.Button("next →", scale=1, elem_id="inspector-next")
        export = gr.Button("export episode (JSONL)", scale=1)
    download = gr.File(label="export", visible=False)
    group = gr.Dataframe(label="its GRPO group: the G episodes of this unit at this step, each with its reward and "
                               "the advantage its rows got (click one to open it)", interactive=False, visible=False,
                         elem_id="inspector-group")
    view = gr.HTML(elem_id="inspector-view")

    @shown_errors
    def list_episodes(run_id, success, lo, hi, tool, ended, bucket, error, order, in_phase, at, current,
                      request: gr.Request):
        """The episodes the filters keep; the open one stays open while it is listed (a link sets it with the
        filters), else `?episode=` of a link to this run, else the first."""
        if not run_id:
            return pd.DataFrame(columns=EPISODE_COLUMNS), gr.Dropdown(choices=[], value=None)
        frame = filtered(wb, run_id, success, lo, hi, tool, ended, bucket, error, order, in_phase, at)
        ids = list(frame["episode_id"])
        wanted = linked(request, "episode") if run_id == linked(request) else None  # `?run=R&episode=E`
        opened = next((e for e in (current, wanted) if e in ids), ids[0] if ids else None)
        return rounded(frame[EPISODE_COLUMNS]), gr.Dropdown(choices=ids, value=opened)

    @shown_errors
    def show(run_id, episode_id, roles, tokens):
        if not run_id or not episode_id:
            said = (f"No episode of <code>{escape(run_id)}</code> matches these filters: loosen them (success, "
                    "checklist, tool, ended by, fidelity, error)." if run_id else "Pick a run and an episode.")
            return f"<div class='empty'>{said}</div>", gr.Dataframe(visible=False)
        siblings = wb.group(run_id, episode_id)
        return view_html(wb, run_id, episode_id, roles, tokens), gr.Dataframe(value=rounded(siblings),
                                                                          visible=not siblings.empty)

    def pick(frame: pd.DataFrame, evt: gr.SelectData):
        return frame.iloc[evt.index[0]]["episode_id"]

    @shown_errors
    def kinds(run_id):
        return gr.Dropdown(choices=[_ANY, *(wb.error_kinds(run_id) if run_id else [])], value=_ANY)

    filters = [run, success, min_checklist, max_checklist, tool, termination, fidelity, error_kind, order, phase,
               at_step]
    run.change(kinds, run, error_kind)
    for control in filters:
        listing = control.change(list_episodes, [*filters, episode], [episodes, episode])
        if control is run:  # runs share episode ids: the open id may stay while the episode it names changed
            listing.then(show, [run, episode, roles, token_view], [view, group])
    tool.submit(list_episodes, [*filters, episode], [episodes, episode])
    episodes.select(pick, episodes, episode)
    previous.click(lambda frame, current: step(frame, current, -1), [episodes, episode], episode)
    following.click(lambda frame, current: step(frame, current, 1), [episodes, episode], episode)
    for control in (episode, roles, token_view):
        control.change(show, [run, episode, roles, token_view], [view, group])
    group.select(pick, group, episode)
    export.click(shown_errors(lambda run_id, episode_id: exported(wb, run_id, episode_id)), [run, episode], download)

    def runs_with_episodes(current, known, request: gr.Request):
        # `?run=NAME` in the page's address opens that run first: a link to a run can be shared
        choices = run_choices(wb.runs(), having=wb.runs_with("episodes"))
        update, held = kept_unless_changed(choices, current or linked(request), known)
        if skipped(held):  # its choices stand: nothing sent (the tick's value may be older than a pick)
            return update, gr.skip(), held
        return update, "" if choices else empty_note("episodes", "episodes"), held

    known = gr.State([])
    app.load(runs_with_episodes, [run, known], [run, note, known])
    ticks.add(runs_with_episodes, [run, known], [run, note, known])
    return Opened(run, tool, phase, at_step, episode)


@dataclass(frozen=True)
class Opened:
    """The Inspector's controls a link from another view sets (`apps.app.episodes_of`): a run, the tool, phase
    and step filters, and the episode to open."""

    run: gr.Dropdown
    tool: gr.Textbox
    phase: gr.Dropdown
    step: gr.Number
    episode: gr.Dropdown

    def components(self) -> list:
        return [self.run, self.tool, self.phase, self.step, self.episode]
