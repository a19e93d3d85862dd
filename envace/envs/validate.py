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


def _type_ok(value: Any, json_type: Any) -> bool:
    if isinstance(json_type, list):  # JSON Schema's ["string", "null"]: any of them
        return not json_type or any(_type_ok(value, t) for t in json_type)
    if not isinstance(json_type, str) or json_type not in _JSON_TYPES:
        return True  # "any", an unknown type name, or none: the tool itself decides
    if isinstance(value, bool) and json_type in ("integer", "number"):
        return False  # bool is an int in Python, never in JSON Schema
    if json_type == "integer" and isinstance(value, float):
        return value.is_integer()  # JSON Schema: an integer is a number with a zero fractional part, 1.0 too
    return isinstance(value, _JSON_TYPES[json_type])


def check_arguments(arguments: dict[str, Any], parameters: dict[str, Any]) -> str | None:
    """Return None when `arguments` fit the schema's top-level `parameters`, else the first problem.

    Checked: required keys present, no unknown keys, JSON types of each given value (an integer is a
    valid number, and a number like 1.0 a valid integer, as JSON Schema says), and enums. Nested objects are
    left to the tool itself.
    """
    if not isinstance(parameters, dict) or not isinstance(arguments, dict):
        return "the tool's parameters or the call's arguments are not objects"
    props: dict[str, Any] = parameters.get("properties", {}) if isinstance(parameters.get("properties"), dict) else {}
    required = parameters.get("required", [])
    for key in required if isinstance(required, list) else []:
        if isinstance(key, str) and key not in arguments:  # a non-string name can name no argument
            return f"missing required parameter '{key}'"
    for key, value in arguments.items():
        if key not in props:
            return f"unknown parameter '{key}'"
        spec = props[key] if isinstance(props[key], dict) else {}
        if not _type_ok(value, spec.get("type")):
            return f"parameter '{key}' should be {spec.get('type')}, got {type(value).__name__}"
        if isinstance(spec.get("enum"), list) and value not in spec["enum"]:
            return f"parameter '{key}' must be one of {spec['enum']}"
    return None


def check_call(call: ToolCall, tools: dict[str, dict[str, Any]], arguments: bool = True) -> tuple[str, str] | None:
    """Validate a call against the episode's tools (name → OpenAI function schema); its arguments too unless
    `arguments` is False (`Environment.validate_arguments`).

    Returns None when the call may be dispatched, else (error kind, message).
    """
    schema = tools.get(call.name)
    if not isinstance(schema, dict):
        return TOOL_NOT_AVAILABLE, f"tool '{call.name}' is not available"
    problem = check_arguments(call.arguments, schema.get("parameters", {})) if arguments else None
    if problem:
        return INVALID_PARAMETERS, problem
    return None
