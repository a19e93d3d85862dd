"""The units of a pass-rate screen whose rewards differ: the pool on which a GRPO group gets a signal.

    .venv/bin/python experiments/screen_units.py RUN [--root runs] [--max N]

Prints one line to stdout, a TOML array of those unit uids (`--set grpo.units=$(…)`), and per unit its hits
to stderr. `--max N` keeps N of them, spread over as many scenarios (whole tasks) as it can: the scenarios
take turns, each giving its unit closest to half scored (the most signal a group of G can expect) first.
A missing run, or a screen in which no unit's rewards differ, is one error line and exit 2: GRPO on
that pool would have no signal at all (`Workbench.unit_rewards`).
"""

from __future__ import annotations

import argparse
import json
import sys

from envace.errors import UsageError, run_main
from envace.study.screen import capped
from envace.units import whole_uid
from workbench import Workbench


def spread_units(wb: Workbench, run: str, most: int | None = None) -> list[str]:
    """The uids of the units of `run` whose episodes' rewards are not all equal, in uid order."""
    if run not in set(wb.runs()["run_id"]):
        raise UsageError(f"no run named '{run}' in {wb.root}")
    units = wb.unit_rewards(run)
    for row in units.itertuples(index=False):
        print(f"{row.task_uid}: {row.hits}/{row.episodes} scored, mean {row.mean:.3f}"
              + ("  <- spread" if row.spread else ""), file=sys.stderr)
    spread = units[units["spread"]]
    if spread.empty:
        raise UsageError(f"screen '{run}': none of its {len(units)} units has rewards that differ, so no GRPO "
                         "group on them would have a signal")
    chosen = capped(list(spread.itertuples(index=False)), most) if most else list(spread["task_uid"])
    scenarios = {whole_uid(u) for u in chosen}
    print(f"{len(chosen)} of {len(spread)} units with spread, from {len(scenarios)} scenario(s)", file=sys.stderr)
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--root", default="runs")
    parser.add_argument("--max", type=int, default=None, help="keep at most N units, over as many scenarios")
    args = parser.parse_args()
    return run_main(lambda: _print_units(args))


def _print_units(args: argparse.Namespace) -> int:
    if args.max is not None and args.max < 1:
        raise UsageError(f"--max: must be at least 1, got {args.max}")
    print(json.dumps(spread_units(Workbench(args.root), args.run, args.max)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
