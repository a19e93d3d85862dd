"""A pack: one forward pass of the update (the package docstring says what every strategy builds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
