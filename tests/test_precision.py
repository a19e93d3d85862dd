"""fp32 master weights for a bf16 full fine-tune (`envace.training.precision`), through `Processes.optimizer`.

Also a worker: `torchrun --nproc_per_node 2 tests/test_precision.py OUT MODE` (MODE `zero` or `fsdp`)
trains the bf16 tiny model on two processes, saves, resumes, and writes what the tests assert to OUT.
"""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from envace.policy.tiny import build_tiny
from envace.training.distributed import Processes
from envace.training.precision import MasterAdamW

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
LR, STEPS = 2e-5, 10  # a full fine-tune's learning rate: Adam moves each weight by about LR a step


def bf16_tiny() -> torch.nn.Module:
    # build_tiny is fp32 whatever dtype `load_policy` is given: cast it as a bf16 checkpoint would load
    return build_tiny()[0].to(torch.bfloat16).train()


def batch(model, rows: int = 4) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (rows, 24), generator=torch.Generator().manual_seed(0))


def train(model, optimizer, ids: torch.Tensor, steps: int, scale: float = 1.0, procs: Processes | None = None):
    """`steps` updates on a fixed next-token loss (`scale`: this process's share of the global batch)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        (model(input_ids=ids, labels=ids).loss * scale).backward()
        if procs is not None:
            procs.sum_gradients(params, True)
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # as the trainer does: on the bf16 gradients, before step
        optimizer.step()


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    """The fraction of weight elements an update moved."""
    return sum((after[n] != w).sum().item() for n, w in before.items()) / sum(w.numel() for w in before.values())


def update_error(before, after, reference) -> float:
    """|Δ - Δ_ref| / |Δ_ref| over all weights: how far an update is from the reference (fp32) update."""
    diff = ref = 0.0
    for n, w in before.items():
        d, d_ref = after[n].float() - w.float(), reference[n].float() - w.float()
        diff, ref = diff + (d - d_ref).pow(2).sum().item(), ref + d_ref.pow(2).sum().item()
    return (diff / ref) ** 0.5


@pytest.fixture(scope="module")
def runs():
    """The bf16 tiny model after STEPS updates through `Processes().optimizer`, and the same start in fp32."""
    torch.set_num_threads(1)
    base = bf16_tiny()
    ids = batch(base)
    model = copy.deepcopy(base)
    optimizer = Processes().optimizer(list(model.parameters()), LR, shard=False)
    train(model, optimizer, ids, STEPS)
    fp32 = copy.deepcopy(base).float()  # the same (bf16-representable) start, trained in fp32 throughout
    train(fp32, torch.optim.AdamW(fp32.parameters(), lr=LR), ids, STEPS)
    names = {p: n for n, p in model.named_parameters()}
    masters = {names[p]: s["master"] for p, s in optimizer.state.items() if "master" in s}
    return weights(base), weights(model), weights(fp32), masters, optimizer


def test_bf16_weights_take_the_small_updates_bf16_alone_rounds_away(runs):
    """In place, bf16 rounds an update below half its spacing (|w|·2^-9) back to w: at lr 2e-5 pure bf16
    AdamW moves about 30% of the tiny model's weights in 10 steps. Stepped on fp32 masters, a weight moves
    once its accumulated updates cross that, as ~98% do (the rest are the norms' 1.0s and the largest)."""
    before, after, _, _, optimizer = runs
    assert changed(before, after) >= 0.9
    assert isinstance(optimizer, MasterAdamW)


def test_the_bf16_run_tracks_the_fp32_run(runs):
    """The update the bf16 weights took is the fp32 run's to within their rounding (pure bf16: 0.87 off),
    and the masters, rounded only through the bf16 forward's gradients, are closer still."""
    before, after, fp32, masters, _ = runs
    assert update_error(before, after, fp32) < 0.3
    assert set(masters) == set(before) and all(m.dtype == torch.float32 for m in masters.values())
    assert all(torch.equal(after[n], m.to(torch.bfloat16)) for n, m in masters.items())  # the rounded master
    assert update_error(before, masters, fp32) < 0.1


def test_fp32_parameters_are_stepped_exactly_as_plain_adamw():
    """Beside bf16 ones, fp32 weights (LoRA's adapters, say) get plain AdamW's updates bit for bit, and no
    master; an all-fp32 model gets plain AdamW itself."""
    gen = torch.Generator().manual_seed(1)
    fp32 = [torch.nn.Parameter(torch.randn(64, 32, generator=gen) * 0.02) for _ in range(2)]
    bf16 = torch.nn.Parameter((torch.randn(64, 32, generator=gen) * 0.02).to(torch.bfloat16))
    plain = [torch.nn.Parameter(p.detach().clone()) for p in fp32]
    ours, theirs = Processes().optimizer([fp32[0], bf16, fp32[1]], LR, shard=False), torch.optim.AdamW(plain, lr=LR)
    for _ in range(5):
        for p, q in zip(fp32, plain, strict=True):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        bf16.grad = torch.randn(bf16.shape, generator=gen).to(torch.bfloat16)
        ours.step()
        theirs.step()
    assert isinstance(ours, MasterAdamW) and all(torch.equal(p, q) for p, q in zip(fp32, plain, strict=True))
    assert "master" not in ours.state[fp32[0]] and ours.state[bf16]["master"].dtype == torch.float32
    assert type(Processes().optimizer(plain, LR, shard=False)) is torch.optim.AdamW


def test_a_resume_from_the_saved_state_is_exact():
    """What `train --resume` does: save `Processes.state` as `state.pt`, load it into a fresh model and
    optimizer: two steps, a save and two more equal four straight steps, bit for bit (the masters are in
    the state; `Optimizer.load_state_dict` alone would round them, and the moments, to bf16)."""
    torch.set_num_threads(1)
    procs, base = Processes(), bf16_tiny()
    ids = batch(base, 2)
    straight = copy.deepcopy(base)
    optimizer = procs.optimizer(list(straight.parameters()), LR, shard=False)
    train(straight, optimizer, ids, 2)
    buffer = io.BytesIO()
    torch.save(procs.state(straight, optimizer), buffer)
    train(straight, optimizer, ids, 2)

    resumed = copy.deepcopy(base)
    again = procs.optimizer(list(resumed.parameters()), LR, shard=False)
    buffer.seek(0)
    procs.load(resumed, again, torch.load(buffer, weights_only=True))
    assert all(s.get("master", s["exp_avg"]).dtype == s["exp_avg"].dtype == torch.float32 and "master" in s
               for s in again.state.values())
    train(resumed, again, ids, 2)
    assert all(torch.equal(p, q) for p, q in zip(straight.parameters(), resumed.parameters(), strict=True))
    for p, q in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert all(torch.equal(optimizer.state[p][k], again.state[q][k]) for k in ("master", "exp_avg", "step"))


SHARDED = ["zero", "fsdp"]


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory) -> dict[str, dict]:
    """`_worker`'s result for each of `SHARDED`, in turn in one two-process launch."""
    out = tmp_path_factory.mktemp("sharded") / "result"
    done = subprocess.run([*TORCHRUN, __file__, str(out), *SHARDED], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {mode: json.loads(Path(f"{out}.{mode}").read_text()) for mode in SHARDED}


@pytest.mark.heavy
@pytest.mark.parametrize("mode", SHARDED)
def test_sharded_optimizers_keep_sharded_masters_and_resume_exactly(sharded_results, mode):
    """Two processes, bf16 weights: ZeRO-1 (each process steps the masters of its slice) and FSDP2 (masters
    are DTensor shards) move the weights as one process does, save every master whole in fp32, and a
    resume from the saved state (FSDP's: each process's own shards) takes the very steps the uninterrupted run
    takes."""
    result = sharded_results[mode]
    assert result["changed"] >= 0.9  # pure bf16: ~0.3
    assert result["vs_one_process"] < 0.05  # only the order the two shares' gradients are summed in differs
    assert result["masters"] == result["tensors"]  # every weight's master, whole and fp32, in the state
    total, most = result["held"]  # elements of masters held by the processes together, by the fullest one
    assert total == 1.0 and most < 0.75  # each master once, split across the two: not replicated
    assert result["resumed_equal"]


def _worker(out: str, mode: str) -> None:
    from envace.training import fsdp

    torch.set_num_threads(1)
    procs = Processes(fsdp=mode == "fsdp")
    base = bf16_tiny()
    ids = batch(base)
    share, scale = ids[procs.rank:: procs.world], len(ids[procs.rank:: procs.world]) / len(ids)

    def build():
        model = copy.deepcopy(base)
        procs.prepare(model)
        return model, procs.optimizer([p for p in model.parameters() if p.requires_grad], LR, shard=mode == "zero")

    def whole(model) -> dict[str, torch.Tensor]:
        return fsdp.full_trainable(model, procs.main) if procs.fsdp else weights(model)

    model, optimizer = build()
    train(model, optimizer, share, STEPS // 2, scale, procs)
    state = procs.state(model, optimizer)
    if procs.main:
        torch.save(state, f"{out}.state.pt")
    if procs.fsdp:  # what a resumable FSDP run saves: each process's own shards, masters included
        procs.save_shards(model, optimizer, f"{out}.shards")
    procs.wait()
    train(model, optimizer, share, STEPS - STEPS // 2, scale, procs)
    straight = whole(model)
    local = getattr(optimizer, "optim", optimizer).state.values()  # ZeRO-1's own slice is `optim`
    held = sum(getattr(s["master"], "_local_tensor", s["master"]).numel() for s in local if "master" in s)
    held = [procs.total(held), procs._reduce(held, torch.distributed.ReduceOp.MAX)]

    model, optimizer = build()
    if procs.fsdp:
        procs.load_shards(model, optimizer, f"{out}.shards")
    else:
        procs.load(model, optimizer, torch.load(f"{out}.state.pt", weights_only=True))
    train(model, optimizer, share, STEPS - STEPS // 2, scale, procs)
    resumed = whole(model)
    if procs.main:
        one = copy.deepcopy(base)
        train(one, MasterAdamW(one.parameters(), lr=LR), ids, STEPS)
        before = weights(base)
        shapes = {n: w.shape for n, w in before.items()}
        saved = state["optimizer"]["state"]
        names = list(before)  # ZeRO-1 keys the state by index, FSDP by name
        saved = {names[k] if isinstance(k, int) else k: v for k, v in saved.items()}
        json.dump({"changed": changed(before, straight), "tensors": len(before),
                   "vs_one_process": update_error(before, straight, weights(one)),
                   "masters": sum("master" in s and s["master"].dtype == torch.float32
                                  and s["master"].shape == shapes[n] for n, s in saved.items()),
                   "held": [h / sum(w.numel() for w in before.values()) for h in held],
                   "resumed_equal": all(torch.equal(straight[n], resumed[n]) for n in before)}, open(out, "w"))
    procs.wait()


if __name__ == "__main__":
    from envace.training.distributed import leave

    for name in sys.argv[2:]:  # each mode in turn, in one launch: `<argv[1]>.<mode>`
        _worker(f"{sys.argv[1]}.{name}", name)
    leave(0)
