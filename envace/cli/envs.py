"""`envace envs|check-env`: which environments load, and whether each one's gold replays through it."""

from __future__ import annotations

import argparse
import os

from envace.cli.console import new_console
from envace.cli.flags import positive
from envace.cli.tables import print_gold_stats


def cmd_envs(args: argparse.Namespace) -> int:
    """Every environment `--env` can name: built-ins and installed plugins, with their categories, or why one does
    not load (it is listed, the others keep working)."""
    from envace.envs import registry

    rows = registry.installed(args.envs or None)
    width = max(len(r.name) for r in rows)
    source_width = max(len(r.source) for r in rows)
    print(f"{'env':<{width}}  {'source':<{source_width}}  categories (each loads a task and resets an environment)")
    for r in rows:
        shown = f"error: {r.error}" if r.error else ", ".join(r.categories)
        print(f"{r.name:<{width}}  {r.source:<{source_width}}  {shown}")
    if not args.envs:
        print("also: --env package.module:factory (a module on the path; docs/environments.md)")
    return 2 if args.envs and any(r.error for r in rows) else 0


def cmd_check_env(args: argparse.Namespace) -> int:
    """Replay every reference through `execute()` and the checker, with a negative control (`envs/check.py`)."""
    from envace.envs import registry
    from envace.envs.check import check_benchmark

    benchmark = registry.get(args.env)
    console = new_console()
    if args.stats:
        return _gold_stats(benchmark, args.model, console)
    check = check_benchmark(benchmark, args.category, args.workers)
    for category, checked in check.run(lambda category: console.status(f"replaying {category} …")):
        if checked is None:
            print(f"{category:<28} no gold answers to replay (the benchmark keeps none for it)", flush=True)
            continue
        n, failures = len(checked.tasks), checked.failures
        fell, held = len(checked.control("fell")), checked.control("held")
        rejected = f", {len(checked.rejected)} call(s) rejected" if checked.rejected else ""
        print(f"{category:<28} {n - len(failures)}/{n}  negative control fell {fell}/{fell + len(held)}{rejected}",
              flush=True)
        for what, uids in (("failed", failures), ("negative control did not fall on", held)):
            if uids:  # every task named, its `env/category/` prefix said once
                prefix = os.path.commonprefix(uids).rpartition("/")[0]
                names = [u[len(prefix) + 1:] if prefix else u for u in uids]
                print(f"  {what} {len(uids)}{f' ({prefix}/…)' if prefix else ''}: {', '.join(names)}", flush=True)
    known, found = check.known, check.found
    print(f"{check.passed}/{check.total} ground-truth trajectories pass the official checker"
          + (f"; {len(known)} fail by known defects of the benchmark's data" if known else ""))
    for uid, reason in known:
        print(f"known defect: {uid}: {reason}")
    for line in found:  # one line each, never wrapped: the uids and errors are copied from here
        print(f"problem: {line}")
    return 1 if found else 0


def _gold_stats(benchmark, model: str, console) -> int:
    """`--stats`: every category's gold calls in both splits, counted with `model`'s tokenizer."""
    from envace import units
    from envace.policy.models import tokenizer_for

    tokenizer = tokenizer_for(model)
    stats = [(category, split, units.gold_stats(benchmark.load_tasks(category, split), tokenizer))
             for category in benchmark.categories for split in ("train", "test")]
    print_gold_stats(console, benchmark.name, model, stats)
    return 0


def register(sub) -> None:
    """envs and check-env."""
    p = sub.add_parser("envs", help="list the environments: built-in, installed plugins (entry points), and errors")
    p.add_argument("envs", nargs="*", metavar="ENV", help="check these only (names or package.module:factory "
                                                          "specs): exit 2 when one does not load")
    p.set_defaults(func=cmd_envs)
    p = sub.add_parser("check-env", help="replay every ground-truth trajectory through execute() and the official "
                                         "checker, with a negative control")
    p.add_argument("env", help="an env name (`envace envs`) or package.module:factory")
    p.add_argument("--stats", action="store_true", help="instead: gold call-message lengths and calls per turn, "
                                                        "and the budgets `auto` resolves to")
    p.add_argument("--model", default="default",
                   help="--stats: whose tokenizer counts the tokens (default: default)")
    p.add_argument("--workers", type=positive("--workers"), default=None,
                   help="processes replaying tasks (default: one per core; 1: none, all in this process)")
    p.add_argument("--category", default=None, help="check this category only (default: every one)")
    p.set_defaults(func=cmd_check_env)
