"""`envace train`: SFT warm-up, then role-wise GRPO with no environment in the loop.

    load the policy (+ LoRA), the train tasks and the train-split example bank
    SFT: the scripted reference policy's rows (`rows.reference_rows`), NLL, whole packs per step
    for each GRPO step k:
        tasks = sample(train tasks, seed, k)                          # nothing random carries over steps
        episodes = G rollouts per task in the rehearsed world         # `actor.RolloutActor.play`
        reward = checklist of each episode, shared by both roles      # `record.score`, `rewards.share`
        A = reward − mean over the same (task, role)                  # `algorithms.of(cfg).advantages`
        one update on every generation of the trained roles           # `grpo.grpo_step`
        store the advantages on the very generations, and every table # `record.write_step`
        push the weights to vLLM servers, when they generate          # `served.ServedPolicy.sync`
        evaluate every `eval_every` updates on test tasks             # `evaluate`
    save the final weights (LoRA merged) to <run>/checkpoint

The actor plays, the learner (`_learn`) updates and records. With `max_staleness = 0` (default) step k is
played by the weights after k updates; with `max_staleness = s ≥ 1` the actor runs on a thread with its own
copy of the weights and plays step k with the weights after max(0, k − s) updates while the learner updates
(`staleness.py`).

Optional on top: a Dyna-style share of calls answered by the real environment (`rollout.real_fraction`),
a shadow share of episodes paired with the real environment (`rollout.shadow_fraction`), and data
parallelism over `accelerate launch` processes (`distributed.py`), optionally fully sharded (`fsdp.py`),
in which case rollouts run on a whole copy of the weights.

Resume is exact because nothing random carries over between steps: step k's tasks and sampling seeds
derive from (seed, k) alone, so `state.pt` (trainable weights, optimiser, next step; written after SFT
and every `save_every` steps, atomically) is all a killed run needs. Shards are keyed by step, so a step
redone after a kill rewrites its rows instead of duplicating them. A warm-up killed before its end goes on from
`sft_state.pt` (`sft_state.py`, every `sft_save_every` SFT steps).
"""

from __future__ import annotations

import copy
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import duckdb
import torch

from envace import ledger, record, rewards, units
from envace.build import build_engine
from envace.config import TrainConfig
from envace.engine.episode import Episode
from envace.engine.examples import ExampleBank
from envace.envs import registry
from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.policy.hf import HFBackend
from envace.policy.models import add_lora, enable_checkpointing, load_policy
from envace.store import Run
from envace.trackers import Tracker, keyed, open_tracker
from envace.training import algorithms
from envace.training.actor import Played, RolloutActor
from envace.training.budget import fitting, row_budget
from envace.training.distributed import Processes
from envace.training.fsdp import launcher_fsdp
from envace.training.grpo import Row, backward, signal_groups
from envace.training.learner import Learner
from envace.training.packing.chain import chains
from envace.training.packing.tree import check_budget
from envace.training.pool import grpo_pool, seen_groups, write_seen
from envace.training.rows import reference_rows, training_rows
from envace.training.served import ServedPolicy
from envace.training.sft_state import SftState
from envace.training.staleness import AheadPipeline
from envace.types import Role


@dataclass
class Session:
    """What every phase of one training run shares."""

    cfg: TrainConfig
    run: Run
    procs: Processes
    say: Callable[[str], None]
    benchmark: Benchmark
    bank: ExampleBank
    model: Any  # the trained module (FSDP-sharded when asked); None on a Ray driver (its learner ranks hold it)
    generator: Any  # the module rollouts generate with: `model` itself unless FSDP shards it
    learner: Any = None  # `learner.Learner` (this process's), or the Ray learner ranks (`cluster.driver`)
    backend: Any = None  # HFBackend on `generator`, or the vLLM servers' RemoteBackend
    served: ServedPolicy | None = None
    tracker: Tracker = field(default_factory=Tracker)
    seen: set[str] = field(default_factory=set)  # task groups SFT has shown the policy (`pool.seen_groups`)


def _write_metrics(run: Run, tracker: Tracker, step: int, phase: str, values: dict[str, dict[str, float]],
                   shard: str) -> None:
    """One step's metrics (per role) into the store, and the same numbers to the experiment tracker."""
    run.write("metrics", shard, [{"run_id": run.run_id, "step": step, "phase": phase, "role": role, "name": name,
                                  "value": float(v)} for role, named in values.items() for name, v in named.items()])
    tracker.log(keyed(phase, values), step)


def save_state(s: Session, next_step: int, versions: dict[int, dict[str, torch.Tensor]] | None = None) -> None:
    """Every process calls this (sharded weights or moments are gathered); process 0 writes `state.pt`, with the
    earlier policy versions the next steps are sampled with (`max_staleness`)."""
    state, run = s.learner.state(), s.run
    if not s.procs.main:
        return
    tmp = run.path / f".state.{os.getpid()}.partial"
    torch.save({"next_step": next_step, **state, "versions": versions or {}}, tmp)
    os.replace(tmp, run.path / "state.pt")  # a kill mid-write leaves the previous state loadable


# Advantage histogram buckets stored per step and role: (name, lower bound, upper bound).
_ADV_BINS = (("lt_-0.5", -float("inf"), -0.5), ("-0.5_-0.1", -0.5, -0.1), ("-0.1_0.1", -0.1, 0.1),
             ("0.1_0.5", 0.1, 0.5), ("ge_0.5", 0.5, float("inf")))


def _std(values: torch.Tensor) -> float:
    return values.std().item() if len(values) > 1 else 0.0


_FIDELITY = ("valid_json", "exact", "structure_f1", "value_acc", "error_agree")


def evaluate(s: Session, updates: int) -> dict[str, float]:
    """Greedy episodes on the first `eval_limit` test tasks (`TrainConfig.evaluation`: the real environment,
    the rehearser as a shadow, leakage-free grounding), stored in the run at step `updates` with phase
    `eval`: official success, checklist, well-formed calls and the rehearser's fidelity against the real
    environment (the ledger's own aggregate over the stored pairs).

    Every process plays its share of the tasks and stores its own shard; the counts are summed across
    processes, and the fidelity is read back from every process's stored pairs, so the numbers are those
    of one process playing them all. Every process must call; the result is process 0's to write."""
    episodes, rows = play_evaluation(s.cfg, s.benchmark, s.bank, s.generator, s.backend, updates, s.procs.share)
    return evaluation_scores(s.run, s.procs, updates, episodes, rows)


def play_evaluation(cfg: TrainConfig, benchmark: Benchmark, bank: ExampleBank, generator, backend, updates: int,
                    share: Callable[[list], list]) -> tuple[list[Episode], list[dict[str, Any]]]:
    """`share` of the evaluation's test tasks played greedily by `generator` through `backend`, scored, rewards
    shared (see `evaluate`)."""
    generator.eval()
    backend.clear_caches()  # nothing cached under the weights before this update
    rollout, tasks = units.select(cfg.evaluation(), benchmark, backend.tokenizer)
    tasks = share(tasks)
    engine = build_engine(backend, benchmark, rollout, bank, id_prefix=f"eval{updates}:")
    episodes = engine.run_batch([(t, 0) for t in tasks]) if tasks else []
    rows = [record.score(ep, rollout.mode, "eval") for ep in episodes]
    for ep, row in zip(episodes, rows, strict=True):
        rewards.share(ep.generations, row["checklist"])
    return episodes, rows


def evaluation_scores(run: Run, procs: Processes, updates: int, episodes: list[Episode],
                      rows: list[dict[str, Any]]) -> dict[str, float]:
    """Store this process's evaluation episodes and return the scores of every process's (see `evaluate`)."""
    shard = f"eval-{updates:05d}"
    if episodes:
        record.write_step(run, updates, episodes, rows, shard + (f"-p{procs.rank}" if procs.world > 1 else ""))
    counts = record.summarise(episodes, rows)
    for name in ("episodes", "successes", "checklist", "caller_messages", "parse_errors", "well_formed"):
        setattr(counts, name, procs.total(getattr(counts, name)))
    summary = counts.as_dict()
    out = {k: summary[k] for k in ("success_rate", "checklist", "well_formed_rate", "parse_error_rate")}
    procs.wait()  # every process's pairs are stored
    pairs = sorted((run.path / "pairs").glob(f"{shard}*.parquet"))
    source = "read_parquet([" + ", ".join(f"'{p}'" for p in pairs) + "], union_by_name = true)"
    overall = ledger.means(ledger.tool_sums(duckdb.connect(), source, run.run_id)) if pairs else None
    overall = overall[overall["tool"] == "all"] if overall is not None else []
    out["pairs"] = int(overall["pairs"].iloc[0]) if len(overall) else 0
    out["rehearsal_error_rate"] = float(overall["malformed"].iloc[0]) if len(overall) else 0.0
    out.update({k: float(overall[k].iloc[0]) for k in _FIDELITY if len(overall)})
    return out


def _evaluate_at(s: Session, updates: int) -> None:
    report_evaluation(s, updates, evaluate(s, updates))  # every process plays its share of the test tasks


def report_evaluation(s: Session, updates: int, scores: dict[str, float]) -> None:
    if s.procs.main:
        _write_metrics(s.run, s.tracker, updates, "eval", {"all": scores}, f"eval-{updates:05d}")
    s.procs.wait()
    s.say(f"  eval after {updates} update(s): success {scores['success_rate']:.2f}, checklist "
          f"{scores['checklist']:.3f}, well-formed {scores['well_formed_rate']:.2f}, rehearsal exact "
          f"{scores.get('exact', 0.0):.2f} over {scores['pairs']} pairs")


def sft_chunks(packs: list[list[int]], rows_per_step: int) -> list[list[list[int]]]:
    """Whole packs per SFT step, at least `rows_per_step` rows each (a pack is never split)."""
    chunks: list[list[list[int]]] = [[]]
    for pk in packs:
        if sum(len(p) for p in chunks[-1]) >= rows_per_step:
            chunks.append([])
        chunks[-1].append(pk)
    return [c for c in chunks if c]


def heartbeat(say: Callable[[str], None], what: str, every_s: float = 30.0) -> Callable[[int, int], None]:
    """An engine `on_step` that reports progress at most every `every_s` seconds."""
    last = [time.perf_counter()]

    def on_step(waiting: int, tokens: int) -> None:
        if time.perf_counter() - last[0] >= every_s:
            last[0] = time.perf_counter()
            say(f"  {what}: {waiting} episode(s) still playing, {tokens} tokens generated")
    return on_step


def _eta(started: float, done: int, total: int) -> str:
    elapsed = time.perf_counter() - started
    left = elapsed / done * (total - done) if done else 0.0
    return f"{elapsed / 60:.1f} min elapsed, ETA {left / 60:.1f} min"


def _step_metrics(rows: list[Row], advantages: list[float], episodes: list[Episode], scored: list[dict[str, Any]],
                  stats: dict[str, Any], real_fraction: float) -> dict[str, dict[str, float]]:
    """Per-role metrics of one GRPO step (this process's share of the batch)."""
    per_role: dict[str, dict[str, float]] = {"all": {k: v for k, v in stats.items() if isinstance(v, int | float)}}
    signal = signal_groups(rows)
    for role in (Role.CALLER, Role.REHEARSER):
        picked = [i for i, r in enumerate(rows) if r.role == role]
        if picked:
            rewards = torch.tensor([rows[i].reward for i in picked])
            adv = torch.tensor([advantages[i] for i in picked])
            errors = sum(g.parse_error is not None for ep in episodes for g in ep.of_role(role))
            per_role[role.value] = {
                "rows": len(picked), "reward_mean": rewards.mean().item(), "reward_std": _std(rewards),
                "adv_mean": adv.mean().item(), "adv_std": _std(adv), "adv_abs_mean": adv.abs().mean().item(),
                "tokens": sum(len(rows[i].completion_ids) for i in picked), "error_rate": errors / len(picked),
                "signal_groups": signal.get(role.value, 0.0),
                **{f"adv_bin_{name}": float(((adv >= lo) & (adv < hi)).sum()) for name, lo, hi in _ADV_BINS}}
    per_role["all"].update(checklist_mean=sum(r["checklist"] for r in scored) / len(scored),
                           real_fraction=real_fraction,
                           rehearsal_errors=sum(r["n_rehearsal_errors"] for r in scored),
                           parse_errors=sum(r["n_parse_errors"] for r in scored))
    return per_role


def _sft(cfg: TrainConfig, model, rows: list[Row], pad: int, procs: Processes,
         log: Callable[[int, dict[str, float]], None], say: Callable[[str], None],
         place: SftState | None = None) -> dict[str, float]:
    """Supervised warm-up on reference rows (`algorithms.SFT`: every advantage 1 turns the loss into the NLL);
    `log(step, values)` records each step's (process 0 calls it). With `place`, a killed warm-up goes on from
    its last saved step (`sft_state.py`)."""
    optimizer = procs.optimizer([p for p in model.parameters() if p.requires_grad], cfg.sft_lr, cfg.shard_optimizer)
    packs, step, started, nll = chains(rows), 0, time.perf_counter(), {}  # an episode's caller rows stay together
    epochs = [sft_chunks(random.Random(cfg.seed + e).sample(packs, len(packs)), cfg.rows_per_step)
              for e in range(cfg.sft_epochs)]
    total = sum(len(chunks) for chunks in epochs)
    done, history = place.load(model, optimizer) if place else (0, [])
    if done:
        say(f"  SFT goes on after step {done}/{total} (sft_state.pt)")
    model.train()
    for epoch, chunks in enumerate(epochs):
        first = step  # this epoch's losses are history[first:]
        for chunk in chunks:
            if step < done:  # taken before the kill: its loss is in history, its update in the weights
                step += 1
                continue
            batch = [rows[j] for pk in procs.share(chunk) for j in pk]
            optimizer.zero_grad(set_to_none=True)
            stats = backward(model, batch, algorithms.SFT.advantages(batch), pad,
                             normaliser=sum(len(pk) for pk in chunk), processes=procs, packing=cfg.packing,
                             max_pack_tokens=cfg.max_pack_tokens, tree_attention=cfg.tree_attention,
                             algorithm=algorithms.SFT)
            params = [p for p in model.parameters() if p.requires_grad]
            if procs.sum_gradients(params, stats["finite"]):
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
            history.append(procs.total(stats["loss"] * len(batch)) / sum(len(pk) for pk in chunk))
            if procs.main:
                log(step, {"nll": history[-1], "tokens": stats["tokens"], "epoch": epoch})
            step += 1
            if place:
                place.save(step, model, optimizer, history)
            say(f"  SFT step {step}/{total}: NLL {history[-1]:.3f}; {_eta(started, step - done, total - done)}")
        losses = history[first:step]
        nll[f"sft_nll_epoch_{epoch + 1}"] = round(sum(losses) / len(losses), 4)
        say(f"  epoch {epoch + 1}: mean completion NLL {nll[f'sft_nll_epoch_{epoch + 1}']:.3f}")
    return nll


def _processes(cfg: TrainConfig, launcher: dict[str, bool] | None, say: Callable[[str], None]) -> Processes:
    """The processes of this launch, sharded as the config or `accelerate launch`'s FSDP settings ask."""
    fsdp = cfg.fsdp or launcher is not None
    procs = Processes(fsdp, reshard_after_forward=launcher["reshard_after_forward"] if launcher else True,
                      timeout_s=cfg.dist_timeout_s, reduce_every_pass=cfg.fsdp_reduce_every_pass)
    if fsdp and procs.world == 1:
        say("fsdp: a single process has nothing to shard across; training unsharded")
    return procs


def warm_up(cfg: TrainConfig, benchmark: Benchmark, bank: ExampleBank, train_tasks, tok, model, procs: Processes,
            log: Callable[[int, dict[str, float]], None], say: Callable[[str], None],
            place: SftState | None = None) -> dict[str, float]:
    """SFT on the reference rows of the first `sft_tasks` train tasks (`_sft`, going on from `place` if a
    killed warm-up saved one); the summary's NLL per epoch."""
    rows = [r for r in reference_rows(train_tasks[: cfg.sft_tasks], benchmark, tok, cfg.rollout.rehearser,
                                      cfg.rollout.caller_demo, bank, cfg.rollout.tool_docs)
            if r.role in cfg.trained_roles or r.role == "summariser"]  # every role the trained weights play
    if cfg.packing == "tree" and cfg.max_pack_tokens is not None:
        check_budget(rows, cfg.max_pack_tokens)  # before the first step, not in the middle of an epoch
    say(f"SFT: {len(rows)} reference rows from {cfg.sft_tasks} train tasks, {cfg.sft_epochs} epoch(s), "
        f"{cfg.packing} packing" + (f", {procs.world} processes" if procs.world > 1 else ""))
    return _sft(cfg, model, rows, tok.pad_token_id, procs, log, say, place)


def log_sft(s: Session) -> Callable[[int, dict[str, float]], None]:
    """SFT step metrics into the store (and the tracker)."""
    return lambda step, values: _write_metrics(s.run, s.tracker, step, "sft", {"all": values}, f"sft-{step:05d}")


def _learn(s: Session, played: Played, push: bool = True, timings: dict[str, float] | None = None,
           since: float | None = None) -> dict[str, dict[str, float]] | None:
    """One role-wise GRPO update on a played step: centre the rewards per (task, role), update, record.

    `push`: the servers generate the next step with the weights just updated (the synchronous loop; with
    `max_staleness` the actor takes published versions itself, and a step's wall time runs from `since`, the
    end of the previous update). A step sampled more than `max_staleness` versions ago is dropped and
    counted, never trained on (None)."""
    cfg, step, started, clock = s.cfg, played.step, time.perf_counter(), time.time()
    staleness = step - played.version
    if staleness > cfg.max_staleness:  # counted in the store, never trained on
        s.say(f"GRPO step {step + 1}: sampled by policy version {played.version}, {staleness} behind: dropped")
        if s.procs.main:
            _write_metrics(s.run, s.tracker, step, "grpo", {"all": {"dropped_stale_steps": 1.0}},
                           f"step-{step:05d}")
        return None
    budget = row_budget(cfg)
    generations, rows = training_rows(played.episodes, cfg.trained_roles)
    advantages = algorithms.of(cfg).advantages(rows)  # over every row: an over-budget one's reward counts
    packed = fitting(rows, budget)
    if len(packed) < len(rows):
        s.say(f"  warning: {len(rows) - len(packed)} row(s) over max_pack_tokens = {budget} left out of the update")
    stats = s.learner.update([rows[i] for i in packed], [advantages[i] for i in packed])
    stats["rows_over_budget"] = len(rows) - len(packed)
    update_s = time.perf_counter() - started
    if push:
        s.procs.sync(s.model, s.generator)
        if s.served is not None:  # the servers generate the next step with the weights just updated
            stats["sync_s"] = _sync(s, s.served)
    stats.update(rollout_s=played.seconds, update_s=update_s, policy_version=played.version, staleness=staleness,
                 rollout_start_t=played.started, update_start_t=clock, **(timings or {}))  # the app's timeline
    if played.actor_seconds:  # Ray's actors: each one's share of the rollout, and how many died on it
        stats.update(actor_restarts=played.restarts,
                     **{record.actor_metric(i): t for i, t in enumerate(played.actor_seconds)})
    stats["step_s"] = time.perf_counter() - since if since is not None else \
        played.seconds + time.perf_counter() - started
    packed = set(packed)
    for i, (g, a) in enumerate(zip(generations, advantages, strict=True)):  # stored exactly as the update used them
        # a row with advantage 0 is not back-propagated, nor is one over the budget
        g.advantage, g.trained = a, stats["updated"] and a != 0.0 and i in packed
    per_role = _step_metrics(rows, advantages, played.episodes, played.scored, stats, played.real_fraction)
    shard = f"step-{step:05d}" + (f"-p{s.procs.rank}" if s.procs.world > 1 else "")
    if s.procs.main:
        _write_metrics(s.run, s.tracker, step, "grpo", per_role, shard)
    record.write_step(s.run, step, played.episodes, played.scored, shard)
    signal = ", ".join(f"{role} {per_role[role]['signal_groups']:.0%}" for role in ("caller", "rehearser")
                       if role in per_role)
    adv = ", ".join(f"{role} ±{per_role[role]['adv_std']:.3f}" for role in ("caller", "rehearser") if role in per_role)
    s.say(f"GRPO step {step + 1}/{cfg.grpo_steps}: {len(rows)} rows, checklist "
          f"{per_role['all']['checklist_mean']:.3f}, groups with signal: {signal or '-'}; "
          f"advantage spread {adv or '-'}; loss {stats['loss']:.4f}; {stats['rows_skipped']} row(s) with advantage 0 "
          f"not back-propagated" + (" (skipped: non-finite)" if stats["skipped"] else "")
          + ("" if stats["updated"] or stats["skipped"] else " (no update: every advantage 0)")
          + (f"; sampled {staleness} version(s) ago" if cfg.max_staleness else ""))
    return per_role


def _due(cfg: TrainConfig, updates: int, every: int) -> bool:
    return bool(every) and (updates % every == 0 or updates == cfg.grpo_steps)


def _in_lock_step(s: Session, tok, start: int, tasks_of: Callable[[int], list], versions: dict) -> None:
    """`max_staleness = 0`: play step k with the weights after k updates, update, push, then play step k + 1."""
    actor = RolloutActor(s.cfg, s.benchmark, s.bank, s.generator, s.backend, s.served,
                         lambda what: heartbeat(s.say, what), s.procs.rank)
    started = time.perf_counter()
    for step in range(start, s.cfg.grpo_steps):
        actor.version = step  # the generation weights are the trained ones
        _learn(s, actor.play(step, tasks_of(step)))
        s.say(f"  {_eta(started, step + 1 - start, s.cfg.grpo_steps - start)}")
        if _due(s.cfg, step + 1, s.cfg.eval_every):
            _evaluate_at(s, step + 1)
        if _due(s.cfg, step + 1, s.cfg.save_every):
            save_state(s, step + 1)


def _ahead(s: Session, tok, start: int, tasks_of: Callable[[int], list], versions: dict) -> None:
    """`max_staleness = k ≥ 1`: an actor thread plays up to k steps ahead on its own copy of the weights while
    the learner updates (`staleness.py`); evaluations run on the actor's thread, after the steps handed to it."""
    cfg = s.cfg
    generator = copy.deepcopy(s.generator).eval()
    backend = s.served.backend if s.served else HFBackend(generator, tok, cfg.rollout.max_batch_tokens)
    actor = RolloutActor(cfg, s.benchmark, s.bank, generator, backend, s.served,
                         lambda what: heartbeat(s.say, what), s.procs.rank)
    actor.version = -1  # loads its first version before it plays

    def evaluate_version(version: int, weights: dict[str, torch.Tensor]) -> None:
        actor.load(weights, version)
        _evaluate_at(replace(s, generator=generator, backend=backend), version)

    overlapped(s, actor, start, tasks_of, versions, evaluate_version)


def overlapped(s: Session, actor, start: int, tasks_of: Callable[[int], list], versions: dict,
               evaluate_version: Callable[[int, dict[str, torch.Tensor]], None]) -> None:
    """The learner's loop while `actor` (a `RolloutActor` on a thread, or the Ray actors) plays ahead: take each
    step in order, update, publish the new version, evaluate and save when due (`staleness.py`)."""
    cfg = s.cfg
    pipe = AheadPipeline(actor, cfg.max_staleness, start, cfg.grpo_steps, {**versions, start: s.learner.weights()},
                         tasks_of)
    evaluations, started = [], time.perf_counter()
    try:
        for step in range(start, cfg.grpo_steps):
            pipe.fill(step)  # the learner holds version `step`
            played, wait_s, load_s = pipe.take(step)
            _learn(s, played, push=False, timings={"wait_s": wait_s, "load_s": load_s}, since=started)
            started = time.perf_counter()
            weights = s.learner.weights()
            pipe.publish(step + 1, weights)
            s.say(f"  learner waited {wait_s:.1f} s for step {step + 1}")
            if _due(cfg, step + 1, cfg.eval_every):
                evaluations.append(pipe.submit(lambda v=step + 1, w=weights: evaluate_version(v, w)))
            if _due(cfg, step + 1, cfg.save_every):
                save_state(s, step + 1, pipe.kept(step + 1))
        for done in evaluations:
            done.result()
    finally:
        pipe.close()


def _served(s: Session, tok) -> ServedPolicy | None:
    """vLLM servers for the rollouts (`rollout.backend = "vllm"` or `servers`), holding the weights trained so far.

    One process: a server on `vllm_devices` (default: the trainer's GPU, `vllm_gpu_memory` of it). Several: each
    starts its own on its own GPU (or on `vllm_devices[rank]`), or all attach to `servers` and process 0 pushes."""
    cfg, procs = s.cfg, s.procs
    if cfg.rollout.backend != "vllm" and not cfg.servers:
        return None
    devices = cfg.vllm_devices
    if procs.world > 1 and devices is not None:
        if len(devices) != procs.world:
            raise UsageError(f"vllm_devices: {procs.world} processes start one server each: give one GPU per "
                             f"process ({procs.world} indices), got {devices}")
        devices = [devices[procs.rank]]
    folder = s.run.path / ("served" if procs.world == 1 else f"served-p{procs.rank}")
    served = ServedPolicy.start(cfg.model, cfg.servers, cfg.lora_rank if cfg.lora else None, cfg.dtype, tok,
                                folder, s.say, gpu_memory=cfg.vllm_gpu_memory, devices=devices,
                                pushes=procs.main or not cfg.servers)
    s.say(f"vLLM: weights synced in {_sync(s, served):.2f} s")
    return served


def _sync(s: Session, served: ServedPolicy) -> float:
    """Push the weights to the servers; shared servers are pushed to by process 0 while the others wait."""
    seconds = served.sync(s.generator)
    if s.cfg.servers:
        s.procs.wait()
    return seconds


def _save_checkpoint(s: Session, tok) -> Any:
    out = s.run.path / "checkpoint"
    if s.procs.main:
        partial = s.run.path / f".checkpoint.{os.getpid()}.partial"
        (s.generator.merge_and_unload() if s.cfg.lora else s.generator).save_pretrained(partial)
        tok.save_pretrained(partial)
        write_seen(partial, s.seen)
        if out.exists():  # a resumed run replaces its earlier checkpoint
            shutil.rmtree(out)
        os.replace(partial, out)  # a kill mid-save leaves no half-written checkpoint behind
    s.procs.wait()
    return out


def step_tasks(cfg: TrainConfig, pool: list, step: int) -> list:
    """GRPO step `step`'s units: drawn from (seed, step) alone, so a resumed run draws them again."""
    return random.Random(cfg.seed * 100_003 + step).sample(pool, cfg.tasks_per_step)


def resumed(s: Session, resume: bool, device: Callable[[], Any]) -> tuple[int, dict, bool]:
    """(next GRPO step, the kept policy versions, whether `state.pt` exists): a resumed run's learner takes the
    saved weights and optimiser first (read once: every process must agree on whether to save, a collective)."""
    state_path = s.run.path / "state.pt"
    saved = state_path.exists()
    if not (resume and saved):
        return 0, {}, saved
    state = torch.load(state_path, weights_only=True, map_location=device())
    s.learner.load(state)
    s.say(f"resuming at GRPO step {state['next_step'] + 1} (SFT already done)")
    return state["next_step"], state.get("versions", {}), saved


def started(s: Session, resume: bool, device: Callable[[], Any], warm: Callable[[], dict]) -> tuple[int, dict, dict]:
    """(next GRPO step, the kept policy versions, the run's summary so far), the learner holding its starting
    weights: a resumed run's saved state, else the base after SFT (`warm()`, which returns SFT's summary), saved
    as `state.pt` before the first step."""
    summary: dict[str, Any] = dict(s.run.meta().get("summary") or {}) if resume else {}
    start, versions, saved = resumed(s, resume, device)
    if not (resume and saved) and s.cfg.sft_tasks and s.cfg.sft_epochs:
        summary.update(warm())
        if s.procs.main:
            s.run.update(summary=summary)
    if not saved:
        save_state(s, 0)
    if s.procs.main:
        sft_place(s.cfg, s.run, s.procs).clear()  # SFT's result is in state.pt now
    return start, versions, summary


def sft_place(cfg: TrainConfig, run: Run, procs: Processes) -> SftState:
    """Where a killed warm-up's place is kept (`sft_state.py`): saved by a single process only."""
    return SftState(run.path / "sft_state.pt", cfg.sft_save_every if procs.world == 1 else 0)


def train(cfg: TrainConfig, run: Run, say: Callable[[str], None] = print, resume: bool = False) -> dict[str, Any]:
    """SFT then GRPO into `run` in this process (and its `accelerate launch` peers): the module docstring.
    `[train.ray]` runs go to `cluster.driver.train_on_ray` instead."""
    launcher = launcher_fsdp(cfg.shard_optimizer)
    procs = _processes(cfg, launcher, say)
    if procs.world > 1 and cfg.max_staleness:
        raise UsageError("max_staleness: rollouts ahead of the update run in one process for now; launch one "
                         "process, or set max_staleness = 0")
    if procs.world > cfg.tasks_per_step:
        raise UsageError(f"{procs.world} processes need tasks_per_step >= {procs.world} (each plays whole tasks)")
    if not procs.main:
        say = lambda _: None  # noqa: E731  (process 0 speaks for all)
    torch.manual_seed(cfg.seed)
    benchmark = registry.get(cfg.rollout.env)
    model, tok = load_policy(cfg.model, cfg.dtype)
    if cfg.gradient_checkpointing or (launcher and launcher["activation_checkpointing"]):
        enable_checkpointing(model)
    if cfg.lora:
        model = add_lora(model, cfg.lora_rank)
    train_tasks = benchmark.load_tasks(cfg.rollout.category, "train")
    bank = ExampleBank(train_tasks)
    cfg, pool = grpo_pool(cfg, benchmark, train_tasks, bank, model, tok, say)
    s = Session(cfg, run, procs, say, benchmark, bank, model, procs.prepare(model),
                seen=seen_groups(cfg, train_tasks))
    if procs.main:  # process 0 speaks for all, to the tracker too
        s.tracker = open_tracker(cfg.report_to, run, asdict(cfg))
    optimizer = procs.optimizer([p for p in model.parameters() if p.requires_grad], cfg.lr, cfg.shard_optimizer)
    s.learner = Learner(cfg, model, optimizer, procs, tok.pad_token_id)
    start, versions, summary = started(s, resume, lambda: s.generator.device, lambda: warm_up(
        cfg, benchmark, bank, train_tasks, tok, model, procs, log_sft(s), say, sft_place(cfg, run, procs)))
    procs.sync(model, s.generator)

    s.served = _served(s, tok) if cfg.grpo_steps > start or cfg.eval_every else None  # nothing to generate: none
    s.backend = s.served.backend if s.served else HFBackend(s.generator, tok, cfg.rollout.max_batch_tokens)
    try:
        if cfg.eval_every and start == 0:
            _evaluate_at(s, 0)

        def tasks_of(step: int) -> list:
            return procs.share(step_tasks(cfg, pool, step))

        (_ahead if cfg.max_staleness else _in_lock_step)(s, tok, start, tasks_of, versions)
    finally:
        if s.served is not None:
            s.served.close()
        s.tracker.close()
    out = _save_checkpoint(s, tok)
    summary["checkpoint"] = str(out)
    say(f"saved {out}")
    return summary
