"""The learner: the trained weights, their optimiser, and the update on rows the actors played.

    update(rows, A):  one GRPO step (`grpo.grpo_step`, the config's `algorithms.of`) on this process's rows
    weights():        the trainable weights whole (LoRA's adapters, or every weight): the version to publish
    state() / load(): weights and optimiser state for `state.pt` (gathered on process 0 under ZeRO-1 / FSDP)

The same object runs in the one process of `envace train`, in each process of `accelerate launch`, and in
each learner rank Ray places (`cluster/workers.py`); the loop in `train.py` never touches the model itself.
"""

from __future__ import annotations

from typing import Any

import torch

from envace.config import TrainConfig
from envace.training import algorithms
from envace.training.distributed import Processes
from envace.training.grpo import Row, grpo_step

# The per-process statistics of an update that add up across data-parallel processes (the rest are process 0's,
# or already global: `updated`, `skipped` and `grad_norm` come out of collectives).
ADDITIVE = ("loss", "tokens", "rows_backpropagated", "rows_skipped")


class Learner:
    """`model` and `optimizer` on `procs` (see the module docstring); `pad_id` pads packed rows."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 procs: Processes, pad_id: int) -> None:
        self.cfg, self.model, self.optimizer, self.procs, self.pad_id = cfg, model, optimizer, procs, pad_id

    def update(self, rows: list[Row], advantages: list[float]) -> dict[str, Any]:
        cfg = self.cfg
        self.model.train()
        return grpo_step(self.model, self.optimizer, rows, advantages, self.pad_id, processes=self.procs,
                         importance_cap=cfg.vllm_importance_cap, packing=cfg.packing,
                         max_pack_tokens=cfg.max_pack_tokens, flat_row_metrics=cfg.flat_row_metrics,
                         tree_attention=cfg.tree_attention, algorithm=algorithms.of(cfg))

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
