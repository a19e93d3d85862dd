"""Launch tab: pick a config under `experiments/` and a job, edit its fields in a form generated from the config's
typed fields (defaults and choices shown, checked before anything starts), read the resolved config, start the
job, watch its log, stop it. The job runs the resolved config as a file, in its own process; the other tabs
pick the new run up as it writes."""

from __future__ import annotations

import shlex
import threading
from pathlib import Path

import gradio as gr
import pandas as pd

from apps.common import shown_errors
from envace.errors import UsageError
from workbench import RunHandle, Workbench
from workbench.launch import KINDS, config_fields, launch_resolved, resolve

FORM_COLUMNS = ["field", "value", "default", "choices", "help"]


def _values(form: pd.DataFrame, shown: dict) -> dict:
    """The form's edited values, read back with their types: the table hands every cell over as text, so a
    field whose shown value was text stays text, any other is read as a TOML literal (3, 0.5, true), as the
    CLI reads flags and `--set`, and the config then checks it like a file."""
    from envace.cli import _typed

    out = {}
    for row in form.to_dict("records"):
        value, before = row["value"], shown.get(row["field"])
        text = "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value).strip()
        if text == str(before):
            out[row["field"]] = before  # unchanged: the file's value (or the default) stands
        elif text != "":
            out[row["field"]] = text if isinstance(before, str) else _typed(text)
    return out


def build(app: gr.Blocks, wb: Workbench, timer: gr.Timer, experiments: Path) -> None:
    handles: dict[str, RunHandle] = {}  # jobs started from this app, by run name
    configs = sorted(str(p) for p in experiments.glob("*.toml"))
    with gr.Row():
        config = gr.Dropdown(label="config", choices=configs, value=next((c for c in configs if "smoke" in c), None),
                             scale=3, elem_id="launch-config")
        kind = gr.Dropdown(label="job", choices=list(KINDS), value="train", scale=1, elem_id="launch-kind")
        name = gr.Textbox(label="run name (optional)", scale=2)
    form = gr.Dataframe(headers=FORM_COLUMNS, label="fields (edit a value; defaults and choices beside it)",
                        interactive=True, max_height=320, wrap=True, elem_id="launch-form")
    with gr.Accordion("resolved config (what the job will run)", open=False):
        preview = gr.Code(language="json", interactive=False, elem_id="launch-preview")
    check = gr.Markdown(elem_id="launch-check")
    with gr.Row():
        start = gr.Button("start", variant="primary")
        stop = gr.Button("stop")
    job = gr.Dropdown(label="job started here", choices=[], value=None, allow_custom_value=True)
    status = gr.Markdown(elem_id="launch-status")
    log = gr.Textbox(label="log (last lines)", lines=16, max_lines=16, autoscroll=True, elem_id="launch-log")
    fast = gr.Timer(1.0, active=False)  # while a job starts or stops, its log and status follow every second
    shown = gr.State({})  # field -> the value the form was filled with (its type decides how an edit is read)

    @shown_errors
    def fill(config, kind):
        rows = config_fields(config, kind) if config else []
        table = pd.DataFrame(rows, columns=FORM_COLUMNS).astype({"value": str, "default": str})
        return table, {r["field"]: r["value"] for r in rows}

    def check_form(kind, form, shown):
        import json
        from dataclasses import asdict

        try:
            cfg = resolve(kind, _values(form, shown))
        except UsageError as exc:
            return "", f"⚠️ **not launchable:** {exc}"
        return json.dumps(asdict(cfg), indent=2, default=str), "✓ the config checks out"

    @shown_errors
    def start_job(config, kind, name, form, shown):
        cfg = resolve(kind, _values(form, shown))  # every field checked, then the name: before anything is written
        handle = launch_resolved(kind, cfg, wb.root, (name or "").strip() or None)
        handles[handle.run_id] = handle
        return gr.Dropdown(choices=list(handles), value=handle.run_id), gr.Timer(active=True)

    def follow(run_id):
        handle = handles.get(run_id)
        if handle is None:
            return "", "", gr.Timer(active=False)
        state = handle.status()
        shown = f"**{handle.run_id}**: {state}  \n`envace {shlex.join(handle.command[4:])}`"
        return shown, handle.log_tail(), gr.Timer(active=state in ("running", "stopping"))

    def stop_job(run_id):
        handle = handles.get(run_id)
        if handle is not None:  # the job stores what it finished and exits; the status follows it
            threading.Thread(target=handle.stop, daemon=True).start()
        return follow(run_id)

    gr.on([app.load, config.change, kind.change], fill, [config, kind], [form, shown])
    gr.on([form.change], check_form, [kind, form, shown], [preview, check])
    start.click(start_job, [config, kind, name, form, shown], [job, fast])
    stop.click(stop_job, job, [status, log, fast])
    gr.on([job.change, timer.tick, fast.tick], follow, job, [status, log, fast])
