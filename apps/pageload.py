"""How long a link to a run takes to open in the app: `python -m apps.pageload --root runs` serves the app on the
store, opens `?run=NAME` for each run in headless Debian Chromium (`--repeat` times) until the run's own tab is
selected, then clicks the Runs tab, and prints each time and their medians; with `--idle S`, also the CPU the
browser spends sitting S seconds on each tab while the app's timer re-reads the store (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from envace.errors import UsageError, run_main


def page_loads(url: str, driver, lands: dict[str, str], repeat: int = 3) -> list[tuple[str, float, float]]:
    """(run, seconds until its link landed on its tab, seconds until a click on Runs selected it), for each run of
    `lands` (run → its tab), `repeat` times each, the first load (a cold cache) left out."""
    from apps.screenshots import follow_link, open_tab

    runs = list(lands)
    times = []
    follow_link(driver, url, runs[0], lands[runs[0]])  # the app's scripts cached, as for a user's second link
    for _ in range(repeat):
        for run in runs:
            start = time.perf_counter()
            follow_link(driver, url, run, lands[run])
            landed = time.perf_counter()
            open_tab(driver, "Runs")
            times.append((run, landed - start, time.perf_counter() - landed))
    return times


def idle_cpu(url: str, driver, seconds: float) -> list[tuple[str, float]]:
    """(tab, the browser's CPU seconds per wall second) over `seconds` on each tab once it has drawn; every
    process of the browser (renderer, GPU, network) counted."""
    import psutil

    from apps.screenshots import TABS, open_tab

    browser = psutil.Process(driver.service.process.pid)

    def cpu() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in browser.children(recursive=True) if p.is_running())

    shares = []
    for tab, _ in TABS:
        open_tab(driver, tab)
        time.sleep(min(seconds, 10.0))  # its first draw done (the Launch form's first fill takes seconds)
        before = cpu()
        time.sleep(seconds)
        shares.append((tab, (cpu() - before) / seconds))
    return shares


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs")
    parser.add_argument("--repeat", type=int, default=3, help="times each run's link is opened")
    parser.add_argument("--limit", type=int, default=5, help="the newest runs of the store opened")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds on each tab for the browser's idle CPU")
    args = parser.parse_args(argv)

    def report() -> int:
        if args.repeat < 1 or args.limit < 1 or args.idle < 0:
            raise UsageError("--repeat and --limit take a positive count, --idle seconds (0: not measured)")
        from apps.screenshots import landings, served

        lands = dict(list(landings(args.root).items())[:args.limit])  # the newest runs
        if not lands:
            raise UsageError(f"no run in {args.root}: nothing to open")
        with served(args.root) as (url, driver):
            times = page_loads(url, driver, lands, args.repeat)
            idle = idle_cpu(url, driver, args.idle) if args.idle else []
        for run, landed, tab in times:
            print(f"{run:<40} link {landed:6.2f} s   tab {tab:6.2f} s")
        print(f"median over {len(times)}: link {statistics.median(t[1] for t in times):.2f} s, "
              f"tab switch {statistics.median(t[2] for t in times):.2f} s")
        for tab, share in idle:
            print(f"idle on {tab:<18} browser {share:.2f} CPU s a second")
        return 0

    return run_main(report)


if __name__ == "__main__":
    sys.exit(main())
