"""The workbench app: `envace app [--root runs] [--host 127.0.0.1] [--port 7860]`.

Tabs: Runs, Inspector, Fidelity, Private rehearsal, Training, Launch. One `Workbench` serves every tab;
a timer re-reads the store every few seconds, so a run that is writing fills the pages in as it goes.
Corrupt shards are skipped and listed on the Runs tab; an empty store says which command fills it.
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr
import pandas as pd

from apps import dashboards, inspector, launcher
from apps.common import kept_unless_changed, linked, percent, run_choices, score, shown_errors
from apps.render import empty_state, warnings_md
from apps.ticks import Ticks
from workbench import Workbench

REFRESH_S = 5.0


def run_table(wb: Workbench) -> pd.DataFrame:
    """The Runs tab: newest first, human times, rates as percentages, and headline metrics for training runs."""
    runs = wb.runs()
    if runs.empty:
        return pd.DataFrame(columns=RUN_COLUMNS)
    heads = wb.headlines().set_index("run_id")
    store = (f"{wb.root}/", f"{wb.root.resolve()}/")  # a checkpoint of this store is shown by its run
    stored = wb.episode_counts()  # a run with no summary count (training, an interrupted run) still has episodes
    table = pd.DataFrame({
        "run": runs["run_id"], "kind": runs["kind"], "status": runs["status"],
        "model": runs["model"].map(lambda m: _short(store, m)),
        "created": pd.to_datetime(runs["created"]).dt.strftime("%Y-%m-%d %H:%M"),
        "episodes": [str(int(n)) if not pd.isna(n) else str(stored.get(r, "")) for r, n in
                     zip(runs["run_id"], runs["episodes"], strict=True)],
        "success": runs["success_rate"].map(percent), "checklist": runs["checklist"].map(score),
        "well-formed calls": runs["well_formed_rate"].map(percent),
        "GRPO steps": runs["run_id"].map(lambda r: "" if r not in heads.index else f"{heads.at[r, 'steps']:.0f}"),
        "last reward": runs["run_id"].map(lambda r: score(heads["reward"].get(r))),
        "groups with signal": runs["run_id"].map(lambda r: percent(heads["signal"].get(r))),
        "eval checklist": runs["run_id"].map(lambda r: score(heads["eval_checklist"].get(r))),
        "eval rehearsal exact": runs["run_id"].map(lambda r: score(heads["eval_exact"].get(r))),
    })
    return table.fillna("")


def _short(prefixes: tuple[str, ...], model: object) -> str:
    """A model as the table shows it: a checkpoint of this store (under one of `prefixes`, the store's folder
    as given and resolved) by its run (`demo-train-…/checkpoint`)."""
    text = str(model or "")
    for prefix in prefixes:
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def matching(frame: pd.DataFrame, query: str | None) -> pd.DataFrame:
    """The rows of the run table whose name, kind, model or status holds every word of `query` (any case)."""
    words = (query or "").lower().split()
    if not words or frame.empty:
        return frame
    text = (frame["run"] + " " + frame["kind"] + " " + frame["model"].astype(str) + " " + frame["status"]).str.lower()
    return frame[[all(w in t for w in words) for t in text]]


RUN_COLUMNS = ["run", "kind", "status", "model", "created", "episodes", "success", "checklist", "well-formed calls",
               "GRPO steps", "last reward", "groups with signal", "eval checklist", "eval rehearsal exact"]
# the columns that say something about each kind of run (and fit a screen); every view keeps run and kind
_PLAYED = ["run", "kind", "status", "model", "created", "episodes", "success", "checklist", "well-formed calls"]
KIND_COLUMNS = {
    "all": ["run", "kind", "status", "model", "created", "episodes", "success"],
    "rollout / eval": _PLAYED,
    "train": ["run", "kind", "status", "model", "created", "episodes", "GRPO steps", "last reward",
              "groups with signal", "eval checklist", "eval rehearsal exact"],
    "sweep / ladder / suite / study / world-model": ["run", "kind", "status", "model", "created", "episodes"],
}


def of_kind(frame: pd.DataFrame, view: str) -> pd.DataFrame:
    """The run table as one view shows it: its kinds' rows (every row for `all`) and its columns."""
    kinds = None if view == "all" else set(view.split(" / "))
    rows = frame if kinds is None or frame.empty else frame[frame["kind"].isin(kinds)]
    return rows[KIND_COLUMNS.get(view, RUN_COLUMNS)]


# the tab a click on a run opens (else the Inspector); a suite opens as the paper's table, on the Runs tab itself
_OPENS = {"train": "training", "sweep": "rehearsal", "ladder": "rehearsal", "suite": "runs", "world-model": "fidelity",
          "study": "runs"}


def tab_of(wb: Workbench, run_id: str, kind: str) -> str:
    """The tab that shows a run best: its kind's, a private-rehearsal evaluation's own tab, else the Inspector."""
    if kind in _OPENS:
        return _OPENS[kind]
    return "rehearsal" if run_id in wb.runs_with("memories") else "inspector"


def runs_tab(app: gr.Blocks, wb: Workbench, ticks: Ticks) -> tuple:
    """The hub: every run (searchable; a kind's view with its own columns), a config diff of the runs picked, and
    a suite's table. Returns the run table, the suite table, the note a link to an unknown run writes, the runs
    picked and the button overlaying their curves (`build` wires what a click opens)."""
    link_note = gr.Markdown(elem_id="link-note")
    empty = gr.Markdown(elem_id="empty-state")
    warnings = gr.Markdown(elem_id="store-warnings")
    with gr.Row():
        search = gr.Textbox(label="search runs (name, kind, model, status)", placeholder="e.g. train", scale=2,
                            elem_id="runs-search")
        view = gr.Radio(list(KIND_COLUMNS), value="all", label="kind (each with its own columns)", scale=3,
                        elem_id="runs-kind")
    runs = gr.Dataframe(label="runs, newest first (click one to open it)", interactive=False, wrap=True,
                        elem_id="runs-table")
    with gr.Row():
        compared = gr.Dropdown(label="compare runs (pick two or more): their config diff, or their curves overlaid",
                               choices=[], value=[], multiselect=True, scale=3, elem_id="runs-compare")
        overlay = gr.Button("overlay their training curves", scale=1, elem_id="runs-overlay")
    differ = gr.Dataframe(label="the fields where their configs differ", interactive=False, visible=False,
                          elem_id="runs-config-diff")
    suite_table = gr.Dataframe(label="suite: ours beside the paper's published rows (substitutes named in the "
                                     "headers)", interactive=False, visible=False, elem_id="suite-table")

    def shown(query, kind):
        wb.refresh()
        frame = run_table(wb)
        return frame, (empty_state(str(wb.root)) if frame.empty else "", warnings_md(wb.warnings),
                       of_kind(matching(frame, query), kind or "all"))

    def refresh(query, picked, kind):
        frame, out = shown(query, kind)
        return *out, gr.Dropdown(choices=list(frame["run"]), value=[r for r in picked or [] if r in set(frame["run"])])

    def tick(query, picked, kind, choices):
        frame, out = shown(query, kind)
        return *out, *kept_unless_changed(list(frame["run"]), picked, choices, multiselect=True,
                                                    pick_first=False)

    @shown_errors
    def compare_configs(run_ids):
        run_ids = [r for r in run_ids or [] if r]
        if len(run_ids) < 2:
            return gr.Dataframe(visible=False)
        return gr.Dataframe(value=wb.config_diff(run_ids), visible=True)

    # re-read the store on every tick: the tabs see new shards by their next query
    known = gr.State([])  # the compare picker's choices, so a tick that finds no new run leaves it alone
    gr.on([search.change, view.change], refresh, [search, compared, view], [empty, warnings, runs, compared],
          api_name="refresh")
    app.load(tick, [search, compared, view, known], [empty, warnings, runs, compared, known])
    ticks.add(tick, [search, compared, view, known], [empty, warnings, runs, compared, known])
    compared.change(compare_configs, compared, differ, api_name="config_diff")
    return runs, suite_table, link_note, compared, overlay


def build(root: str | Path = "runs", experiments: str | Path = "experiments",
          refresh_s: float = REFRESH_S) -> gr.Blocks:
    wb = Workbench(root)
    with gr.Blocks(title="EnvACE Workbench", analytics_enabled=False) as app:
        ticks = Ticks(refresh_s)
        gr.Markdown(f"## EnvACE Workbench · `{wb.root}`")
        with gr.Tabs() as tabs:
            with gr.Tab("Runs", id="runs"):
                runs, suite_table, link_note, compared, overlay = runs_tab(app, wb, ticks)
            with gr.Tab("Inspector", id="inspector"):
                inspected = inspector.build(app, wb, ticks)
            with gr.Tab("Fidelity", id="fidelity") as tab:
                measured, tools = dashboards.fidelity_tab(app, wb, ticks, tab)
            with gr.Tab("Private rehearsal", id="rehearsal") as tab:
                swept, rehearsed, inspect_turn, turn, laddered = dashboards.rehearsal_tab(app, wb, ticks, tab)
            with gr.Tab("Training", id="training") as tab:
                trained, phase, by_step = dashboards.training_tab(app, wb, ticks, tab)
            with gr.Tab("Launch", id="launch") as tab:
                launcher.build(wb, ticks, tab, Path(experiments))
        ticks.wire()

        @shown_errors
        def open_run(frame: pd.DataFrame, evt: gr.SelectData):
            run_id, kind = frame.iloc[evt.index[0]]["run"], frame.iloc[evt.index[0]]["kind"]
            tab = tab_of(wb, run_id, kind)
            suite = gr.Dataframe(value=wb.suite(run_id), visible=True) if kind == "suite" else \
                gr.Dataframe(visible=False)
            return (gr.Tabs(selected=tab), run_id if tab == "inspector" else gr.skip(),
                    [run_id] if tab == "training" else gr.skip(), run_id if tab == "fidelity" else gr.skip(),
                    run_id if kind == "sweep" else gr.skip(),
                    run_id if tab == "rehearsal" and kind not in ("sweep", "ladder") else gr.skip(),
                    run_id if kind == "ladder" else gr.skip(), suite)

        def follow_link(request: gr.Request):
            """`?run=NAME` opens the tab of the run's kind (an unknown name says so); `&episode=ID` that episode."""
            run_id = linked(request)
            if run_id is None:
                return gr.skip(), ""
            kinds = dict(zip(wb.runs()["run_id"], wb.runs()["kind"], strict=True))
            if run_id not in kinds:
                return gr.Tabs(selected="runs"), (f"**No run named `{run_id}` in `{wb.root}`.** The link may point "
                                                  "to another store; the runs this one holds are listed below.")
            return gr.Tabs(selected=tab_of(wb, run_id, kinds[run_id])), ""

        app.load(follow_link, None, [tabs, link_note])
        runs.select(open_run, runs, [tabs, inspected.run, trained, measured, swept, rehearsed, laddered, suite_table])

        def overlay_curves(picked):
            """The training runs among those picked, overlaid on the Training tab."""
            trains = [r for r in picked or [] if r in set(run_choices(wb.runs(), kinds=("train",)))]
            if not trains:
                raise gr.Error("pick one or more training runs to overlay their curves")
            return gr.Tabs(selected="training"), trains

        overlay.click(overlay_curves, compared, [tabs, trained])
        _link_to_episodes(wb, tabs, inspected, tools=(measured, tools), steps=(trained, phase, by_step),
                          turn=(inspect_turn, turn))
    return app


def episodes_of(run_id: str, tool: str = "", phase: str = "any", step: int | None = None,
                episode: str | None = None) -> tuple:
    """The Inspector opened on a run's episodes, filtered (a tool they call, a phase and step) and, given one,
    that episode open: the updates for `[tabs, *Opened.components()]`."""
    return gr.Tabs(selected="inspector"), run_id, tool, phase, "" if step is None else str(step), \
        episode if episode else gr.skip()


def _link_to_episodes(wb: Workbench, tabs: gr.Tabs, inspected: inspector.Opened, tools: tuple, steps: tuple,
                      turn: tuple) -> None:
    """What an aggregate opens: a tool of the Fidelity table → the episodes that call it; a step of a training
    run → that step's episodes; a privately rehearsed turn → its episode."""
    opened = [tabs, *inspected.components()]

    @shown_errors
    def open_tool(run_id, frame: pd.DataFrame, evt: gr.SelectData):
        tool = str(frame.iloc[evt.index[0]]["tool"])
        tool = "" if tool == "all" else tool
        if run_id in (None, dashboards.ALL_RUNS):  # every run's pairs: the newest run with pairs of this tool
            run_id = next((r for r in run_choices(wb.runs(), having=wb.runs_with("pairs"))
                           if not tool or tool in set(wb.fidelity_by_tool(r)["tool"])), None)
        return episodes_of(run_id, tool) if run_id else (gr.skip(),) * len(opened)

    @shown_errors
    def open_step(run_ids, phase, frame: pd.DataFrame, evt: gr.SelectData):
        return episodes_of(run_ids[0], phase=phase, step=int(frame.iloc[evt.index[0]]["step"]))

    tools[1].select(open_tool, [tools[0], tools[1]], opened)
    steps[2].select(open_step, list(steps), opened)
    turn[0].click(lambda picked: episodes_of(picked[0], episode=picked[1]) if picked else (gr.skip(),) * len(opened),
                  turn[1], opened)


def serve(root: str | Path = "runs", host: str = "127.0.0.1", port: int = 7860, block: bool = True) -> gr.Blocks:
    """Start the app on `host:port` (localhost unless told otherwise)."""
    app = build(root)
    app.queue().launch(server_name=host, server_port=port, prevent_thread_lock=not block, show_error=True,
                       ssr_mode=False, quiet=True)
    return app
