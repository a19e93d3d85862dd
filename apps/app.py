"""The workbench app: `envace app [--root runs] [--host 127.0.0.1] [--port 7860]`.

Tabs: Runs, Inspector, Fidelity, Private rehearsal, Training, Launch. One `Workbench` serves every tab;
a timer re-reads the store every few seconds, so a run that is writing fills the pages in as it goes.
Corrupt shards are skipped and listed on the Runs tab; an empty store says which command fills it.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from apps import dashboards, inspector, launcher
from apps.common import rounded
from apps.render import empty_state, warnings_md
from workbench import Workbench

REFRESH_S = 5.0


def build(root: str | Path = "runs", experiments: str | Path = "experiments",
          refresh_s: float = REFRESH_S) -> gr.Blocks:
    wb = Workbench(root)
    with gr.Blocks(title="EnvACE Workbench", analytics_enabled=False) as app:
        timer = gr.Timer(refresh_s)
        gr.Markdown(f"## EnvACE Workbench · `{wb.root}`")
        with gr.Tab("Runs"):
            empty = gr.Markdown(elem_id="empty-state")
            warnings = gr.Markdown(elem_id="store-warnings")
            runs = gr.Dataframe(label="runs (newest first)", interactive=False, elem_id="runs-table")
        with gr.Tab("Inspector"):
            inspector.build(app, wb, timer)
        with gr.Tab("Fidelity"):
            dashboards.fidelity_tab(app, wb, timer)
        with gr.Tab("Private rehearsal"):
            dashboards.rehearsal_tab(app, wb, timer)
        with gr.Tab("Training"):
            dashboards.training_tab(app, wb, timer)
        with gr.Tab("Launch"):
            launcher.build(app, wb, timer, Path(experiments))

        def refresh():
            wb.refresh()
            frame = rounded(wb.runs().drop(columns=["summary"]))
            return empty_state(str(wb.root)) if frame.empty else "", warnings_md(wb.warnings), frame

        # re-read the store on every tick: the tabs see new shards by their next query
        gr.on([app.load, timer.tick], refresh, None, [empty, warnings, runs])
    return app


def serve(root: str | Path = "runs", host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> gr.Blocks:
    """Start the app on `host:port` (localhost unless told otherwise)."""
    app = build(root)
    app.queue().launch(server_name=host, server_port=port, prevent_thread_lock=not block, show_error=True,
                       ssr_mode=False, quiet=True)
    return app
