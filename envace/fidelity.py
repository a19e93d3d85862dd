"""World-model fidelity: how close a rehearsed tool response is to the real one.

Every metric is a small pure function of the two responses as the caller sees them (text; JSON when
it parses) and never raises. `score_pair` bundles them for the `pairs` table; the embedding cosine
lives in `embedding.py` because it needs a model. Error flags follow the benchmark's own failure convention
(`Benchmark.is_error`): the rehearser applies it to what it writes, `real_error` to the real response.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from difflib import SequenceMatcher
from typing import Any

from envace.envs.benchmark import json_error
from envace.formats import as_json_value
from envace.types import ToolResult

_MISSING = object()
_SIMILARITY_CHARS = 4000  # difflib is quadratic; long-context responses are compared on their head


def canonical(value: Any) -> str:
    """One text per JSON value: sorted keys, no whitespace, unicode kept."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def call_key(calls: list) -> list[tuple[str, str]]:
    """The calls of a caller message as comparable (name, canonical arguments): the action it takes."""
    return [(c.name, canonical(c.arguments)) for c in calls]


def _parse(text: str | None) -> Any:
    return _MISSING if text is None else as_json_value(text)


def _paths(value: Any, prefix: str = "$") -> Iterator[str]:
    """Key paths of a JSON value's structure; list items share one `[]` path."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield f"{prefix}.{key}"
            yield from _paths(child, f"{prefix}.{key}")
    elif isinstance(value, list):
        for child in value:
            yield f"{prefix}[]"
            yield from _paths(child, f"{prefix}[]")


def _leaves(value: Any, prefix: str = "$") -> Iterator[tuple[str, Any]]:
    """(path, scalar) for every leaf; list items keep their index here."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _leaves(child, f"{prefix}.{key}")
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _leaves(child, f"{prefix}[{i}]")
    else:
        yield prefix, value


def _json_kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, int | float) else type(value).__name__


def _same_value(a: Any, b: Any, rel_tol: float) -> bool:
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def valid_json(rehearsed: str | None) -> float:
    """1.0 when the rehearsed response is JSON text (a bare string result counts as invalid), else 0.0."""
    if rehearsed is None:
        return 0.0
    try:
        json.loads(rehearsed)
        return 1.0
    except (ValueError, RecursionError):  # malformed, or past the int-digit or nesting limits
        return 0.0


def exact_match(real: str | None, rehearsed: str | None) -> float:
    """1.0 when both are the same JSON value after canonical normalisation (key order, spacing), else 0.0."""
    a, b = _parse(real), _parse(rehearsed)
    if a is _MISSING or b is _MISSING:
        return 0.0
    return float(canonical(a) == canonical(b))


def structure_f1(real: str | None, rehearsed: str | None) -> float:
    """F1 of the key-path sets (keys and nesting). 1.0: same structure; 0.0: no shared key (or missing).

    Two scalars have no keys: 1.0 when they are the same JSON kind (number, string, …), else 0.0.
    """
    a, b = _parse(real), _parse(rehearsed)
    if a is _MISSING or b is _MISSING:
        return 0.0
    try:
        pa, pb = set(_paths(a)), set(_paths(b))
    except RecursionError:
        return 0.0
    if not pa and not pb:
        return float(_json_kind(a) == _json_kind(b))
    shared = len(pa & pb)
    return 0.0 if not shared else 2 * shared / (len(pa) + len(pb))


def value_accuracy(real: str | None, rehearsed: str | None, rel_tol: float = 1e-3) -> float:
    """Share of the real response's leaf values that the rehearsal has at the same path.

    Numbers match within `rel_tol`; other scalars must be equal and of the same type. 1.0: every real
    leaf reproduced; 0.0: none (or missing). An empty real container scores 1.0 only on an exact match.
    """
    a, b = _parse(real), _parse(rehearsed)
    if a is _MISSING or b is _MISSING:
        return 0.0
    try:
        real_leaves = list(_leaves(a))
        other = dict(_leaves(b))
    except RecursionError:
        return 0.0
    if not real_leaves or (len(real_leaves) == 1 and real_leaves[0][0] == "$" and isinstance(a, list | dict)):
        return float(canonical(a) == canonical(b))
    hits = sum(1 for path, value in real_leaves if path in other and _same_value(value, other[path], rel_tol))
    return hits / len(real_leaves)


def real_error(result: ToolResult, is_error: Callable[[str], bool] = json_error) -> bool:
    """Whether a real response failed: the environment flagged it, or its text reports a failure in the benchmark's
    convention (`Benchmark.is_error`, the same test the rehearsed side is held to)."""
    return result.is_error or bool(is_error(result.content))


def error_agreement(real_error: bool | None, rehearsed_error: bool | None) -> str:
    """`both_error`, `both_ok`, `false_error` (rehearsal invents a failure), `missed_error`, or
    `no_rehearsal` when `rehearsed_error` is None (a malformed rehearsal agrees with nothing)."""
    if rehearsed_error is None:
        return "no_rehearsal"
    real_error, rehearsed_error = bool(real_error), bool(rehearsed_error)
    if real_error == rehearsed_error:
        return "both_error" if real_error else "both_ok"
    return "false_error" if rehearsed_error else "missed_error"


def string_similarity(real: str | None, rehearsed: str | None) -> float:
    """difflib ratio of the canonical texts: 1.0 identical, 0.0 nothing in common (or missing)."""
    a, b = _parse(real), _parse(rehearsed)
    if a is _MISSING or b is _MISSING:
        return 0.0
    return SequenceMatcher(None, canonical(a)[:_SIMILARITY_CHARS], canonical(b)[:_SIMILARITY_CHARS],
                           autojunk=False).ratio()


def copied(rehearsed: str | None, examples: list[str]) -> bool:
    """True when the rehearsal is, canonically, one of the few-shot results its prompt showed."""
    b = _parse(rehearsed)
    if b is _MISSING:
        return False
    text = canonical(b)
    return any(canonical(as_json_value(e)) == text for e in examples)


def score_pair(real: str | None, rehearsed: str | None, real_error: bool | None, rehearsed_error: bool | None,
               examples: list[str]) -> dict[str, Any]:
    """Every text metric of one pair, keyed by its `pairs` column name."""
    agreement = error_agreement(real_error, rehearsed_error)
    return {
        "valid_json": valid_json(rehearsed), "exact": exact_match(real, rehearsed),
        "structure_f1": structure_f1(real, rehearsed), "value_acc": value_accuracy(real, rehearsed),
        "error_agreement": agreement, "error_agree": float(agreement.startswith("both")),
        "string_sim": string_similarity(real, rehearsed), "copied": copied(rehearsed, examples),
    }
