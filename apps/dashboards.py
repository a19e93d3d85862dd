"""The chart tabs: Fidelity, Private rehearsal and Training. Each picks a run, draws the workbench's
figures for it, and follows new rows while the run writes."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from apps.common import keep_choice, rounded, run_choices, shown_errors
from workbench import Workbench, figures

_ALL = "all runs"


def fidelity_tab(app: gr.Blocks, wb: Workbench, timer: gr.Timer) -> None:
    run = gr.Dropdown(label="run", choices=[_ALL], value=_ALL, allow_custom_value=True, elem_id="fidelity-run")
    table = gr.Dataframe(label="per tool (copied = verbatim one of its few-shot examples)", interactive=False,
                         max_height=260)
    with gr.Row():
        bars = gr.Plot(label="per tool")
        calibration = gr.Plot(label="fidelity vs success")
    over_training = gr.Plot(label="fidelity over training (train runs)")

    @shown_errors
    def draw(run_id):
        scoped = None if run_id in (None, _ALL) else run_id
        by_tool = wb.fidelity_by_tool(scoped)
        per_episode = wb.calibration(scoped)
        over = wb.fidelity_over_training(scoped) if scoped else pd.DataFrame(columns=["step", "source", "name",
                                                                                     "value"])
        return (rounded(by_tool), figures.fidelity_bars(by_tool), figures.calibration(per_episode),
                figures.fidelity_over_training(over))

    def choices(current):
        return keep_choice([_ALL, *run_choices(wb.runs(), having=wb.runs_with("pairs") | wb.runs_with("metrics"))],
                           current)

    gr.on([app.load, timer.tick], choices, run, run)
    run.change(draw, run, [table, bars, calibration, over_training], api_name="fidelity")


def rehearsal_tab(app: gr.Blocks, wb: Workbench, timer: gr.Timer) -> None:
    gr.Markdown("Success against the number of privately imagined attempts N (`envace sweep`); dotted: "
                "private-rehearsal tokens per episode on the second axis.")
    with gr.Row():
        sweep = gr.Dropdown(label="sweep", choices=[], value=None, allow_custom_value=True)
        metric = gr.Radio(["success_rate", "checklist", "well_formed_rate"], value="checklist", label="metric")
    curves = gr.Plot()
    cells = gr.Dataframe(label="cells", interactive=False, max_height=200)
    gr.Markdown("### A committed turn: what it imagined, what it wrote down, what it did")
    run = gr.Dropdown(label="run with private rehearsal", choices=[], value=None, allow_custom_value=True)
    turns = gr.Dataframe(label="rehearsed turns (click one)", interactive=False, max_height=200)
    imagined = gr.Dataframe(label="imagined attempts", interactive=False, wrap=True)
    memory = gr.Textbox(label="memory (appended to the user's message)", lines=3)
    committed = gr.Textbox(label="committed action (the caller's first message of the turn)", lines=3)

    @shown_errors
    def draw(sweep_id, metric):
        frame = wb.sweep(sweep_id) if sweep_id else wb.sweep().iloc[0:0]
        return figures.budget_curves(frame, metric), rounded(frame)

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
                first["completion_text"].iloc[0] if len(first) else "")

    def choices(current_sweep, current_run):
        return (keep_choice(run_choices(wb.runs(), having=wb.runs_with("sweep")), current_sweep),
                keep_choice(run_choices(wb.runs(), having=wb.runs_with("memories")), current_run))

    gr.on([app.load, timer.tick], choices, [sweep, run], [sweep, run])
    gr.on([sweep.change, metric.change], draw, [sweep, metric], [curves, cells], api_name="budget_curves")
    run.change(list_turns, run, turns, api_name="rehearsed_turns")
    turns.select(open_turn, [run, turns], [imagined, memory, committed])


def training_tab(app: gr.Blocks, wb: Workbench, timer: gr.Timer) -> None:
    with gr.Row():
        run = gr.Dropdown(label="train run", choices=[], value=None, allow_custom_value=True, scale=3)
        phase = gr.Radio(["grpo", "sft", "eval"], value="grpo", label="phase", scale=2)
    curves = gr.Plot()
    table = gr.Dataframe(label="last step", interactive=False, max_height=240)

    @shown_errors
    def draw(run_id, phase):
        if not run_id:
            return None, None
        long = wb.training(run_id, phase)
        if long.empty:
            return None, pd.DataFrame({"note": [f"no {phase} metrics stored for {run_id} yet"]})
        names = figures.TRAINING_METRICS if phase == "grpo" else tuple(sorted(set(long["name"])))
        last = long[long["step"] == long["step"].max()].pivot_table(index="name", columns="role", values="value")
        return figures.training_curves(long, names), rounded(last.reset_index(), 4)

    def choices(current):
        return keep_choice(run_choices(wb.runs(), kinds=("train",)), current)

    gr.on([app.load, timer.tick], choices, run, run)
    def follow(run_id, phase):
        # only a run that is still writing gets new points; redrawing a finished one would reset the zoom
        runs = wb.runs()
        live = run_id in set(runs[runs["status"] == "running"]["run_id"])
        return draw(run_id, phase) if live else (gr.skip(), gr.skip())

    gr.on([run.change, phase.change], draw, [run, phase], [curves, table], api_name="training")
    timer.tick(follow, [run, phase], [curves, table])
