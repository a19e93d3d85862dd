"""One pack through the model: the log-probability and entropy of each of its scored tokens.

Only the hidden states that predict a scored token go through the vocabulary projection, in chunks
of `chunk` rows whose logits are recomputed in the backward pass (activation checkpointing of the
head alone), so the head's memory is `chunk × vocab`, whatever the number of completion tokens.

A tree pack (`packing.tree`) runs every attention layer through `tree_attention`, registered with
transformers' attention interface: one attention call over the pack with its tree mask (a token sees its
ancestors and itself; position id = depth), so its hidden state is the one its row's own forward pass
gives. Trees of one pack share no keys: each is its own call (a tree that is one run of tokens, plain
causal attention), so a pack of many small trees does not pay for a mask of their product. Keys and
values of segments forwarded earlier (deferred, `packing.tree.Restore`) come first on the key axis: they
are detached *leaves*, so a child pack's backward pass leaves their gradient on them, and `restore` runs
the deferred segment's own backward pass with it (gradient restoration: exact), recomputing its
activations: a deferred pack keeps only its inputs (activation checkpointing), so the path above a pack
costs its keys and values alone.

A masked call runs one of two kernels (`packing.attention = "dense" | "flex" | "auto"`, chosen once per pack
by `flex_tree.choose`): `dense`, SDPA with an additive `[tokens × keys]` mask, every masked-out pair
computed; or `flex`, FlexAttention with a block mask of the same tree (`kv ≤ q < end(kv)` in preorder,
`flex_tree`), which skips fully masked-out tiles (CUDA for training: it has no backward pass on a CPU).
`auto` is dense on a CPU and measured per pack size on CUDA. Both build their mask once per pack and
every layer reads it.

Why a mask over the pack rather than one call per segment (each over its ancestors' keys gathered,
its own causally): on this CPU the update of a real GRPO step took 75.8 s with the mask and 80.4 s
per segment, at 3,778 against 5,863 MiB peak resident (measured at commit 3503f5d), since every
segment's gathered keys are kept for the backward pass (docs/log/benchmarks-2026-12.md). Packs are small (the
budget defers long shared prefixes), so on a CPU the masked-out pairs cost little.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.nn.attention.flex_attention import BlockMask
from torch.utils.checkpoint import checkpoint

from envace.errors import UsageError
from envace.policy.models import has_dropout
from envace.training import flex_tree
from envace.training.packing import Pack
from envace.training.packing.tree import TreeLayout

TREE_ATTENTION = "envace_tree"


@dataclass
class TreeState:
    """What the attention layers of one tree forward share: the layout, the deferred leaves, the attention kernel
    (`attention` as asked; `kind`, dense or flex, once the first layer has chosen it), and what is recorded."""

    layout: TreeLayout
    leaves: dict[int, list[tuple[torch.Tensor, torch.Tensor]]]  # deferred segment -> per layer (keys, values)
    attention: str = "dense"  # dense | flex | auto (flex_tree.choose)
    kind: str | None = None
    recorded: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    masks: dict[tuple[int, int], torch.Tensor | BlockMask] = field(default_factory=dict)  # per block, every layer's
    layers: int = 0


def tree_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                   envace_tree: TreeState | None = None, **kwargs):
    """transformers' attention interface: (module, q [1,H,N,d], k/v [1,Hkv,N,d], mask) -> ([1,N,H,d], None)."""
    if envace_tree is None:  # not a tree pack (generation, a row or chain pack): plain SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if kwargs.get("sliding_window"):
        raise UsageError("packing = tree: sliding-window attention layers are not supported; use packing = chain")
    state, layer = envace_tree, module.layer_idx
    state.layers = max(state.layers, layer + 1)
    if state.layout.record is not None:  # a deferred segment: its children read these (once: not on recompute)
        state.recorded.setdefault(layer, (key, value))
    if state.layout.external:
        key = torch.cat([state.leaves[s][layer][0] for s in state.layout.external] + [key], dim=2)
        value = torch.cat([state.leaves[s][layer][1] for s in state.layout.external] + [value], dim=2)
    groups = getattr(module, "num_key_value_groups", 1)
    blocks = attention_blocks(state.layout)
    if state.kind is None:
        state.kind = _choose(state, [(blk, keys) for blk, keys, masked in blocks if masked], query, key, value, groups,
                             dropout, scaling)
    outs = []
    for (a, b), (lo, hi), masked in blocks:
        q, k, v = query[:, :, a:b], key[:, :, lo:hi], value[:, :, lo:hi]
        if not masked:
            outs.append(_sdpa(q, k, v, None, groups, dropout, scaling))
            continue
        if (a, b) not in state.masks:
            state.masks[a, b] = _mask(state.kind, state.layout, (a, b), (lo, hi), query.dtype, key.device)
        outs.append(_attend(state.kind, q, k, v, state.masks[a, b], groups, dropout, scaling))
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def attention_blocks(layout: TreeLayout) -> list[tuple[tuple[int, int], tuple[int, int], bool]]:
    """Each block of a pack (its token range), its range on the key axis, and whether it needs a mask: separate
    trees attend on their own, a tree that is one run of tokens plainly causally; with deferred keys above (first
    on the key axis), the pack is one block over all of them."""
    first = layout.segments[0]
    above = first.keys[-1][0] - first.start
    runs = {(seg.start, seg.end) for seg in layout.segments}
    return [((a, b), (0, above + b) if above else (a, b), bool(above) or (a, b) not in runs) for a, b in layout.blocks]


def _choose(state: TreeState, masked, query, key, value, groups: int, dropout: float, scaling) -> str:
    """The pack's kernel (`flex_tree.choose`), timed on its largest masked block when `auto` measures."""
    if not masked:  # every block plain causal: no mask to choose for
        return "dense"
    (a, b), (lo, hi) = max(masked, key=lambda m: m[1][1] - m[1][0])
    q, k, v = query[:, :, a:b], key[:, :, lo:hi], value[:, :, lo:hi]

    def kernel(kind: str):  # the block's kernel, its mask built once for the timed calls
        mask = _mask(kind, state.layout, (a, b), (lo, hi), q.dtype, k.device)
        return lambda q, k, v: _attend(kind, q, k, v, mask, groups, 0.0, scaling)

    return flex_tree.choose(state.attention, q, k, v, lambda: kernel("dense"), lambda: kernel("flex"), dropout)


def _mask(kind: str, layout: TreeLayout, block: tuple[int, int], keys: tuple[int, int], dtype, device):
    """A masked block's mask, built once per pack for every layer: FlexAttention's block mask, or an additive one
    (0 / −inf in the attention's dtype: SDPA would turn a boolean mask into a float copy per layer call, each kept
    for the backward pass, layers × tokens × keys × 4 bytes)."""
    if kind == "flex":
        return flex_tree.tree_block_mask(layout, block, keys, device)
    seen = pack_mask(layout, block, keys, device)
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))


def _attend(kind: str, query, key, value, mask, groups: int, dropout: float, scaling) -> torch.Tensor:
    if kind == "flex":
        return flex_tree.attend(query, key, value, mask, scaling)
    return _sdpa(query, key, value, mask, groups, dropout, scaling)


def _sdpa(query, key, value, mask: torch.Tensor | None, groups: int, dropout: float, scaling) -> torch.Tensor:
    """SDPA over one block: causal without a mask. CPU's kernels take grouped heads with a mask; CUDA's may not."""
    gqa = {}
    if groups > 1 and query.device.type == "cpu":
        gqa = {"enable_gqa": True}
    elif groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                            is_causal=mask is None, scale=scaling, **gqa)


def pack_mask(layout: TreeLayout, block: tuple[int, int], keys: tuple[int, int], device) -> torch.Tensor:
    """[block's tokens × keys] booleans: a token sees its ancestors' keys and, causally, its own segment's
    (`keys`: the block's range on the key axis, which holds every key its segments see)."""
    (a, b), (k0, k1) = block, keys
    mask = torch.zeros(b - a, k1 - k0, dtype=torch.bool, device=device)
    for seg in layout.segments:
        if not a <= seg.start < b:  # blocks hold whole segments
            continue
        rows = slice(seg.start - a, seg.end - a)
        for lo, hi in seg.keys[:-1]:
            mask[rows, lo - k0:hi - k0] = True
        lo, hi = seg.keys[-1]
        mask[rows, lo - k0:hi - k0] = torch.ones(hi - lo, hi - lo, dtype=torch.bool, device=device).tril()
    return mask


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(TREE_ATTENTION, tree_attention)


@contextmanager
def tree_attention_on(model):
    """Route `model`'s attention through `tree_attention` while its tree packs run forward *and* backward
    (checkpointed layers recompute their forward in the backward pass)."""
    _register()
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None
               and hasattr(c, "_attn_implementation")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    for c in configs.values():
        c._attn_implementation = TREE_ATTENTION
    try:
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = before[k]


def _head_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    logp = torch.log_softmax(logits, dim=-1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


def scored_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, chunk: int = 256, rng: bool = True
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(target | hidden) and the entropy of π at each row of `hidden` [K, d], `chunk` rows of logits at a time."""
    head = model.get_output_embeddings()
    logps, entropies = [], []
    for i in range(0, len(targets), chunk):
        h, t = hidden[i:i + chunk], targets[i:i + chunk]
        if torch.is_grad_enabled() and h.requires_grad:
            logp, entropy = checkpoint(_head_logprobs, head, h, t, use_reentrant=False, preserve_rng_state=rng)
        else:
            logp, entropy = _head_logprobs(head, h, t)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:
        return hidden.new_zeros(0), hidden.new_zeros(0)
    return torch.cat(logps), torch.cat(entropies)


@dataclass
class Forwarded:
    """A pack after its forward pass: per scored token its log-prob (with graph) and entropy (without)."""

    logp: torch.Tensor
    entropy: torch.Tensor
    recorded: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # a deferred segment's keys and values
    flex: bool = False  # a tree pack whose masked attention ran FlexAttention


def forward(model, pack: Pack, leaves: dict, chunk: int = 256, tree_attention: str = "dense") -> Forwarded:
    """Forward `pack` (a tree pack needs `tree_attention_on(model)` around this call and its backward);
    `tree_attention`: the kernel of its masked attention (dense | flex | auto: `flex_tree.choose`)."""
    device = next(model.parameters()).device
    rng = has_dropout(model)  # recomputes replay the RNG only if the forward draws from it (`has_dropout`)
    ids = torch.tensor([pack.ids], device=device)
    positions = torch.tensor([pack.positions], device=device)
    extra = {}
    state = None
    if pack.tree is not None:
        state = TreeState(pack.tree, leaves, tree_attention)
        extra["envace_tree"] = state

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        out = model(input_ids=ids, position_ids=positions, output_hidden_states=True, logits_to_keep=1,
                    use_cache=False, **extra)
        return out.hidden_states[-1][0], out.logits[0, -1:]

    if state is not None and pack.tree.record is not None and torch.is_grad_enabled():
        # A deferred segment's graph waits for its children: keep only its inputs and recompute its activations
        # in its backward pass (`restore`), so the path above a pack holds keys and values, not activations
        # (each level would otherwise also hold its own copy of every key above it).
        hidden, last = checkpoint(run, use_reentrant=False, preserve_rng_state=rng)
    else:
        hidden, last = run()
    with torch.no_grad():  # the model's own last logits must be its head on the last hidden state: no soft-cap
        own = model.get_output_embeddings()(hidden[-1:]).float()
        if torch.isfinite(own).all() and not torch.allclose(own, last.float(), rtol=1e-3, atol=1e-3):
            raise UsageError(f"{type(model).__name__}: its logits are not its output embedding of its last hidden "
                             f"state (a final soft-cap or scale?), which this trainer's loss assumes")
    logp, entropy = scored_logprobs(model, hidden[torch.tensor(pack.src, dtype=torch.long, device=device)],
                                    torch.tensor(pack.tgt, dtype=torch.long, device=device), chunk, rng)
    recorded = None
    if state is not None and pack.tree.record is not None:
        if len(state.recorded) != state.layers or not state.layers:
            raise RuntimeError("packing = tree: not every layer attended through the attention interface")
        recorded = [state.recorded[i] for i in range(state.layers)]
    return Forwarded(logp, entropy, recorded, state is not None and state.kind == "flex")


def leaves_of(recorded: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Detached copies of a deferred segment's keys and values that collect their children's gradient."""
    return [(k.detach().requires_grad_(k.requires_grad), v.detach().requires_grad_(v.requires_grad))
            for k, v in recorded]


def restore(loss: torch.Tensor | None, recorded, leaves) -> None:
    """The deferred segment's backward pass: its own loss plus, through its keys and values, its children's."""
    outputs, grads = [], []
    if loss is not None and loss.requires_grad:
        outputs.append(loss)
        grads.append(torch.ones_like(loss))
    for (k, v), (lk, lv) in zip(recorded, leaves, strict=True):
        for out, leaf in ((k, lk), (v, lv)):
            if out.requires_grad and leaf.grad is not None:
                outputs.append(out)
                grads.append(leaf.grad)
    if outputs:
        torch.autograd.backward(outputs, grads)
