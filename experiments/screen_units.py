"""The units of a pass-rate screen whose rewards differ: the pool on which a GRPO group gets a signal.

    .venv/bin/python experiments/screen_units.py RUN [--root runs]

Prints one line to stdout, a TOML array of those unit uids (`--set grpo_units=$(…)`), and per unit its hits
to stderr. A missing run, or a screen in which no unit's rewards differ, is one error line and exit 2: GRPO on
that pool would have no signal at all (`Workbench.unit_rewards`).
"""

from __future__ import annotations

import argparse
import json
import sys

from envace.errors import UsageError
from workbench import Workbench


def spread_units(wb: Workbench, run: str) -> list[str]:
    """The uids of the units of `run` whose episodes' rewards are not all equal, in uid order."""
    if run not in set(wb.runs()["run_id"]):
        raise UsageError(f"no run named '{run}' in {wb.root}")
    units = wb.unit_rewards(run)
    for row in units.itertuples(index=False):
        print(f"{row.task_uid}: {row.hits}/{row.episodes} scored, mean {row.mean:.3f}"
              + ("  <- spread" if row.spread else ""), file=sys.stderr)
    chosen = list(units.loc[units["spread"], "task_uid"])
    if not chosen:
        raise UsageError(f"screen '{run}': none of its {len(units)} units has rewards that differ, so no GRPO "
                         "group on them would have a signal")
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--root", default="runs")
    args = parser.parse_args()
    try:
        print(json.dumps(spread_units(Workbench(args.root), args.run)))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
