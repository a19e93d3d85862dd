"""`envace runs|show|fidelity|judge|migrate|doctor|export`: the commands that read or rewrite the run store."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from envace.cli.console import LiveReporter, new_console
from envace.cli.flags import positive, with_root
from envace.cli.tables import print_fidelity, print_judge, print_runs, print_summary, print_world_model
from envace.errors import UsageError
from envace.paths import runs_root


def cmd_runs(args: argparse.Namespace) -> int:
    from envace.store import episode_counts, list_runs, open_store

    root = runs_root(args.root)
    runs = list_runs(root)
    con, index = open_store(root)
    stored = episode_counts(con)
    console = new_console()
    for warning in index.warnings:  # the runs and the shards skipped, as the app lists them
        console.print(f"warning: {warning}", markup=False)
    if not runs:
        console.print(f"no runs in {root}; start one with: envace rollout --limit 2")
        return 0
    print_runs(console, runs, stored)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from envace import show
    from envace.store import get_run, open_store

    root = runs_root(args.root)
    meta = get_run(root, args.run)
    console = new_console()
    con, index = open_store(root)
    for warning in show.warnings(index, meta["run_id"]):
        console.print(f"warning: {warning}", markup=False)
    console.print(f"[bold]{meta['run_id']}[/]  {meta.get('kind')}  status {meta.get('status')}  "
                  f"model {meta.get('model')}  git {str(meta.get('git_sha'))[:10]}")
    if meta.get("kind") in ("rollout", "eval") and meta.get("summary"):
        print_summary(console, "summary", meta["summary"])
    for table in show.tables(con, meta):
        console.print(table)
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from envace import ledger, world_model
    from envace.store import connect, get_run

    root = runs_root(args.root)
    meta = get_run(root, args.run)
    console = new_console()
    if meta.get("kind") == "world-model":
        frame = world_model.table(world_model.pairs(connect(root), "pairs", meta["run_id"]))
        print_world_model(console, frame, meta["run_id"])
        return 0
    frame = ledger.means(ledger.tool_sums(connect(root), "pairs", meta["run_id"]))
    if frame.empty:
        console.print(f"run {meta['run_id']} has no pairs: {_no_pairs_hint(meta)}")
        return 0
    print_fidelity(console, frame, meta["run_id"])
    return 0


def _no_pairs_hint(meta: dict[str, Any]) -> str:
    """Why a run has no pairs, and what would give it some."""
    config = meta.get("config") or {}
    mode = config.get("mode") if meta.get("kind") != "train" else None
    if meta.get("kind") == "train":
        return "set [train.rollout] shadow_fraction (or [train.eval] every) to pair rehearsals with the real " \
               "environment"
    if mode in ("real+shadow", "rehearse+shadow"):
        return "it is a shadow run, but its caller issued no tool calls, so nothing was answered both ways"
    if meta.get("kind") == "sweep":
        return "a sweep's table has none; its cells are eval runs (envace runs lists them)"
    return "rerun with --mode real+shadow or rehearse+shadow"


def cmd_judge(args: argparse.Namespace) -> int:
    """`envace judge RUN`: the optional rubric judge over a stored run's episodes (`envace/judge.py`)."""
    from envace.jobs import judge_job
    from envace.judge import caveat

    console = new_console()
    with console.status("judging …") as status:
        run, rows = judge_job(args.run, runs_root(args.root), args.model, args.limit, args.max_new_tokens,
                              LiveReporter(console),
                              progress=lambda done, total: status.update(f"judging: {done}/{total} windows"))
    print_judge(console, run.run_id, rows)
    console.print(caveat(args.model), markup=False)
    console.print(f"stored in {run.path / 'judgements'}", markup=False)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from envace.export import export_run

    rows = export_run(runs_root(args.root), args.run, args.format, args.out)
    print(f"exported {args.run} to {args.out} ({args.format}): "
          + ", ".join(f"{table} {n}" for table, n in rows.items()))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from envace.doctor import findings

    root = runs_root(args.root)
    found = findings(root)
    if not found:
        print(f"{root}: no problems found")
        return 0
    print(f"{len(found)} problem(s) in {root}")
    for problem, where, fix in found:  # whole paths and commands, never wrapped: they are copied from here
        print(f"- {problem}\n    at  {where}\n    fix {fix}")
    return 1


def cmd_migrate(args: argparse.Namespace) -> int:
    """The run store's old layout, or with FILE a config file's old flat [train] keys (`envace/migrate.py`)."""
    from envace.store import migrate

    if args.file is not None:
        if args.root is not None:
            raise UsageError("migrate: a FILE.toml or a store's --root, not both")
        from envace.migrate import migrate_file

        moved = migrate_file(args.file)
        print(f"{args.file}: " + (f"{len(moved)} key(s) moved: " + ", ".join(f"{a} → {b}" for a, b in moved)
                                  if moved else "no old [train] key, left as it is"))
        return 0
    root = runs_root(args.root)
    done = migrate(root)
    print(f"converted {len(done)} run(s) in {root} to the current layout" + (f": {', '.join(done)}" if done else ""))
    return 0


def register(sub) -> None:
    """runs, show, fidelity, judge, migrate, doctor and export."""
    with_root(sub.add_parser("runs", help="list stored runs")).set_defaults(func=cmd_runs)
    for name, func, text in (("show", cmd_show, "summary of one run (rollout, eval, train or sweep)"),
                             ("fidelity", cmd_fidelity, "per-tool world-model fidelity of a run's pairs")):
        p = with_root(sub.add_parser(name, help=text))
        p.add_argument("run")
        p.set_defaults(func=func)
    p = with_root(sub.add_parser("judge", help="optional rubric judging of a stored run by a model (VitaBench); "
                                                "stored apart, not comparable with published numbers"))
    p.add_argument("run")
    p.add_argument("--model", default="default",
                   help="the judge: default, tiny, a checkpoint folder or a server URL (default: default)")
    p.add_argument("--limit", type=positive("--limit"), default=None, help="judge the first N episodes only")
    p.add_argument("--max-new-tokens", type=positive("--max-new-tokens"), default=256,
                   help="tokens per judge answer (one line per rubric; default: 256)")
    p.set_defaults(func=cmd_judge)
    p = with_root(sub.add_parser("migrate", help="convert runs stored under the old table and column names; with "
                                                  "FILE.toml, rewrite that config file's flat [train] keys of "
                                                  "earlier releases to their tables ([train.sft], …)"))
    p.add_argument("file", nargs="?", default=None, metavar="FILE.toml",
                   help="a config file to rewrite in place, line by line: its comments stay, a moved key's with it")
    p.set_defaults(func=cmd_migrate)
    with_root(sub.add_parser("doctor", help="every problem in a store, and what to do about it")
              ).set_defaults(func=cmd_doctor)
    p = with_root(sub.add_parser("export", help="one run's tables as a Hugging Face dataset, Parquet or JSONL"))
    p.add_argument("run")
    p.add_argument("out", type=Path, help="the folder to write (new or empty)")
    p.add_argument("--format", default="hf-datasets", help="hf-datasets | parquet | jsonl (default: hf-datasets)")
    p.set_defaults(func=cmd_export)
