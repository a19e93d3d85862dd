"""`envace private-ladder`: why private rehearsal helps or hurts, one rung of memory at a time
(`envace/private/ladder.py`)."""

from __future__ import annotations

import argparse

from envace.cli.console import LiveReporter, new_console
from envace.cli.flags import ROLLOUT_FLAGS, add_config_flags, positive, rollout_config, root_hint, with_root
from envace.config import toml_literal
from envace.paths import runs_root

_LADDER_FLAGS = tuple(n for n in ROLLOUT_FLAGS if n != "model")  # each cell's model is one of --models


def cmd_private_ladder(args: argparse.Namespace) -> int:
    """Per model, N = 0 and each rung as one eval run on the same turns and seeds; then the paired table and the
    per-turn diagnosis, stored in the ladder's run."""
    from envace import show
    from envace.jobs import ladder_job
    from envace.private import ladder
    from envace.store import connect, get_run

    base = rollout_config(args, _LADDER_FLAGS)
    rungs = ladder.parse_rungs(args.rungs) if args.rungs is not None else ladder.default_rungs(base.private.budget)
    models = ladder.parse_models(args.models.split(","))
    seeds = ladder.parse_seeds(args.seeds, base.seed)
    console = new_console()
    root = runs_root(args.root)
    run, *_ = ladder_job(args.name, models, rungs, seeds, base, root, LiveReporter(console))
    for table in show.tables(connect(root), get_run(root, run.run_id)):  # what `envace show` prints of it
        console.print(table)
    console.print(f"tables: {run.path / 'ladder.csv'}, {run.path / 'diagnosis.csv'}", markup=False)
    console.print(f"next: envace show {run.run_id}{root_hint(args)}", markup=False)
    return 0


def register(sub) -> None:
    """private-ladder."""
    p = with_root(sub.add_parser(
        "private-ladder", help="why private rehearsal helps or hurts: N = 0 and each rung of memory (empty, "
                               "reference, real, rehearsed, select) on the same turns and seeds, paired; resumable"))
    p.add_argument("--name", required=True, help="the ladder's run and the prefix of its cell runs (a re-run with "
                                                 "the same name keeps the finished cells)")
    p.add_argument("--models", required=True,
                   help="comma-separated LABEL=PATH checkpoints, e.g. sft=runs/RUN,envace=runs/RUN2 (a training "
                        "run stands for its checkpoint; default, tiny and checkpoint folders are taken too)")
    p.add_argument("--rungs", default=None,
                   help="comma-separated rungs besides N = 0: empty, reference, real, rehearsed, select (default: "
                        "all of them, select only where --budget is 2 or more)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds; the rungs that sample run once per seed "
                                                 "(default: the config's seed)")
    p.add_argument("--config", default=None, help="TOML file with a [rollout] table (and [rollout.private]); "
                                                  "flags override it")
    add_config_flags(p, _LADDER_FLAGS, private=False)
    p.add_argument("--private", dest="private", default=None, type=toml_literal,
                   help="how the rungs with attempts imagine: parallel | sequential (default: the config's, else "
                        "parallel)")
    p.add_argument("--budget", dest="budget", default=None, type=positive("--budget"),
                   help="imagined attempts N of the real, rehearsed and select rungs (default: the config's, else 1)")
    p.add_argument("--private-steps", dest="private_steps", default=None, type=positive("--private-steps"),
                   help="caller messages per imagined attempt (default: the config's)")
    p.add_argument("--private-temperature", dest="private_temperature", default=None, type=toml_literal,
                   help="sampling temperature of the imagined attempts (default: the config's; 0: each attempt is the "
                        "greedy action, so only what the memory says can move a score)")
    p.add_argument("--private-memory", dest="private_memory", default=None, type=toml_literal,
                   help="how attempts (and the reference's gold) become the memory: summary | transcript (default: "
                        "the config's)")
    p.set_defaults(func=cmd_private_ladder)
