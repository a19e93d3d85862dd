"""FlexAttention for a tree pack: its tree mask as a block mask, so fully masked-out tiles are skipped.

A pack's key axis is a forest in DFS preorder: the deferred segments above the pack (one root path)
first, then the pack's own segments, pack token i at key `above + i` (`packing.tree`; `above` = keys −
queries). In preorder a node's subtree is the interval [node, end(node)), so a query at key position p
sees exactly its ancestors and itself:

    visible(p, k)  ⇔  k ≤ p < end(k),

with end(k) one past the last key of k's subtree. Every token of a radix segment s has the same
descendants after itself (the rest of s, then s's children), so end(k) = end(s): the largest own-key end
of the segments that see s (s included). That is one int32 per key, read from the layout's `SegmentKeys`
alone (`key_ends`); `mask_mod` is two comparisons and one gather, and `create_block_mask` turns it into
128 × 128 tiles (lengths need not be multiples of 128: the last tiles are padded and the kernels bound their
indices). A tile with no visible pair is never computed, a fully visible one skips the mask. The block
mask is built once per pack block and read by every layer (`forward.TreeState.masks`), as the dense
additive mask is; heads are not materialised (`enable_gqa`: K/V keep their own head count).

Which kernel runs (`packing.attention = "dense" | "flex" | "auto"`, `choose`):

* `dense`: SDPA with the additive `[tokens × keys]` mask (`forward.pack_mask`), every masked-out pair computed;
* `flex`: this module; FlexAttention has no backward pass on a CPU, so `flex` with gradients there is a
  `UsageError` (its forward without gradient runs eagerly on a CPU, which is what the CPU tests use);
* `auto`: dense off CUDA. On CUDA, by measurement per bucket of the key count (the next power of two)
  and attention shape (heads, KV heads, head dim, dtype): the first pack of a bucket times both kernels on
  its own q/k/v (its largest masked block, one layer, forward + backward, one warm-up and three timed reps,
  synchronised; masks prebuilt, since each is built once per pack), and the faster serves that bucket for
  the rest of the process. Why measure: FlexAttention packing has been reported at 0.72× the speed of its
  baseline at 512 tokens and 2.34× at 8,192 on an H200 (a 125M model; not measured here), so the crossover
  depends on the pack's size and the model. What ran is visible: `backward`'s `tree_attention_flex_packs`
  counts the packs that ran FlexAttention, and each bucket's choice is logged (INFO, with both timings).

On CUDA FlexAttention runs compiled (`torch.compile(flex_attention)`: eager materialises the scores);
pack lengths vary, so after the first recompile dynamo treats them as dynamic.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from functools import cache

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from envace.errors import UsageError
from envace.training.packing.tree import TreeLayout

KINDS = ("auto", "dense", "flex")
_log = logging.getLogger(__name__)
_chosen: dict[tuple, str] = {}  # (bucket, heads, kv heads, head dim, dtype, device) -> "dense" | "flex"


def key_ends(layout: TreeLayout, block: tuple[int, int], keys: tuple[int, int]) -> torch.Tensor:
    """[keys] int32, block-local: one past the last key of each key's subtree on the key axis (module docstring).
    A key no query of the block sees keeps 0 (visible to none)."""
    (a, b), (k0, k1) = block, keys
    end = torch.zeros(k1 - k0, dtype=torch.int32)
    for seg in layout.segments:
        if not a <= seg.start < b:  # blocks hold whole segments
            continue
        own_end = seg.keys[-1][1] - k0
        for lo, hi in seg.keys:  # every key this segment sees has it in its subtree
            end[lo - k0:hi - k0].clamp_(min=own_end)
    return end


def tree_mask_mod(layout: TreeLayout, block: tuple[int, int], keys: tuple[int, int], device) -> Callable:
    """mask_mod(b, h, q, kv) of the block: `kv ≤ p < end(kv)` with p = q + (keys − queries), the query's key."""
    end = key_ends(layout, block, keys).to(device)
    # the deferred keys above the block, first on the key axis; a tensor, as `end`, so that a compiled kernel takes
    # both as inputs (a captured int would be a constant: one recompilation per value)
    shift = torch.tensor((keys[1] - keys[0]) - (block[1] - block[0]), dtype=torch.int32, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        p = q_idx + shift
        return (kv_idx <= p) & (p < end[kv_idx])

    return mask_mod


def tree_block_mask(layout: TreeLayout, block: tuple[int, int], keys: tuple[int, int], device) -> BlockMask:
    """The block's FlexAttention `BlockMask` (one batch, shared by every head), built once and read by every layer."""
    mask_mod = tree_mask_mod(layout, block, keys, device)
    return create_block_mask(mask_mod, None, None, block[1] - block[0], keys[1] - keys[0], device=device)


def tiles(block_mask: BlockMask) -> tuple[int, int]:
    """(tiles computed, tiles in all) of a one-batch, one-head block mask (`BlockMask.sparsity` counts padded
    lengths as if whole tiles were real, so it goes negative on unaligned ones)."""
    computed = block_mask.kv_num_blocks.sum().item()
    if block_mask.full_kv_num_blocks is not None:
        computed += block_mask.full_kv_num_blocks.sum().item()
    (q_len, kv_len), (q_tile, kv_tile) = block_mask.seq_lengths, block_mask.BLOCK_SIZE
    return int(computed), -(-q_len // q_tile) * -(-kv_len // kv_tile)


@cache
def _compiled() -> Callable:
    return torch.compile(flex_attention)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: BlockMask,
           scale: float | None) -> torch.Tensor:
    """q [1,H,n,d], k/v [1,Hkv,keys,d] -> [1,H,n,d]: compiled on CUDA, eager elsewhere (forward only off CUDA)."""
    gqa = query.shape[1] != key.shape[1]
    if query.device.type == "cuda":
        return _compiled()(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    with warnings.catch_warnings():  # eager is the only FlexAttention a CPU forward needs: its notice is noise here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)


def check(kind: str, device: torch.device | str, grad: bool) -> None:
    """`kind` is one of KINDS, and `flex` has a backward pass where gradients are needed: one line otherwise."""
    if kind not in KINDS:
        raise UsageError(f"packing.attention: '{kind}' is not one of {', '.join(KINDS)}")
    device_type = torch.device(device).type
    if kind == "flex" and grad and device_type != "cuda":
        raise UsageError(f"packing.attention = flex: FlexAttention has no backward pass on {device_type} (CUDA only); "
                         f"use packing.attention = dense or auto")


def choose(kind: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dense: Callable,
           flex: Callable, dropout: float = 0.0) -> str:
    """The kernel, `dense` or `flex`, of a pack whose largest masked block has these q/k/v (`auto`: by the rule of
    the module docstring); `dense()` and `flex()` build that block's mask and return its kernel, (q, k, v) -> out."""
    check(kind, query.device, torch.is_grad_enabled() and query.requires_grad)
    if kind == "flex" and dropout:
        raise UsageError("packing.attention = flex: FlexAttention has no attention dropout; use packing.attention = "
                         "dense")
    if kind != "auto":
        return kind
    if query.device.type != "cuda" or dropout:
        return "dense"
    keys = key.shape[2]
    bucket = (1 << max(keys - 1, 0).bit_length(), query.shape[1], key.shape[1], query.shape[-1], query.dtype,
              query.device)
    if bucket not in _chosen:
        seconds = {"dense": _seconds(dense(), query, key, value)}
        try:
            seconds["flex"] = _seconds(flex(), query, key, value)
        except Exception as exc:  # noqa: BLE001  (a kernel that fails to compile here is not a choice, not a crash)
            _log.warning("tree_attention auto: FlexAttention failed on this device (%s); dense attention is used",
                         str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            seconds["flex"] = float("inf")
        _chosen[bucket] = min(seconds, key=seconds.get)
        _log.info("tree_attention auto: %s for masked blocks of %d to %d keys (measured on q %s: dense %.2f ms, "
                  "flex %.2f ms per layer, forward + backward)", _chosen[bucket], bucket[0] // 2 + 1, bucket[0],
                  tuple(query.shape), 1e3 * seconds["dense"], 1e3 * seconds["flex"])
    return _chosen[bucket]


def _seconds(run: Callable, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, reps: int = 3) -> float:
    """Seconds of one forward + backward of `run` on detached copies of q/k/v (one warm-up: compilation)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (query, key, value))

    def once() -> None:
        run(q, k, v).sum().backward()

    # A layer may run under activation checkpointing, whose saved-tensor hooks would capture this side graph:
    # identity hooks on top keep the measurement's own saved tensors plain.
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        once()
        torch.cuda.synchronize(query.device)
        start = time.perf_counter()
        for _ in range(reps):
            once()
        torch.cuda.synchronize(query.device)
    return (time.perf_counter() - start) / reps
