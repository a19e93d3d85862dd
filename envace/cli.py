"""`envace …` commands. The one place that wires environments, backends, the engine and the store.

Bad input (unknown names, missing paths, malformed configs) prints one `error:` line and exits 2;
an interrupted job keeps every batch it already stored.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from envace.config import PrivateOptions, RolloutConfig, from_dict, load_toml
from envace.errors import UsageError
from envace.paths import runs_root


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        raise UsageError(message)


def _console():
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 140  # logs and pipes: keep the tables' columns readable instead of 80 wide
    return console


# -- rollout ---------------------------------------------------------------------------------------

_ROLLOUT_FLAGS = ("env", "category", "split", "limit", "offset", "mode", "model", "group_size", "batch_size",
                  "max_steps_per_turn", "max_new_tokens", "temperature", "top_p", "seed", "on_parse_error",
                  "decision_sample", "tool_docs", "user_model", "user_max_new_tokens", "max_user_turns")


# flag → field of [rollout.private]
_PRIVATE_FLAGS = {"rehearsal": "mode", "budget": "budget", "rehearsal_scope": "scope",
                  "rehearsal_steps": "max_steps", "measure_change": "measure_change"}


def _rollout_config(args: argparse.Namespace) -> RolloutConfig:
    data: dict[str, Any] = {}
    if args.config:
        raw = load_toml(args.config)
        data.update(raw.get("rollout", raw))
    data.update({k: getattr(args, k) for k in _ROLLOUT_FLAGS if getattr(args, k) is not None})
    private = {key: getattr(args, flag) for flag, key in _PRIVATE_FLAGS.items() if getattr(args, flag) is not None}
    if private:
        data["private"] = {**data.get("private", {}), **private}
    return from_dict(RolloutConfig, data, where=args.config or "rollout")


def summary_table(title: str, summary: dict[str, Any]):
    from rich.table import Table

    table = Table(title=title, show_header=False)
    rows = [
        ("episodes", f"{summary['episodes']}"),
        ("official success", f"{summary['success_rate']:.1%}"),
        ("checklist reward", f"{summary.get('checklist', 0.0):.3f}"),
        ("calls per turn", f"{summary['calls_per_turn']:.2f}"),
        ("parse-error rate", f"{summary['parse_error_rate']:.1%} of {summary['caller_messages']} caller messages"),
        ("well-formed-call rate", f"{summary.get('well_formed_rate', 0.0):.1%} of caller messages"),
        ("generated tokens/s", f"{summary['tokens_per_s']:.1f} ({summary['generated_tokens']} tokens)"),
        ("pairs (real vs rehearsed)", f"{summary.get('pairs', 0)}"),
        ("private-rehearsal tokens", f"{summary.get('private_tokens', 0)}"),
        ("terminations", ", ".join(f"{k} {v}" for k, v in sorted(summary["terminations"].items()))),
        ("wall time", f"{summary['wall_s']:.0f} s"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    return table


def play(cfg: RolloutConfig, root, run_name: str | None, kind: str, console, backend=None):
    """Play `cfg`'s episodes into a new run with progress lines; returns (run, summary)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from envace.envs import registry
    from envace.policy import load_backend
    from envace.rehearsal.rollout import RolloutEngine
    from envace.store import Run

    bench = registry.get(cfg.env)
    tasks = bench.load_tasks(cfg.category, cfg.split, cfg.limit, cfg.offset)
    if not tasks:
        raise UsageError(f"no {cfg.env} tasks in {cfg.category} / {cfg.split} at offset {cfg.offset}")
    private = f", private rehearsal {cfg.private.mode} N={cfg.private.budget}" if cfg.private.active else ""
    console.print(f"[bold]{kind}[/] {len(tasks)} {cfg.env} {cfg.category} {cfg.split} task(s) × "
                  f"{cfg.group_size}, mode {cfg.mode}{private}, model {cfg.model}")
    if backend is None:
        console.print("loading model …")
        backend = load_backend(cfg.model, cfg.max_batch_tokens)
    examples = None
    if cfg.caller_demo or cfg.rehearser.fewshot == "other_tasks":
        from envace.rehearsal.examples import ExampleBank

        examples = ExampleBank(bench.load_tasks(cfg.category, "train"))
    run = Run.create(root, kind, asdict(cfg), cfg.model, run_name)
    user_backend = None
    if cfg.user_model and any(t.simulated_user for t in tasks):
        console.print(f"loading the simulated user's model {cfg.user_model} …")
        user_backend = load_backend(cfg.user_model, cfg.max_batch_tokens)
    engine = RolloutEngine(backend, bench, cfg, backend.max_context, examples, user_backend)
    total = len(tasks) * cfg.group_size
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[status]}"), console=console,
                  transient=False) as progress:
        bar = progress.add_task("episodes", total=total, status="")
        done = {"n": 0, "ok": 0, "steps": 0}

        def on_step(waiting: int, tokens: int) -> None:
            done["steps"] += 1
            status = f"step {done['steps']}: {waiting} episode(s) generating, {tokens} tokens so far"
            progress.update(bar, status=status)
            if not console.is_terminal:  # no live bar in a log: one line per step instead
                console.print(status)

        def on_episode(row: dict[str, Any]) -> None:
            done["n"] += 1
            done["ok"] += bool(row["success"])
            progress.update(bar, advance=1, status=f"success {done['ok']}/{done['n']}")
            console.print(f"  {row['episode_id']}: {'success' if row['success'] else 'fail'} "
                          f"({row['termination']}, {row['n_turns']}/{row['n_ref_turns']} turns, "
                          f"{row['n_calls']} calls)")

        engine.on_step = on_step
        with run.running():
            summary = engine.run(tasks, run, on_episode).as_dict()
    run.update(status="completed", summary=summary)
    return run, summary


def cmd_rollout(args: argparse.Namespace) -> int:
    cfg = _rollout_config(args)
    console = _console()
    run, summary = play(cfg, runs_root(args.root), args.run_name, getattr(args, "kind", "rollout"), console)
    console.print(summary_table(f"{run.run_id}", summary))
    console.print(f"stored in {run.path}")
    console.print(f"next: [bold]envace show {run.run_id}[/]" + (f" --root {args.root}" if args.root else ""))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """`envace eval CHECKPOINT|default`: a rollout of the test split (by default) stored as an eval run."""
    if args.model is not None:
        raise UsageError("envace eval takes the model as its first argument, not --model")
    args.model, args.kind = args.checkpoint, "eval"
    return cmd_rollout(args)


def cmd_sweep(args: argparse.Namespace) -> int:
    """Private-rehearsal budget grid × modes × models, one eval run per cell, one table."""
    import shutil
    from dataclasses import replace

    from rich.table import Table

    from envace.policy import load_backend
    from envace.rehearsal import sweep
    from envace.store import Run, check_run_id, get_run

    if args.model or args.rehearsal or args.budget is not None:
        raise UsageError("envace sweep sets the model and the rehearsal per cell: use --models, --modes, --budgets")
    models, modes, budgets = sweep.parse_grid(args.models.split(","), args.modes, args.budgets)
    base = _rollout_config(args)
    name = check_run_id(args.name)
    root = runs_root(args.root)
    console = _console()
    grid = sweep.cells(models, modes, budgets)
    configs = [replace(base, model=c.model, private=replace(base.private, mode=c.mode, budget=c.budget))
               for c in grid]
    for cfg in configs:  # every cell's config is valid before the first one runs
        cfg.validate()
    grid_config = {"models": models, "modes": modes, "budgets": budgets, "base": asdict(base)}
    if (root / name / "run.json").exists():  # resuming: the grid may have changed, the finished cells stay
        table_run = Run(root, name)
        table_run.update(status="running", config=grid_config)
    else:
        table_run = Run.create(root, "sweep", grid_config, "", name)
    rows, backends = [], {}
    for n, (cell, cfg) in enumerate(zip(grid, configs, strict=True), 1):
        run_name = cell.run_name(name)
        if (root / run_name / "run.json").exists():
            meta = get_run(root, run_name)
            if meta.get("status") == "completed":
                console.print(f"cell {n}/{len(grid)} {run_name}: done already, kept")
                rows.append(sweep.cell_row(name, cell, run_name, meta.get("summary") or {}))
                continue
            shutil.rmtree(root / run_name)  # an unfinished cell is redone from scratch
        console.print(f"cell {n}/{len(grid)} {run_name}")
        if cell.model not in backends:
            backends.clear()  # one model in memory at a time
            backends[cell.model] = load_backend(cell.model, cfg.max_batch_tokens)
        backends[cell.model].clear_caches()
        _, summary = play(cfg, root, run_name, "eval", console, backends[cell.model])
        rows.append(sweep.cell_row(name, cell, run_name, summary))
        sweep.write_table(table_run, rows)
    sweep.write_table(table_run, rows)
    table_run.update(status="completed", summary={"cells": len(rows)})
    table = Table("model", "mode", "N", "episodes", "success", "checklist", "well-formed",
                  "private tokens / episode", "s / episode", title=f"sweep {name}")
    for r in rows:
        table.add_row(r["label"], r["mode"], str(r["budget"]), str(r["episodes"]), f"{r['success_rate']:.1%}",
                      f"{r['checklist']:.3f}", f"{r['well_formed_rate']:.1%}",
                      f"{r['private_tokens_per_episode']:.0f}", f"{r['wall_s_per_episode']:.0f}")
    console.print(table)
    console.print(f"table: {table_run.path / 'sweep.csv'}")
    return 0


# -- train -----------------------------------------------------------------------------------------

def _overridden(table: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply `--set key=value` (dotted keys reach nested tables; values read as TOML, else as strings)."""
    import tomllib

    table = {k: dict(v) if isinstance(v, dict) else v for k, v in table.items()}
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects key=value, got '{item}'")
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
        *parents, leaf = key.strip().split(".")
        target = table
        for name in parents:
            target = target.setdefault(name, {})
            if not isinstance(target, dict):
                raise UsageError(f"--set {key}: '{name}' is not a table")
        target[leaf] = value
    return table


def cmd_train(args: argparse.Namespace) -> int:
    from envace.config import TrainConfig
    from envace.store import Run, get_run
    from envace.training.train import train

    raw = load_toml(args.config)
    if "train" not in raw:
        raise UsageError(f"{args.config} has no [train] table")
    cfg = from_dict(TrainConfig, _overridden(raw["train"], args.set), where=f"{args.config} [train]")
    console = _console()
    root = runs_root(args.root)
    from envace.training.distributed import launch_position, wait_for
    from envace.training.fsdp import launcher_fsdp

    launcher_fsdp(cfg.shard_optimizer)  # refuse an FSDP launch this trainer cannot honour before a run exists
    rank, world = launch_position()
    if world > 1 and not (args.run_name or args.resume):
        raise UsageError("training with several processes needs --run-name (every process writes to that run)")
    if rank > 0:  # process 0 creates or reopens the run; the others join it
        name = args.resume or args.run_name
        wait_for(root / name / "run.json")
        run = Run(root, name)
    elif args.resume:
        meta = get_run(root, args.resume)
        stored = {k: v for k, v in meta.get("config", {}).items() if k != "grpo_steps"}
        if meta.get("kind") != "train" or stored != {k: v for k, v in asdict(cfg).items() if k != "grpo_steps"}:
            raise UsageError(f"run '{args.resume}' was not trained with this config (only grpo_steps may grow)")
        run = Run(root, args.resume)
        run.update(status="running", pid=os.getpid(), config=asdict(cfg))
    else:
        run = Run.create(root, "train", asdict(cfg), cfg.model, args.run_name)
    console.print(f"[bold]train[/] {args.config} → {run.path}" + (f" (process {rank} of {world})" if world > 1 else ""))
    with run.running():
        summary = train(cfg, run, console.print, resume=bool(args.resume))
    if rank == 0:
        run.update(status="completed", summary=summary)
        from rich.table import Table

        table = Table(title=f"{run.run_id}", show_header=False)
        for key, value in summary.items():
            table.add_row(key, str(value))
        console.print(table)
        console.print(f"next: envace eval {summary['checkpoint']} --limit 4")
    return 0


# -- runs / show -----------------------------------------------------------------------------------

def cmd_app(args: argparse.Namespace) -> int:
    # The CLI is the one module that wires every layer: the app sits above envace and is imported here only.
    from apps.app import serve

    root = runs_root(args.root)
    print(f"EnvACE Workbench on http://{args.host}:{args.port} over {root} (Ctrl-C stops it)")
    serve(root, args.host, args.port)
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from rich.table import Table

    from envace.store import list_runs

    root = runs_root(args.root)
    runs = list_runs(root)
    console = _console()
    if not runs:
        console.print(f"no runs in {root}; start one with: envace rollout --limit 2")
        return 0
    table = Table("run", "kind", "status", "model", "episodes", "success", "created")
    for meta in runs:
        s = meta.get("summary") or {}
        table.add_row(meta["run_id"], meta.get("kind", ""), meta.get("status", ""), meta.get("model", ""),
                      str(s.get("episodes", "")), f"{s['success_rate']:.1%}" if "success_rate" in s else "",
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(meta.get("created_at", 0))))
    console.print(table)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from rich.table import Table

    from envace.store import connect, get_run

    root = runs_root(args.root)
    meta = get_run(root, args.run)
    console = _console()
    console.print(f"[bold]{meta['run_id']}[/]  {meta.get('kind')}  status {meta.get('status')}  "
                  f"model {meta.get('model')}  git {str(meta.get('git_sha'))[:10]}")
    if meta.get("summary"):
        console.print(summary_table("summary", meta["summary"]))
    con = connect(root)
    by_category = con.execute(
        "SELECT category, count(*) AS episodes, avg(success::INT) AS success, sum(n_calls) AS calls, "
        "sum(n_parse_errors) AS parse_errors FROM episodes WHERE run_id = ? GROUP BY category ORDER BY category",
        [meta["run_id"]]).fetchall()
    table = Table("category", "episodes", "success", "calls", "parse errors", title="stored episodes")
    for category, n, success, calls, errors in by_category:
        table.add_row(category, str(n), f"{success:.1%}", str(calls), str(errors))
    console.print(table)
    tools = con.execute(
        "SELECT name, count(*) AS n, avg(is_error::INT) FROM calls WHERE run_id = ? GROUP BY name "
        "ORDER BY n DESC LIMIT 10", [meta["run_id"]]).fetchall()
    if tools:
        t = Table("tool", "calls", "error rate", title="most called tools")
        for name, n, err in tools:
            t.add_row(name, str(n), f"{err:.1%}")
        console.print(t)
    return 0


# -- fidelity --------------------------------------------------------------------------------------

FIDELITY_SQL = """
SELECT coalesce(name, 'all') AS tool, count(*) AS pairs,
       avg(exact) AS exact, avg(structure_f1) AS structure_f1, avg(value_acc) AS value_acc,
       avg(error_agree) AS error_agree, avg(embed_cos) AS embed_cos, avg(copied::INT) AS copy_rate,
       avg(decision_changed::INT) AS decision_change, count(decision_changed) AS forks,
       avg((rehearsal_error IS NOT NULL)::INT) AS malformed
FROM pairs WHERE run_id = ? GROUP BY ROLLUP (name) HAVING count(*) > 0
ORDER BY name IS NULL, pairs DESC, name
"""


def cmd_fidelity(args: argparse.Namespace) -> int:
    from rich.table import Table

    from envace.store import connect, get_run

    root = runs_root(args.root)
    meta = get_run(root, args.run)
    rows = connect(root).execute(FIDELITY_SQL, [meta["run_id"]]).fetchall()
    console = _console()
    if not rows:
        console.print(f"run {meta['run_id']} has no pairs: rerun with --mode real+shadow or rehearse+shadow")
        return 0
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    table = Table("tool", "pairs", "exact", "struct F1", "value acc", "error agree", "embed cos", "copy rate",
                  "decision Δ", "malformed", title=f"world-model fidelity of {meta['run_id']}")
    for tool, n, *scores, forks, malformed in rows:
        cells = [fmt(v) for v in scores]
        cells[-1] = f"{cells[-1]} ({forks})" if forks else "-"
        table.add_row(tool, str(n), *cells, fmt(malformed))
    console.print(table)
    console.print("exact: same JSON after normalisation; struct F1: key paths; value acc: real leaf values "
                  "reproduced; error agree: both fail or both succeed; embed cos: MiniLM cosine; copy rate: "
                  "verbatim few-shot copies; decision Δ: next action changed (forks sampled); malformed: "
                  "rehearsals without a valid <execution_result>")
    return 0


# -- check-env -------------------------------------------------------------------------------------

def cmd_check_env(args: argparse.Namespace) -> int:
    from envace.envs import registry
    from envace.envs.check import replay_reference_scores

    bench = registry.get(args.env)
    console = _console()
    passed = total = 0
    for category in bench.categories:
        with console.status(f"replaying {category} …"):
            ok, n, failures = replay_reference_scores(bench, category)
        passed, total = passed + ok, total + n
        console.print(f"{category:<28} {ok}/{n}" + (f"  failed: {', '.join(failures[:5])}" if failures else ""))
    console.print(f"[bold]{passed}/{total}[/] ground-truth trajectories pass the official checker")
    return 0 if passed == total else 1


# -- bench -----------------------------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    from envace import bench

    if args.what == "train":
        from envace.training.benchmark import bench_train

        bench_train(model=args.model, tasks=args.limit, console=_console())
        return 0
    if args.what == "store":
        from workbench.bench import bench_store  # the CLI wires every layer; the bench times the app's queries

        if args.runs < 1 or args.rows < args.runs:
            raise UsageError("--runs must be >= 1 and --rows at least --runs")
        bench_store(args.runs, args.rows, _console(), args.keep)
        return 0
    if args.what == "private":
        budgets = tuple(int(b) for b in args.budgets.split(",") if b.strip())
        if not budgets or min(budgets) < 1:
            raise UsageError(f"--budgets takes comma-separated N >= 1, got '{args.budgets}'")
        bench.bench_private(model=args.model, limit=args.limit, max_new_tokens=args.max_new_tokens,
                            budgets=budgets, console=_console())
        return 0
    run = {"rollout": bench.bench_rollout, "rehearsal": bench.bench_rehearsal}[args.what]
    run(model=args.model, limit=args.limit, max_new_tokens=args.max_new_tokens, console=_console())
    return 0


# -- parser ----------------------------------------------------------------------------------------

def _add_rollout_flags(p: argparse.ArgumentParser) -> None:
    # argparse %-formats help text: escape the config docs' own % signs
    help_of = {f.name: f.metadata.get("help", "").replace("%", "%%") for f in fields(RolloutConfig)}
    types = {"limit": int, "offset": int, "group_size": int, "batch_size": int, "max_steps_per_turn": int,
             "max_new_tokens": int, "seed": int, "user_max_new_tokens": int, "max_user_turns": int,
             "temperature": float, "top_p": float, "decision_sample": float}
    for name in _ROLLOUT_FLAGS:
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=types.get(name, str), default=None,
                       help=help_of[name])
    p.add_argument("--domain", dest="category", default=None, help="τ²: airline | retail | telecom | telecom_solo "
                   "(the category)")
    private = {f.name: f.metadata.get("help", "") for f in fields(PrivateOptions)}
    p.add_argument("--rehearsal", default=None, help="private rehearsal: " + private["mode"])
    p.add_argument("--budget", type=int, default=None, help=private["budget"])
    p.add_argument("--rehearsal-scope", default=None, help=private["scope"])
    p.add_argument("--rehearsal-steps", type=int, default=None, help=private["max_steps"])
    p.add_argument("--measure-change", action="store_const", const=True, default=None, help=private["measure_change"])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="envace", description="World-rehearsal agentic RL workbench.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_root(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--root", default=None, help="run store root (default: $ENVACE_RUNS or runs/)")
        return p

    p = with_root(sub.add_parser("rollout", help="play benchmark episodes with a model and store them"))
    p.add_argument("--config", default=None, help="TOML file with a [rollout] table; flags override it")
    p.add_argument("--run-name", default=None, help="name of the run folder (default: generated)")
    _add_rollout_flags(p)
    p.set_defaults(func=cmd_rollout)

    p = with_root(sub.add_parser("eval", help="evaluate a checkpoint (or `default`) on benchmark episodes"))
    p.add_argument("checkpoint", help="a checkpoint folder (e.g. runs/<run>/checkpoint), `default` or `tiny`")
    p.add_argument("--config", default=None, help="TOML file with a [rollout] table; flags override it")
    p.add_argument("--run-name", default=None)
    _add_rollout_flags(p)
    p.set_defaults(func=cmd_eval)

    p = with_root(sub.add_parser("sweep", help="private-rehearsal budget sweep: grid × modes × models → one table"))
    p.add_argument("--name", required=True, help="sweep name: its table's run and the prefix of its cell runs")
    p.add_argument("--models", default="base=default",
                   help="comma-separated LABEL=SPEC models, e.g. base=default,trained=runs/x/checkpoint")
    p.add_argument("--budgets", default="0,1,2,4,8", help="comma-separated N")
    p.add_argument("--modes", default="parallel,sequential")
    p.add_argument("--config", default=None, help="TOML file with a [rollout] table (episodes, rehearser, ...)")
    _add_rollout_flags(p)
    p.set_defaults(func=cmd_sweep)

    p = with_root(sub.add_parser("train", help="SFT warm-up then role-wise GRPO from a TOML config"))
    p.add_argument("config", help="TOML file with a [train] table")
    p.add_argument("--run-name", default=None)
    p.add_argument("--resume", default=None, metavar="RUN", help="continue a killed or finished train run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a [train] field, e.g. --set variant=caller_only --set rehearser.max_new_tokens=64")
    p.set_defaults(func=cmd_train)

    with_root(sub.add_parser("runs", help="list stored runs")).set_defaults(func=cmd_runs)

    p = with_root(sub.add_parser("app", help="the workbench app (Gradio) over the run store"))
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: localhost only)")
    p.add_argument("--port", type=int, default=7860)
    p.set_defaults(func=cmd_app)

    p = with_root(sub.add_parser("show", help="summary of one run"))
    p.add_argument("run")
    p.set_defaults(func=cmd_show)

    p = with_root(sub.add_parser("fidelity", help="per-tool world-model fidelity of a shadow run"))
    p.add_argument("run")
    p.set_defaults(func=cmd_fidelity)

    p = sub.add_parser("check-env", help="replay every ground-truth trajectory through the official checker")
    p.add_argument("env", help="benchmark name: bfcl or tau2")
    p.set_defaults(func=cmd_check_env)

    p = sub.add_parser("bench", help="performance benchmarks (ratios measured side by side)")
    p.add_argument("what", choices=["rollout", "rehearsal", "train", "private", "store"])
    p.add_argument("--budgets", default="1,2", help="private: imagined attempts N to measure (comma-separated)")
    p.add_argument("--model", default="default")
    p.add_argument("--limit", type=int, default=2,
                   help="rollout/rehearsal: BFCL test episodes (= batch size); train: BFCL train tasks "
                        "whose reference rows form the batch")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=50, help="store: runs in the synthetic store")
    p.add_argument("--rows", type=int, default=1_000_000, help="store: pairs in it (and 1.5x as many turns)")
    p.add_argument("--keep", type=Path, default=None, help="store: build it here and keep it (default: a temp dir)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress lines reach a log file as they happen
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: every completed batch is stored", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
