"""The rehearser role: the policy, prompted as the environment, writes each call's result.

Every pending call of every episode becomes one rehearser prompt (`prompts.rehearser_prompt`: the
validate-first instruction, tools, response schema, grounding examples, the conversation, the caller's
latest message and the call), and all of them go to the backend in one call. Each output is parsed
strictly (`formats.parse_execution_result`); a malformed one becomes an `INVALID_EXECUTION_RESULT`
error result, and a rehearsed `{"error": …}` value an error result that keeps a named validation kind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from envace.config import RehearserOptions
from envace.formats import ParsedResult, content_of, is_error_value, parse_execution_result, strip_thinking
from envace.rehearsal.episode import Pending
from envace.rehearsal.examples import ExampleBank
from envace.rehearsal.prompts import ChatRenderer, rehearser_prompt
from envace.rehearsal.sampler import Sampler
from envace.types import Role, ToolResult

_NAMED_ERRORS = {"INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS"}


@dataclass
class Rehearsal:
    """The rehearser's answer to one call: what the caller would see, how it parsed, what it was shown."""

    result: ToolResult
    parsed: ParsedResult
    examples: list[str]


def as_result(parsed: ParsedResult) -> ToolResult:
    """The tool result a caller sees for a parsed rehearsal."""
    if parsed.error:
        message = f"INVALID_EXECUTION_RESULT: {parsed.error}"
        return ToolResult(json.dumps({"error": message}), True, "INVALID_EXECUTION_RESULT")
    value = parsed.value
    if not is_error_value(value):
        return ToolResult(content_of(value), False, "")
    kind = value["error"] if isinstance(value["error"], str) and value["error"] in _NAMED_ERRORS else "TOOL_ERROR"
    return ToolResult(content_of(value), True, kind)


class Rehearser:
    """Rehearses batches of pending calls with one backend call each; see the module docstring.

    `frozen` generates with the base weights (adapters off): the rehearser of caller-only training.
    """

    def __init__(self, sampler: Sampler, renderer: ChatRenderer, examples: ExampleBank, options: RehearserOptions,
                 frozen: bool = False) -> None:
        self.sampler, self.renderer, self.examples, self.options, self.frozen = \
            sampler, renderer, examples, options, frozen

    def rehearse(self, pending: list[Pending]) -> list[Rehearsal]:
        if not pending:
            return []
        shown, prompts = [], []
        for p in pending:
            ep = p.episode
            examples = self.examples.for_call(ep.task, p.call, self.options)
            shown.append([e.content for e in examples])
            messages = rehearser_prompt(ep.task, p.call, examples, ep.history, ep.latest, self.options)
            prompts.append(self.renderer.messages(messages))
        gens = self.sampler(prompts, self.options.max_new_tokens, frozen=self.frozen)
        out = []
        for p, prompt, gen, examples in zip(pending, prompts, gens, shown, strict=True):
            parsed = parse_execution_result(strip_thinking(gen.text))
            p.episode.record(Role.REHEARSER, gen, len(prompt), prompt_ids=prompt, call_index=p.index,
                             parse_error=parsed.error, parse_detail=parsed.detail or None)
            out.append(Rehearsal(as_result(parsed), parsed, examples))
        return out
