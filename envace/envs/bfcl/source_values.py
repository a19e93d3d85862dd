"""A possible answer's value written as a Java or JavaScript caller writes it: source text, what BFCL's checker reads.

BFCL's Java and JavaScript items take every argument as a string of source text (`"true"`, `"3.5f"`, `new
ArrayList<>(Arrays.asList("a", "b"))`), which the checker turns back into a value with its type converters
(`ast_eval/type_convertor`); the possible answers hold the values. Replaying the gold through the checker
(`envace check-env bfcl`) needs the other direction: `as_source(value, schema, language)` writes a value so
that the converter for the parameter's declared type reads it back as that value.
"""

from __future__ import annotations

import json
from typing import Any


def _number(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _java(value: Any, schema: dict[str, Any]) -> str:
    kind, nested = schema.get("type"), (schema.get("items") or {}).get("type")
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "float" and isinstance(value, int | float):
        return f"{_number(float(value))}f"
    if kind == "long" and isinstance(value, int):
        return f"{value}L"
    if kind == "Array" and isinstance(value, list):
        return "new Object[]{" + ", ".join(_java(e, {"type": nested}) for e in value) + "}"
    if kind == "ArrayList" and isinstance(value, list):
        if not value:
            return "new ArrayList<>()"
        quote = {"String": '"', "char": "'"}.get(nested, "")
        items = (f"{quote}{e}{quote}" if quote else _java(e, {"type": nested}) for e in value)
        return "new ArrayList<>(Arrays.asList(" + ", ".join(items) + "))"
    if kind == "HashMap" and isinstance(value, dict):
        return "new HashMap<String, Object>() {{ " + " ".join(
            f'put("{k}", {_java_literal(v)});' for k, v in value.items()) + " }}"
    return _number(value) if isinstance(value, int | float) else str(value)


def _java_literal(value: Any) -> str:
    """A value as `parse_java_value` reads it without a declared type: strings quoted, numbers and booleans bare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return _number(value) if isinstance(value, int | float) else f'"{value}"'


def _js(value: Any, schema: dict[str, Any]) -> str:
    kind, nested = schema.get("type"), (schema.get("items") or {}).get("type")
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "Bigint" and isinstance(value, int):
        return f"{value}n"
    if kind == "array" and isinstance(value, list):
        if nested:
            return "[" + ", ".join(f'"{e}"' if isinstance(e, str) else _js(e, {"type": nested}) for e in value) + "]"
        return "[" + ", ".join(_js_literal(e) for e in value) + "]"
    if kind == "dict" and isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_js_literal(v)}" for k, v in value.items()) + "}"
    return _number(value) if isinstance(value, int | float) else str(value)


def _js_literal(value: Any) -> str:
    """A value as `parse_js_value` (or a nested collection) reads it: strings quoted, lists and objects in JS."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_js_literal(e) for e in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_js_literal(v)}" for k, v in value.items()) + "}"
    return _number(value) if isinstance(value, int | float) else json.dumps(value)


def as_source(value: Any, schema: dict[str, Any], language: str) -> str:
    """`value` as Java or JavaScript source text for a parameter declared by `schema` (BFCL's own type names)."""
    return _java(value, schema) if language == "Java" else _js(value, schema)
