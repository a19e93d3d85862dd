"""Jobs as library functions: rollout, eval, world-model, sweep, ladder, train, and judge (rubric judging of a stored
run).

The CLI, the notebooks and `workbench.launch` (through the CLI) run these same functions. Each takes a
validated config, writes one run to the store (a sweep, a ladder: one eval run per cell plus its table run) and
returns it with its summary. Progress goes to a `Reporter`: one line at a time by default; the CLI
draws a live bar. Bad input raises `UsageError` before any run folder exists; an interrupted job keeps
every step it stored and leaves its run marked `interrupted`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
from collections.abc import Collection
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from envace import record, rewards, units
from envace.config import RolloutConfig, TrainConfig, extends, nest, results_only
from envace.envs import registry
from envace.errors import UsageError
from envace.policy.specs import DEFAULT_MODEL, REFERENCE_MODEL
from envace.store import STAGING, Run, check_run_id, get_run, swap_in


class Reporter:
    """Where a job reports progress. Override any method; the default prints plain lines."""

    def say(self, text: str) -> None:
        print(text, flush=True)

    def begin(self, total: int) -> None:
        """`total` episodes are about to be played."""

    def step(self, waiting: int, tokens: int) -> None:
        """One engine step generated for `waiting` episodes; `tokens` generated so far."""

    def episode(self, row: dict[str, Any]) -> None:
        self.say(f"  {row['episode_id']}: {'success' if row['success'] else 'fail'} ({row['termination']}, "
                 f"{row['n_turns']}/{row['n_ref_turns']} turns, {row['n_calls']} calls)")

    def end(self) -> None:
        """The episodes are played."""


def _examples(cfg: RolloutConfig, benchmark):
    """Train-split material when the rehearser's grounding or the caller's demonstration needs it."""
    from envace.engine.examples import ExampleBank

    if cfg.caller_demo or cfg.rehearser.fewshot == "other_tasks":
        return ExampleBank(benchmark.load_tasks(cfg.category, "train"))
    return ExampleBank()


def play(cfg: RolloutConfig, run: Run | None, backend, reporter: Reporter | None = None, tasks=None,
         user_backend=None, phase: str = "rollout", rehearser_backend=None, private_hook=None) -> record.Summary:
    """Play every task of `cfg` `group_size` times, one batch at a time, writing each batch as a step of `run`.

    `tasks` defaults to `units.select(cfg)`'s (which also resolves an `auto` token budget); `user_backend` and
    `rehearser_backend` play those roles when they are not the policy; `private_hook` builds the private-rehearsal
    hook instead of `PrivateRehearsal` (`build.build_engine`).
    """
    import time

    from envace.build import build_engine

    reporter = reporter or Reporter()
    benchmark = registry.get(cfg.env)
    if tasks is None or cfg.max_new_tokens == units.AUTO:
        cfg, selected = units.select(cfg, benchmark, backend.tokenizer)
        tasks = selected if tasks is None else tasks
    engine = build_engine(backend, benchmark, cfg, _examples(cfg, benchmark), user_backend,
                          rehearser_backend=rehearser_backend, private_hook=private_hook)
    engine.on_step = reporter.step
    summary, started = record.Summary(), time.perf_counter()
    reporter.begin(len(tasks) * cfg.group_size)
    for step, batch in enumerate(engine.batches(tasks)):
        episodes = engine.run_batch(batch)
        rows = [record.score(ep, cfg.mode, phase) for ep in episodes]
        for ep, row in zip(episodes, rows, strict=True):
            rewards.share(ep.generations, row["checklist"])
        if run is not None:
            record.write_step(run, step, episodes, rows, f"batch-{step:05d}")
        for ep, row in zip(episodes, rows, strict=True):
            summary.add(row, len(ep.pairs))
            reporter.episode(row)
    reporter.end()
    summary.generation_s = engine.sampler.generation_s
    summary.wall_s = time.perf_counter() - started
    return summary


def rollout_job(cfg: RolloutConfig, root: str | Path = "runs", name: str | None = None, kind: str = "rollout",
                reporter: Reporter | None = None, backend=None, rehearser_backend=None,
                only: Collection[str] | None = None, private_hook=None) -> tuple[Run, dict[str, Any]]:
    """One rollout (or eval) run: load the model, play `cfg`'s tasks, store every batch; returns (run, summary).
    `backend` and `rehearser_backend`, when given, are used instead of loading `cfg.model` and
    `cfg.rehearser_model`; `only` keeps the units of these task uids; `private_hook`: `play`'s."""
    from envace.policy import load_backend
    from envace.policy.models import tokenizer_for
    from envace.policy.scripted import ReferencePolicy

    reporter = reporter or Reporter()
    benchmark = registry.get(cfg.env)
    tokenizer = backend.tokenizer if backend is not None else tokenizer_for(_rendering_model(cfg))
    cfg, tasks = units.select(cfg, benchmark, tokenizer)  # turn units and `auto` budgets, before any model loads
    if only is not None:
        tasks = [t for t in tasks if units.source_uid(t) in set(only)]
    if not tasks:
        raise UsageError(f"no {cfg.env} tasks in {cfg.category} / {cfg.split} at offset {cfg.offset}")
    private = f", private rehearsal {cfg.private.mode} N={cfg.private.budget}" if cfg.private.active else ""
    unit = "turn(s)" if cfg.unit == "turn" else "task(s)"
    rehearses = cfg.mode != "real" or cfg.private.active
    rehearser = f", rehearser {cfg.rehearser_model}" if cfg.rehearser_model and rehearses else ""
    reporter.say(f"{kind} {len(tasks)} {cfg.env} {cfg.category} {cfg.split} {unit} × {cfg.group_size}, "
                 f"mode {cfg.mode}{private}, model {cfg.model}{rehearser}, {cfg.max_new_tokens} new tokens per "
                 "message")
    owned = []  # backends (and their servers) this job starts, and stops when it ends

    def load(spec: str, role: str):
        if spec == REFERENCE_MODEL:  # replays the gold: nothing to load, nothing to stop
            return ReferencePolicy(tokenizer, tasks)
        reporter.say(f"loading {role} …")
        loaded = load_backend(spec, cfg.max_batch_tokens, cfg.backend, say=reporter.say)
        owned.append(loaded)
        return loaded

    try:
        backend = backend if backend is not None else load(cfg.model, "model")
        user_backend = load(cfg.user_model, f"the simulated user's model {cfg.user_model}") \
            if cfg.user_model and any(t.simulated_user for t in tasks) else None
        if rehearser_backend is None and cfg.rehearser_model and rehearses:
            rehearser_backend = load(cfg.rehearser_model, f"the rehearser's model {cfg.rehearser_model}")
        measured = cfg.rehearser_model if kind == "world-model" else cfg.model  # the model the run is about
        run = Run.create(root, kind, asdict(cfg), measured, name)
        run.update(sampling=cfg.temperatures())  # unset temperatures as resolved: what the run sampled at
        with run.running():
            summary = play(cfg, run, backend, reporter, tasks, user_backend, rehearser_backend=rehearser_backend,
                           private_hook=private_hook).as_dict()
        _report(cfg.report_to, run, asdict(cfg), [(0, {kind: _numbers(summary)})])
    finally:
        _close(owned)
    run.update(status="completed", summary=summary)
    return run, summary


def _rendering_model(cfg: RolloutConfig) -> str:
    """Whose tokenizer renders the prompts: the policy's; the scripted `reference` policy has none of its own, so
    it takes its rehearser's (the model a world-model benchmark measures), else the default model's."""
    if cfg.model != REFERENCE_MODEL:
        return cfg.model
    return cfg.rehearser_model if cfg.rehearser_model not in ("", REFERENCE_MODEL) else DEFAULT_MODEL


def _numbers(summary: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _report(report_to: str, run: Run, config: dict[str, Any], steps: list[tuple[int, dict[str, dict[str, float]]]]):
    """A finished job's numbers to its experiment tracker, one step at a time."""
    from envace.trackers import keyed, open_tracker

    if report_to == "none":
        return
    tracker = open_tracker(report_to, run, config)
    for step, values in steps:
        tracker.log(keyed("result", values), step)
    tracker.close()


def _close(backends: list) -> None:
    for backend in backends:
        if hasattr(backend, "close"):
            backend.close()


def eval_job(model: str, cfg: RolloutConfig, root: str | Path = "runs", name: str | None = None,
             reporter: Reporter | None = None, backend=None, private_hook=None) -> tuple[Run, dict[str, Any]]:
    """A rollout of `model` stored as an `eval` run (the test split unless `cfg` says otherwise)."""
    return rollout_job(replace(cfg, model=model), root, name, "eval", reporter, backend, private_hook=private_hook)


def world_model_job(model: str, cfg: RolloutConfig, root: str | Path = "runs", name: str | None = None,
                    reporter: Reporter | None = None, turns: str = "", backend=None) -> tuple[Run, dict[str, Any]]:
    """The world-model benchmark of `model` (`envace/world_model.py`) on `cfg`'s category, split and limit, the
    calls of user turns `turns` (`K`, `K..`, `K..L`; empty: all), stored as a run of kind `world-model`;
    `backend`, when given, rehearses instead of loading `model`."""
    from envace import world_model

    cfg = world_model.config(model, cfg, turns)
    benchmark = registry.get(cfg.env)
    cfg = world_model.check_tasks(cfg, benchmark.load_tasks(cfg.category, cfg.split, cfg.limit, cfg.offset))
    return rollout_job(cfg, root, name, world_model.KIND, reporter, rehearser_backend=backend)


def sweep_job(name: str, models: dict[str, str], modes: list[str], budgets: list[int], base: RolloutConfig,
              root: str | Path = "runs", reporter: Reporter | None = None) -> tuple[Run, list[dict[str, Any]]]:
    """Private-rehearsal budgets × modes × models: one eval run per cell, one table (`private/sweep.py`).

    A re-run keeps every cell whose run completed and redoes the others from scratch.
    """
    from envace.private import sweep

    reporter = reporter or Reporter()
    root, name = Path(root), check_run_id(name)
    grid = sweep.cells(models, modes, budgets)
    # every cell's config is checked before the first one runs
    configs = [replace(base, model=c.model, private=replace(base.private, mode=c.mode, budget=c.budget),
                       report_to="none") for c in grid]  # the sweep reports its table, once
    grid_config = {"models": models, "modes": modes, "budgets": budgets, "base": asdict(base)}
    table_run = _table_run(root, name, "sweep", grid_config, "")
    rows: list[dict[str, Any]] = []
    backends: dict[str, Any] = {}
    with table_run.running():
        for n, (cell, cfg) in enumerate(zip(grid, configs, strict=True), 1):
            run_name = cell.run_name(name)
            summary = _play_cell(root, run_name, cfg, backends, reporter, f"cell {n}/{len(grid)}")
            rows.append(sweep.cell_row(name, cell, run_name, summary))
            sweep.write_table(table_run, rows)
        sweep.write_table(table_run, rows)
    _close(list(backends.values()))
    _report(base.report_to, table_run, grid_config, [
        (i, {f"{r['label']}-{r['mode']}": {k: float(r[k] or 0) for k in ("budget", "success_rate", "checklist",
                                                                           "private_tokens_per_episode")}})
        for i, r in enumerate(rows)])
    table_run.update(status="completed", summary={"cells": len(rows)})
    return table_run, rows


def _table_run(root: Path, name: str, kind: str, config: dict[str, Any], model: str) -> Run:
    """A grid's own run (its table), created, or reopened on a re-run (the grid may have changed: the finished
    cells stay)."""
    if (root / name / "run.json").exists():
        table_run = Run(root, name)
        table_run.update(status="running", config=config)
        return table_run
    return Run.create(root, kind, config, model, name)


def _play_cell(root: Path, run_name: str, cfg: RolloutConfig, backends: dict[str, Any], reporter: Reporter,
               label: str, private_hook=None) -> dict[str, Any]:
    """One cell of a grid (a sweep's, a suite's, a ladder's): its eval run's summary. A cell whose run completed
    before is kept; an unfinished one is redone beside the old and swapped in when done (a reader meanwhile sees the
    old cell, never a missing folder). `backends` holds the one model in memory (one server running) at a time."""
    from envace.policy import load_backend

    cell_root = root
    if (root / run_name).exists():
        meta = get_run(root, run_name) if (root / run_name / "run.json").exists() else {}
        if meta.get("status") == "completed":
            reporter.say(f"{label} {run_name}: done already, kept")
            return meta.get("summary") or {}
        cell_root = root / STAGING
        shutil.rmtree(cell_root / run_name, ignore_errors=True)
    reporter.say(f"{label} {run_name}")
    if cfg.model not in backends:
        _close(list(backends.values()))
        backends.clear()
        # the scripted reference policy holds each cell's own tasks: the cell's job builds it
        backends[cfg.model] = None if cfg.model == REFERENCE_MODEL else \
            load_backend(cfg.model, cfg.max_batch_tokens, cfg.backend, say=reporter.say)
    if hasattr(backends[cfg.model], "clear_caches"):
        backends[cfg.model].clear_caches()
    _, summary = eval_job(cfg.model, cfg, cell_root, run_name, reporter, backends[cfg.model], private_hook)
    if cell_root != root:
        swap_in(cell_root / run_name, root / run_name)
    return summary


def ladder_job(name: str, models: dict[str, str], rungs: list[str], seeds: list[int], base: RolloutConfig,
               root: str | Path = "runs", reporter: Reporter | None = None) -> tuple[Run, Any, str, list[dict]]:
    """The private-rehearsal ladder (`private/ladder.py`): per model, N = 0 and each rung, one eval run per cell on
    the same turns and seeds; the ladder's own run `name` holds the comparisons (`ladder`, ladder.csv) and the
    per-turn diagnosis (`ladder_turns`, diagnosis.csv), rewritten after every cell. A re-run keeps every cell whose
    run completed and redoes the others. Returns (run, comparison table, its caption, diagnosis per rung)."""
    from envace import compare
    from envace.private import ladder
    from envace.store import connect

    reporter = reporter or Reporter()
    root, name = Path(root), check_run_id(name)
    base = ladder.base_config(base, rungs)
    grid = ladder.cells(models, rungs, seeds, base.temperature == 0)
    configs = [ladder.cell_config(c, base, seeds) for c in grid]  # every cell checked before the first one runs
    for cell in grid:
        check_run_id(cell.run_name(name))
    if "real" in rungs:
        ladder.check_copy(base)
    table_run = _table_run(root, name, "ladder", {"models": models, "rungs": rungs, "seeds": seeds,
                                                  "base": asdict(base)}, "")

    def completed(run_id: str) -> bool:
        return (root / run_id / "run.json").exists() and get_run(root, run_id).get("status") == "completed"

    def tables() -> tuple[Any, str, list[dict]]:
        con = connect(root)
        turns = {c.run_name(name): ladder.turn_rows(con, name, c, c.run_name(name)) for c in grid
                 if c.rung != ladder.NONE and completed(c.run_name(name))}
        frame, caption = compare.with_holm(ladder.comparisons(con, name, grid, seeds, completed))
        return frame, caption, ladder.write_tables(table_run, frame, turns)

    backends: dict[str, Any] = {}
    try:
        with table_run.running():
            for n, (cell, cfg) in enumerate(zip(grid, configs, strict=True), 1):
                _play_cell(root, cell.run_name(name), cfg, backends, reporter, f"cell {n}/{len(grid)}",
                           ladder.hook(cell.rung))
                frame, caption, diagnosis = tables()
                table_run.update(summary={"cells": n, "of": len(grid), "caption": caption})
    finally:
        _close(list(backends.values()))
    table_run.update(status="completed", summary={"cells": len(grid), "of": len(grid), "caption": caption})
    return table_run, frame, caption, diagnosis


def suite_job(name: str, model: str, base: RolloutConfig, limit: int | None = None, root: str | Path = "runs",
              reporter: Reporter | None = None) -> tuple[Run, list[dict[str, Any]]]:
    """The paper's benchmarks for `model` (`envace/suite.py`): one eval run per cell, one table run `name` of kind
    `suite` whose summary lists the cells. A re-run keeps every completed cell and plays the others."""
    from envace import suite

    reporter = reporter or Reporter()
    root, name = Path(root), check_run_id(name)
    grid = suite.cells(base.private.mode, base.private.budget)
    configs = [suite.cell_config(cell, base, model, limit) for cell in grid]  # every cell checked before the first
    grid_config = {"model": model, "limit": limit, "base": asdict(base)}
    table_run = _table_run(root, name, suite.KIND, grid_config, model)
    rows: list[dict[str, Any]] = []
    backends: dict[str, Any] = {}
    try:
        with table_run.running():
            for n, (cell, cfg) in enumerate(zip(grid, configs, strict=True), 1):
                run_name = cell.run_name(name)
                done = _play_cell(root, run_name, cfg, backends, reporter, f"cell {n}/{len(grid)}")
                rows.append({**asdict(cell), "cell_run": run_name, "episodes": done.get("episodes", 0),
                             "success_rate": done.get("success_rate")})
                table_run.update(summary={"cells": rows})
    finally:
        _close(list(backends.values()))
    table_run.update(status="completed", summary={"cells": rows})
    return table_run, rows


def _resumable(config: dict[str, Any]) -> dict[str, Any]:
    """A train config as `--resume` compares it: its old flat keys nested (a run stored by an earlier release),
    grpo.steps may grow, a Ray run may join another cluster (the address, not whether there is one, may
    change), and what changes no result may differ (`config.results_only`)."""
    out = results_only(nest(config))
    if isinstance(out.get("grpo"), dict):
        out["grpo"] = {k: v for k, v in out["grpo"].items() if k != "steps"}
    if isinstance(out.get("ray"), dict):
        out["ray"] = {**out["ray"], "address": bool(out["ray"].get("address"))}
    return out


def _resume_run(root: Path, name: str, cfg: TrainConfig) -> Run:
    """The stored run `name` reopened for `cfg` (resolved), which must be the config it was trained with."""
    meta = get_run(root, name)
    stored, asked = _resumable(meta.get("config", {})), _resumable(json.loads(json.dumps(asdict(cfg), default=str)))
    if meta.get("kind") != "train" or not extends(stored, asked):  # e.g. saved before [train.ray] existed
        raise UsageError(f"run '{name}' was not trained with this config (only grpo.steps may grow)")
    run = Run(root, name)
    run.update(status="running", pid=os.getpid(), config=asdict(cfg))
    return run


def train_job(cfg: TrainConfig, root: str | Path = "runs", name: str | None = None, resume: str | None = None,
              reporter: Reporter | None = None) -> tuple[Run, dict[str, Any]]:
    """SFT then role-wise GRPO (`training/loop.py`) into a new run, or `resume` a stored one exactly.

    Under `accelerate launch` / `torchrun` every process calls this with the same `name`: process 0
    creates (or reopens) the run, the others join it.
    """
    from envace.training.distributed import launch_position, wait_for
    from envace.training.fsdp import launcher_fsdp
    from envace.training.loop import train

    reporter = reporter or Reporter()
    root = Path(root)
    cfg = cfg.resolve()  # what the run trains with, and what its run.json keeps
    launcher_fsdp(cfg.distributed.shard_optimizer)  # refuse an FSDP launch this trainer cannot honour, before a run
    rank, world = launch_position()
    if world > 1 and not (name or resume):
        raise UsageError("training with several processes needs --run-name (every process writes to that run)")
    cluster, trainer = contextlib.nullcontext(), train
    if cfg.ray.address:  # actors and learner ranks placed by Ray; this process drives them and writes the run
        from envace.training.cluster.driver import train_on_ray
        from envace.training.cluster.placement import reserved

        cluster = reserved(cfg, reporter.say)
    with cluster as placement:  # joined, placed and every node checked before a run exists: a refusal leaves none
        if placement is not None:
            trainer = functools.partial(train_on_ray, placement=placement)
        if rank > 0:
            wait_for(root / (resume or name) / "run.json")
            run = Run(root, resume or name)
        elif resume:
            run = _resume_run(root, resume, cfg)
        else:
            run = Run.create(root, "train", asdict(cfg), cfg.model, name)
        reporter.say(f"train → {run.path}" + (f" (process {rank} of {world})" if world > 1 else ""))
        with run.running():
            summary = trainer(cfg, run, reporter.say, resume=bool(resume))
    if rank == 0:
        run.update(status="completed", summary=summary)
    return run, summary


def _judged_episodes(con, meta: dict[str, Any], limit: int | None):
    """(benchmark, episode rows) of a stored run to judge; a run without episodes or rubrics is a UsageError."""
    run_id = meta["run_id"]
    episodes = con.execute("SELECT step, episode_id, task_uid, env, category FROM episodes WHERE run_id = ? "
                           "ORDER BY step, episode_id", [run_id]).fetchall()
    if not episodes:
        raise UsageError(f"run '{run_id}' has no episodes to judge")
    config = meta.get("config") or {}
    rollout = config.get("rollout") if isinstance(config.get("rollout"), dict) else {}
    env = config.get("env") or rollout.get("env") or episodes[0][3]
    benchmark = registry.get(str(env))
    if benchmark.rubrics is None:
        raise UsageError(f"run '{run_id}' plays {benchmark.name}, which has no rubrics to judge "
                         "(rubric judging is for benchmarks with natural-language checks, e.g. vitabench)")
    return benchmark, episodes[:limit]


def _judge_items(con, run_id: str, chosen: list[tuple], tasks: dict, benchmark) -> list:
    """One `judge.Item` per chosen episode: its task's rubrics and its transcript, rebuilt from the stored caller
    and user generations and the calls with their responses."""
    from envace import judge
    from envace.units import whole_uid

    ids = [e[1] for e in chosen]
    rows_of: dict[str, dict[tuple[int, str], list[dict[str, Any]]]] = {"generations": {}, "calls": {}}
    for table, columns, where in (
            ("generations", "turn, turn_step, role, user_message, completion_text", " AND role IN ('caller', 'user')"),
            ("calls", "turn, turn_step, call_index, name, arguments, response", "")):
        cursor = con.execute(f"SELECT step, episode_id, {columns} FROM {table} WHERE run_id = ?{where} "
                             "AND list_contains(?, episode_id)", [run_id, ids])
        names = [d[0] for d in cursor.description]
        for values in cursor.fetchall():
            row = dict(zip(names, values, strict=True))
            rows_of[table].setdefault((row["step"], row["episode_id"]), []).append(row)
    items = []
    for step, episode_id, uid, _, _ in chosen:
        task = tasks.get(uid) or tasks[whole_uid(uid)]
        greeting = task.simulated_user.greeting if task.simulated_user is not None else None
        messages = judge.transcript(rows_of["generations"].get((step, episode_id), []),
                                    rows_of["calls"].get((step, episode_id), []), greeting)
        context = benchmark.judge_context(task) if benchmark.judge_context else ""
        items.append(judge.Item(task.uid, list(benchmark.rubrics(task)), messages, context))
    return items


def judge_job(run_id: str, root: str | Path = "runs", model: str = "default", limit: int | None = None,
              max_new_tokens: int = 256, reporter: Reporter | None = None, backend=None,
              progress=None) -> tuple[Run, list[dict[str, Any]]]:
    """Judge a stored run's episodes against their benchmark's rubrics (`envace/judge.py`) with `model` (or the
    given `backend`, named `model`), and write table `judgements` (one shard per judge model: a re-run replaces
    it). Returns (run, one summary per episode: episode_id, task_uid, rubrics, met, unparsed, rubric_judge)."""
    import hashlib
    import re

    from envace import judge
    from envace.engine.sampler import Sampler
    from envace.policy.specs import check_model_spec
    from envace.store import connect
    from envace.units import whole_uid

    reporter = reporter or Reporter()
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UsageError(f"limit: must be at least 1, got {limit}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise UsageError(f"max-new-tokens: must be at least 1, got {max_new_tokens}")
    root = Path(root)
    meta = get_run(root, run_id)
    con = connect(root)
    benchmark, episodes = _judged_episodes(con, meta, limit)
    if backend is None:
        check_model_spec(model)
    tasks = {}
    for category in sorted({e[4] for e in episodes}):
        tasks.update({t.uid: t for t in benchmark.load_tasks(category, "all")})
    chosen = [e for e in episodes if (tasks.get(e[2]) or tasks.get(whole_uid(e[2]))) is not None]
    for missing in [e for e in episodes if e not in chosen]:
        reporter.say(f"skipped {missing[1]}: its task {missing[2]} is not in {benchmark.name} any more")
    if not chosen:
        raise UsageError(f"none of run '{meta['run_id']}''s tasks is in {benchmark.name}: nothing to judge")
    items = _judge_items(con, meta["run_id"], chosen, tasks, benchmark)
    reporter.say(f"judging {len(items)} episode(s) of {meta['run_id']} ({benchmark.name}) with {model}, "
                 f"{sum(len(i.rubrics) for i in items)} rubrics")
    owned = []
    try:
        if backend is None:
            from envace.policy import load_backend

            reporter.say("loading the judge's model …")
            backend = load_backend(model, say=reporter.say)
            owned.append(backend)
        results = judge.judge(Sampler(backend), items, max_new_tokens, progress)
    finally:
        _close(owned)
    rows, summaries = [], []
    for (step, episode_id, uid, _, _), item, result in zip(chosen, items, results, strict=True):
        rows += [{"run_id": meta["run_id"], "step": step, "episode_id": episode_id, "task_uid": uid,
                  "rubric_index": k, "rubric": rubric, "verdict": verdict, "judge_model": model,
                  "judge_text": result.raw} for k, (rubric, verdict) in enumerate(zip(item.rubrics, result.verdicts,
                                                                                      strict=True))]
        summaries.append({"episode_id": episode_id, "task_uid": uid, "rubrics": len(item.rubrics),
                          "met": sum(v is True for v in result.verdicts),
                          "unparsed": sum(v is None for v in result.verdicts),
                          judge.SUBSCORE: judge.share(result.verdicts)})
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("._-")[:60] or "model"
    run = Run(root, meta["run_id"])
    run.write("judgements", f"judge-{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}", rows)
    return run, summaries
