"""AdamW with fp32 master weights, for a full fine-tune of a model loaded in bfloat16.

Why: bf16 keeps 8 significant bits, so a weight w can only move in steps of about |w|·2^-8, and
`w + Δ` rounds back to w whenever |Δ| < |w|·2^-9. Adam's update is about lr per step whatever the
gradient's scale (m̂ / √v̂ ≈ ±1), so at lr 2e-5 no weight with |w| above about 0.01 ever moves: on the tiny
model most of a full fine-tune's updates are rounded away (tests/test_precision.py measures it), and the
moments, kept in bf16 beside the weights, lose the same way.

The fix is the classic mixed-precision recipe: keep an fp32 copy ("master") of every trainable weight
whose dtype is not fp32, and step AdamW on the masters, whose 24 bits accumulate the small updates:

    master.grad = p.grad.float()     # the bf16 gradient, clipped already by the caller
    AdamW.step(master)               # moments are fp32, shaped like the master
    p.copy_(master)                  # round to nearest: the bf16 weight the next forward uses

so the bf16 weight is always the rounded master, and it moves once the accumulated updates cross half a
bf16 step. Weights already in fp32 (LoRA's adapters, a float32 model) are stepped in place exactly as
plain `torch.optim.AdamW` steps them. The cost is 4 bytes of master per weight beside the 8 of fp32
moments, plus an fp32 copy of the gradients (of this process's slice or shard) while `step` runs.

`MasterAdamW` is an `AdamW` over the model's own parameters: `param_groups` (their `lr` included) and
`zero_grad` are AdamW's. Its per-parameter state is AdamW's plus `master`, so `state_dict()` carries the
masters and a resume is exact; the sharding wrappers see a standard optimizer keyed by the model's
parameters. Under ZeRO-1 (`ZeroRedundancyOptimizer(optimizer_class=MasterAdamW)`) each process holds the
masters of its own slice only, steps them and broadcasts the rounded bf16 weights; under FSDP2 the
parameters are DTensor shards, so the masters (`p.float()`) and moments are sharded the same way, and
torch.distributed.checkpoint gathers and scatters `master` like any other state tensor.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import chain

import torch


def low_precision(p: torch.Tensor) -> bool:
    """Whether AdamW would lose updates stepping `p` in place (any floating dtype narrower than fp32)."""
    return p.is_floating_point() and p.dtype != torch.float32 and p.dtype != torch.float64


class MasterAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` that steps an fp32 master of each low-precision parameter (see the module doc)."""

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:  # it would recompute the bf16 gradients after they were copied to the masters
            raise NotImplementedError("MasterAdamW.step takes no closure")
        params = [group["params"] for group in self.param_groups]
        masters: list[tuple[torch.Tensor, torch.Tensor]] = []
        seen: defaultdict[torch.Tensor, dict] = defaultdict(dict)  # the state AdamW steps, keyed by what it steps
        own = self.state
        try:  # whatever fails, each master goes back into its parameter's state and the groups are restored
            for group in self.param_groups:
                stepped = []
                for p in group["params"]:
                    if p.grad is None or not low_precision(p):
                        stepped.append(p)
                        if p.grad is not None:
                            seen[p] = own[p]
                        continue
                    state = own[p]
                    # Popped while AdamW runs: it initialises a parameter's moments when its state is empty.
                    master = state.pop("master", None)
                    if master is None:
                        master = p.detach().float()  # a copy (a DTensor shard's stays a DTensor, sharded alike)
                    masters.append((p, master))
                    master.grad = p.grad.float()
                    seen[master] = state  # the same dict: AdamW's moments land in this parameter's state
                    stepped.append(master)
                group["params"] = stepped
            self.state = seen
            super().step()
        finally:
            self.state = own
            for group, ps in zip(self.param_groups, params, strict=True):
                group["params"] = ps
            for p, master in masters:
                master.grad = None
                self.state[p]["master"] = master
        for p, master in masters:
            p.copy_(master)
        return None

    def load_state_dict(self, state_dict: dict) -> None:
        # `Optimizer.load_state_dict` casts every floating state tensor to its parameter's dtype: that would
        # round a bf16 parameter's fp32 master and moments to bf16, and the resume would not be exact. Put
        # them back in fp32 (which also upgrades the bf16 moments of a state saved by plain AdamW).
        super().load_state_dict(state_dict)
        ids = chain.from_iterable(group["params"] for group in state_dict["param_groups"])
        params = dict(zip(ids, chain.from_iterable(group["params"] for group in self.param_groups), strict=True))
        for key, saved in state_dict["state"].items():
            p = params.get(key)
            if p is None or not low_precision(p):
                continue
            for name, value in saved.items():
                if name != "step" and torch.is_tensor(value) and value.is_floating_point():
                    self.state[p][name] = value.to(device=p.device, dtype=torch.float32, copy=True)
