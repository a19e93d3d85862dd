"""What a training process builds before its first step: the policy, its processes, its vLLM servers.

The single-process loop (`loop.py`), each `accelerate launch` process and each Ray worker (`cluster/workers.py`)
build the same things the same way, in the same order (the seed is set before LoRA's random init).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from envace.config import TrainConfig
from envace.engine.examples import ExampleBank
from envace.envs import registry
from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.policy.models import add_lora, enable_checkpointing, load_policy
from envace.store import Run
from envace.training.distributed import Processes
from envace.training.served import ServedPolicy


@dataclass
class Policy:
    """The trained model with its tokenizer, the benchmark, its train tasks and their example bank."""

    model: Any
    tok: Any
    benchmark: Benchmark
    train_tasks: list
    bank: ExampleBank


def build_policy(cfg: TrainConfig, checkpointing: bool = False, threads: float | None = None,
                 gpu: bool = True) -> Policy:
    """The policy as every process of a run builds it: seeded, checkpointed when asked (`policy.gradient_checkpointing`,
    or `checkpointing` from the launcher), with LoRA adapters when `lora`. `threads`: torch's threads (a Ray
    worker's CPUs, not the whole node's); `gpu` False keeps the model in host memory."""
    if threads is not None:
        torch.set_num_threads(max(1, int(threads)))
    benchmark = registry.get(cfg.rollout.env)
    model, tok = policy_model(cfg, checkpointing, gpu)
    train_tasks = benchmark.load_tasks(cfg.rollout.category, "train")
    return Policy(model, tok, benchmark, train_tasks, ExampleBank(train_tasks))


def policy_model(cfg: TrainConfig, checkpointing: bool = False, gpu: bool = True):
    """(model, tokenizer) of `build_policy`: seeded (a randomly initialised model draws the same weights in every
    process), checkpointed when asked, with LoRA adapters when `lora`."""
    torch.manual_seed(cfg.seed)
    model, tok = load_policy(cfg.model, cfg.policy.dtype, gpu)
    if cfg.policy.gradient_checkpointing or checkpointing:
        enable_checkpointing(model)
    if cfg.policy.lora:
        model = add_lora(model, cfg.policy.lora_rank)
    return model, tok


def processes(cfg: TrainConfig, launcher: dict[str, bool] | None, say: Callable[[str], None]) -> Processes:
    """The processes of this launch, sharded as the config or `accelerate launch`'s FSDP settings ask; refused
    in one line where the config cannot run on them."""
    fsdp = cfg.distributed.fsdp or launcher is not None
    procs = Processes(fsdp, reshard_after_forward=launcher["reshard_after_forward"] if launcher else True,
                      timeout_s=cfg.distributed.timeout_s, reduce_every_pass=cfg.distributed.reduce_every_pass)
    if fsdp and procs.world == 1:
        say("fsdp: a single process has nothing to shard across; training unsharded")
    if procs.world > 1 and cfg.grpo.max_staleness:
        raise UsageError("grpo.max_staleness: rollouts ahead of the update run in one process for now; launch one "
                         "process, or set grpo.max_staleness = 0")
    if procs.world > cfg.grpo.tasks_per_step:
        raise UsageError(f"{procs.world} processes need grpo.tasks_per_step >= {procs.world} (each plays whole tasks)")
    return procs


def start_servers(cfg: TrainConfig, procs: Processes, run: Run, tok,
                  say: Callable[[str], None]) -> ServedPolicy | None:
    """vLLM servers for the rollouts (`rollout.backend = "vllm"` or `serving.servers`), None when neither is asked.

    One process: a server on `serving.devices` (default: the trainer's GPU, `serving.gpu_memory` of it). Several:
    each starts its own on its own GPU (or on `serving.devices[rank]`), or all attach to `serving.servers` and
    process 0 pushes."""
    if cfg.rollout.backend != "vllm" and not cfg.serving.servers:
        return None
    devices = cfg.serving.devices
    if procs.world > 1 and devices is not None:
        if len(devices) != procs.world:
            raise UsageError(f"serving.devices: {procs.world} processes start one server each: give one GPU per "
                             f"process ({procs.world} indices), got {devices}")
        devices = [devices[procs.rank]]
    folder = run.path / ("served" if procs.world == 1 else f"served-p{procs.rank}")
    share = cfg.serving.share(shares_gpu=devices is None or trainer_gpu() in devices)
    return ServedPolicy.start(cfg.model, cfg.serving.servers, cfg.policy.lora_rank if cfg.policy.lora else None,
                              cfg.policy.dtype, tok, folder, say, gpu_memory=share, devices=devices,
                              pushes=procs.main or not cfg.serving.servers)


def trainer_gpu() -> int | None:
    """The GPU this process trains on (None on a CPU)."""
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def publisher(cfg: TrainConfig, procs: Processes, model, generator,
              served: ServedPolicy | None) -> Callable[[], float | None]:
    """A push: the generator (FSDP's whole copy, or `model` itself) and the servers take the weights just
    updated; it returns the servers' sync seconds (None without servers)."""
    def push() -> float | None:
        procs.sync(model, generator)
        if served is None:
            return None
        seconds = served.sync(generator)
        if cfg.serving.servers:  # shared servers: process 0 pushes while the others wait
            procs.wait()
        return seconds
    return push


def step_tasks(cfg: TrainConfig, pool: list, step: int) -> list:
    """GRPO step `step`'s units: drawn from (seed, step) alone, so a resumed run draws them again."""
    return random.Random(cfg.seed * 100_003 + step).sample(pool, cfg.grpo.tasks_per_step)


def heartbeat(say: Callable[[str], None], what: str, every_s: float = 30.0) -> Callable[[int, int], None]:
    """An engine `on_step` that reports progress at most every `every_s` seconds."""
    last = [time.perf_counter()]

    def on_step(waiting: int, tokens: int) -> None:
        if time.perf_counter() - last[0] >= every_s:
            last[0] = time.perf_counter()
            say(f"  {what}: {waiting} episode(s) still playing, {tokens} tokens generated")
    return on_step
