"""Fuzzy matching as upstream does it (TOOLS.md §4), on `rapidfuzz`, which reproduces thefuzz's scorers.

Every score is `round(partial_ratio)` over `default_process`-normalized strings; rankings sort by score,
descending, and ties keep candidate order (Python's sort is stable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

T = TypeVar("T")


def score(query: str, candidate: str) -> int:
    """Normalized partial ratio, 0..100 (0 when either side normalizes to nothing)."""
    a, b = default_process(query), default_process(candidate)
    if not a or not b:
        return 0
    return round(fuzz.partial_ratio(a, b))


def keyword_query(keywords: object) -> str:
    """Search keywords concatenated with no separator (`["rice", "noodle"]` → `ricenoodle`); a string as is."""
    if isinstance(keywords, str):
        return keywords
    return "".join(str(k) for k in keywords) if isinstance(keywords, list | tuple) else str(keywords)


def rank(query: str, records: Sequence[T], text: Callable[[T], str]) -> list[T]:
    """Every record, best first. Records with identical candidate texts collapse to the last of them,
    which is then listed once per occurrence (upstream maps texts back to records through a dict)."""
    texts = [text(r) for r in records]
    by_text = {t: r for t, r in zip(texts, records, strict=True)}
    scored = sorted(((score(query, t), i) for i, t in enumerate(texts)), key=lambda s: -s[0])
    return [by_text[texts[i]] for _, i in scored]


def best(query: str, candidates: Sequence[str]) -> tuple[str, int] | None:
    """The first best-scoring candidate and its score; None without candidates."""
    top: tuple[str, int] | None = None
    for candidate in candidates:
        s = score(query, candidate)
        if top is None or s > top[1]:
            top = (candidate, s)
    return top


def geocode_match(query: str, candidates: Sequence[str]) -> str | None:
    """The known address a typed one geocodes to: best partial ratio ≥ 30 and raw `fuzz.ratio` ≥ 20."""
    top = best(query, candidates)
    if top is None or top[1] < 30 or round(fuzz.ratio(query, top[0])) < 20:
        return None
    return top[0]
