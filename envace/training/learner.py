"""The learner: the trained weights, their optimisers, and the updates on what the actors played.

    step(played) -> StepResult  one role-wise GRPO update on a played step:
                                    rows = every generation of the trained roles         # `rows.training_rows`
                                    A = reward − mean over the same (task, role)         # `algorithms.of(cfg)`
                                    update on the rows within the packing budget         # `update`
                                    each generation keeps the advantage and whether it was trained
    sft_step(rows, n)           one supervised step (every advantage 1: the loss is the NLL over n rows)
    weights()                   the trainable weights whole (LoRA's adapters, or every weight): the version to publish
    state() / load()            weights and optimiser state for `state.pt` (gathered on process 0 under ZeRO-1 / FSDP)
    save_shards() / load_shards()   the same under FSDP, each process writing and reading its own shards

`Learner` runs in the one process of `envace train`, in each process of `accelerate launch`, and in each learner
rank Ray places (`cluster/workers.py`); `cluster.driver.RemoteLearner` is the same interface over those ranks.
`step` is shared: only `update` differs, so SFT and GRPO go through one object and the loop never touches a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from envace.config import TrainConfig
from envace.training import algorithms
from envace.training.actor import Played
from envace.training.budget import fitting, row_budget
from envace.training.distributed import Processes
from envace.training.grpo import Row, backward, grpo_step
from envace.training.rows import training_rows

# The per-process statistics of an update that add up across data-parallel processes (the rest are process 0's,
# or already global: `updated`, `skipped` and `grad_norm` come out of collectives).
ADDITIVE = ("loss", "tokens", "rows_backpropagated", "rows_skipped")


@dataclass
class StepResult:
    """A GRPO update: the step it trained on, its rows with their advantages, and the update's statistics."""

    played: Played
    rows: list[Row]
    advantages: list[float]
    stats: dict[str, Any]
    budget: int | None = None  # the packing budget rows had to fit (`budget.row_budget`)

    @property
    def staleness(self) -> int:
        return self.played.step - self.played.version


class BaseLearner:
    """`step` on top of `update`, which a learner implements (in this process, or across Ray's ranks)."""

    cfg: TrainConfig

    def update(self, rows: list[Row], advantages: list[float]) -> dict[str, Any]:
        raise NotImplementedError

    def held(self, published) -> dict[str, torch.Tensor]:
        """A version `weights()` published, as tensors in this process (for `state.pt`): the weights themselves
        here; Ray's learner publishes a reference to them instead."""
        return published

    def save_in_place(self, path, next_step: int, versions: dict) -> bool:
        """Whether this learner wrote `state.pt` at `path` itself; here not: `checkpoint.save_state` gathers
        `state()` and writes it (Ray's learner always writes it itself: `RemoteLearner.save_in_place`)."""
        return False

    def load_in_place(self, path) -> tuple[int, dict] | None:
        """(next step, versions) when this learner read `state.pt` itself (`save_in_place`'s counterpart); None:
        `checkpoint.load_state` reads it and hands `load` the state."""
        return None

    def step(self, played: Played) -> StepResult:
        """One update on `played` (module docstring). Advantages are taken over every row, so a row over the
        packing budget still counts in its group's baseline; it is left out of the update and counted."""
        cfg = self.cfg
        generations, rows = training_rows(played.episodes, cfg.trained_roles)
        advantages = algorithms.of(cfg).advantages(rows)
        packed = fitting(rows, row_budget(cfg))  # the rest is counted, and reported by the recorder
        stats = self.update([rows[i] for i in packed], [advantages[i] for i in packed])
        stats["rows_over_budget"] = len(rows) - len(packed)
        packed = set(packed)
        for i, (g, a) in enumerate(zip(generations, advantages, strict=True)):  # stored exactly as used
            # a row with advantage 0 is not back-propagated, nor is one over the budget
            g.advantage, g.trained = a, stats["updated"] and a != 0.0 and i in packed
        return StepResult(played, rows, advantages, stats, row_budget(cfg))


class Learner(BaseLearner):
    """`model` on `procs` (module docstring; built after `procs.prepare(model)`, which FSDP shards in place) with
    its GRPO AdamW at `grpo.lr`; `pad_id` pads packed rows. SFT takes an AdamW of its own at `sft.lr`, made at its
    first step."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, procs: Processes, pad_id: int) -> None:
        self.cfg, self.model, self.procs, self.pad_id = cfg, model, procs, pad_id
        self.optimizer = procs.optimizer(self._trainable(), cfg.grpo.lr, cfg.distributed.shard_optimizer)
        self._sft_optimizer: torch.optim.Optimizer | None = None

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def update(self, rows: list[Row], advantages: list[float]) -> dict[str, Any]:
        cfg = self.cfg
        self.model.train()
        return grpo_step(self.model, self.optimizer, rows, advantages, self.pad_id, processes=self.procs,
                         importance_cap=cfg.grpo.importance_cap, packing=cfg.packing.strategy,
                         max_pack_tokens=cfg.packing.max_tokens, flat_row_metrics=cfg.packing.flat_row_metrics,
                         tree_attention=cfg.packing.attention, algorithm=algorithms.of(cfg))

    @property
    def sft_optimizer(self) -> torch.optim.Optimizer:
        if self._sft_optimizer is None:
            self._sft_optimizer = self.procs.optimizer(self._trainable(), self.cfg.sft.lr,
                                                       self.cfg.distributed.shard_optimizer)
        return self._sft_optimizer

    def sft_step(self, rows: list[Row], normaliser: int) -> dict[str, Any]:
        """One SFT step on this process's `rows`: the NLL of their completions summed over every process and
        divided by `normaliser` (the step's rows across processes), clipped at 1, one AdamW step."""
        cfg, optimizer = self.cfg, self.sft_optimizer
        self.model.train()
        optimizer.zero_grad(set_to_none=True)
        stats = backward(self.model, rows, algorithms.SFT.advantages(rows), self.pad_id, normaliser=normaliser,
                         processes=self.procs, packing=cfg.packing.strategy, max_pack_tokens=cfg.packing.max_tokens,
                         tree_attention=cfg.packing.attention, algorithm=algorithms.SFT)
        params = self._trainable()
        if self.procs.sum_gradients(params, stats["finite"]):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
        return stats

    def weights(self) -> dict[str, torch.Tensor] | None:
        """A copy of the trainable weights, whole, on process 0 (every process must call under FSDP)."""
        if self.procs.fsdp:
            from envace.training.fsdp import full_trainable

            return full_trainable(self.model, self.procs.main)
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def state(self) -> dict | None:
        return self.procs.state(self.model, self.optimizer)

    def load(self, state: dict) -> None:
        self.procs.load(self.model, self.optimizer, state)

    def save_shards(self, folder) -> None:
        self.procs.save_shards(self.model, self.optimizer, folder)

    def load_shards(self, folder) -> None:
        self.procs.load_shards(self.model, self.optimizer, folder)
