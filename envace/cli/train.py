"""`envace train|study`: the commands that update weights."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from envace.cli.console import LiveReporter, new_console
from envace.cli.flags import root_hint, with_root
from envace.cli.tables import print_train_summary
from envace.config import TrainConfig, load_toml, moved_key, nest, toml_literal, warn_moved, warn_old
from envace.errors import UsageError
from envace.jobs import train_job
from envace.paths import runs_root


def _overridden(table: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply `--set key=value` (dotted keys reach nested tables; values read as TOML, else as strings; an old flat
    key, e.g. `lr`, sets its new one, `grpo.lr`, with a warning)."""
    def copy(value: Any) -> Any:
        return {k: copy(v) for k, v in value.items()} if isinstance(value, dict) else value

    table = copy(table)
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects key=value, got '{item}'")
        *parents, leaf = key.strip().split(".")
        value = toml_literal(text)
        moved = moved_key(leaf, value) if not parents else None
        if moved is not None:
            *parents, leaf = moved.split(".")
        target = table
        for name in parents:
            target = target.setdefault(name, {})
            if not isinstance(target, dict):
                raise UsageError(f"--set {key}: '{name}' is not a table")
        target[leaf] = value
    return table


def cmd_train(args: argparse.Namespace) -> int:
    raw = load_toml(args.config)
    if not isinstance(raw.get("train"), dict):
        raise UsageError(f"{args.config} has no [train] table")
    where = f"{args.config} [train]"
    table = _overridden(nest(raw["train"], where), args.set)  # old keys, in the file or in --set, read as new ones
    if args.ray is not None:
        table["ray"] = {**(table["ray"] if isinstance(table.get("ray"), dict) else {}), "address": args.ray}
    cfg = TrainConfig.from_dict(table, where=where)
    warn_old(raw["train"], where)  # once the config is built: a refused one is its one error line
    for key, _, text in (item.partition("=") for item in args.set):
        if (new := moved_key(key.strip(), toml_literal(text))) is not None:
            warn_moved(key.strip(), f"--set {key.strip()} is now --set {new}")
    console = new_console()
    run, summary = train_job(cfg, runs_root(args.root), args.run_name, args.resume, LiveReporter(console))
    if int(os.environ.get("RANK", "0")) == 0:  # one summary from a multi-process launch, not one per rank
        print_train_summary(console, run.run_id, summary)
        env = "" if cfg.rollout.env == "bfcl" else \
            f" --env {shlex.quote(cfg.rollout.env)} --category {shlex.quote(cfg.rollout.category)}"
        console.print(f"next: envace eval {summary['checkpoint']}{env} --limit 4{root_hint(args)}", markup=False,
                      soft_wrap=True)
    return 0


def cmd_study(args: argparse.Namespace) -> int:
    """`envace study FILE`: every stage not done yet, then the report (`envace/study`); `--so-far`: the report
    over the stages completed so far, running nothing."""
    from envace.study import report_so_far, study_job

    console = new_console()
    if args.so_far:
        report = report_so_far(args.config, runs_root(args.root), args.name)
        console.print(report.read_text(), markup=False, soft_wrap=True)
        console.print(f"written: {report}", markup=False, soft_wrap=True)
        return 0
    run, report = study_job(args.config, runs_root(args.root), args.name, LiveReporter(console))
    console.print(report.read_text(), markup=False, soft_wrap=True)
    console.print(f"next: envace app{root_hint(args)}  (the study's runs: {run.run_id}-*)", markup=False)
    return 0


def register(sub) -> None:
    """train and study."""
    p = with_root(sub.add_parser("train", help="SFT warm-up then role-wise GRPO from a TOML config"))
    p.add_argument("config", help="TOML file with a [train] table")
    p.add_argument("--run-name", default=None, help="name of the run folder (default: generated)")
    p.add_argument("--resume", default=None, metavar="RUN", help="continue a killed or finished train run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a [train] field, e.g. --set grpo.variant=caller_only "
                        "--set rollout.rehearser.max_new_tokens=64")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="place rollout actors and learner ranks with Ray (`[train.ray]` sizes them): alone, on a Ray "
                        "started on this machine; with ADDRESS (auto, HOST:PORT), on that running cluster")
    p.set_defaults(func=cmd_train)

    p = with_root(sub.add_parser("study", help="the controlled study as one resumable command: SFT per seed, a "
                                               "screened pool SFT never saw, the arms and both controls, every test "
                                               "turn, the world model, private rehearsal, one report"))
    p.add_argument("config", help="TOML file with [study], [rollout] (the evaluation) and [train] (the recipe)")
    p.add_argument("--name", default=None, help="the study's run and its stages' prefix (default: the file's name)")
    p.add_argument("--so-far", action="store_true", help="run nothing: write report-so-far.md from the stages "
                   "completed so far (while the study runs, too)")
    p.set_defaults(func=cmd_study)
