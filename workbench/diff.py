"""Structural diff of two tool responses: what the rehearser got wrong, key by key.

Responses are JSON text (or any string). Both are parsed; the diff walks them together and reports
each difference at its JSON path:

- `missing`: in the real response, absent from the rehearsed one;
- `added`: in the rehearsed response only (invented);
- `type_changed`: same path, different JSON types (e.g. a number rehearsed as a string);
- `value_changed`: same type, different value; numbers also carry their `drift` (rehearsed − real).

Lists are aligned by their longest common subsequence of equal items, not by index: dropping the first
of `["a", "b", "c"]` is one missing item, not two changed values and a missing one (what BFCL's `ls` and
`find` results need). Items left unmatched between two aligned ones are compared in order with the next
item of the same JSON type on the other side; the rest are missing or added. A change's `path` is where it
stands in the real response (an added one: in the rehearsed response); `rehearsed_path` says where a
changed value stands in the rehearsed one when that differs.
A response that is not JSON is compared as one string value at the root path `$`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # missing | added | type_changed | value_changed
    real: Any = None
    rehearsed: Any = None
    drift: float | None = None
    rehearsed_path: str | None = None  # where it stands in the rehearsed response, when not at `path`

    @property
    def at_rehearsed(self) -> str:
        return self.rehearsed_path or self.path


def _parse(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def _kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _aligned(real: list, rehearsed: list) -> list[tuple[int | None, int | None]]:
    """Index pairs (i, j) in order: equal items matched by a longest common subsequence, and in each gap
    between two matches the leftover items paired in order with the next of the same JSON type (None where none
    is left)."""
    a, b = [_key(x) for x in real], [_key(x) for x in rehearsed]
    lcs = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) - 1, -1, -1):
        for j in range(len(b) - 1, -1, -1):
            lcs[i][j] = lcs[i + 1][j + 1] + 1 if a[i] == b[j] else max(lcs[i + 1][j], lcs[i][j + 1])
    matches, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            matches.append((i, j))
            i, j = i + 1, j + 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            i += 1
        else:
            j += 1
    out, i, j = [], 0, 0
    for mi, mj in [*matches, (len(a), len(b))]:
        free = list(range(j, mj))
        for x in range(i, mi):  # leftovers: the next one of the same JSON type, else missing
            y = next((y for y in free if _kind(rehearsed[y]) == _kind(real[x])), None)
            if y is not None:
                free.remove(y)
            out.append((x, y))
        out += [(None, y) for y in free]
        if mi < len(a):
            out.append((mi, mj))
        i, j = mi + 1, mj + 1
    return out


def _walk(path: str, real: Any, rehearsed: Any, out: list[Change], rehearsed_path: str | None = None) -> None:
    at = rehearsed_path if rehearsed_path not in (None, path) else None
    if _kind(real) != _kind(rehearsed):
        out.append(Change(path, "type_changed", real, rehearsed, rehearsed_path=at))
    elif isinstance(real, dict):
        other = at or path
        for key in real:
            if key not in rehearsed:
                out.append(Change(f"{path}.{key}", "missing", real[key], None))
            else:
                _walk(f"{path}.{key}", real[key], rehearsed[key], out, f"{other}.{key}")
        out.extend(Change(f"{other}.{key}", "added", None, rehearsed[key]) for key in rehearsed if key not in real)
    elif isinstance(real, list):
        other = at or path
        for i, j in _aligned(real, rehearsed):
            if j is None:
                out.append(Change(f"{path}[{i}]", "missing", real[i], None))
            elif i is None:
                out.append(Change(f"{other}[{j}]", "added", None, rehearsed[j]))
            else:
                _walk(f"{path}[{i}]", real[i], rehearsed[j], out, f"{other}[{j}]")
    elif real != rehearsed:
        drift = float(rehearsed) - float(real) if _kind(real) == "number" else None
        out.append(Change(path, "value_changed", real, rehearsed, drift, rehearsed_path=at))


def json_diff(real: str | None, rehearsed: str | None) -> list[Change]:
    """Every structural difference between a real and a rehearsed response (empty when they agree)."""
    out: list[Change] = []
    _walk("$", _parse(real), _parse(rehearsed), out)
    return out


def diff_rows(real: str | None, rehearsed: str | None) -> list[dict[str, Any]]:
    """`json_diff` as table rows, values rendered as compact JSON (for DataFrames and the app)."""
    def show(v: Any) -> str:
        return "" if v is None else json.dumps(v, ensure_ascii=False)[:200]

    return [{"path": c.path, "kind": c.kind, "real": show(c.real), "rehearsed": show(c.rehearsed),
             "drift": c.drift} for c in json_diff(real, rehearsed)]
