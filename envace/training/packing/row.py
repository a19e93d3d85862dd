"""`row` packing: every row is its own forward pass (what a per-row trainer such as TRL's does)."""

from __future__ import annotations

from collections.abc import Sequence

from envace.training.packing.pack import Pack, sequence_pack


def row_packs(rows: Sequence) -> list[Pack]:
    return [sequence_pack(r.prompt_ids + r.completion_ids, [(i, len(r.prompt_ids), len(r.completion_ids))])
            for i, r in enumerate(rows)]
