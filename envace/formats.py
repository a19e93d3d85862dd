"""Parsing of model text into tool calls. Model text is parsed and validated, never evaluated.

Caller format (Hermes / Qwen2.5 ChatML): one or more blocks
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; several blocks are parallel calls, and a
block may also hold a JSON list of calls. A message with no ``<tool_call>`` tag is a plain answer that
ends the user turn. One malformed block voids every call of the message (as the reference does), and
the message is classified with a named error kind so the store can count it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from envace.types import ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)

# Parse error kinds, stored verbatim in the `turns.parse_error` column.
UNBALANCED_TAGS = "unbalanced_tags"
JSON_DECODE_ERROR = "json_decode_error"
NOT_A_CALL = "not_a_call"
MISSING_NAME = "missing_name"
BAD_ARGUMENTS = "bad_arguments"


@dataclass(frozen=True)
class ParsedMessage:
    """A caller message split into its calls and its free text.

    `error` is None for a well-formed message (with or without calls), else one of the kinds above.
    """

    calls: list[ToolCall] = field(default_factory=list)
    text: str = ""
    error: str | None = None
    detail: str = ""

    @property
    def is_answer(self) -> bool:
        """True when the message is a plain answer: well-formed and without calls."""
        return self.error is None and not self.calls


def _call_from_json(obj: Any) -> ToolCall | tuple[str, str]:
    if not isinstance(obj, dict):
        return NOT_A_CALL, f"expected an object with name and arguments, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return MISSING_NAME, "the call has no string 'name'"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        # Some models double-encode the arguments; a JSON string holding an object is accepted.
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return BAD_ARGUMENTS, f"arguments string is not JSON: {exc.msg}"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return BAD_ARGUMENTS, f"arguments must be an object, got {type(args).__name__}"
    return ToolCall(name=name.strip(), arguments=args)


def parse_tool_calls(text: str) -> ParsedMessage:
    """Split a caller message into tool calls and text. Never raises."""
    if not isinstance(text, str):
        return ParsedMessage(error=NOT_A_CALL, detail="message is not text")
    opens, closes = text.count(TOOL_CALL_OPEN), text.count(TOOL_CALL_CLOSE)
    if opens == 0 and closes == 0:
        return ParsedMessage(text=text.strip())
    if opens != closes:
        return ParsedMessage(text=text.strip(), error=UNBALANCED_TAGS,
                             detail=f"{opens} opening and {closes} closing tool_call tags")
    calls: list[ToolCall] = []
    for block in _BLOCK.findall(text):
        try:
            obj = json.loads(block.strip())
        except (json.JSONDecodeError, RecursionError) as exc:
            return ParsedMessage(text=text.strip(), error=JSON_DECODE_ERROR, detail=str(exc)[:200])
        for item in obj if isinstance(obj, list) else [obj]:
            parsed = _call_from_json(item)
            if isinstance(parsed, tuple):
                return ParsedMessage(text=text.strip(), error=parsed[0], detail=parsed[1])
            calls.append(parsed)
    if not calls:
        return ParsedMessage(text=text.strip(), error=NOT_A_CALL, detail="tool_call block holds no call")
    return ParsedMessage(calls=calls, text=_BLOCK.sub("", text).strip())


def render_tool_call(call: ToolCall) -> str:
    """The canonical caller text of one call, as the chat template renders an assistant tool call."""
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


# -- rehearser output ------------------------------------------------------------------------------

RESULT_OPEN = "<execution_result>"
RESULT_CLOSE = "</execution_result>"
MAX_RESULT_CHARS = 20_000

# Rehearsal error kinds, stored verbatim in `pairs.rehearsal_error`.
MISSING_RESULT = "missing_result"
UNCLOSED_RESULT = "unclosed_result"
SEVERAL_RESULTS = "several_results"
INVALID_JSON = "invalid_json"
EMPTY_RESULT = "empty_result"
TOO_LONG = "too_long"


@dataclass(frozen=True)
class ParsedResult:
    """A rehearser message: the JSON value inside `<execution_result>`, or a classified error."""

    value: Any = None
    error: str | None = None
    detail: str = ""


def parse_execution_result(text: str) -> ParsedResult:
    """Strictly parse `<execution_result>JSON</execution_result>`. Never raises."""
    if not isinstance(text, str):
        return ParsedResult(error=MISSING_RESULT, detail="message is not text")
    if len(text) > MAX_RESULT_CHARS:
        return ParsedResult(error=TOO_LONG, detail=f"{len(text)} characters")
    opens, closes = text.count(RESULT_OPEN), text.count(RESULT_CLOSE)
    if opens == 0:
        return ParsedResult(error=MISSING_RESULT, detail="no <execution_result> tag")
    if opens > 1 or closes > 1:
        return ParsedResult(error=SEVERAL_RESULTS, detail=f"{opens} results")
    if closes == 0:
        return ParsedResult(error=UNCLOSED_RESULT, detail="no </execution_result> (truncated?)")
    body = text.split(RESULT_OPEN, 1)[1].split(RESULT_CLOSE, 1)[0].strip()
    if not body:
        return ParsedResult(error=EMPTY_RESULT, detail="empty result")
    try:
        return ParsedResult(value=json.loads(body))
    except (json.JSONDecodeError, RecursionError) as exc:
        return ParsedResult(error=INVALID_JSON, detail=str(exc)[:200])


def as_json_value(content: str) -> Any:
    """A tool response as a JSON value: parsed when it is JSON text, else the text as a JSON string."""
    try:
        return json.loads(content)
    except (json.JSONDecodeError, TypeError, RecursionError):
        return content


def is_error_value(value: Any) -> bool:
    """A tool result that reports failure: an object with an `error` key (BFCL's tools and the rehearser alike)."""
    return isinstance(value, dict) and "error" in value


def render_execution_result(value: Any) -> str:
    return f"{RESULT_OPEN}\n{json.dumps(value, ensure_ascii=False)}\n{RESULT_CLOSE}"


def content_of(value: Any) -> str:
    """The text a caller sees for a JSON result value (strings stay bare, as real tools return them)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
