"""GRPO's pool: the train units it samples, kept apart from what SFT taught.

Improving on a turn that SFT showed the policy is partly recall, so a study that trains on it cannot tell
learning from memory. By default the pool therefore holds only units whose group (`types.task_group`: BFCL's
scenario index, which its categories share) no SFT has seen:

    seen = groups of this run's SFT tasks (train_tasks[:sft.tasks])
         ∪ groups the starting checkpoint was supervised on (its `SEEN_FILE`, written by every checkpoint)
    pool = train units ∖ seen                               (`grpo.tasks` = N: those of the first N unseen tasks)

A pool that names seen units (`grpo.units`) is refused unless `grpo.pool_overlap = true` says the overlap is
intended (the demo, the earlier recipes), in which case the pool is what it was before: the first N train tasks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from envace import units
from envace.build import build_engine
from envace.config import PrivateOptions, TrainConfig
from envace.engine.examples import ExampleBank
from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.policy.hf import HFBackend
from envace.training.budget import fitting_pool, row_budget
from envace.types import task_group

SEEN_FILE = "envace_sft.json"  # beside a checkpoint's weights: {"groups": [the task groups SFT trained it on]}


def inherited(model: str) -> set[str]:
    """The task groups the checkpoint at `model` was supervised on (empty for a hub model or a bare folder)."""
    seen = Path(model) / SEEN_FILE
    return set(json.loads(seen.read_text())["groups"]) if seen.is_file() else set()


def seen_groups(cfg: TrainConfig, train_tasks: list) -> set[str]:
    """Every task group the policy this run trains has been supervised on: its own SFT's and its checkpoint's."""
    own = {task_group(t) for t in train_tasks[: cfg.sft.tasks]} if cfg.sft.epochs else set()
    return own | inherited(cfg.model)


def write_seen(folder: Path, groups: set[str]) -> None:
    """Record in a checkpoint being written what SFT has shown it, for the runs that start from it."""
    (Path(folder) / SEEN_FILE).write_text(json.dumps({"groups": sorted(groups)}, indent=1))


def grpo_pool(cfg: TrainConfig, benchmark: Benchmark, train_tasks: list, bank: ExampleBank, model, tok,
              say: Callable[[str], None]) -> tuple[TrainConfig, list]:
    """The units GRPO samples from (the module docstring; `grpo.units`; those whose first row fits the packing
    budget), and the config with its rollout's `auto` budgets resolved on the gold data."""
    rollout, pool = units.select(cfg.rollout, benchmark, tok)  # turn units, and an `auto` budget resolved
    seen = set() if cfg.grpo.pool_overlap else seen_groups(cfg, train_tasks)
    if cfg.grpo.units is not None:
        pool = _fixed_pool(pool, cfg.grpo.units, rollout.unit)
        overlap = [t.uid for t in pool if task_group(t) in seen]
        if overlap:
            raise UsageError(f"grpo.units: {overlap[0]} is in a scenario SFT trained on ({len(overlap)} of the "
                             f"{len(pool)} units): GRPO on it is partly recall; pick units SFT never saw, or set "
                             "grpo.pool_overlap = true")
    else:
        unseen = [t for t in train_tasks if task_group(t) not in seen]
        first = {t.uid for t in unseen[: cfg.grpo.tasks]}
        left_out = len(pool)
        pool = [t for t in pool if units.source_uid(t) in first]
        left_out -= len(pool)
        if seen:
            say(f"GRPO's pool leaves out the {len(seen)} scenario(s) SFT trained on: {left_out} {rollout.unit}(s) "
                + ("" if cfg.grpo.tasks is None else f"besides those past the first {cfg.grpo.tasks} tasks ") + "out")
    cfg = replace(cfg, rollout=rollout)
    if row_budget(cfg) is not None and pool:  # before SFT and any rollout: a pool where no row fits is refused
        # the probe only renders each unit's first prompt, in this process: it never generates, so it needs no
        # served backend whatever loop the actors play, and imagines no memory (grpo.memory_episodes): a memory
        # lengthens a prompt by at most [rollout.private] memory_tokens, and the engine's context cap
        # (`engine_context`) ends an episode whose rows would not fit, memory or not
        probe = build_engine(HFBackend(model, tok), benchmark, replace(cfg.rollout_at(0), episode_loop="lockstep",
                                                                       private=PrivateOptions()), bank)
        pool = fitting_pool(probe, pool, row_budget(cfg), say)
    if len(pool) < cfg.grpo.tasks_per_step:
        raise UsageError(f"grpo.tasks_per_step: {cfg.grpo.tasks_per_step} per step, but only {len(pool)} train "
                         f"{rollout.unit}s to sample from (grpo.tasks, rollout.max_turn_calls, packing.max_tokens"
                         + (", and the scenarios SFT trained on are left out" if seen else "") + ")")
    say(f"GRPO on {len(pool)} train {rollout.unit}s, {rollout.max_new_tokens} new tokens per message")
    return cfg, pool


def _fixed_pool(pool: list, uids: list[str], unit: str) -> list:
    """The units of `pool` named by `grpo.units`; a uid outside the pool is a usage error, not an empty step."""
    known, wanted = {t.uid for t in pool}, set(uids)
    missing = [u for u in uids if u not in known]
    if missing:
        example = f" (e.g. {min(known)})" if known else ""
        raise UsageError(f"grpo.units: {missing[0]} is not one of the {len(pool)} train {unit}s GRPO samples "
                         f"from{example}")
    return [t for t in pool if t.uid in wanted]
