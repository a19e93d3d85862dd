"""Run under `torchrun --nproc_per_node 2` by tests/test_train.py: two FSDP updates on unequal shares
must equal the updates one unsharded process takes with the whole batch, also across a save and load.
Mode `full` or `lora` (FSDP), `full_every_pass` (FSDP reducing the gradients after every pass), or `zero`
(data parallel with AdamW's moments sharded: ZeRO stage 1). Under FSDP it also records the most unsharded
gradient elements held between passes (`held`): what `fsdp_reduce_every_pass` removes.

Every mode named after argv[1] runs in turn, in the one launch (its start, two processes importing torch and
building the model, was most of each mode's time); each writes {"weights": max |Δ|, "moments": max |Δ|, ...} to
`<argv[1]>.<mode>` (process 0).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

from envace.policy.models import add_lora
from envace.policy.tiny import build_tiny
from envace.training.distributed import Processes, leave
from envace.training.grpo import Row, grpo_step

ROWS = [Row("A", "caller", [1, 5, 7], [9, 11], 1.0), Row("A", "caller", [1, 5, 7, 9, 11, 4], [12], 1.0),
        Row("B", "rehearser", [1, 4, 6], [8, 3], 0.0), Row("C", "caller", [2, 5], [10, 2, 2], 0.0),
        Row("D", "rehearser", [3, 3, 8], [4, 4, 4, 4], 1.0)]
ADVANTAGES = [0.5, 0.5, -1.0, 0.25, -0.4]
SHARES = [[0, 1, 2, 4], [3]]  # process 0 runs three packs, process 1 one: it must pad with idle passes


def trainable(model) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def unsharded_grad_elements(model) -> int:
    """Gradient elements FSDP2 holds unsharded right now (accumulated between passes, or not yet reduced)."""
    from torch.distributed.fsdp import FSDPModule

    held = 0
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        for param in group.fsdp_params if group else ():
            grad = param.unsharded_accumulated_grad
            if grad is None and hasattr(param, "_unsharded_param"):
                grad = param._unsharded_param.grad
            held += grad.numel() if grad is not None else 0
    return held


def main(out: str, mode: str) -> None:
    lora, zero = mode == "lora", mode == "zero"
    procs = Processes(fsdp=not zero, reduce_every_pass=mode == "full_every_pass")
    held = [0]
    sync = procs.gradient_sync

    def measured_sync(model, last: bool) -> None:  # before each pass: what the previous passes left unsharded
        held.append(unsharded_grad_elements(model))
        sync(model, last)

    procs.gradient_sync = measured_sync
    base, tok = build_tiny(seed=2)
    if lora:
        base = add_lora(base, 4)
        for n, p in base.named_parameters():  # LoRA's B starts at zero: give both factors a gradient
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(len(n)))
    reference = copy.deepcopy(base).train()
    ref_opt = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad], lr=1e-2)
    model = copy.deepcopy(base).train()
    generator = procs.prepare(model)
    optimizer = procs.optimizer([p for p in model.parameters() if p.requires_grad], 1e-2, shard=zero)
    share = SHARES[procs.rank]
    rows, advantages = [ROWS[i] for i in share], [ADVANTAGES[i] for i in share]

    names = [n for n, p in reference.named_parameters() if p.requires_grad]
    grpo_step(reference, ref_opt, ROWS, ADVANTAGES, tok.pad_token_id)
    ref_moments = {names[i]: s["exp_avg"].clone() for i, s in ref_opt.state_dict()["state"].items()}
    grpo_step(model, optimizer, rows, advantages, tok.pad_token_id, processes=procs)
    procs.sync(model, generator)
    state = procs.state(model, optimizer)
    if procs.main:
        torch.save(state, f"{out}.state.pt")
    if procs.fsdp:  # and each process's own shards, as a resumable FSDP run saves them
        procs.save_shards(model, optimizer, f"{out}.shards")
    procs.wait()

    # A fresh sharded model loads that state and takes a second step: what a resumed run does.
    again = copy.deepcopy(base).train()
    generator = procs.prepare(again)
    optimizer = procs.optimizer([p for p in again.parameters() if p.requires_grad], 1e-2, shard=zero)
    procs.load(again, optimizer, torch.load(f"{out}.state.pt", weights_only=True))
    from_shards = same_shards(procs, base, again, optimizer, f"{out}.shards", zero) if procs.fsdp else None
    grpo_step(reference, ref_opt, ROWS, ADVANTAGES, tok.pad_token_id)
    stats = grpo_step(again, optimizer, rows, advantages, tok.pad_token_id, processes=procs)
    procs.sync(again, generator)
    if procs.main:
        ref, got = trainable(reference), dict(generator.named_parameters())
        # ZeRO-1 keys the moments by index, FSDP by name
        saved = {names[k] if isinstance(k, int) else k: v for k, v in state["optimizer"]["state"].items()}
        json.dump({"weights": max((ref[n] - got[n]).abs().max().item() for n in ref),
                   "moved": max((ref[n] - w).abs().max().item() for n, w in trainable(base).items()),
                   "tensors": len(ref), "saved": [len(state["model"]), len(saved)],
                   "moments": max((saved[n]["exp_avg"] - m).abs().max().item() for n, m in ref_moments.items()),
                   "skipped": stats["skipped"], "held": max(held), "from_shards": from_shards,
                   "shard_files": sorted(p.stat().st_size for p in Path(f"{out}.shards").glob("*.distcp"))},
                  open(out, "w"))
    procs.wait()


def same_shards(procs: Processes, base, loaded, optimizer, folder: str, zero: bool) -> bool:
    """Whether a fresh sharded model that reads `folder` (`Processes.load_shards`) holds, shard for shard, the
    weights and optimiser state `loaded` got from the whole state: every process's answer, gathered."""
    from envace.training.fsdp import sharded_state

    fresh = copy.deepcopy(base).train()
    procs.prepare(fresh)
    fresh_opt = procs.optimizer([p for p in fresh.parameters() if p.requires_grad], 1e-2, shard=zero)
    procs.load_shards(fresh, fresh_opt, folder)
    pairs = list(zip(leaves(sharded_state(loaded, optimizer)), leaves(sharded_state(fresh, fresh_opt)),
                     strict=True))
    mine = torch.tensor([float(bool(pairs) and all(torch.equal(a, b) for a, b in pairs))])
    torch.distributed.all_reduce(mine, op=torch.distributed.ReduceOp.MIN)
    return bool(mine.item())


def leaves(obj) -> list:
    """The tensors of a nested state, in order (a DTensor as this process's shard of it)."""
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in leaves(obj[k])]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in leaves(v)]
    if isinstance(obj, torch.Tensor):
        return [obj.to_local() if hasattr(obj, "to_local") else obj]
    return []


if __name__ == "__main__":
    for name in sys.argv[2:]:
        main(f"{sys.argv[1]}.{name}", name)
    leave(0)
