"""BFCL call strings <-> parsed calls, without ever evaluating text.

Ground truth is stored as Python call strings (`mv(source='a', destination='b')`, sometimes with
positional arguments). They are read with `ast` and `ast.literal_eval` on each argument node only.
The official checker takes call strings too; `to_call_string` writes them from validated calls, with
every value rendered by `repr` of a JSON value, so what it executes is exactly what we executed.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from envace.types import ToolCall


def parse_call_string(text: str, positional_names: Callable[[str], list[str]]) -> ToolCall:
    """Parse one ground-truth call string; `positional_names(fn)` maps positions to parameter names."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    args: dict[str, Any] = {}
    if node.args:
        names = positional_names(name)
        for pos, arg in enumerate(node.args):
            args[names[pos]] = ast.literal_eval(arg)
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"**kwargs are not supported: {text!r}")
        args[kw.arg] = ast.literal_eval(kw.value)
    return ToolCall(name=name, arguments=args)


def to_call_string(call: ToolCall) -> str:
    """`name(k=v, ...)` with each value as a Python literal of its JSON value."""
    if not call.name.isidentifier() or any(not k.isidentifier() for k in call.arguments):
        raise ValueError(f"not a valid identifier in call {call.name}")
    inner = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    return f"{call.name}({inner})"


def checker_calls(step: list[ToolCall]) -> list[str]:
    """The call strings of one step, for the official checker, leaving out any call no call string can
    write (an argument name that is not an identifier, as `touch({"file name": "a"})`).

    Leaving it out gives the checker's verdict on what the model did: the checker `eval`s each string, so
    that call could only fail there with an error result and change no state, and its state and response
    checks compare states and the gold results, which no error of a malformed call can equal.
    """
    out = []
    for call in step:
        try:
            out.append(to_call_string(call))
        except ValueError:
            continue
    return out
