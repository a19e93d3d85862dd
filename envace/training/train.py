"""`envace train`: SFT warm-up, then role-wise GRPO with no environment in the loop.

Each GRPO step plays `tasks_per_step` train tasks G times in `rehearse` mode (the policy is caller and
environment), scores every episode with the checklist reward, turns every generation into a row,
and takes one update (`grpo.grpo_step`). Per-step, per-role metrics and every step's episodes go to
the run store; the final weights are saved under the run folder. Optional on top: a Dyna-style share
of calls answered by the real environment (`real_fraction`), evaluation on test tasks every
`eval_every` updates, and data parallelism over `accelerate launch` processes (`distributed.py`),
optionally fully sharded (`fsdp.py`), in which case rollouts run on a whole copy of the weights.

Resume is exact because nothing random carries over between steps: step k's tasks and sampling
seeds derive from (seed, k) alone, so `state.pt` (trainable weights, optimiser, next step; written
after SFT and every `save_every` steps, atomically) is all a killed run needs. Shards are keyed by
step, so a step redone after a kill rewrites its rows instead of duplicating them.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from typing import Any

import duckdb
import torch

from envace import ledger, record, rewards
from envace.config import TrainConfig
from envace.envs import registry
from envace.errors import UsageError
from envace.policy.hf import HFBackend
from envace.policy.models import add_lora, load_policy
from envace.rehearsal.build import build_engine
from envace.rehearsal.episode import Episode
from envace.rehearsal.examples import ExampleBank
from envace.store import Run
from envace.training.distributed import Processes
from envace.training.fsdp import launcher_fsdp
from envace.training.grpo import Row, backward, grpo_step, pack, role_advantages
from envace.training.rows import reference_rows, training_rows
from envace.types import Role


def _metric_rows(run: Run, step: int, phase: str, values: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    return [{"run_id": run.run_id, "step": step, "phase": phase, "role": role, "name": name, "value": float(v)}
            for role, named in values.items() for name, v in named.items()]


def _save_state(run: Run, model, optimizer, next_step: int, procs: Processes) -> None:
    """Every process calls this (sharded weights or moments are gathered); process 0 writes `state.pt`."""
    state = procs.state(model, optimizer)
    if not procs.main:
        return
    tmp = run.path / f".state.{os.getpid()}.partial"
    torch.save({"next_step": next_step, **state}, tmp)
    os.replace(tmp, run.path / "state.pt")  # a kill mid-write leaves the previous state loadable


# Advantage histogram buckets stored per step and role: (name, lower bound, upper bound).
_ADV_BINS = (("lt_-0.5", -float("inf"), -0.5), ("-0.5_-0.1", -0.5, -0.1), ("-0.1_0.1", -0.1, 0.1),
             ("0.1_0.5", 0.1, 0.5), ("ge_0.5", 0.5, float("inf")))


def _std(values: torch.Tensor) -> float:
    return values.std().item() if len(values) > 1 else 0.0


_FIDELITY = ("valid_json", "exact", "structure_f1", "value_acc", "error_agree")


def evaluate(backend: HFBackend, benchmark, cfg: TrainConfig, bank: ExampleBank, run: Run, updates: int
             ) -> dict[str, float]:
    """Greedy episodes on the first `eval_limit` test tasks (`TrainConfig.evaluation`: the real environment,
    the rehearser as a shadow, leakage-free grounding), stored in the run at step `updates` with phase
    `eval`: official success, checklist, well-formed calls and the rehearser's fidelity against the real
    environment (the ledger's own aggregate over the stored pairs)."""
    rollout = cfg.evaluation()
    engine = build_engine(backend, benchmark, rollout, bank, id_prefix=f"eval{updates}:")
    episodes = engine.run_batch([(t, 0) for t in benchmark.load_tasks(rollout.category, "test", cfg.eval_limit)])
    rows = [record.score(ep, rollout.mode, "eval") for ep in episodes]
    for ep, row in zip(episodes, rows, strict=True):
        rewards.share(ep.generations, row["checklist"])
    shard = f"eval-{updates:05d}"
    record.write_step(run, updates, episodes, rows, shard)
    summary = record.summarise(episodes, rows).as_dict()
    out = {k: summary[k] for k in ("success_rate", "checklist", "well_formed_rate", "parse_error_rate")}
    pairs_shard = run.path / "pairs" / f"{shard}.parquet"
    overall = ledger.means(ledger.tool_sums(duckdb.connect(), f"read_parquet('{pairs_shard}')", run.run_id))
    overall = overall[overall["tool"] == "all"]
    out["pairs"] = int(overall["pairs"].iloc[0]) if len(overall) else 0
    out["rehearsal_error_rate"] = float(overall["malformed"].iloc[0]) if len(overall) else 0.0
    out.update({k: float(overall[k].iloc[0]) for k in _FIDELITY if len(overall)})
    return out


def _evaluate_at(updates: int, backend: HFBackend, benchmark, cfg: TrainConfig, bank: ExampleBank, run: Run, model,
                 procs: Processes, say: Callable[[str], None]) -> None:
    if not procs.main:  # process 0 evaluates while the others wait
        procs.wait()
        return
    model.eval()
    backend.clear_caches()
    scores = evaluate(backend, benchmark, cfg, bank, run, updates)
    run.write("metrics", f"eval-{updates:05d}", _metric_rows(run, updates, "eval", {"all": scores}))
    procs.wait()
    say(f"  eval after {updates} update(s): success {scores['success_rate']:.2f}, checklist {scores['checklist']:.3f}, "
        f"well-formed {scores['well_formed_rate']:.2f}, rehearsal exact {scores.get('exact', 0.0):.2f} "
        f"over {scores['pairs']} pairs")


def _chunks(packs: list[list[int]], rows_per_step: int) -> list[list[list[int]]]:
    """Whole packs per SFT step, at least `rows_per_step` rows each (a pack is never split)."""
    chunks: list[list[list[int]]] = [[]]
    for pk in packs:
        if sum(len(p) for p in chunks[-1]) >= rows_per_step:
            chunks.append([])
        chunks[-1].append(pk)
    return [c for c in chunks if c]


def _heartbeat(say: Callable[[str], None], what: str, every_s: float = 30.0) -> Callable[[int, int], None]:
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
                **{f"adv_bin_{name}": float(((adv >= lo) & (adv < hi)).sum()) for name, lo, hi in _ADV_BINS}}
    per_role["all"].update(checklist_mean=sum(r["checklist"] for r in scored) / len(scored),
                           real_fraction=real_fraction,
                           rehearsal_errors=sum(r["n_rehearsal_errors"] for r in scored),
                           parse_errors=sum(r["n_parse_errors"] for r in scored))
    return per_role


def _sft(cfg: TrainConfig, model, rows: list[Row], pad: int, run: Run, procs: Processes,
         say: Callable[[str], None]) -> dict[str, float]:
    """Supervised warm-up on reference rows: every advantage 1 turns the policy loss into the NLL."""
    optimizer = procs.optimizer([p for p in model.parameters() if p.requires_grad], cfg.sft_lr, cfg.shard_optimizer)
    packs, step, started, nll = pack(rows), 0, time.perf_counter(), {}
    epochs = [_chunks(random.Random(cfg.seed + e).sample(packs, len(packs)), cfg.rows_per_step)
              for e in range(cfg.sft_epochs)]
    total = sum(len(chunks) for chunks in epochs)
    model.train()
    for epoch, chunks in enumerate(epochs):
        losses = []
        for chunk in chunks:
            batch = [rows[j] for pk in procs.share(chunk) for j in pk]
            optimizer.zero_grad(set_to_none=True)
            stats = backward(model, batch, [1.0] * len(batch), pad, total_rows=sum(len(pk) for pk in chunk),
                             processes=procs)
            params = [p for p in model.parameters() if p.requires_grad]
            if procs.sum_gradients(params, stats["finite"]):
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
            losses.append(procs.total(stats["loss"] * len(batch)) / sum(len(pk) for pk in chunk))
            if procs.main:
                run.write("metrics", f"sft-{step:05d}", _metric_rows(run, step, "sft", {"all": {
                    "nll": losses[-1], "tokens": stats["tokens"], "epoch": epoch}}))
            step += 1
            say(f"  SFT step {step}/{total}: NLL {losses[-1]:.3f}; {_eta(started, step, total)}")
        nll[f"sft_nll_epoch_{epoch + 1}"] = round(sum(losses) / len(losses), 4)
        say(f"  epoch {epoch + 1}: mean completion NLL {nll[f'sft_nll_epoch_{epoch + 1}']:.3f}")
    return nll


def _processes(cfg: TrainConfig, launcher: dict[str, bool] | None, say: Callable[[str], None]) -> Processes:
    """The processes of this launch, sharded as the config or `accelerate launch`'s FSDP settings ask."""
    fsdp = cfg.fsdp or launcher is not None
    procs = Processes(fsdp, reshard_after_forward=launcher["reshard_after_forward"] if launcher else True)
    if fsdp and procs.world == 1:
        say("fsdp: a single process has nothing to shard across; training unsharded")
    return procs


def _warm_up(cfg: TrainConfig, benchmark, train_tasks, bank, tok, model, run: Run, procs: Processes,
             say: Callable[[str], None]) -> dict[str, float]:
    rows = [r for r in reference_rows(train_tasks[: cfg.sft_tasks], benchmark, tok, cfg.rollout.rehearser,
                                      cfg.rollout.caller_demo, bank, cfg.rollout.tool_docs)
            if r.role in cfg.trained_roles]
    say(f"SFT: {len(rows)} reference rows ({len(pack(rows))} packed sequences) from {cfg.sft_tasks} train "
        f"tasks, {cfg.sft_epochs} epoch(s)" + (f", {procs.world} processes" if procs.world > 1 else ""))
    return _sft(cfg, model, rows, tok.pad_token_id, run, procs, say)


def _grpo_step(step: int, cfg: TrainConfig, benchmark, tasks, backend: HFBackend, bank, model, generator,
               optimizer, run: Run, procs: Processes, say: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """One role-wise GRPO update: play, score, share the reward, centre it per (task, role), update, record."""
    generator.eval()
    backend.clear_caches()  # cached keys and values belong to the weights before the last update
    rollout = cfg.rollout_at(step, procs.rank)
    engine = build_engine(backend, benchmark, rollout, bank, id_prefix=f"s{step}:")
    engine.on_step = _heartbeat(say, f"GRPO step {step + 1} rollouts")
    episodes = engine.run_batch([(t, g) for t in tasks for g in range(rollout.group_size)])
    scored = [record.score(ep, rollout.mode, "grpo") for ep in episodes]
    for ep, row in zip(episodes, scored, strict=True):
        rewards.share(ep.generations, row["checklist"])
    generations, rows = training_rows(episodes, cfg.trained_roles)
    advantages = role_advantages(rows, cfg.scale_by_std)
    model.train()
    stats = grpo_step(model, optimizer, rows, advantages, backend.tokenizer.pad_token_id, processes=procs)
    procs.sync(model, generator)
    for g, a in zip(generations, advantages, strict=True):  # stored exactly as the update used them
        g.advantage, g.trained = a, not stats["skipped"]
    per_role = _step_metrics(rows, advantages, episodes, scored, stats, rollout.real_fraction)
    shard = f"step-{step:05d}" + (f"-p{procs.rank}" if procs.world > 1 else "")
    if procs.main:
        run.write("metrics", shard, _metric_rows(run, step, "grpo", per_role))
    record.write_step(run, step, episodes, scored, shard)
    say(f"GRPO step {step + 1}/{cfg.grpo_steps}: {len(rows)} rows, checklist "
        f"{per_role['all']['checklist_mean']:.3f}, loss {stats['loss']:.4f}"
        + (" (skipped: non-finite)" if stats["skipped"] else ""))
    return per_role


def train(cfg: TrainConfig, run: Run, say: Callable[[str], None] = print, resume: bool = False) -> dict[str, Any]:
    launcher = launcher_fsdp(cfg.shard_optimizer)
    procs = _processes(cfg, launcher, say)
    if procs.world > cfg.tasks_per_step:
        raise UsageError(f"{procs.world} processes need tasks_per_step >= {procs.world} (each plays whole tasks)")
    if not procs.main:
        say = lambda _: None  # noqa: E731  (process 0 speaks for all)
    torch.manual_seed(cfg.seed)
    benchmark = registry.get(cfg.rollout.env)
    model, tok = load_policy(cfg.model, cfg.dtype)
    if cfg.gradient_checkpointing or (launcher and launcher["activation_checkpointing"]):
        model.activation_checkpointing_enable()
        model.enable_input_require_grads()  # LoRA leaves the embeddings frozen; checkpointed blocks need a grad path
    if cfg.lora:
        model = add_lora(model, cfg.lora_rank)
    generator = procs.prepare(model)  # `model` itself unless FSDP shards it
    train_tasks = benchmark.load_tasks(cfg.rollout.category, "train")
    bank = ExampleBank(train_tasks)
    summary: dict[str, Any] = dict(run.meta().get("summary") or {}) if resume else {}
    optimizer = procs.optimizer([p for p in model.parameters() if p.requires_grad], cfg.lr, cfg.shard_optimizer)
    state_path = run.path / "state.pt"
    saved = state_path.exists()  # read once: every process must agree on whether to save (a collective)
    start = 0
    if resume and saved:
        state = torch.load(state_path, weights_only=True, map_location=generator.device)
        procs.load(model, optimizer, state)
        start = state["next_step"]
        say(f"resuming at GRPO step {start + 1} (SFT already done)")
    elif cfg.sft_tasks and cfg.sft_epochs:
        summary.update(_warm_up(cfg, benchmark, train_tasks, bank, tok, model, run, procs, say))
        if procs.main:
            run.update(summary=summary)
    if not saved:
        _save_state(run, model, optimizer, 0, procs)
    procs.sync(model, generator)

    backend = HFBackend(generator, tok)
    if cfg.eval_every and start == 0:
        _evaluate_at(0, backend, benchmark, cfg, bank, run, generator, procs, say)
    started = time.perf_counter()
    for step in range(start, cfg.grpo_steps):
        tasks = procs.share(random.Random(cfg.seed * 100_003 + step).sample(train_tasks, cfg.tasks_per_step))
        _grpo_step(step, cfg, benchmark, tasks, backend, bank, model, generator, optimizer, run, procs, say)
        say(f"  {_eta(started, step + 1 - start, cfg.grpo_steps - start)}")
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.grpo_steps):
            _evaluate_at(step + 1, backend, benchmark, cfg, bank, run, generator, procs, say)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.grpo_steps:
            _save_state(run, model, optimizer, step + 1, procs)
    out = run.path / "checkpoint"
    if procs.main:
        partial = run.path / f".checkpoint.{os.getpid()}.partial"
        (generator.merge_and_unload() if cfg.lora else generator).save_pretrained(partial)
        tok.save_pretrained(partial)
        if out.exists():  # a resumed run replaces its earlier checkpoint
            shutil.rmtree(out)
        os.replace(partial, out)  # a kill mid-save leaves no half-written checkpoint behind
    procs.wait()
    summary["checkpoint"] = str(out)
    say(f"saved {out}")
    return summary
