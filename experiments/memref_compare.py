"""Does memory-aware SFT remove private rehearsal's harm? The two ladders of experiments/private_ladder_cpu.sh side
by side, turn by turn: the study's seed-0 SFT checkpoint (`private_cpu-ladder`, model `sft`) and the memory-aware
SFT of the same tasks and seed (`[train.sft] memory = "reference"`, ladder `private_cpu-ladder-memref`, model
`memref`), on the same 117 1-call BFCL multi_turn_base test turns, greedy.

    .venv/bin/python experiments/memref_compare.py [RUNS [FIGURE]]   # RUNS: the runs folder (default runs/)

Prints one paired table (each row: A and B on the same turns, Δ = B − A with its 95% interval resampled by task,
the MDE at 80% power, McNemar's exact p on "scored" and the sign-flip permutation p by task, Holm over the table)
and writes it to RUNS/private_cpu-ladder-memref/compare.csv. The last row compares the harm itself: per turn,
(rehearsed − N = 0) under memref against the same under sft (a difference of differences: McNemar does not
apply). FIGURE (e.g. docs/figures/private_ladder.html): each model's mean checklist per rung, drawn with plotly.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from envace.compare import episode_pairs, row, with_holm
from envace.stats import paired_outcomes
from envace.store import connect
from envace.units import whole_uid

SFT, MEMREF = "private_cpu-ladder-sft", "private_cpu-ladder-memref-memref"
ROWS = [  # (what, A's cell, B's cell)
    ("N = 0: memref vs sft", f"{SFT}-none", f"{MEMREF}-none"),
    ("reference: memref vs sft", f"{SFT}-reference", f"{MEMREF}-reference"),
    ("rehearsed: memref vs sft", f"{SFT}-rehearsed-s0", f"{MEMREF}-rehearsed-s0"),
    ("sft: rehearsed vs N = 0", f"{SFT}-none", f"{SFT}-rehearsed-s0"),
    ("memref: rehearsed vs N = 0", f"{MEMREF}-none", f"{MEMREF}-rehearsed-s0"),
    ("memref: empty vs N = 0", f"{MEMREF}-none", f"{MEMREF}-empty"),
    ("memref: reference vs N = 0", f"{MEMREF}-none", f"{MEMREF}-reference"),
]


def harm(con, none: str, rehearsed: str) -> pd.DataFrame:
    """Per turn: the rehearsed memory's checklist minus N = 0's (task_uid, harm)."""
    pairs = episode_pairs(con, none, rehearsed)
    return pairs.assign(harm=pairs["b"] - pairs["a"])[["task_uid", "harm"]]


def figure(con, runs: set[str], path: Path) -> None:
    """Mean checklist per rung, one bar per model, for the cells that completed."""
    import plotly.graph_objects as go

    rungs = ["none", "empty", "reference", "real", "rehearsed-s0"]
    fig = go.Figure()
    for label, prefix in (("SFT", SFT), ("memory-aware SFT (reference memories)", MEMREF)):
        cells = [(r, f"{prefix}-{r}") for r in rungs if f"{prefix}-{r}" in runs]
        means = [con.execute("SELECT avg(checklist) FROM episodes WHERE run_id = ?", [c]).fetchall()[0][0]
                 for _, c in cells]
        fig.add_bar(name=label, x=["N = 0" if r == "none" else r.removesuffix("-s0") for r, _ in cells], y=means,
                    text=[f"{m:.3f}" for m in means], textposition="outside")
    fig.update_layout(title="Private rehearsal ladder: 117 one-call BFCL multi_turn_base test turns, greedy, seed 0",
                      yaxis_title="mean checklist", xaxis_title="memory in front of the committed turn",
                      barmode="group", template="plotly_white")
    fig.write_html(path, include_plotlyjs="cdn")


def main(root: Path, figure_path: Path | None = None) -> pd.DataFrame:
    con = connect(root)
    runs = set(con.execute("SELECT run_id FROM runs WHERE status = 'completed'").df()["run_id"])
    rows = [row({"comparison": what}, [episode_pairs(con, a, b)])
            for what, a, b in ROWS if a in runs and b in runs]
    if {f"{SFT}-none", f"{SFT}-rehearsed-s0", f"{MEMREF}-none", f"{MEMREF}-rehearsed-s0"} <= runs:
        sft, mem = harm(con, f"{SFT}-none", f"{SFT}-rehearsed-s0"), harm(con, f"{MEMREF}-none",
                                                                       f"{MEMREF}-rehearsed-s0")
        both = sft.merge(mem, on="task_uid", suffixes=("_sft", "_memref"))
        out = paired_outcomes(both["harm_sft"], both["harm_memref"], [whole_uid(u) for u in both["task_uid"]])
        rows.append({"comparison": "harm (rehearsed − N = 0): memref vs sft", "Δ per seed": f"{out['delta']:+.3f}",
                     "pairs": out["pairs"], "A": out["before"], "B": out["after"], "Δ = B − A": out["delta"],
                     "95% CI": f"{out['lo']:+.3f} … {out['hi']:+.3f}",
                     "MDE 80%": out["mde"], "up/down": "", "McNemar p": float("nan"),
                     "permutation p": out["permutation_p"]})
    frame, caption = with_holm(rows)
    frame = frame[[c for c in frame.columns if not c.startswith("_")]]
    out_dir = root / "private_cpu-ladder-memref"
    if out_dir.is_dir():
        frame.to_csv(out_dir / "compare.csv", index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(caption)
    if figure_path is not None:
        figure(con, runs, figure_path)
    return frame


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs"), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
