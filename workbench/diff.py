"""Structural diff of two tool responses: what the rehearser got wrong, key by key.

Responses are JSON text (or any string). Both are parsed; the diff walks them together and reports
each difference at its JSON path:

- `missing`: in the real response, absent from the rehearsed one;
- `added`: in the rehearsed response only (invented);
- `type_changed`: same path, different JSON types (e.g. a number rehearsed as a string);
- `value_changed`: same type, different value; numbers also carry their `drift` (rehearsed − real).

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


def _walk(path: str, real: Any, rehearsed: Any, out: list[Change]) -> None:
    if _kind(real) != _kind(rehearsed):
        out.append(Change(path, "type_changed", real, rehearsed))
    elif isinstance(real, dict):
        for key in real:
            if key not in rehearsed:
                out.append(Change(f"{path}.{key}", "missing", real[key], None))
            else:
                _walk(f"{path}.{key}", real[key], rehearsed[key], out)
        out.extend(Change(f"{path}.{key}", "added", None, rehearsed[key]) for key in rehearsed if key not in real)
    elif isinstance(real, list):
        for i in range(max(len(real), len(rehearsed))):
            if i >= len(rehearsed):
                out.append(Change(f"{path}[{i}]", "missing", real[i], None))
            elif i >= len(real):
                out.append(Change(f"{path}[{i}]", "added", None, rehearsed[i]))
            else:
                _walk(f"{path}[{i}]", real[i], rehearsed[i], out)
    elif real != rehearsed:
        drift = float(rehearsed) - float(real) if _kind(real) == "number" else None
        out.append(Change(path, "value_changed", real, rehearsed, drift))


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
