"""Launch tab: pick a config under `experiments/` and a job, edit its fields in a form generated from the config's
typed fields (one folded group per TOML table; a checkbox, a dropdown or a number as the field's type asks;
its default beside it and a changed value marked; start waits for a config that checks out), read the resolved
config, start the job, watch its log, stop it. The job runs the resolved config as a file, in its own process;
the other tabs pick the new run up as it writes."""

from __future__ import annotations

import json
import shlex
import threading
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr

from apps.common import shown_errors
from apps.ticks import Ticks
from envace.config import toml_literal
from envace.errors import UsageError
from workbench import RunHandle, Workbench
from workbench.launch import KINDS, config_fields, launch_resolved, resolve

PER_ROW = 3  # fields side by side in the form


def _read(row: dict, value: Any) -> Any:
    """A widget's value as the config takes it: a number field's integer as an int, a `literal` field's text as
    a TOML literal (as `--set` reads it), an emptied field as None (the default stands)."""
    if row["widget"] == "literal":
        text = str(value or "").strip()
        return toml_literal(text) if text else None
    if row["widget"] == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return None if value == "" else value


def _edited(row: dict, value: Any, now: dict) -> dict:
    """`values` with the widget's field set to its value, or no update when it holds that value already."""
    read = _read(row, value)
    return gr.skip() if row["field"] in now and now[row["field"]] == read else {**now, row["field"]: read}


def _label(row: dict) -> str:
    """The field's name, marked ● when its value is not the default."""
    return ("● " if row["value"] != row["default"] else "") + row["field"].rpartition(".")[2]


def _shown(row: dict) -> Any:
    """The field's value as its widget holds it (a text widget: the TOML literal, empty for unset)."""
    value = row["value"]
    if row["widget"] == "checkbox":
        return bool(value)
    if row["widget"] in ("dropdown", "suggest", "integer", "number"):
        return value
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def _widget(row: dict, job: str) -> gr.components.Component:
    """The field's widget from its type (`workbench.launch.widget_of`), its help and default under its name."""
    info = (row["help"] + f" (default: {json.dumps(row['default'])})").strip()
    kw = {"label": _label(row), "info": info, "value": _shown(row), "interactive": True, "scale": 1,
          "min_width": 240, "elem_id": f"launch-{job}-" + row["field"].replace(".", "-")}
    if row["widget"] == "checkbox":
        return gr.Checkbox(**kw)
    if row["widget"] in ("dropdown", "suggest"):
        return gr.Dropdown(choices=row["choices"], allow_custom_value=row["widget"] == "suggest", **kw)
    if row["widget"] in ("integer", "number"):
        return gr.Number(precision=0 if row["widget"] == "integer" else None, **kw)
    return gr.Textbox(**kw)


def changes(rows: list[dict], values: dict, kind: str) -> str:
    """The fields set away from their defaults (by the file or by an edit here), each with its default: what
    this launch changes, in one place."""
    out = [f"`{f}` = {json.dumps(v)} (default {json.dumps(r['default'])}" + (", edited here)" if v != r["value"]
                                                                                 else ")")
           for r in rows if (f := r["field"]) in values and (v := values[f]) is not None and v != r["default"]]
    return (f"**{len(out)} field(s) changed from the `{kind}` defaults:** " + " · ".join(out)) if out else \
        f"Every field at its `{kind}` default."


def typed_forms(values: gr.State) -> dict[str, tuple[gr.Column, dict[str, gr.components.Component]]]:
    """A form per config table (`train`; `rollout` for rollout, eval and sweep), built once, the one of the job
    picked shown: one folded group per TOML table (the job's own open), rows of `PER_ROW` typed widgets; each
    edit lands in `values`. Built up front rather than drawn per config: a form drawn while other events run
    races Gradio's session bookkeeping ("dictionary changed size during iteration")."""
    forms = {}
    for job in ("train", "rollout"):
        rows, widgets = config_fields(None, job), {}
        with gr.Column(visible=job == "train") as column:
            for table in dict.fromkeys(r["table"] for r in rows):
                group = [r for r in rows if r["table"] == table]
                with gr.Accordion(f"[{table}] · {len(group)} fields", open=table == job,
                                  elem_classes=["launch-table"]):
                    for at in range(0, len(group), PER_ROW):  # rows of equal columns: every help text readable
                        with gr.Row(equal_height=False):
                            for row in group[at:at + PER_ROW]:
                                widgets[row["field"]] = widget = _widget(row, job)
                                # an edit (`.change`: this Gradio's number widget sends `.input` the value
                                # before the keystroke); a value `fill` put in `values` already is skipped,
                                # not re-applied and the config re-checked once per filled field
                                widget.change(partial(_edited, row), [widget, values], values)
                            for _ in range(PER_ROW - len(group[at:at + PER_ROW])):
                                gr.HTML("")  # the last row's columns as wide as the others
        forms[job] = (column, widgets)
    return forms


def checked(kind: str, rows: list[dict], now: dict) -> tuple:
    """The resolved config, what it changes, and whether it can start: the button waits for a config that checks
    out."""
    try:
        cfg = resolve(kind, now)
    except UsageError as exc:
        return "", changes(rows, now, kind), f"⚠️ **not launchable:** {exc}", gr.Button(interactive=False)
    return (json.dumps(asdict(cfg), indent=2, default=str), changes(rows, now, kind), "✓ the config checks out",
            gr.Button(interactive=True))


def build(wb: Workbench, ticks: Ticks, tab: gr.Tab, experiments: Path) -> None:
    handles: dict[str, RunHandle] = {}  # jobs started from this app, by run name
    configs = sorted(str(p) for p in experiments.glob("*.toml"))
    with gr.Row():
        config = gr.Dropdown(label="config", choices=configs, value=next((c for c in configs if "smoke" in c), None),
                             scale=3, elem_id="launch-config")
        kind = gr.Dropdown(label="job", choices=list(KINDS), value="train", scale=1, elem_id="launch-kind")
        name = gr.Textbox(label="run name (optional)", scale=2)
    values = gr.State({})  # field -> its value now (the file's, else the default, then the edits here)
    fields = gr.State([])  # the rows `config_fields` gave the form

    forms = typed_forms(values)

    with gr.Accordion("resolved config (what the job will run)", open=False):
        preview = gr.Code(language="json", interactive=False, elem_id="launch-preview")
    changed = gr.Markdown(elem_id="launch-changes")
    check = gr.Markdown(elem_id="launch-check")
    with gr.Row():
        start = gr.Button("start", variant="primary", interactive=False, elem_id="launch-start")
        stop = gr.Button("stop")
    job = gr.Dropdown(label="job started here", choices=[], value=None, allow_custom_value=True)
    status = gr.Markdown(elem_id="launch-status")
    log = gr.Textbox(label="log (last lines)", lines=16, max_lines=16, autoscroll=True, elem_id="launch-log")
    fast = gr.Timer(1.0, active=False)  # while a job starts or stops, its log and status follow every second

    @shown_errors
    def fill(config, kind):
        """The job's form shown and filled from the config file (its values, marked where not the default)."""
        rows = config_fields(config, kind)
        table = "train" if kind == "train" else "rollout"
        filled = {r["field"]: gr.update(value=_shown(r), label=_label(r)) for r in rows}
        return (rows, {r["field"]: r["value"] for r in rows},
                *(gr.Column(visible=job == table) for job in forms),
                *(filled.get(f, gr.skip()) if job == table else gr.skip() for job in forms for f in forms[job][1]))

    @shown_errors
    def start_job(config, kind, name, now):
        cfg = resolve(kind, now)  # every field checked, then the name: before anything is written
        handle = launch_resolved(kind, cfg, wb.root, (name or "").strip() or None)
        handles[handle.run_id] = handle
        return gr.Dropdown(choices=list(handles), value=handle.run_id), gr.Timer(active=True)

    def follow(run_id, shown_status="", shown_log=""):
        """The job's status and log tail, each sent only when it changed: every update redraws in the browser."""
        handle = handles.get(run_id)
        if handle is None:
            return "", "", gr.Timer(active=False)
        state = handle.status()
        now = f"**{handle.run_id}**: {state}  \n`envace {shlex.join(handle.command[4:])}`", handle.log_tail()
        return (*(gr.skip() if new == old else new for new, old in zip(now, (shown_status, shown_log), strict=True)),
                gr.Timer(active=state in ("running", "stopping")))

    def stop_job(run_id):
        handle = handles.get(run_id)
        if handle is not None:  # the job stores what it finished and exits; the status follows it
            threading.Thread(target=handle.stop, daemon=True).start()
        return follow(run_id)

    filled = [fields, values, *(forms[job][0] for job in forms), *(w for job in forms for w in forms[job][1].values())]

    def first_fill(config, kind, rows):
        """The form filled the first time the tab opens (a page load that lands elsewhere fills nothing: setting
        ~150 widgets cost every page load seconds), kept as edited when the tab opens again."""
        return fill(config, kind) if not rows else (gr.skip(),) * len(filled)

    tab.select(first_fill, [config, kind, fields], filled)
    gr.on([config.change, kind.change], fill, [config, kind], filled)
    values.change(checked, [kind, fields, values], [preview, changed, check, start])
    start.click(start_job, [config, kind, name, values], [job, fast])
    stop.click(stop_job, job, [status, log, fast])
    gr.on([job.change, fast.tick], follow, [job, status, log], [status, log, fast], show_progress="hidden")
    ticks.add(follow, [job, status, log], [status, log, fast])
