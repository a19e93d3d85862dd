"""Save workbench figures as standalone HTML for docs: `python -m workbench.report sweep NAME OUT.html`.

Kinds: `sweep NAME` (success and checklist vs budget), `training RUN` (per-role curves),
`fidelity RUN` (per-tool bars). `--root` selects the store (default `runs/`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envace.errors import UsageError, run_main
from workbench.core import Workbench
from workbench.figures import budget_curves, fidelity_bars, training_curves


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.report")
    parser.add_argument("kind", choices=["sweep", "training", "fidelity"])
    parser.add_argument("run")
    parser.add_argument("out", type=Path)
    parser.add_argument("--root", default="runs")
    parser.add_argument("--metric", default="checklist", help="sweep: success_rate | checklist | well_formed_rate")
    args = parser.parse_args(argv)
    return run_main(lambda: _save(args))


def _save(args: argparse.Namespace) -> int:
    wb = Workbench(args.root)
    if args.kind == "sweep":
        frame = wb.sweep(args.run)
        fig = budget_curves(frame, args.metric)
    elif args.kind == "training":
        frame = wb.training(args.run)
        fig = training_curves(frame)
    else:
        frame = wb.fidelity_by_tool(args.run)
        fig = fidelity_bars(frame)
    if frame.empty:
        raise UsageError(f"nothing stored for {args.kind} '{args.run}' under {args.root}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(args.out, include_plotlyjs="cdn")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
