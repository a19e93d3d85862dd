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
from dataclasses import dataclass
from typing import Literal

from envace.errors import UsageError

Strategy = Literal["tree", "chain", "row"]
STRATEGIES: tuple[str, ...] = ("tree", "chain", "row")


@dataclass(frozen=True)
class Pack:
    """One forward pass: a sequence, its scored tokens, and which rows own them."""

    ids: list[int]
    positions: list[int]
    src: list[int]  # per scored token: the index of the hidden state that predicts it
    tgt: list[int]  # per scored token: its token id
    entry_row: list[int]  # per entry: the row (index into the batch)
    entry_token: list[int]  # per entry: which of that row's completion tokens it is
    entry_node: list[int]  # per entry: the scored token holding its log-prob
    tree: object | None = None  # a `tree.TreeLayout` (tree-shaped attention), or None (causal)

    @property
    def rows(self) -> list[int]:
        return sorted(set(self.entry_row))


def sequence_pack(seq: list[int], owners: Sequence[tuple[int, int, int]]) -> Pack:
    """A causal pack of one sequence; `owners` are (row, start, length): row's completion is seq[start:start+length]."""
    src, tgt, entry_row, entry_token, entry_node = [], [], [], [], []
    for row, start, length in owners:
        for t in range(length):
            entry_row.append(row)
            entry_token.append(t)
            entry_node.append(len(src))
            src.append(start + t - 1)
            tgt.append(seq[start + t])
    return Pack(list(seq), list(range(len(seq))), src, tgt, entry_row, entry_token, entry_node)


def build(rows: Sequence, strategy: str, max_tokens: int | None = None, recompute: bool = False) -> list:
    """The forward passes of `rows` (objects with `prompt_ids` and `completion_ids`) under `strategy`, in order.

    Row and chain packs are one sequence each. Tree packs hold at most `max_tokens` tokens alive at once
    (`[train] max_pack_tokens`), with deferred segments and their `tree.Restore` between them unless
    `recompute` (FSDP). A row with an empty prompt has no hidden state to predict its first token from.
    """
    for i, row in enumerate(rows):
        if not row.prompt_ids:
            raise ValueError(f"row {i} has an empty prompt: its first completion token has nothing to condition on")
    if strategy == "row":
        from envace.training.packing.row import row_packs

        return row_packs(rows)
    if strategy == "chain":
        from envace.training.packing.chain import chain_packs

        return chain_packs(rows)
    if strategy == "tree":
        from envace.training.packing.tree import tree_packs

        return tree_packs(rows, max_tokens, recompute)
    raise UsageError(f"packing: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
