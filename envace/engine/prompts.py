"""Prompt rendering as token ids, append-only (token-in, token-out).

The caller's context is one growing list of token ids. Generated ids are appended verbatim; only new
messages (tool responses, the next user turn) are rendered and tokenized, as the *delta* the chat
template adds after a finished assistant message. Nothing the model wrote is ever re-tokenized, so
the prompt of step k+1 always starts with the exact ids of step k's prompt and completion. The one exception
is `[rollout] past_thinking = "drop"` (`past_thinking.py`): when a user turn starts, the caller's past messages
are re-rendered as the template renders them (Qwen3's without their `<think>` block).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from envace.config import RehearserOptions
from envace.formats import as_json_value, render_execution_result, render_tool_call
from envace.types import Task, ToolCall, ToolResult

# A throwaway conversation ending in an assistant message: rendering it with the new messages appended and
# keeping what follows that message's end isolates exactly the text the template adds for them. The search
# for the end (rather than subtracting the prefix's own rendering) also holds for templates that render an
# earlier assistant message differently once more messages follow (Qwen3's drops its empty think block).
_MARK = "<envace:last-assistant>"
_PREFIX = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
           {"role": "assistant", "content": _MARK}]
# An assistant message between this opening and a later user message is a *past* one, which a template may render
# otherwise than the model wrote it (Qwen3's drops its `<think>` block): `past_message` reads that rendering off.
_BEFORE = _PREFIX[:2]
_ASSISTANT = "<|im_start|>assistant\n"

def compact_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as name, one-sentence description and `argument: type` (`?` = optional).

    BFCL's full schemas cost 3-5k prompt tokens per episode (each function repeats its class's
    description); this form carries what a call needs in about a third of that, which is what makes
    training on one CPU fit in an hour.
    """
    fn = tool["function"]
    text = fn.get("description", "").split("Tool description: ", 1)[-1]
    params = fn.get("parameters") or {}
    required = set(params.get("required", []))
    arguments = {name: str(spec.get("type", "any")) + ("" if name in required else "?")
                 for name, spec in params.get("properties", {}).items()}
    return {"name": fn["name"], "description": re.split(r"(?<=\.)\s", text, maxsplit=1)[0],
            "arguments": arguments}


def with_memory(text: str, memory: str) -> str:
    """The user's message followed by the private-rehearsal memory, marked as imagined."""
    if not memory:
        return text
    return f"{text}\n\n<rehearsal_memory>\n{memory}\n</rehearsal_memory>"


class ChatRenderer:
    """Renders a task's opening prompt and later message deltas into token ids.

    `tool_docs="compact"` shows tools as `compact_tool` renders them instead of full JSON schemas;
    `thinking` is the template's `enable_thinking` (Qwen3): off, the generation prompt closes an empty
    think block so the model answers at once.
    """

    def __init__(self, tokenizer, tool_docs: str = "full", thinking: bool = False) -> None:
        self.tokenizer = tokenizer
        self.thinking = thinking
        self._shown = compact_tool if tool_docs == "compact" else (lambda tool: tool)
        self.end_of_message = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if f"{_MARK}<|im_end|>" not in self._render(_PREFIX, generation_prompt=False):
            raise ValueError("chat template is not ChatML: the assistant message should end with <|im_end|>")

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation_prompt,
                                                  enable_thinking=self.thinking)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @cached_property
    def prefill(self) -> list[int]:
        """Ids the generation prompt adds after the assistant header (Qwen3, thinking off: the empty think block),
        which the template does not render before a past message."""
        before = self._render(_BEFORE, generation_prompt=False)
        header = self._render(_BEFORE, generation_prompt=True)[len(before):]
        return self.encode(header.removeprefix(_ASSISTANT)) if header.startswith(_ASSISTANT) else []

    def past_message(self, ids: list[int]) -> list[int]:
        """A finished assistant message (its ids after the header, through <|im_end|>) as the template renders it
        once a later user message follows. Qwen3's keeps what follows `</think>`; a message the template keeps as
        written keeps its sampled ids (re-encoding its text could spell it differently)."""
        text = self.tokenizer.decode(ids[:-1])
        before = self._render(_BEFORE, generation_prompt=False)
        full = self._render([*_BEFORE, {"role": "assistant", "content": text}, {"role": "user", "content": "v"}],
                            generation_prompt=False)
        if not full.startswith(before + _ASSISTANT):
            raise ValueError("chat template is not ChatML: a past assistant message should open with "
                             f"{_ASSISTANT!r}")
        shown = full[len(before + _ASSISTANT):]
        shown = shown[: shown.index("<|im_end|>")]
        return ids if shown == text else self.encode(shown) + [self.end_of_message]

    def opening(self, task: Task, demonstration: list[dict[str, Any]] | None = None, memory: str = "") -> list[int]:
        """System prompt with the task's tools, an optional worked example, the first user turn (with
        a private-rehearsal memory, if any), and the assistant header."""
        messages = [{"role": "system", "content": task.system_prompt}, *(demonstration or []),
                    {"role": "user", "content": with_memory(task.user_turns[0], memory)}]
        return self.encode(self._render(messages, generation_prompt=True, tools=[self._shown(t) for t in task.tools]))

    def delta(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of `messages` plus the next assistant header, to append after a finished assistant message.

        The generated message ends at <|im_end|>; the template's newline after it belongs to the delta.
        """
        full = self._render(_PREFIX + messages, generation_prompt=True)
        return self.encode(full[full.index(f"{_MARK}<|im_end|>") + len(f"{_MARK}<|im_end|>"):])

    def messages(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A whole conversation (a rehearser's, summariser's or simulated user's prompt) with the next assistant
        header."""
        return self.encode(self._render(messages, generation_prompt=True, tools=tools))

    def tool_results(self, results: list[ToolResult]) -> list[int]:
        return self.delta([{"role": "tool", "content": r.content} for r in results])

    def user_turn(self, text: str, new_tools: list[dict[str, Any]] | None = None, memory: str = "") -> list[int]:
        """The next user message; tools revealed at this turn are listed in it, as BFCL's prompting mode does."""
        text = with_memory(text, memory)
        if new_tools:
            listing = "\n".join(json.dumps(self._shown(t), ensure_ascii=False) for t in new_tools)
            text = f"<tools>\n{listing}\n</tools>\n{text}"
        return self.delta([{"role": "user", "content": text}])


# -- the rehearser role ----------------------------------------------------------------------------

REHEARSER_SYSTEM = """You are a precise tool simulator. You receive one tool call and reply with the result the real tool would return.
Validate the call first, in this order:
- INVALID_TOOL_CALL_FORMAT: the call is not a well-formed function call with JSON arguments.
- TOOL_NOT_AVAILABLE: the tool is not among the available tools.
- INVALID_PARAMETERS: a required parameter is missing, a parameter is unknown, or a value has the wrong type or is not an allowed value.
If one applies, the result is {"error": "<KIND>", "message": "<what is wrong>"}.
Otherwise write the result the tool returns, consistent with its response schema, the previous results and the conversation; a tool that fails returns {"error": "<message>"}.
Reply with exactly one <execution_result> tag holding one JSON value, then </execution_result>, and nothing else."""  # noqa: E501

_RESULT_CHARS = 600  # long-context results are shown truncated as examples


@dataclass(frozen=True)
class Example:
    """One (call, real result) shown to the rehearser as grounding."""

    call: ToolCall
    content: str


def flatten_history(history: list[tuple[str, str]]) -> str:
    """`User:` / `Assistant:` / `Tool[name]:` lines, the way the rehearser reads the conversation."""
    return "\n".join(f"{who}: {text}" for who, text in history) or "<empty>"


def rehearser_prompt(task: Task, call: ToolCall, examples: list[Example], history: list[tuple[str, str]],
                     latest: str, options: RehearserOptions) -> list[dict[str, Any]]:
    """Chat messages asking the rehearser for `call`'s result; each section is switchable."""
    schemas = {t["function"]["name"]: t["function"] for t in task.tools}
    for added in task.tools_added.values():
        schemas.update({t["function"]["name"]: t["function"] for t in added})
    parts = []
    if options.tools == "all":
        parts.append("## Available tools\n" + "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas.values()))
    elif options.tools == "called":
        parts.append("## Available tools\n" + ", ".join(schemas))
        if call.name in schemas:
            parts.append("## Schema of the called tool\n" + json.dumps(schemas[call.name], ensure_ascii=False))
    response_schema = task.payload.get("response_schemas", {}).get(call.name)
    if options.response_schema and response_schema:
        parts.append("## Response schema of the called tool\n" + json.dumps(response_schema, ensure_ascii=False))
    if options.fewshot != "none":
        shown = "\n".join(f"{json.dumps({'name': e.call.name, 'arguments': e.call.arguments}, ensure_ascii=False)}"
                          f" -> {e.content[:_RESULT_CHARS]}" for e in examples)
        parts.append("## Previous tool calls and results\n" + (shown or "<unavailable>"))
    if options.history:
        parts.append("## Conversation so far\n" + flatten_history(history))
    if options.latest_message:
        parts.append("## The caller's latest message\n" + (latest or "<empty>"))
    parts.append("## Call to simulate\n" + json.dumps({"name": call.name, "arguments": call.arguments},
                                                      ensure_ascii=False))
    messages = [{"role": "user", "content": "\n\n".join(parts)}]
    if options.demo_turn and examples:
        # One answered call in the exact output format: a small model copies a format it has just
        # seen, where a description of the format alone gets prose back.
        first = examples[0]
        messages[:0] = [
            {"role": "user", "content": "## Call to simulate\n" + json.dumps(
                {"name": first.call.name, "arguments": first.call.arguments}, ensure_ascii=False)},
            {"role": "assistant", "content": render_execution_result(as_json_value(first.content))}]
    if options.system:
        messages.insert(0, {"role": "system", "content": REHEARSER_SYSTEM})
    return messages


# -- the summariser role ---------------------------------------------------------------------------

SUMMARISER_SYSTEM = """You have privately rehearsed the user's request in an imagined copy of the tools: every result below was imagined, not real.
Write a short memory for your one real attempt: which calls to make and in which order, what you expect them to return, and what went wrong in rehearsal.
Reply in plain text, a few sentences, no tool calls."""  # noqa: E501


def reference_memory(steps: list[Any], result_chars: int = 80) -> str:
    """The memory a perfect summariser writes of a turn's reference trajectory (`ReferenceStep`s): the calls in
    order with what they return, in plain text (the SFT target of the summariser role)."""
    if not steps:
        return "No call is needed: reply to the user directly."
    lines = [f"{i}. {s.call.name} {json.dumps(s.call.arguments, ensure_ascii=False)} returns "
             f"{s.result.content[:result_chars]}" for i, s in enumerate(steps, 1)]
    return "Make these calls in order:\n" + "\n".join(lines) + "\nThen reply to the user without a call."


def reference_transcript(steps: list[Any]) -> list[tuple[str, str]]:
    """A turn's reference trajectory as an imagined attempt's transcript reads: each call its own message, its
    result, and the closing answer (what the scripted reference caller writes)."""
    out: list[tuple[str, str]] = []
    for s in steps:
        out += [("Assistant", render_tool_call(s.call)), (f"Tool[{s.call.name}]", s.result.content)]
    return out + [("Assistant", "Done.")]


def summariser_prompt(request: str, attempts: list[list[tuple[str, str]]], memory: str) -> list[dict[str, Any]]:
    """Chat messages asking for a rehearsal memory from imagined attempts (and the memory so far)."""
    parts = ["## User request\n" + request]
    if memory:
        parts.append("## Memory so far\n" + memory)
    for k, transcript in enumerate(attempts, 1):
        parts.append(f"## Imagined attempt {k}\n" + flatten_history(transcript))
    return [{"role": "system", "content": SUMMARISER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
