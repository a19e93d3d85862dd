"""`envace rollout|eval|world-model|world-model-compare|suite|sweep`: the commands that play episodes and score them.

Each advertises exactly the flags it accepts: the rollout config's fields it lets a flag set, over a
`--config` file's `[rollout]` table.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import Any

from envace.cli.console import LiveReporter, new_console
from envace.cli.flags import ROLLOUT_FLAGS, add_config_flags, positive, rollout_config, root_hint, with_root
from envace.cli.tables import print_against_none, print_suite, print_summary, print_sweep, print_world_model
from envace.config import toml_literal
from envace.errors import UsageError
from envace.jobs import eval_job, rollout_job, sweep_job
from envace.paths import runs_root

_EVAL_FLAGS = tuple(n for n in ROLLOUT_FLAGS if n != "model")  # the model is eval's first argument
# world-model: the benchmark's tasks and where to generate; the caller, mode and sampling are the benchmark's own
_WORLD_MODEL_FLAGS = ("env", "category", "split", "limit", "offset", "backend", "max_batch_tokens", "report_to")
_SUITE_FLAGS = ("max_new_tokens", "max_steps_per_turn", "tool_docs", "caller_demo", "user_model",
                "user_max_new_tokens", "max_user_turns", "backend", "max_batch_tokens", "thinking")
_SWEEP_FLAGS = _EVAL_FLAGS  # a sweep sets the model and the private rehearsal per cell


def cmd_rollout(args: argparse.Namespace) -> int:
    cfg = rollout_config(args)
    console = new_console()
    run, summary = rollout_job(cfg, runs_root(args.root), args.run_name, "rollout", LiveReporter(console))
    _done(console, args, run, summary)
    return 0


def _done(console, args: argparse.Namespace, run, summary: dict[str, Any]) -> None:
    print_summary(console, f"{run.run_id}", summary)
    console.print(f"stored in {run.path}")
    console.print(f"next: [bold]envace show {run.run_id}{root_hint(args)}[/]")


def cmd_eval(args: argparse.Namespace) -> int:
    """`envace eval CHECKPOINT|default`: a rollout of the test split (by default) stored as an eval run."""
    cfg = rollout_config(args, _EVAL_FLAGS)
    console = new_console()
    run, summary = eval_job(args.checkpoint, cfg, runs_root(args.root), args.run_name, LiveReporter(console))
    _done(console, args, run, summary)
    return 0


def cmd_world_model(args: argparse.Namespace) -> int:
    """`envace world-model MODEL`: MODEL rehearses every gold call in its real context (`envace/world_model.py`)."""
    from envace import world_model
    from envace.jobs import world_model_job
    from envace.store import connect

    cfg = rollout_config(args, _WORLD_MODEL_FLAGS)
    console = new_console()
    run, _ = world_model_job(args.model, cfg, runs_root(args.root), args.run_name, LiveReporter(console),
                             args.turns or "")
    console.print(f"stored in {run.path}")
    frame = world_model.table(world_model.pairs(connect(runs_root(args.root)), "pairs", run.run_id))
    print_world_model(console, frame, run.run_id)
    console.print(f"next: envace world-model-compare {run.run_id} OTHER_RUN{root_hint(args)}", markup=False)
    return 0


def cmd_world_model_compare(args: argparse.Namespace) -> int:
    """`envace world-model-compare A B`: B − A on the calls both rehearsed, paired, with Holm-adjusted p."""
    from envace import world_model
    from envace.store import connect, get_run

    root = runs_root(args.root)
    con = connect(root)
    a, b = (get_run(root, r)["run_id"] for r in (args.run_a, args.run_b))
    frame = world_model.compare(world_model.matched(world_model.pairs(con, "pairs", a),
                                                    world_model.pairs(con, "pairs", b), (a, b)))
    new_console().print(world_model.compare_table(frame, a, b))
    return 0


def cmd_suite(args: argparse.Namespace) -> int:
    """`envace suite MODEL`: BFCL-v4, τ²-Bench and VitaBench as the paper reports them, beside its rows."""
    from envace import suite
    from envace.jobs import suite_job
    from envace.store import connect, get_run

    if (args.private is None) != (args.budget is None) or args.private not in (None, "parallel", "sequential"):
        raise UsageError("--private parallel|sequential and --budget K go together")
    cfg = rollout_config(args, _SUITE_FLAGS)
    if args.private:
        cfg = replace(cfg, private=replace(cfg.private, mode=args.private, budget=args.budget))
    name = args.name or f"suite-{time.strftime('%Y%m%d-%H%M%S')}"
    console = new_console()
    run, _ = suite_job(name, args.model, cfg, args.limit, runs_root(args.root), LiveReporter(console))
    print_suite(console, suite.outcomes(connect(runs_root(args.root)), get_run(runs_root(args.root), run.run_id)),
                run.run_id, args.limit)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Private-rehearsal budget grid × modes × models, one eval run per cell, one table; then each N > 0 cell
    against its model's N = 0 cell, paired by turn, Holm-adjusted over the table."""
    from envace import compare
    from envace.private import sweep
    from envace.store import connect

    models, modes, budgets = sweep.parse_grid(args.models.split(","), args.modes, args.budgets)
    base = rollout_config(args, _SWEEP_FLAGS)
    console = new_console()
    table_run, rows = sweep_job(args.name, models, modes, budgets, base, runs_root(args.root), LiveReporter(console))
    print_sweep(console, table_run.run_id, rows)
    frame, caption = compare.with_holm(sweep.against_none(connect(table_run.path.parent), [table_run.run_id],
                                                          list(models), modes, budgets))
    print_against_none(console, frame, caption)
    console.print(f"table: {table_run.path / 'sweep.csv'}")
    return 0


def register(sub) -> None:
    """rollout, eval, world-model, world-model-compare, suite and sweep."""
    config_help = "TOML file with a [rollout] table; flags override it"
    name_help = "name of the run folder (default: generated)"
    p = with_root(sub.add_parser("rollout", help="play benchmark episodes with a model and store them"))
    p.add_argument("--config", default=None, help=config_help)
    p.add_argument("--run-name", default=None, help=name_help)
    add_config_flags(p)
    p.set_defaults(func=cmd_rollout)

    p = with_root(sub.add_parser("eval", help="evaluate a checkpoint (or `default`) on benchmark episodes"))
    p.add_argument("checkpoint", help="a checkpoint folder (e.g. runs/<run>/checkpoint), `default` or `tiny`")
    p.add_argument("--config", default=None, help=config_help)
    p.add_argument("--run-name", default=None, help=name_help)
    add_config_flags(p, _EVAL_FLAGS)
    p.set_defaults(func=cmd_eval)

    p = with_root(sub.add_parser("world-model", help="the world-model benchmark: MODEL rehearses every gold call "
                                                      "in its real context, scored against the real response"))
    p.add_argument("model", help="the rehearser: default, tiny, a checkpoint folder, a server URL, or reference "
                                 "(the gold itself)")
    p.add_argument("--config", default=None, help=config_help + " (the rehearser's prompt options)")
    p.add_argument("--run-name", default=None, help=name_help)
    p.add_argument("--turns", default=None, metavar="K..L",
                   help="rehearse only the calls of these user turns (0-based): K, K.. or K..L (default: all)")
    add_config_flags(p, _WORLD_MODEL_FLAGS, private=False)
    p.set_defaults(func=cmd_world_model)
    p = with_root(sub.add_parser("world-model-compare", help="two world-model runs over the same calls, paired: "
                                                              "Δ per metric, interval and sign test"))
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.set_defaults(func=cmd_world_model_compare)

    p = with_root(sub.add_parser("suite", help="BFCL-v4, τ²-Bench and VitaBench as the paper reports them, "
                                                "beside its published rows (one eval run per cell, resumable)"))
    p.add_argument("model", help="default, tiny, a checkpoint folder, a server URL or reference")
    p.add_argument("--name", default=None, help="the suite's run and the prefix of its cells (default: generated; "
                                                "a re-run with the same name keeps the finished cells)")
    p.add_argument("--limit", type=positive("--limit"), default=None,
                   help="the first N items of each cell: a smoke of the whole suite, not a score")
    p.add_argument("--private", default=None, help="also run τ² and BFCL multi-turn with private rehearsal: "
                                                   "parallel | sequential (with --budget)")
    p.add_argument("--budget", type=positive("--budget"), default=None, help="imagined attempts N per turn")
    p.add_argument("--config", default=None, help=config_help + " (budgets, docs, the user model)")
    add_config_flags(p, _SUITE_FLAGS, private=False)
    p.set_defaults(func=cmd_suite)

    p = with_root(sub.add_parser("sweep", help="private-rehearsal budget sweep: grid × modes × models → one table"))
    p.add_argument("--name", required=True, help="sweep name: its table's run and the prefix of its cell runs")
    p.add_argument("--models", default="base=default",
                   help="comma-separated LABEL=SPEC models, e.g. base=default,trained=runs/x/checkpoint "
                        "(default: base=default)")
    p.add_argument("--budgets", default="0,1,2,4,8", help="comma-separated N (default: 0,1,2,4,8)")
    p.add_argument("--modes", default="parallel,sequential",
                   help="parallel and/or sequential (default: parallel,sequential)")
    p.add_argument("--config", default=None, help=config_help)
    add_config_flags(p, _SWEEP_FLAGS, private=False)
    p.add_argument("--private-memory", dest="private_memory", default=None, type=toml_literal,
                   help="how every cell's attempts become its memory: summary | transcript (default: the config's)")
    p.set_defaults(func=cmd_sweep)
