"""How long a link to a run takes to open in the app: `python -m apps.pageload --root runs` serves the app on the
store, opens `?run=NAME` for each run in headless Debian Chromium (`--repeat` times) until the run's own tab is
selected, then clicks the Runs tab, and prints each time and their medians (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from envace.errors import UsageError, run_main


def page_loads(root: str | Path, repeat: int = 3, limit: int = 5) -> list[tuple[str, float, float]]:
    """(run, seconds until its link landed on its tab, seconds until a click on Runs selected it), for the
    newest `limit` runs of the store, `repeat` times each, one browser, the first load (a cold cache) left out."""
    from apps.screenshots import follow_link, landings, open_tab, served

    lands = landings(root)
    if not lands:
        raise UsageError(f"no run in {root}: nothing to open")
    runs = list(lands)[:limit]
    times = []
    with served(root) as (url, driver):
        follow_link(driver, url, runs[0], lands[runs[0]])  # the app's scripts cached, as for a user's second link
        for _ in range(repeat):
            for run in runs:
                start = time.perf_counter()
                follow_link(driver, url, run, lands[run])
                landed = time.perf_counter()
                open_tab(driver, "Runs")
                times.append((run, landed - start, time.perf_counter() - landed))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs")
    parser.add_argument("--repeat", type=int, default=3, help="times each run's link is opened")
    parser.add_argument("--limit", type=int, default=5, help="the newest runs of the store opened")
    args = parser.parse_args(argv)

    def report() -> int:
        if args.repeat < 1 or args.limit < 1:
            raise UsageError("--repeat and --limit take a positive count")
        times = page_loads(args.root, args.repeat, args.limit)
        for run, landed, tab in times:
            print(f"{run:<40} link {landed:6.2f} s   tab {tab:6.2f} s")
        print(f"median over {len(times)}: link {statistics.median(t[1] for t in times):.2f} s, "
              f"tab switch {statistics.median(t[2] for t in times):.2f} s")
        return 0

    return run_main(report)


if __name__ == "__main__":
    sys.exit(main())
