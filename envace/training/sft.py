"""SFT, the warm-up before GRPO: the scripted reference policy's rows, NLL, whole packs per step.

    rows = reference rows of the first `sft.tasks` train tasks, every role the trained weights play
    for each epoch e: packs shuffled by (seed, e), cut into steps of ≥ `sft.rows_per_step` rows   # `sft_chunks`
        for each step: `Learner.sft_step` (every advantage 1: the loss is the completion NLL)
    the summary: the mean NLL of each epoch

Its chunks are drawn from (seed, epoch) alone, so a killed warm-up goes on from `sft_state.pt` (`sft_state.py`)
taking the same steps in the same order.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from envace.config import TrainConfig
from envace.training.distributed import Processes
from envace.training.grpo import Row
from envace.training.learner import Learner
from envace.training.memory_rows import sft_memory_rows
from envace.training.packing.chain import chains
from envace.training.packing.tree import check_budget
from envace.training.rows import reference_rows
from envace.training.setup import Policy
from envace.training.sft_state import SftState


def sft_chunks(packs: list[list[int]], rows_per_step: int) -> list[list[list[int]]]:
    """Whole packs per SFT step, at least `rows_per_step` rows each (a pack is never split)."""
    chunks: list[list[list[int]]] = [[]]
    for pk in packs:
        if sum(len(p) for p in chunks[-1]) >= rows_per_step:
            chunks.append([])
        chunks[-1].append(pk)
    return [c for c in chunks if c]


def eta(started: float, done: int, total: int) -> str:
    elapsed = time.perf_counter() - started
    left = elapsed / done * (total - done) if done else 0.0
    return f"{elapsed / 60:.1f} min elapsed, ETA {left / 60:.1f} min"


def sft_rows(cfg: TrainConfig, policy: Policy) -> list[Row]:
    """The reference rows of the first `sft.tasks` train tasks, of every role the trained weights play; with
    `sft.memory`, then a copy of each caller row with a rehearsal memory in its turn's user message
    (`memory_rows.py`)."""
    rows = [r for r in reference_rows(policy.train_tasks[: cfg.sft.tasks], policy.benchmark, policy.tok,
                                      cfg.rollout.rehearser, cfg.rollout.caller_demo, policy.bank,
                                      cfg.rollout.tool_docs)
            if r.role in cfg.trained_roles or r.role == "summariser"]
    if cfg.sft.memory != "none":
        rows += sft_memory_rows(cfg, policy)
    if cfg.packing.strategy == "tree" and cfg.packing.max_tokens is not None:
        check_budget(rows, cfg.packing.max_tokens)  # before the first step, not in the middle of an epoch
    return rows


def warm_up(cfg: TrainConfig, policy: Policy, learner: Learner, log: Callable[[int, dict[str, float]], None],
            say: Callable[[str], None], place: SftState | None = None) -> dict[str, float]:
    """SFT on `sft_rows` through `learner` (module docstring); `log(step, values)` records each step's metrics
    (process 0 calls it). With `place`, a killed warm-up goes on from its last saved step. Returns the NLL per
    epoch."""
    procs = learner.procs
    rows = sft_rows(cfg, policy)
    say(f"SFT: {len(rows)} reference rows from {cfg.sft.tasks} train tasks, {cfg.sft.epochs} epoch(s), "
        f"{cfg.packing.strategy} packing" + (f", {procs.world} processes" if procs.world > 1 else ""))
    packs = chains(rows)  # an episode's caller rows stay together
    epochs = [sft_chunks(random.Random(cfg.seed + e).sample(packs, len(packs)), cfg.sft.rows_per_step)
              for e in range(cfg.sft.epochs)]
    total, step, started, nll = sum(len(chunks) for chunks in epochs), 0, time.perf_counter(), {}
    done, history = place.load(learner.model, learner.sft_optimizer) if place else (0, [])
    if done:
        say(f"  SFT goes on after step {done}/{total} (sft_state.pt)")
    for epoch, chunks in enumerate(epochs):
        first = step  # this epoch's losses are history[first:]
        for chunk in chunks:
            if step < done:  # taken before the kill: its loss is in history, its update in the weights
                step += 1
                continue
            batch, size = [rows[j] for pk in procs.share(chunk) for j in pk], sum(len(pk) for pk in chunk)
            stats = learner.sft_step(batch, size)
            history.append(procs.total(stats["loss"] * len(batch)) / size)
            if procs.main:
                log(step, {"nll": history[-1], "tokens": stats["tokens"], "epoch": epoch})
            step += 1
            if place:
                place.save(step, learner.model, learner.sft_optimizer, history)
            say(f"  SFT step {step}/{total}: NLL {history[-1]:.3f}; {eta(started, step - done, total - done)}")
        losses = history[first:step]
        nll[f"sft_nll_epoch_{epoch + 1}"] = round(sum(losses) / len(losses), 4)
        say(f"  epoch {epoch + 1}: mean completion NLL {nll[f'sft_nll_epoch_{epoch + 1}']:.3f}")
    return nll


def sft_place(cfg: TrainConfig, run_path, procs: Processes) -> SftState:
    """Where a killed warm-up's place is kept (`sft_state.py`): saved by a single process only."""
    return SftState(run_path / "sft_state.pt", cfg.sft.save_every if procs.world == 1 else 0)
