"""Checking a parsed call against an OpenAI-style tool schema before anything is dispatched."""

from __future__ import annotations

from typing import Any

from envace.types import ToolCall

TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
INVALID_PARAMETERS = "INVALID_PARAMETERS"

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


def _type_ok(value: Any, json_type: str | None) -> bool:
    if json_type is None or json_type == "any" or json_type not in _JSON_TYPES:
        return True
    if isinstance(value, bool) and json_type in ("integer", "number"):
        return False  # bool is an int in Python, never in JSON Schema
    return isinstance(value, _JSON_TYPES[json_type])


def check_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """Return None when `arguments` fit the schema's top-level `parameters`, else the first problem.

    Checked: required keys present, no unknown keys, JSON types of each given value (an integer is a
    valid number), and enums. Nested objects are left to the tool itself.
    """
    props: dict[str, Any] = parameters.get("properties", {}) or {}
    for key in parameters.get("required", []) or []:
        if key not in arguments:
            return f"missing required parameter '{key}'"
    for key, value in arguments.items():
        if key not in props:
            return f"unknown parameter '{key}'"
        spec = props[key] or {}
        if not _type_ok(value, spec.get("type")):
            return f"parameter '{key}' should be {spec.get('type')}, got {type(value).__name__}"
        if "enum" in spec and value not in spec["enum"]:
            return f"parameter '{key}' must be one of {spec['enum']}"
    return None


def check_call(call: ToolCall, tools: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """Validate a call against the episode's tools (name → OpenAI function schema).

    Returns None when the call may be dispatched, else (error kind, message).
    """
    schema = tools.get(call.name)
    if schema is None:
        return TOOL_NOT_AVAILABLE, f"tool '{call.name}' is not available"
    problem = check_arguments(call.arguments, schema.get("parameters", {}))
    if problem:
        return INVALID_PARAMETERS, problem
    return None
