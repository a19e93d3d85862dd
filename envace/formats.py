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

# Parse error kinds, stored verbatim in the `generations.parse_error` column.
UNBALANCED_TAGS = "unbalanced_tags"
JSON_DECODE_ERROR = "json_decode_error"
NOT_A_CALL = "not_a_call"
MISSING_NAME = "missing_name"
BAD_ARGUMENTS = "bad_arguments"
MESSAGE_TOO_LONG = "message_too_long"
MAX_MESSAGE_CHARS = 100_000


def _loads(text: str) -> tuple[Any, str | None]:
    """(value, None) for JSON text, else (None, why): never raises. Besides malformed JSON this refuses what
    Python's decoder raises on outside `JSONDecodeError` (an integer past the int-string limit, nesting past
    the recursion limit) and text no UTF-8 store or tokenizer can hold (an escaped lone surrogate)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; so is the int-digit limit
        return None, str(exc)[:200] or type(exc).__name__
    bad = _unencodable(value)
    return (None, bad) if bad else (value, None)


def _unencodable(value: Any) -> str | None:
    """Why `value` cannot be written as UTF-8 (a lone surrogate in a string or key), walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "text holds an unpaired surrogate"
        elif isinstance(item, dict):
            stack += list(item.keys()) + list(item.values())
        elif isinstance(item, list):
            stack += item
    return None


def _pairs(text: str, open_tag: str, close_tag: str) -> list[tuple[int, int]] | None:
    """The (start, end) of each `open_tag … close_tag` block in order, or None when the tags do not pair up
    (a close before its open, an open inside a block, an unclosed open): a real scan, not a count."""
    tags = sorted([(m.start(), True) for m in re.finditer(re.escape(open_tag), text)]
                  + [(m.start(), False) for m in re.finditer(re.escape(close_tag), text)])
    blocks, start = [], None
    for at, is_open in tags:
        if is_open == (start is not None):
            return None
        if is_open:
            start = at + len(open_tag)
        else:
            blocks.append((start, at))
            start = None
    return None if start is not None else blocks


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
        # Some models double-encode the arguments; a JSON string holding an object is accepted (once).
        args, why = _loads(args) if args.strip() else ({}, None)
        if why:
            return BAD_ARGUMENTS, f"arguments string is not JSON: {why}"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return BAD_ARGUMENTS, f"arguments must be an object, got {type(args).__name__}"
    return ToolCall(name=name.strip(), arguments=args)


def parse_tool_calls(text: str) -> ParsedMessage:
    """Split a caller message into tool calls and text. Never raises: any string gets a classified result."""
    if not isinstance(text, str):
        return ParsedMessage(error=NOT_A_CALL, detail="message is not text")
    if len(text) > MAX_MESSAGE_CHARS:
        return ParsedMessage(error=MESSAGE_TOO_LONG, detail=f"{len(text)} characters")
    if TOOL_CALL_OPEN not in text and TOOL_CALL_CLOSE not in text:
        return ParsedMessage(text=text.strip())
    blocks = _pairs(text, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    if blocks is None:
        return ParsedMessage(text=text.strip(), error=UNBALANCED_TAGS,
                             detail=f"{text.count(TOOL_CALL_OPEN)} opening and {text.count(TOOL_CALL_CLOSE)} "
                                    "closing tool_call tags, not in matching pairs")
    calls: list[ToolCall] = []
    for start, end in blocks:
        obj, why = _loads(text[start:end].strip())
        if why:
            return ParsedMessage(text=text.strip(), error=JSON_DECODE_ERROR, detail=why)
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


def strip_thinking(text: str) -> str:
    """The text without its reasoning: every `<think>…</think>` block removed, and an unclosed `<think>` (a
    budget cut mid-thought) taking the rest with it. A call or a result inside thinking is no action."""
    if not isinstance(text, str) or "<think>" not in text and "</think>" not in text:
        return text
    out = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
    if "</think>" in out:  # the template opened the block in the prompt: everything before its end is thought
        out = out.rsplit("</think>", 1)[1]
    return out.split("<think>", 1)[0].strip()


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
    blocks = _pairs(text, RESULT_OPEN, RESULT_CLOSE)
    if not blocks:  # the close is missing (a cut-off rehearsal), or comes before the open
        return ParsedResult(error=UNCLOSED_RESULT, detail="no </execution_result> after <execution_result> "
                                                          "(truncated?)")
    (start, end), = blocks
    body = text[start:end].strip()
    if not body:
        return ParsedResult(error=EMPTY_RESULT, detail="empty result")
    value, why = _loads(body)
    return ParsedResult(error=INVALID_JSON, detail=why) if why else ParsedResult(value=value)


def as_json_value(content: str) -> Any:
    """A tool response as a JSON value: parsed when it is JSON text, else the text as a JSON string."""
    if not isinstance(content, str):
        return content
    value, why = _loads(content)
    return content if why else value


def is_error_value(value: Any) -> bool:
    """A tool result that reports failure: an object with an `error` key (BFCL's tools and the rehearser alike)."""
    return isinstance(value, dict) and "error" in value


def render_execution_result(value: Any) -> str:
    return f"{RESULT_OPEN}\n{json.dumps(value, ensure_ascii=False)}\n{RESULT_CLOSE}"


def content_of(value: Any) -> str:
    """The text a caller sees for a JSON result value (strings stay bare, as real tools return them)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
