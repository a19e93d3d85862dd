"""Fully sharded data parallelism (FSDP2, torch's `fully_shard`) for `envace train`.

Weights, gradients and AdamW's moments are split across the processes; each decoder layer is
gathered only while it runs. Two things make this trainer different from a plain FSDP loop:

* **Generation runs on an unsharded copy.** Every process samples episodes of its own lengths, and a
  sharded model would need every process in each layer's all-gather at every decoding step, so the
  processes would deadlock. Each process therefore keeps a whole, frozen copy of the model for
  rollouts and evaluation (a colocated inference engine), and the trained weights are copied into it
  after every update (`sync`): with LoRA only the adapters move, a full fine-tune moves every weight.
* **Every process runs the same number of forward/backward passes.** Gradients are reduce-scattered
  in the backward pass, a collective, so a process with fewer packs pads with idle passes that add
  zero gradient (`envace.training.grpo.backward`), and only the last pass synchronises.

`accelerate launch --config_file experiments/accelerate_fsdp.yaml` turns this on through the
environment it sets (`launcher_fsdp`); `[train.distributed] fsdp = true` does the same under torchrun.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from envace.errors import UsageError
from envace.policy.models import put_weights


def launcher_fsdp(shard_optimizer: bool = False) -> dict[str, bool] | None:
    """The FSDP settings `accelerate launch` passed in the environment, or None when it asked for none.

    Only what this trainer implements is accepted: FSDP2 with whole-layer wrapping and whole state
    dicts; parameter offload is refused rather than ignored, and so is ZeRO-1 on top of FSDP.
    """
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() != "true":
        return None
    if shard_optimizer:
        raise UsageError("the accelerate config asks for FSDP, which already shards the optimizer state: "
                         "drop distributed.shard_optimizer")
    if os.environ.get("FSDP_VERSION", "2") != "2":
        raise UsageError("the accelerate config asks for FSDP version 1: set fsdp_version: 2 (torch's fully_shard)")
    if os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true":
        raise UsageError("fsdp_offload_params is not supported by envace train: set it to false")
    return {"reshard_after_forward": os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() == "true",
            "activation_checkpointing": os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true"}


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """The decoder-layer class names transformers declares unsplittable (the units to gather one at a time)."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    raise UsageError(f"{type(model).__name__} declares no decoder-layer class (_no_split_modules) to shard by")


def shard(model: torch.nn.Module, reshard_after_forward: bool = True, generates: bool = True) -> torch.nn.Module | None:
    """Shard `model` in place (one FSDP unit per decoder layer plus the root) and return its generation copy, a
    whole model beside the shards (None for a process that never `generates`)."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    generator = copy.deepcopy(model).eval().requires_grad_(False) if generates else None
    classes = _layer_classes(model)
    for module in list(model.modules()):
        if type(module).__name__ in classes:
            fully_shard(module, reshard_after_forward=reshard_after_forward)
    # The root (embeddings, final norm, head) stays gathered from its forward to its backward: the loss projects
    # the scored hidden states through the head after the forward returns (`training.forward`), in chunks.
    fully_shard(model, reshard_after_forward=False)
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            # The loss is already normalised by the global row count: sum the shares, do not average them
            # (and with a plain sum: gloo has no pre-multiplied one).
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return generator


def _gathered(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) of each trainable weight, gathered one at a time (every process must iterate)."""
    for name, p in model.named_parameters():
        if p.requires_grad:
            yield name, p.full_tensor()


def full_trainable(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """Every trainable weight, whole and in CPU memory, where `keep` (a collective)."""
    return {name: whole.detach().cpu() for name, whole in _gathered(model) if keep}


@torch.no_grad()
def sync(model: torch.nn.Module, generator: torch.nn.Module) -> None:
    """Copy the trained weights into the generation copy (a collective)."""
    put_weights(generator, _gathered(model))


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """AdamW's whole state keyed by parameter name, on process 0 (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Each process writes the shards it holds of the trainable weights and of the optimiser's state into `folder`
    (torch.distributed.checkpoint: a file a process, and the metadata process 0 writes once every file is in), so
    nothing is gathered on one process. A collective; `folder` is the same path on every process, on a
    filesystem they all see."""
    import torch.distributed.checkpoint as dcp

    dcp.save(sharded_state(model, optimizer), checkpoint_id=folder)


def load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """`save_shards`' folder put back into the shards, each process reading the pieces its own shards cover
    (torch.distributed.checkpoint re-slices when the processes are more or fewer than those that saved)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = sharded_state(model, optimizer)
    dcp.load(state, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                   options=StateDictOptions(strict=False))


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"model": the trainable weights' shards by name, "optimizer": the optimiser's state for them}, as DTensors
    over this process's shards (a frozen base stays out: it is the model's files)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, moments = get_state_dict(model, optimizer)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    return {"model": {n: w for n, w in weights.items() if n in trained}, "optimizer": moments}


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Put a saved whole state back into the shards (every process reads `state.pt` itself)."""
    from torch.distributed.checkpoint import state_dict as dcp

    options = dcp.StateDictOptions(full_state_dict=True, strict=False)
    dcp.set_model_state_dict(model, state["model"], options=options)
    dcp.set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"], options=options)
