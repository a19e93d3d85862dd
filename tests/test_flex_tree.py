"""FlexAttention for tree packs (`training/flex_tree.py`) against the dense mask (`forward.pack_mask`).

On a CPU FlexAttention runs forward only (no backward pass), so this file checks the mask itself (the block
mask's dense form equals the tree mask, block by block) and the log-probs of a forward without gradient
(fp32, within 1e-5), on packs with deferred segments above them and with key counts that are multiples of
neither 8 nor 128. Gradients of flex against dense need CUDA: that test runs in the device check on a GPU.
"""

import copy
import random

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from envace.errors import UsageError
from envace.training import flex_tree
from envace.training import forward as fwd
from envace.training.grpo import Row, backward
from envace.training.packing import build
from envace.training.packing.tree import Restore

TOL = 1e-5  # fp32 log-probs, flex against dense (both softmax over the same visible keys, summed in another order)


def _toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(5, 2900) for _ in range(n)]


def _rows(seed: int) -> list[Row]:
    """Two prompts (so a pack may hold separate trees), G branches each, some sharing a few first tokens: long
    enough for several 128-token tiles, lengths chosen so no key count is a multiple of 8 by design."""
    rng = random.Random(seed)
    rows = []
    for task, prompt_len in (("A", 141), ("B", 37)):
        prompt, lead = _toks(rng, prompt_len + rng.randrange(3)), _toks(rng, 5)
        for g in range(4):
            completion = (lead if g < 2 else []) + _toks(rng, 61 + 13 * g + rng.randrange(3))
            rows.append(Row(task, "caller", prompt, completion, float(g % 2)))
    return rows


def _budgets(rows: list[Row]) -> dict[str, dict]:
    longest = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    return {"whole tree": {"max_tokens": 10_000}, "deferred": {"max_tokens": longest},
            "recompute": {"max_tokens": longest, "recompute": True}}


def _tree_packs(rows, **budget):
    return [op for op in build(rows, "tree", **budget) if not isinstance(op, Restore)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("budget", ["whole tree", "deferred", "recompute"])
def test_the_block_masks_dense_form_is_the_tree_mask(seed, budget):
    rows = _rows(seed)
    packs = _tree_packs(rows, **_budgets(rows)[budget])
    unaligned = deferred = skipped = 0
    for pack in packs:
        layout = pack.tree
        deferred += bool(layout.external)
        for block, keys, _ in fwd.attention_blocks(layout):
            n, k = block[1] - block[0], keys[1] - keys[0]
            unaligned += k % 8 != 0
            expected = fwd.pack_mask(layout, block, keys, "cpu")
            mod = flex_tree.tree_mask_mod(layout, block, keys, "cpu")
            assert torch.equal(create_mask(mod, 1, 1, n, k, device="cpu")[0, 0], expected)
            block_mask = flex_tree.tree_block_mask(layout, block, keys, "cpu")
            assert block_mask.shape[-2:] == (n, k)
            computed, total = flex_tree.tiles(block_mask)
            skipped += computed < total
    assert unaligned, "some key count must be off a multiple of 8"
    if budget == "whole tree":  # four branches of ~100 tokens: a later branch's tiles skip an earlier one's
        assert skipped, "some 128 × 128 tile must be skipped"
    if budget == "deferred":
        assert deferred, "a budget of the longest row must defer the shared prompt"


def _logprobs(model, rows, kind: str, **budget) -> tuple[torch.Tensor, int]:
    """Every tree pack's scored log-probs without gradient (deferred keys and values passed down as leaves), and
    how many packs ran FlexAttention."""
    out, flex, leaves = [], 0, {}
    with torch.no_grad(), fwd.tree_attention_on(model):
        for op in build(rows, "tree", **budget):
            if isinstance(op, Restore):
                del leaves[op.segment]
                continue
            forwarded = fwd.forward(model, op, leaves, tree_attention=kind)
            out.append(forwarded.logp)
            flex += forwarded.flex
            if forwarded.recorded is not None:
                leaves[op.tree.record] = fwd.leaves_of(forwarded.recorded)
    return torch.cat(out), flex


@pytest.mark.parametrize("budget", ["whole tree", "deferred", "recompute"])
def test_flex_logprobs_equal_the_dense_ones_without_gradient(tiny, budget):
    model, _ = tiny
    rows = _rows(3)
    dense, flex_packs = _logprobs(model, rows, "dense", **_budgets(rows)[budget])
    assert flex_packs == 0
    flex, flex_packs = _logprobs(model, rows, "flex", **_budgets(rows)[budget])
    assert flex_packs > 0
    torch.testing.assert_close(flex, dense, rtol=0, atol=TOL)


def test_flex_with_gradients_on_a_cpu_is_one_line_and_auto_picks_dense(tiny):
    model, _ = tiny
    rows = _rows(4)
    advantages = [1.0, -1.0] * (len(rows) // 2)
    with pytest.raises(UsageError, match="packing.attention = flex: FlexAttention has no backward pass on cpu") as err:
        backward(copy.deepcopy(model), rows, advantages, 0, tree_attention="flex")
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="packing.attention: 'sparse' is not one of auto, dense, flex"):
        backward(copy.deepcopy(model), rows, advantages, 0, tree_attention="sparse")
    trained = copy.deepcopy(model)
    assert backward(trained, rows, advantages, 0, tree_attention="auto")["tree_attention_flex_packs"] == 0
    assert any(p.grad is not None for p in trained.parameters())
    with torch.no_grad():  # without gradients, flex runs on a CPU too, and says so
        assert backward(model, rows, advantages, 0, tree_attention="flex", skip_flat=False)[
            "tree_attention_flex_packs"] > 0
    q = torch.zeros(1, 4, 3, 8)
    assert flex_tree.choose("auto", q, q, q, dense=None, flex=None) == "dense"  # nothing timed off CUDA


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="FlexAttention has no backward pass on a CPU: the device check runs this on a GPU")
@pytest.mark.parametrize("budget", ["whole tree", "deferred"])
def test_flex_gradients_equal_the_dense_ones_on_cuda(tiny, budget):
    model = copy.deepcopy(tiny[0]).cuda()
    rows = _rows(5)
    advantages = [0.5, -1.0, 1.0, -0.25] * (len(rows) // 4)
    max_tokens = _budgets(rows)[budget]["max_tokens"]
    grads, stats = {}, {}
    for kind in ("dense", "flex", "auto"):
        trained = copy.deepcopy(model).train()
        stats[kind] = backward(trained, rows, advantages, 0, max_pack_tokens=max_tokens, tree_attention=kind)
        grads[kind] = {n: p.grad for n, p in trained.named_parameters() if p.grad is not None}
    assert stats["dense"]["tree_attention_flex_packs"] == 0 < stats["flex"]["tree_attention_flex_packs"]
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads["dense"].values())).item()
    for kind in ("flex", "auto"):
        gap = max((grads[kind][n] - g).abs().max().item() for n, g in grads["dense"].items())
        assert gap / norm <= 1e-4, kind  # fp32; the GPU's matmuls may round through TF32
        assert stats[kind]["loss"] == pytest.approx(stats["dense"]["loss"], rel=1e-4)
    assert flex_tree._chosen  # auto measured at least one bucket


@pytest.mark.parametrize("value", ["sparse", "FLEX"])
def test_a_tree_attention_outside_its_names_is_one_line_naming_the_field(tmp_path, capsys, value):
    from envace.cli import main

    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set",
                 f"packing.attention={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "packing.attention" in err[0] and "auto, dense, flex" in err[0]
    assert not list(tmp_path.iterdir())  # before any run or model
