"""Rollouts ahead of the update, side by side: the table and figure of experiments/async_cpu.sh's runs.

    python experiments/async_report.py --root runs async-k0 async-k1 async-k2

Per run, over its GRPO steps: wall per step (the learner's, `step_s`), generated tokens per second of that
wall, each part's busy share of it (rollouts, update, the learner's wait for rollouts, the actor's weight
loads, the pushes to the server), the staleness of what was trained on, the actors' slot-time idle
(`actor_slot_idle`: the slot-seconds offered but empty over the steps' wall, a finished episode's slot empty
until refilled; each step weighted by its wall), and the older round count: in a step, 1 − Σ caller messages /
(episodes × the longest episode's), the share of engine rounds that wait for the longest episode. Writes
the figure (busy shares per run) to --figure (default docs/figures/async_cpu.html) unless --no-figure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envace.store import connect

PARTS = (("rollout_s", "rollouts"), ("update_s", "update"), ("wait_s", "learner waits"), ("load_s", "actor loads"),
         ("sync_s", "weight push"))


def measure(con, run: str) -> dict:
    """The run's row of the table ({} when it has no timed GRPO step)."""
    metric = con.execute("SELECT name, sum(value), count(*) FROM metrics WHERE run_id = ? AND phase = 'grpo' "
                         "AND role = 'all' GROUP BY name", [run]).fetchall()
    sums = {name: total for name, total, _ in metric}
    steps = dict((name, n) for name, _, n in metric).get("step_s", 0)
    if not steps:
        return {}
    stale = con.execute("SELECT value, count(*) FROM metrics WHERE run_id = ? AND phase = 'grpo' AND role = 'all' "
                        "AND name = 'staleness' GROUP BY value ORDER BY value", [run]).fetchall()
    tokens = con.execute("SELECT sum(generated_tokens) FROM episodes WHERE run_id = ? AND phase = 'grpo'",
                         [run]).fetchall()[0][0] or 0
    idle = con.execute("SELECT avg(1 - s / (n * m)) FROM (SELECT step, sum(n_steps) AS s, count(*) AS n, "
                       "max(n_steps) AS m FROM episodes WHERE run_id = ? AND phase = 'grpo' GROUP BY step "
                       "HAVING max(n_steps) > 0)", [run]).fetchall()[0][0]
    slots = con.execute("SELECT sum(i.value * s.value) / sum(s.value) FROM metrics i JOIN metrics s USING "
                        "(run_id, phase, role, step) WHERE i.run_id = ? AND i.phase = 'grpo' AND i.role = 'all' "
                        "AND i.name = 'actor_slot_idle' AND s.name = 'step_s'", [run]).fetchall()[0][0]
    wall = sums["step_s"]
    return {"run": run, "steps": steps, "wall_per_step": wall / steps, "tokens_per_s": tokens / wall,
            "shares": {label: sums.get(name, 0.0) / wall for name, label in PARTS if name in sums},
            "staleness": ", ".join(f"{int(v)}: {n}" for v, n in stale), "idle": idle, "slot_idle": slots}


def table(rows: list[dict]) -> str:
    labels = [label for _, label in PARTS if any(label in r["shares"] for r in rows)]
    head = ["run", "steps", "wall / step (s)", "tokens / s", *(f"{label} (share)" for label in labels),
            "steps by staleness", "slot-time idle", "idle in engine rounds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["run"], str(r["steps"]), f"{r['wall_per_step']:.1f}", f"{r['tokens_per_s']:.1f}",
                 *(f"{r['shares'][label]:.0%}" if label in r["shares"] else "—" for label in labels),
                 r["staleness"], f"{r['slot_idle']:.1%}" if r["slot_idle"] is not None else "—",
                 f"{r['idle']:.0%}" if r["idle"] is not None else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(rows: list[dict], out: Path) -> None:
    import plotly.graph_objects as go

    fig = go.Figure()
    for _, label in PARTS:
        fig.add_trace(go.Bar(name=label, x=[r["run"] for r in rows], y=[r["shares"].get(label, 0.0) for r in rows]))
    fig.update_layout(barmode="group", yaxis_title="share of the learner's wall time", yaxis_tickformat=".0%",
                      title="Where a GRPO step's time goes: synchronous vs rollouts ahead of the update",
                      margin={"t": 80})
    fig.write_html(out, include_plotlyjs="cdn")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--root", default="runs")
    parser.add_argument("--no-figure", action="store_true")
    parser.add_argument("--figure", default="docs/figures/async_cpu.html", help="where the figure goes")
    args = parser.parse_args()
    if not Path(args.root).is_dir():
        print(f"error: no runs folder at {args.root}", file=sys.stderr)
        return 2
    con = connect(args.root)
    rows = [measure(con, run) for run in args.runs]
    missing = [run for run, row in zip(args.runs, rows, strict=True) if not row]
    if missing:
        print(f"error: run '{missing[0]}' has no GRPO steps with wall times under {args.root}", file=sys.stderr)
        return 2
    print(table(rows))
    if not args.no_figure:
        out = Path(args.figure)
        figure(rows, out)
        print(f"figure: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
