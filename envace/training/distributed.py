"""Data parallelism across the processes of `accelerate launch` / `torchrun`; a lone process is the default.

Each process plays a disjoint share of a step's tasks (all G rollouts of a task stay on one process,
so role-wise advantages are exact locally), back-propagates its rows with the loss normalised by the
*global* row count, and the gradients are summed across processes before clipping: every process then
takes exactly the update one process with the whole batch would take. Gradients are summed by hand
rather than through DDP's hooks because processes run different numbers of packed forward passes.
Process 0 alone writes metrics, evaluations, `state.pt` and the checkpoint.

With `shard_optimizer`, AdamW's moments are partitioned across processes (ZeRO stage 1, torch's
`ZeroRedundancyOptimizer`): each process updates its slice of the weights and broadcasts it. That
is the memory a full fine-tune runs out of first (two fp32 moments per weight), and it keeps whole
parameters and whole gradients on every process, which the hand-summed gradients above need; FSDP
and ZeRO-2/3 shard those too and are not wired.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import TypeVar

import torch

T = TypeVar("T")


def launch_position() -> tuple[int, int]:
    """(rank, world size) as `accelerate launch` / `torchrun` set them; (0, 1) for a lone process."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class Processes:
    """This process's rank among `world` data-parallel processes."""

    def __init__(self) -> None:
        self.rank, self.world = launch_position()
        if self.world > 1:
            from accelerate import PartialState

            # gloo on CPU (tests run two processes under torchrun), NCCL on GPUs.
            state = PartialState(cpu=not torch.cuda.is_available())
            self.rank, self.world = state.process_index, state.num_processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        return list(items[self.rank:: self.world])

    def total(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return t.item()

    def sum_gradients(self, params: list[torch.nn.Parameter], finite: bool) -> bool:
        """Sum every gradient across processes; False everywhere if any process saw a non-finite loss."""
        if self.world == 1:
            return finite
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
        return self.total(0.0 if finite else 1.0) == 0.0

    def optimizer(self, params: list[torch.nn.Parameter], lr: float, shard: bool) -> torch.optim.Optimizer:
        """AdamW, its state sharded across the processes when `shard` and there are several."""
        if shard and self.world > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, lr=lr)
        return torch.optim.AdamW(params, lr=lr)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict | None:
        """The whole optimizer state on process 0 (gathered from every shard: all processes must call)."""
        if hasattr(optimizer, "consolidate_state_dict"):
            optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if self.main else None

    def wait(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def wait_for(path, seconds: float = 120.0) -> None:
    """Block until process 0 has created `path` (the run folder) or fail clearly."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear: is process 0 running?")
        time.sleep(0.2)
