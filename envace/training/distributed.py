"""Data parallelism across the processes of `accelerate launch` / `torchrun`; a lone process is the default.

Each process plays a disjoint share of a step's tasks (all G rollouts of a task stay on one process,
so role-wise advantages are exact locally), back-propagates its rows with the loss normalised by the
*global* row count, and the gradients are summed across processes before clipping: every process then
takes exactly the update one process with the whole batch would take. Gradients are summed by hand
rather than through DDP's hooks because processes run different numbers of packed forward passes.
Process 0 alone writes metrics, evaluations, `state.pt` and the checkpoint.

With `distributed.shard_optimizer`, AdamW's moments are partitioned across processes (ZeRO stage 1, torch's
`ZeroRedundancyOptimizer`): each process updates its slice of the weights and broadcasts it. That
is the memory a full fine-tune runs out of first (two fp32 moments and, for bf16 weights, an fp32 master
per weight: `precision.py`), and it keeps whole
parameters and whole gradients on every process. With `fsdp` those are sharded too (`fsdp.py`):
gradients are then reduce-scattered in the backward pass instead of summed here, every process runs
the same number of passes, and rollouts run on a whole copy of the weights.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn, TypeVar

import torch

from envace.errors import UsageError
from envace.training.precision import MasterAdamW, low_precision

T = TypeVar("T")


def launch_position() -> tuple[int, int]:
    """(rank, world size) as `accelerate launch` / `torchrun` set them; (0, 1) for a lone process."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class Processes:
    """This process's rank among `world` data-parallel processes, and how the model is spread over them."""

    def __init__(self, fsdp: bool = False, reshard_after_forward: bool = True, timeout_s: float = 1800.0,
                 reduce_every_pass: bool = False) -> None:
        self.rank, self.world = launch_position()
        if self.world > 1:
            from datetime import timedelta

            from accelerate import PartialState

            # gloo on CPU (tests run two processes under torchrun), NCCL on GPUs. The timeout bounds every
            # collective: NCCL's default (10 min) is shorter than an evaluation or a vLLM server's start-up.
            state = PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=timeout_s))
            self.rank, self.world = state.process_index, state.num_processes
            atexit.register(_close)
        self.fsdp = fsdp and self.world > 1
        # NCCL reduces only tensors on the process's GPU; gloo takes CPU tensors.
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.reshard_after_forward = reshard_after_forward
        self.reduce_every_pass = reduce_every_pass

    def prepare(self, model: torch.nn.Module, generates: bool = True) -> torch.nn.Module | None:
        """Shard `model` for training when `fsdp`; returns the model rollouts generate with (under FSDP a whole
        copy, none when this process never `generates`)."""
        if not self.fsdp:
            return model
        from envace.training.fsdp import shard

        return shard(model, self.reshard_after_forward, generates)

    def sync(self, model: torch.nn.Module, generator: torch.nn.Module) -> None:
        """After an update: the generation copy takes the trained weights (a no-op when they are one model)."""
        if generator is not model:
            from envace.training.fsdp import sync

            sync(model, generator)

    def passes(self, count: int) -> int:
        """Forward/backward passes this process runs: the most any process needs under FSDP (collectives)."""
        return int(self._reduce(count, torch.distributed.ReduceOp.MAX)) if self.fsdp else count

    def gradient_sync(self, model: torch.nn.Module, last: bool) -> None:
        """Under FSDP, reduce-scatter the gradients in the last backward pass only (FSDP2 then holds each weight's
        whole, unsharded gradient between passes), or in every pass with `reduce_every_pass` (they accumulate
        sharded: the sum of the per-pass sums, the same gradient up to the order of additions)."""
        if self.fsdp:
            model.set_requires_gradient_sync(last or self.reduce_every_pass)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        return list(items[self.rank:: self.world])

    def total(self, value: float) -> float:
        return self._reduce(value, torch.distributed.ReduceOp.SUM) if self.world > 1 else value

    def _reduce(self, value: float, op) -> float:
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=op)
        return t.item()

    def sum_gradients(self, params: list[torch.nn.Parameter], finite: bool) -> bool:
        """Sum every gradient across processes (FSDP did in the backward pass); False everywhere if any
        process saw a non-finite loss."""
        if self.world == 1:
            return finite
        for p in params if not self.fsdp else ():  # FSDP reduced them in the backward pass
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
        return self.total(0.0 if finite else 1.0) == 0.0

    def optimizer(self, params: list[torch.nn.Parameter], lr: float, shard: bool) -> torch.optim.Optimizer:
        """AdamW, its state sharded across the processes when `shard` and there are several.

        When a trainable weight is not fp32 (a full fine-tune in bfloat16), AdamW steps fp32 masters of
        those weights instead (`precision.MasterAdamW`): in place, bf16 rounds most lr-sized updates away.
        The masters are optimizer state, so they are sharded like the moments: per process slice under
        ZeRO-1, as DTensor shards under FSDP; fp32 weights (LoRA's adapters) are stepped as plain AdamW does.
        """
        adamw = MasterAdamW if any(low_precision(p) for p in params) else torch.optim.AdamW
        if shard and self.world > 1 and not self.fsdp:  # FSDP's moments are sharded with the weights
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(params, optimizer_class=adamw, lr=lr)
        return adamw(params, lr=lr)

    def state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
        """Trainable weights and optimizer state, whole, on process 0 (gathered from every shard: all
        processes must call); None elsewhere."""
        if self.fsdp:
            from envace.training import fsdp

            weights, moments = fsdp.full_trainable(model, self.main), fsdp.optimizer_state(model, optimizer)
        else:
            if hasattr(optimizer, "consolidate_state_dict"):  # ZeRO-1: gathered on process 0 only
                optimizer.consolidate_state_dict(to=0)
            weights = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
            moments = optimizer.state_dict() if self.main else None
        return {"model": weights, "optimizer": moments, "fsdp": self.fsdp} if self.main else None

    def load(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """The inverse of `state` (every process reads the saved file itself)."""
        self._same_sharding(state.get("fsdp", False))
        if self.fsdp:
            from envace.training.fsdp import load

            load(model, optimizer, state)
        else:
            model.load_state_dict(state["model"], strict=False)
            optimizer.load_state_dict(state["optimizer"])

    def save_shards(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder) -> None:
        """Under FSDP: each process writes its own shards of the weights and optimiser state into `folder`
        (`fsdp.save_shards`), where `state` would gather them whole on process 0. A collective."""
        from envace.training.fsdp import save_shards

        save_shards(model, optimizer, folder)

    def load_shards(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder) -> None:
        """The inverse of `save_shards` (every process reads its pieces)."""
        self._same_sharding(True)
        from envace.training.fsdp import load_shards

        load_shards(model, optimizer, folder)

    def _same_sharding(self, saved_fsdp: bool) -> None:
        if saved_fsdp != self.fsdp:
            raise UsageError("this run's state was saved " + ("with" if saved_fsdp else "without") +
                             " FSDP: resume it the same way (same fsdp setting, several processes)")

    def wait(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def _close() -> None:
    """Tear the process group down before the interpreter does (the fallback when `leave` is not reached)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def leave(code: int) -> NoReturn:
    """End a process of a multi-process launch with `code`, once its work is stored.

    Destroying the process group is not enough: some of torch's distributed threads outlive it, and the
    interpreter's static destruction then meets them unjoined and aborts a process that finished its work
    ("terminate called without an active exception": one run in six or eight of the two-process test here,
    even with the group destroyed at exit). Exiting without static destruction skips that step; every file
    is already closed and renamed into place, so nothing is lost."""
    _close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def wait_for(path, seconds: float = 120.0) -> None:
    """Block until process 0 has created `path` (the run folder) or fail clearly."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear: is process 0 running?")
        time.sleep(0.2)
