"""Launch tab: start a job from a config under `experiments/`, watch its log, stop it. The other tabs
pick the new run up as it writes."""

from __future__ import annotations

import shlex
from pathlib import Path

import gradio as gr

from apps.common import shown_errors
from envace.errors import UsageError
from workbench import RunHandle, Workbench, launch
from workbench.launch import KINDS


def build(app: gr.Blocks, wb: Workbench, timer: gr.Timer, experiments: Path) -> None:
    handles: dict[str, RunHandle] = {}  # jobs started from this app, by run name
    configs = sorted(str(p) for p in experiments.glob("*.toml"))
    with gr.Row():
        config = gr.Dropdown(label="config", choices=configs, value=next((c for c in configs if "smoke" in c), None),
                             scale=3, elem_id="launch-config")
        kind = gr.Dropdown(label="job", choices=list(KINDS), value="train", scale=1)
        name = gr.Textbox(label="run name (optional)", scale=2)
    extra = gr.Textbox(label="extra flags", placeholder="e.g. --limit 2 --mode real+shadow")
    with gr.Row():
        start = gr.Button("start", variant="primary")
        stop = gr.Button("stop")
    job = gr.Dropdown(label="job started here", choices=[], value=None, allow_custom_value=True)
    status = gr.Markdown()
    log = gr.Textbox(label="log (last lines)", lines=16, max_lines=16, autoscroll=True, elem_id="launch-log")

    @shown_errors
    def start_job(config, kind, name, extra):
        args = shlex.split(extra or "")
        if any(a == "--root" or a.startswith("--root=") for a in args):
            raise UsageError("the store root is the app's own (--root is not accepted here)")
        handle = launch(config, kind=kind, root=wb.root, name=name.strip() or None, args=args)
        handles[handle.run_id] = handle
        return gr.Dropdown(choices=list(handles), value=handle.run_id)

    def follow(run_id):
        handle = handles.get(run_id)
        if handle is None:
            return "", ""
        return f"**{handle.run_id}**: {handle.status()}  \n`envace {shlex.join(handle.command[4:])}`", handle.log_tail()

    def stop_job(run_id):
        if run_id in handles:
            handles[run_id].stop()
        return follow(run_id)

    start.click(start_job, [config, kind, name, extra], job)
    stop.click(stop_job, job, [status, log])
    gr.on([job.change, timer.tick], follow, job, [status, log])
