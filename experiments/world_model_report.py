"""The tables of docs/log/results-earlier.md "The world model, measured", read from the store
`world_model_study.sh` wrote.

    .venv/bin/python experiments/world_model_report.py [--root runs] [--tag wm] [--seeds 0 1 2]
        [--arms envace fidelity caller_only real_env control] [--plot OUT.html]
    .venv/bin/python experiments/world_model_report.py --seed 0 --best   # the best trained arm's run name

World model: every arm's benchmark run (`wm-ARM-screened-TAG-sSEED`) against SFT's (`wm-sft-TAG`) on the same
gold calls, paired by call (`Workbench.world_model_compare`: Δ = arm − SFT, a bootstrap interval resampling
tasks, the sign test over the calls whose score differs); then split by whether the call's tool was called in the
arm's trained pool, and by tool. Private rehearsal: every cell of the two sweeps (`private-summary-TAG`,
`private-transcript-TAG`): memories accepted, outcome against the same model without rehearsal (paired by
turn), and the cost per committed turn. The training tables per arm are experiments/turns_report.py's.

Every table that prints p-values prints them Holm-adjusted too, over the family its caption names: all the sign
tests of that table.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from envace import world_model
from envace.config import nest
from envace.envs import registry
from envace.errors import UsageError, run_main
from envace.stats import cluster_bootstrap, holm, sign_test
from envace.units import whole_uid
from workbench import Workbench

METRICS = ("exact", "structure_f1", "value_acc", "error_agree", "valid", "embed_cos")


def md(frame: pd.DataFrame) -> str:
    def cell(v) -> str:
        if isinstance(v, float):
            return "–" if np.isnan(v) else f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)])


def stored_units(wb: Workbench, run: str) -> list[str]:
    """The units a train run's GRPO was fixed to (its stored `grpo.units`, or `grpo_units` in an earlier run)."""
    config = json.loads((wb.root / run / "run.json").read_text())["config"]
    return nest(config).get("grpo", {}).get("units") or []


def pool_tools(wb: Workbench, run: str) -> set[str]:
    """The tools of the gold calls of an arm's trained turns (`grpo.units`)."""
    units = stored_units(wb, run)
    bfcl = registry.get("bfcl")
    tasks = {t.uid: t for t in bfcl.load_tasks("multi_turn_base", "train")}
    tools = set()
    for uid in units:
        turn = int(uid.rsplit("@t", 1)[1])
        tools |= {step.call.name for step in tasks[whole_uid(uid)].reference[turn]}
    return tools


def delta(frame: pd.DataFrame, metric: str) -> tuple[float, float, float, float] | None:
    """Δ = B − A of one metric over matched calls: (mean, 95% interval over tasks, sign test p); None if no call
    has the metric in both runs."""
    both = frame[[f"{metric}_a", f"{metric}_b", "episode_id"]].dropna()
    diff = both[f"{metric}_b"] - both[f"{metric}_a"]
    if not len(diff):
        return None
    lo, hi = cluster_bootstrap(diff, both["episode_id"])
    return float(diff.mean()), lo, hi, sign_test(diff)


def paired(frame: pd.DataFrame) -> dict:
    """Δ (arm − SFT) of each metric over matched calls: `calls`, and `delta`'s tuple per metric (for a Δ table's
    cells, `delta_cells`, and the figure)."""
    return {"calls": len(frame), **{m: delta(frame, m) for m in METRICS}}


def delta_cells(rows: list[tuple[dict, dict]]) -> tuple[list[dict], str]:
    """A Δ table: each row `(its leading columns, paired's numbers)` with `Δ (low … high) p=… Holm=…` cells, the
    sign test p Holm-adjusted over every sign test of the table; and the caption that names that family."""
    ps = [float("nan") if n[m] is None else n[m][3] for _, n in rows for m in METRICS]
    adjusted = iter(holm(ps))
    out = []
    for lead, numbers in rows:
        cells = {**lead, "calls": str(numbers["calls"])}
        for m in METRICS:
            d, h = numbers[m], next(adjusted)
            cells[f"Δ {m}"] = "–" if d is None else f"{d[0]:+.3f} ({d[1]:+.3f} … {d[2]:+.3f}) p={d[3]:.3g} Holm={h:.3g}"
        out.append(cells)
    n, plural = sum(p == p for p in ps), "s" * (len(rows) != 1)
    return out, (f"p: exact sign test over the calls whose score differs; Holm: that p Holm-adjusted over the {n} sign "
                 f"tests of this table ({len(rows)} row{plural} × {len(METRICS)} metrics, those with calls in both "
                 "runs).")


def forest(parts: dict[str, dict], out: str) -> None:
    """The Δ tables as a figure (standalone HTML): one row per arm and call set (`paired`'s numbers), Δ exact and
    Δ struct F1 against SFT with their 95% intervals (uncorrected: the tables' Holm column says which rows
    survive the correction)."""
    labels = list(parts)[::-1]  # plotly draws the first row at the bottom
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=("Δ exact", "Δ struct F1"))
    for col, metric in enumerate(("exact", "structure_f1"), start=1):
        cells = [parts[label][metric] or (np.nan,) * 4 for label in labels]
        mean = [c[0] for c in cells]
        fig.add_trace(go.Scatter(
            x=mean, y=labels, mode="markers", showlegend=False, marker={"size": 9},
            error_x={"type": "data", "symmetric": False, "array": [c[2] - c[0] for c in cells],
                     "arrayminus": [c[0] - c[1] for c in cells]},
            customdata=[[parts[label]["calls"], c[3]] for label, c in zip(labels, cells, strict=True)],
            hovertemplate="%{y}<br>Δ %{x:+.3f}<br>calls %{customdata[0]}, sign test p %{customdata[1]:.3g}"
                          "<extra></extra>"), row=1, col=col)
        fig.add_vline(x=0, line={"color": "grey", "dash": "dot"}, row=1, col=col)
    fig.update_layout(title="The world model: each arm against SFT on the same gold calls (95% interval over tasks)",
                      template="plotly_white", height=120 + 28 * len(labels), margin={"l": 320})
    fig.write_html(out, include_plotlyjs="cdn")
    print(f"figure → {out}", file=sys.stderr)


def world_model_tables(wb: Workbench, tag: str, seeds: list[int], arms: list[str], present: set[str],
                       plot: str | None = None) -> None:
    sft = f"wm-sft-{tag}"
    if sft not in present:
        print(f"(no {sft} yet)")
        return
    base = wb.world_model_calls(sft)
    print(f"\n### The world-model benchmark: SFT ({sft})\n")
    table = wb.world_model(sft)
    print(md(pd.DataFrame({"tool": table["tool"], "calls": table["calls"], "tasks": table["tasks"], **{
        label: [f"{v:.3f} ({lo:.3f} … {hi:.3f})" if v == v else "–"
                for v, lo, hi in zip(table[m], table[f"{m}_lo"], table[f"{m}_hi"], strict=True)]
        for m, label in world_model.LABELS.items()}})))
    overall, split, tools, parts = [], [], [], {}
    for seed in seeds:
        for arm in arms:
            run = f"{arm}-screened-{tag}-s{seed}"
            if f"wm-{run}" not in present:
                continue
            matched = world_model.matched(base, wb.world_model_calls(f"wm-{run}"), (sft, f"wm-{run}"))
            parts[f"{arm} s{seed}: all {len(matched)} calls"] = numbers = paired(matched)
            overall.append(({"arm": arm, "seed": seed}, numbers))
            in_pool = matched["tool"].isin(pool_tools(wb, run))
            for name, part in (("tool called in the trained pool", matched[in_pool]),
                               ("tool not called in the trained pool", matched[~in_pool])):
                parts[f"{arm} s{seed}: {len(part)} calls, {name.removeprefix('tool ')}"] = numbers = paired(part)
                split.append(({"arm": arm, "seed": seed, "calls of": name}, numbers))
            for tool, part in matched.groupby("tool"):
                d = (part["exact_b"] - part["exact_a"]).to_numpy(float)
                f = (part["structure_f1_b"] - part["structure_f1_a"]).to_numpy(float)
                tools.append({"arm": arm, "seed": seed, "tool": tool, "calls": len(part),
                              "SFT exact": part["exact_a"].mean(), "arm exact": part["exact_b"].mean(),
                              "Δ exact": d.mean(), "Δ struct F1": f.mean(), "calls up/down (struct F1)":
                              f"{(f > 0).sum()}/{(f < 0).sum()}"})
    if overall:
        print("\n### Each arm against SFT on the same calls (Δ = arm − SFT, 95% interval over tasks, sign test p, "
              "Holm-adjusted p)\n")
        cells, note = delta_cells(overall)
        print(md(pd.DataFrame(cells)) + f"\n\n{note}")
        print("\n### Split by whether the tool was called in the arm's trained pool\n")
        cells, note = delta_cells(split)
        print(md(pd.DataFrame(cells)) + f"\n\n{note}")
        print("\n### Per tool (exact and struct F1)\n")
        print(md(pd.DataFrame(tools)))
        if plot:
            forest(parts, plot)


def private_tables(wb: Workbench, tag: str, sweeps: set[str]) -> None:
    rows = []
    for memory in ("summary", "transcript"):
        # `private-MEMORY-TAG`, and `private-MEMORY-TAG-ARM` for an arm swept later (world_model_study.sh)
        name = f"private-{memory}-{tag}"
        for sweep in sorted(r for r in sweeps if r == name or r.startswith(f"{name}-")):
            rows += private_cells(wb, sweep, memory)
    if rows:
        print("\n### Private rehearsal on the 24 test turns, both memory kinds\n")
        frame = pd.DataFrame(rows)
        frame.insert(frame.columns.get_loc("sign p") + 1, "Holm p", holm(frame["sign p"]))
        n = int(frame["sign p"].notna().sum())
        print(md(frame) + f"\n\nsign p: exact sign test over the turns whose checklist differs from N = 0; Holm p: "
              f"that p Holm-adjusted over the {n} sign tests of this table (every cell with N > 0, both memory kinds).")


def private_cells(wb: Workbench, sweep: str, memory: str) -> list[dict]:
    """One row per cell of a private-rehearsal sweep: memories accepted, Δ checklist against the same model's
    N = 0 cell (paired by turn), cost per committed turn."""
    rows = []
    for cell in wb.sweep(sweep).itertuples(index=False):
        episodes = wb.episodes(cell.cell_run, limit=1_000_000).set_index("task_uid")["checklist"]
        plain = wb.episodes(f"{sweep}-{cell.label}-none-0", limit=1_000_000).set_index("task_uid")["checklist"]
        common = episodes.index.intersection(plain.index)
        diffs = (episodes[common] - plain[common]).to_numpy(float)
        memories = wb.sql(f"SELECT memory, memory_error FROM memories WHERE run_id = '{cell.cell_run}'")
        accepted = int((memories["memory_error"].isna() & (memories["memory"] != "")).sum())
        lo, hi = cluster_bootstrap(diffs, [whole_uid(u) for u in common]) if cell.budget else \
            (float("nan"), float("nan"))  # resampled by task: a task's turns share its scenario
        rows.append({"memory": memory, "model": cell.label, "mode": cell.mode, "N": cell.budget,
                     "turns": len(episodes), "scored": int((episodes > 0).sum()), "checklist": episodes.mean(),
                     "memories accepted": f"{accepted}/{len(memories)}" if len(memories) else "–",
                     "Δ checklist vs N = 0": diffs.mean() if cell.budget else float("nan"),
                     "95% CI": f"{lo:+.3f} … {hi:+.3f}" if cell.budget else "–",
                     "sign p": sign_test(diffs) if cell.budget else float("nan"),
                     "private tokens / turn": cell.private_tokens_per_episode,
                     "s / turn": cell.wall_s_per_episode})
    return rows


def best_arm(wb: Workbench, tag: str, seed: int, arms: list[str], present: set[str]) -> str:
    """The trained arm (not the control) whose screen after training scores most often on its trained turns."""
    scores = {}
    for arm in arms:
        run = f"{arm}-screened-{tag}-s{seed}"
        if arm == "control" or f"screen-{run}" not in present:
            continue
        units = stored_units(wb, run)
        episodes = wb.episodes(f"screen-{run}", limit=1_000_000)
        scores[run] = int((episodes[episodes["task_uid"].isin(units)]["checklist"] > 0).sum())
    if not scores:
        raise UsageError(f"no arm of tag {tag}, seed {seed} has been screened after training")
    print(f"scored on the trained turns after training: {scores}", file=sys.stderr)
    return max(scores, key=lambda r: (scores[r], -list(scores).index(r)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs")
    parser.add_argument("--tag", default="wm")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--seed", type=int, default=0, help="--best: the seed whose arms compete")
    parser.add_argument("--arms", nargs="*", default=["envace", "fidelity", "caller_only", "real_env", "control"])
    parser.add_argument("--best", action="store_true", help="print the best trained arm's run name and stop")
    parser.add_argument("--plot", metavar="OUT.html", help="also save the Δ tables as a figure")
    args = parser.parse_args()
    return run_main(lambda: _report(args))


def _report(args: argparse.Namespace) -> int:
    wb = Workbench(args.root)
    completed = wb.runs().query("status == 'completed'")
    present = set(completed["run_id"])
    if args.best:
        print(best_arm(wb, args.tag, args.seed, args.arms, present))
        return 0
    world_model_tables(wb, args.tag, args.seeds, args.arms, present, args.plot)
    private_tables(wb, args.tag, set(completed.query("kind == 'sweep'")["run_id"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
