"""How a batch of rows becomes forward passes: one `Pack` per pass, built by one strategy per module.

Every strategy produces the same thing, so the loss never branches on it. A pack is one token sequence
(`ids`, with a position id per token) and the *scored tokens* in it: completion token k is predicted by
the hidden state at `src[k]` and is `tgt[k]`. An *entry* is one (row, completion token) of the batch;
`entry_node[e]` is the scored token it reads, so a token shared by several rows' completions (two
rollouts that wrote the same text, in the tree) is projected once and its log-prob counted once per
row that owns it: exactly the per-row sum.

- `row`: every row its own sequence (the reference every other strategy is tested against);
- `chain`: an episode's caller rows joined, each prompt extending the previous row's sequence;
- `tree`: the rows of a step merged into prefix trees, every shared token computed once
  (`tree.py`; the tree-shaped attention is `attention.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from envace.errors import UsageError
from envace.training.packing.chain import chain_packs
from envace.training.packing.pack import Pack, sequence_pack
from envace.training.packing.row import row_packs
from envace.training.packing.tree import tree_packs

__all__ = ["STRATEGIES", "Pack", "Strategy", "build", "sequence_pack"]

Strategy = Literal["tree", "chain", "row"]
STRATEGIES: tuple[str, ...] = ("tree", "chain", "row")


def build(rows: Sequence, strategy: str, max_tokens: int | None = None, recompute: bool = False) -> list:
    """The forward passes of `rows` (objects with `prompt_ids` and `completion_ids`) under `strategy`, in order.

    Row and chain packs are one sequence each. Tree packs hold at most `max_tokens` tokens alive at once
    (`[train.packing] max_tokens`), with deferred segments and their `tree.Restore` between them unless
    `recompute` (FSDP). A row with an empty prompt has no hidden state to predict its first token from.
    """
    for i, row in enumerate(rows):
        if not row.prompt_ids:
            raise ValueError(f"row {i} has an empty prompt: its first completion token has nothing to condition on")
    if strategy == "row":
        return row_packs(rows)
    if strategy == "chain":
        return chain_packs(rows)
    if strategy == "tree":
        return tree_packs(rows, max_tokens, recompute)
    raise UsageError(f"packing: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
