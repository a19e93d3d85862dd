"""The chart tabs: Fidelity, Private rehearsal and Training. Each picks runs, draws the workbench's figures for
them on load, on opening the tab (so it shows what the store holds now) and whenever the pick changes, follows
a run that is still writing, and says what is missing (and which command makes it) when there is nothing to
draw."""

from __future__ import annotations

from collections.abc import Callable

import gradio as gr
import pandas as pd

from apps.common import empty_note, first_draw, kept_unless_changed, linked, rounded, run_choices, shown_errors, skipped
from apps.ticks import Ticks
from envace import world_model
from workbench import Workbench, figures

ALL_RUNS = "all runs"  # the Fidelity picker's choice of every run at once


def fidelity_tab(app: gr.Blocks, wb: Workbench, ticks: Ticks, tab: gr.Tab) -> tuple[gr.Dropdown, gr.Dataframe]:
    """Per-tool fidelity of a run's pairs (or every run's), calibration, fidelity over training and a world-model
    run's benchmark. Returns the run picker and the per-tool table (a click on a tool opens its episodes)."""
    note = gr.Markdown(elem_id="fidelity-note")
    run = gr.Dropdown(label="run", choices=[ALL_RUNS], value=ALL_RUNS, allow_custom_value=True, elem_id="fidelity-run")
    table = gr.Dataframe(label="per tool (copied = verbatim one of its few-shot examples; malformed = no usable "
                               "rehearsal); click a tool to open the episodes that call it", interactive=False,
                         max_height=260, elem_id="fidelity-tools")
    with gr.Row():
        bars = gr.Plot(label="per tool")
        calibration = gr.Plot(label="fidelity vs success")
    over_training = gr.Plot(label="fidelity over training", visible=False)
    benchmark = gr.Dataframe(label="world-model benchmark: mean (95% bootstrap interval over tasks); every gold "
                                   "call rehearsed in its real context", interactive=False, visible=False,
                             elem_id="fidelity-world-model")

    @shown_errors
    def draw(run_id):
        scoped = None if run_id in (None, ALL_RUNS) else run_id
        by_tool = wb.fidelity_by_tool(scoped)
        if by_tool.empty:
            return (empty_note("pairs of real and rehearsed responses" + (f" in `{scoped}`" if scoped else ""),
                               "pairs"), None, None, None, gr.Plot(visible=False), gr.Dataframe(visible=False))
        overall = by_tool[by_tool["tool"] == "all"].iloc[0]
        said = ""
        if overall["malformed"] == 1:
            said = (f"**Every one of the {int(overall['pairs'])} rehearsals was malformed** (no usable "
                    "`<execution_result>`): there is nothing to compare, so every score is 0.")
        is_train = scoped is not None and scoped in set(run_choices(wb.runs(), kinds=("train",)))
        over = figures.fidelity_over_training(wb.fidelity_over_training(scoped)) if is_train else None
        measured = scoped is not None and scoped in set(run_choices(wb.runs(), kinds=("world-model",)))
        return (said, rounded(by_tool), figures.fidelity_bars(by_tool[by_tool["tool"] != "all"]),
                figures.calibration(wb.calibration(scoped)), gr.Plot(value=over, visible=is_train),
                gr.Dataframe(value=_intervals(wb.world_model(scoped)) if measured else None, visible=measured))

    def choices(current, known, request: gr.Request):
        return kept_unless_changed([ALL_RUNS, *run_choices(wb.runs(), having=wb.runs_with("pairs"))], current, known)

    outputs = [note, table, bars, calibration, over_training, benchmark]

    def landing(current, known, request: gr.Request):  # `?run=NAME` picks that run first (if it has pairs)
        update, held = choices(linked(request) or current, known, request)
        return update, held, *first_draw(update, current, len(outputs), draw)

    known = gr.State([])  # the picker's choices: a tick sends it nothing while they stand
    ticks.add(choices, [run, known], [run, known])
    app.load(landing, [run, known], [run, known, *outputs])
    # always_last: a pick that lands while a draw is pending (a link's tab opening as the load fills the picker)
    # is drawn after it; Gradio's default for a listener led by `.select` drops it
    gr.on([tab.select, run.change], draw, run, outputs, api_name="fidelity", trigger_mode="always_last")
    return run, table


def _intervals(frame: pd.DataFrame) -> pd.DataFrame:
    """The world-model table as it reads: one `mean (low–high)` cell per metric."""
    cells = {m: [("" if v != v else f"{v:.2f} ({lo:.2f}–{hi:.2f})")
                 for v, lo, hi in zip(frame[m], frame[f"{m}_lo"], frame[f"{m}_hi"], strict=True)]
             for m in world_model.LABELS}
    return pd.DataFrame({"tool": frame["tool"], "calls": frame["calls"], "tasks": frame["tasks"],
                         **{world_model.LABELS[m]: c for m, c in cells.items()}})


def _ladder_section(wb: Workbench) -> tuple[gr.Dropdown, Callable, list]:
    """The ladder's part of the Private rehearsal tab: its picker, the function that draws a ladder, and what it
    draws into (its note, the paired comparisons, the per-turn diagnosis)."""
    gr.Markdown("### The ladder: why a memory helps or hurts (`envace private-ladder`)\n"
                "The same turns and seeds with no memory (N = 0), the empty block, a memory of the turn's gold "
                "(reference), of the imagined attempt played on a copy of the real state (real), today's rehearsed "
                "memory, and select.")
    ladder_note = gr.Markdown(elem_id="ladder-note")

    def first_ladder(request: gr.Request | None) -> str | None:
        """The ladder a page opens on: the one its `?run=` names, else the newest."""
        ladders = run_choices(wb.runs(), having=wb.runs_with("ladder"))
        return linked(request) if linked(request) in ladders else next(iter(ladders), None)

    ladder = gr.Dropdown(label="ladder", choices=[], value=None, allow_custom_value=True, elem_id="ladder-run")
    comparisons = gr.Dataframe(label="each rung against N = 0 and against the rehearsed memory, paired by turn "
                                     "(95% interval resampled by task; p-values Holm-adjusted over the table)",
                               interactive=False, wrap=True, elem_id="ladder-table")
    diagnosed = gr.Dataframe(label="per turn: the memory changed the committed first action / the committed call "
                                   "copies an imagined one / fidelity of the answers it was written from",
                             interactive=False, elem_id="ladder-diagnosis")
    @shown_errors
    def draw_ladder(ladder_id, request: gr.Request | None = None):
        # An empty picker is the page's pick not arrived yet (the tab's select can run before the load's choices
        # land): draw what it will hold, the linked ladder else the newest, so that a draw finishing late never
        # covers the ladder with the empty note
        ladder_id = ladder_id or first_ladder(request)
        hidden = gr.Dataframe(visible=False), gr.Dataframe(visible=False)
        if not ladder_id:  # no placeholder tables: the note says what fills them
            return empty_note("private-rehearsal ladder", "ladder"), *hidden
        frame = wb.ladder(ladder_id)
        if frame.empty:
            return (f"**Ladder `{ladder_id}` has no rung paired with its N = 0 cell yet**; its cells are still "
                    "playing. This page picks them up as they complete."), *hidden
        return "", gr.Dataframe(ladder_table(frame), visible=True), \
            gr.Dataframe(rounded(wb.ladder_diagnosis(ladder_id)), visible=True)

    return ladder, draw_ladder, [ladder_note, comparisons, diagnosed]


def rehearsal_tab(app: gr.Blocks, wb: Workbench, ticks: Ticks,
                  tab: gr.Tab) -> tuple[gr.Dropdown, gr.Dropdown, gr.Button, gr.State, gr.Dropdown]:
    """Success against the private budget N, the ladder of memories that tells why it helps or hurts, and one
    committed turn: what it imagined, wrote down and did. Returns the sweep and run pickers, the button (with the
    turn it reads) that opens the turn's episode, and the ladder picker."""
    gr.Markdown("Success against the number of privately imagined attempts N (`envace sweep`); dotted: "
                "private-rehearsal tokens per episode on the second axis.")
    note = gr.Markdown(elem_id="rehearsal-note")
    with gr.Row():
        sweep = gr.Dropdown(label="sweep", choices=[], value=None, allow_custom_value=True)
        metric = gr.Radio(["success_rate", "checklist", "well_formed_rate"], value="checklist", label="metric")
    curves = gr.Plot()
    cells = gr.Dataframe(label="cells", interactive=False, max_height=200)
    ladder, draw_ladder, drawn = _ladder_section(wb)
    gr.Markdown("### A committed turn: what it imagined, what it wrote down, what it did")
    run = gr.Dropdown(label="run with private rehearsal", choices=[], value=None, allow_custom_value=True)
    turns = gr.Dataframe(label="rehearsed turns (click one)", interactive=False, max_height=200,
                         elem_id="rehearsal-turns")
    imagined = gr.Dataframe(label="imagined attempts", interactive=False, wrap=True)
    memory = gr.Textbox(label="memory (appended to the user's message)", lines=3)
    committed = gr.Textbox(label="committed action (the caller's first message of the turn)", lines=3)
    opened = gr.State(None)  # (run, episode) of the turn clicked
    inspect = gr.Button("open this turn's episode in the Inspector", visible=False, elem_id="rehearsal-inspect")

    @shown_errors
    def draw(sweep_id, metric):
        if not sweep_id:  # no empty plot, no placeholder table: the note says what fills them
            return empty_note("budget sweep", "sweep"), gr.Plot(visible=False), gr.Dataframe(visible=False)
        frame = wb.sweep(sweep_id)
        return "", gr.Plot(figures.budget_curves(frame, metric), visible=True), gr.Dataframe(rounded(frame),
                                                                                             visible=True)

    @shown_errors
    def list_turns(run_id):
        return wb.rehearsed_turns(run_id) if run_id else None

    @shown_errors
    def open_turn(run_id, frame: pd.DataFrame, evt: gr.SelectData):
        row = frame.iloc[evt.index[0]]
        detail = wb.rehearsed_turn(run_id, row["episode_id"], int(row["turn"]))
        steps = wb.steps(run_id, row["episode_id"])
        first = steps[(steps["turn"] == row["turn"]) & (steps["turn_step"] == 0) & (steps["role"] == "caller")]
        return (detail["imagined"], row["memory"] or f"(no memory: {row['memory_error']})",
                first["completion_text"].iloc[0] if len(first) else "", (run_id, row["episode_id"]),
                gr.Button(visible=True))

    def choices(current_sweep, current_run, current_ladder, known, request: gr.Request):
        known = known or [None] * 3
        picks = [kept_unless_changed(run_choices(wb.runs(), having=wb.runs_with(table)), current or linked(request),
                                     held) for table, current, held in
                 zip(("sweep", "memories", "ladder"), (current_sweep, current_run, current_ladder), known, strict=True)]
        held = [old if skipped(new) else new for (_, new), old in zip(picks, known, strict=True)]
        return *(update for update, _ in picks), held

    def landing(current_sweep, current_run, current_ladder, metric, known, request: gr.Request):
        to_sweep, to_run, to_ladder, held = choices(current_sweep, current_run, current_ladder, known, request)
        return (to_sweep, to_run, to_ladder, held, *first_draw(to_ladder, current_ladder, len(drawn), draw_ladder),
                *first_draw(to_sweep, current_sweep, 3, draw, metric))

    pickers, known = [sweep, run, ladder], gr.State(None)  # known: the pickers' choices, sent only when they change
    app.load(landing, [*pickers, metric, known], [*pickers, known, *drawn, note, curves, cells])
    ticks.add(choices, [*pickers, known], [*pickers, known])
    gr.on([tab.select, ladder.change], draw_ladder, ladder, drawn, api_name="ladder", trigger_mode="always_last")
    gr.on([tab.select, sweep.change, metric.change], draw, [sweep, metric], [note, curves, cells],
          api_name="budget_curves", trigger_mode="always_last")
    run.change(list_turns, run, turns, api_name="rehearsed_turns")
    turns.select(open_turn, [run, turns], [imagined, memory, committed, opened, inspect])
    return sweep, run, inspect, opened, ladder


def ladder_table(frame: pd.DataFrame) -> pd.DataFrame:
    """A ladder's comparisons as they read: the interval and the up/down counts in one cell each."""
    interval = [f"{lo:+.3f} … {hi:+.3f}" for lo, hi in zip(frame["lo"], frame["hi"], strict=True)]
    moved = [f"{int(u)}/{int(d)}" for u, d in zip(frame["up"], frame["down"], strict=True)]
    out = frame.drop(columns=["lo", "hi", "up", "down"])
    out.insert(out.columns.get_loc("MDE 80%"), "95% CI", interval)
    out.insert(out.columns.get_loc("MDE 80%") + 1, "up/down", moved)
    return rounded(out)


def training_tab(app: gr.Blocks, wb: Workbench, ticks: Ticks,
                 tab: gr.Tab) -> tuple[gr.Dropdown, gr.Radio, gr.Dataframe]:
    """Curves of the runs picked (metric, x-axis, smoothing), the actors' timeline, the first run's episodes on the
    wall clock (or, for a run stored before episodes kept their times, a note saying so), the last step, and the first
    run's episodes per step. Returns the run picker, the phase and the per-step table (a click opens that step's
    episodes)."""
    note = gr.Markdown(elem_id="training-note")
    with gr.Row():
        runs = gr.Dropdown(label="train runs (several overlay their curves)", choices=[], value=[], multiselect=True,
                           allow_custom_value=True, scale=3, elem_id="training-runs")
        phase = gr.Radio(["grpo", "sft", "eval"], value="grpo", label="phase", scale=2)
        smoothing = gr.Slider(0, 0.95, value=0, step=0.05, label="smoothing (moving average)", scale=1)
    with gr.Row():
        picked = gr.Dropdown(label="metrics (empty: the usual ones)", choices=[], value=[], multiselect=True,
                             scale=3, elem_id="training-metrics")
        x_axis = gr.Radio(list(figures.X_AXES), value="step", label="x-axis", scale=2, elem_id="training-x")
    curves = gr.Plot(elem_id="training-curves")
    timeline = gr.Plot(label="actors, learner and publishes (the first run picked)")
    episode_bars = gr.Plot(label="episodes (the first run picked)", elem_id="training-episodes")
    table = gr.Dataframe(label="last step", interactive=False, max_height=240)
    by_step = gr.Dataframe(label="episodes per step (the first run picked; click a step to open its episodes)",
                           interactive=False, max_height=240, visible=False, elem_id="training-steps")

    @shown_errors
    def draw(run_ids, phase, smoothing, chosen, x):
        run_ids = [r for r in (run_ids or []) if r]
        hidden = (gr.Plot(visible=False), gr.Plot(visible=False), gr.Plot(visible=False), gr.Dataframe(visible=False),
                  gr.Dropdown(choices=[]), gr.Dataframe(visible=False))
        if not run_ids:  # no empty plot, no placeholder table: the note says what fills them
            return empty_note("training runs", "train"), *hidden
        long = pd.concat([wb.training(r, phase).assign(run_id=r) for r in run_ids], ignore_index=True)
        if long.empty:
            return f"No {phase} metrics stored for {', '.join(run_ids)} yet.", *hidden
        available = figures.curve_metrics(long, phase)
        chosen = [n for n in (chosen or []) if n in available]
        usual = [n for n in figures.TRAINING_METRICS if n in available] if phase == "grpo" else available
        names = tuple(chosen or usual)
        spans = figures.step_timeline(long[long["run_id"] == run_ids[0]]) if phase == "grpo" else None
        last = long[(long["step"] == long.groupby("run_id")["step"].transform("max"))
                    & ~long["name"].str.endswith("_t")]  # a span's wall-clock start is for the timeline only
        table = last.pivot_table(index="name", columns=["run_id", "role"], values="value")
        table.columns = [" · ".join(map(str, c)) for c in table.columns]
        steps = wb.episodes_by_step(run_ids[0], phase) if phase != "sft" else pd.DataFrame()  # SFT plays none
        idle = figures.actor_slot_idle(long, run_ids[0]) if phase == "grpo" else None  # the actors' slots: GRPO's only
        bars = figures.episode_timeline(wb.episode_spans(run_ids[0], phase), idle) if not steps.empty else None
        said = "" if bars is not None or steps.empty else (
            f"`{run_ids[0]}` stored no start and end times for its {phase} episodes (it was written before episodes "
            "kept them): no episode timeline for it.")
        return (said, gr.Plot(figures.training_curves(long, names, smoothing, phase, x), visible=True),
                gr.Plot(spans, visible=spans is not None), gr.Plot(bars, visible=bars is not None),
                gr.Dataframe(rounded(table.reset_index(), 4), visible=True),
                gr.Dropdown(choices=available, value=chosen), gr.Dataframe(rounded(steps), visible=not steps.empty))

    def choices(current, known, request: gr.Request):
        wanted = current or ([linked(request)] if linked(request) else None)
        return kept_unless_changed(run_choices(wb.runs(), kinds=("train",)), wanted, known, multiselect=True)

    def landing(current, phase, smoothing, chosen, x, known, request: gr.Request):
        update, held = choices(current, known, request)
        return update, held, *first_draw(update, current, len(outputs), draw, phase, smoothing, chosen, x)

    def follow(run_ids, phase, smoothing, chosen, x):
        # only runs still writing get new points; redrawing finished ones would reset the zoom
        running = set(wb.runs().query("status == 'running'")["run_id"])
        return draw(run_ids, phase, smoothing, chosen, x) if set(run_ids or []) & running else (gr.skip(),) * 7

    inputs, outputs = [runs, phase, smoothing, picked, x_axis], [note, curves, timeline, episode_bars, table, picked,
                                                                 by_step]
    known = gr.State([])  # the picker's choices, so a tick that finds no new run sends nothing
    ticks.add(choices, [runs, known], [runs, known])
    app.load(landing, [*inputs, known], [runs, known, *outputs])
    gr.on([tab.select, runs.change, phase.change, smoothing.release, picked.input, x_axis.change], draw,
          inputs, outputs, api_name="training", trigger_mode="always_last")
    ticks.add(follow, inputs, outputs)
    return runs, phase, by_step
