"""BFCL's fixed split: item (or multi-turn scenario) k is test when k % 4 == 3, train otherwise."""

from __future__ import annotations

from typing import Any

from envace.errors import UsageError
from envace.types import Split


def split_of(k: int) -> str:
    return Split.TEST if k % 4 == 3 else Split.TRAIN


def chosen(items: Any, split: str, limit: int | None, offset: int) -> list[tuple[int, Any]]:
    """(k, item) for the items of `split` (`all`: every one) in order, sliced by `offset` and `limit` after it."""
    if split not in tuple(Split):
        raise UsageError(f"unknown split '{split}' (choose from train, test, all)")
    picked = [(k, item) for k, item in enumerate(items) if split == Split.ALL or split_of(k) == split]
    return picked[offset: None if limit is None else offset + limit]
