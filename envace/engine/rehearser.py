"""The rehearser role: the policy, prompted as the environment, writes each call's result.

Every pending call of every episode becomes one rehearser prompt (`prompts.rehearser_prompt`: the
validate-first instruction, tools, response schema, grounding examples, the conversation, the caller's
latest message and the call), and all of them go to the backend in one call. Each output is parsed
strictly (`formats.parse_execution_result`); a malformed one becomes an `INVALID_EXECUTION_RESULT`
error result, a rehearsed `{"error": …}` naming a validation kind a refusal of that kind, and any other
result an error when the benchmark's failure convention says so (`Benchmark.is_error`; τ² writes
`Error: …`), so rehearsed and real error flags mean the same thing in every benchmark.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from envace.config import RehearserOptions
from envace.engine.episode import Pending
from envace.engine.examples import ExampleBank
from envace.engine.prompts import ChatRenderer, rehearser_prompt
from envace.engine.sampler import Sampler
from envace.envs.benchmark import json_error
from envace.formats import ParsedResult, content_of, is_error_value, parse_execution_result, strip_thinking
from envace.policy.backend import Backend, Generation
from envace.types import Role, ToolResult

_NAMED_ERRORS = {"INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS"}


@dataclass
class Rehearsal:
    """The rehearser's answer to one call: what the caller would see, how it parsed, what it was shown."""

    result: ToolResult
    parsed: ParsedResult
    examples: list[str]


def as_result(parsed: ParsedResult, is_error: Callable[[str], bool] = json_error) -> ToolResult:
    """The tool result a caller sees for a parsed rehearsal; `is_error` is the benchmark's failure convention."""
    if parsed.error:
        message = f"INVALID_EXECUTION_RESULT: {parsed.error}"
        return ToolResult(json.dumps({"error": message}), True, "INVALID_EXECUTION_RESULT")
    value, content = parsed.value, content_of(parsed.value)
    if is_error_value(value) and isinstance(value["error"], str) and value["error"] in _NAMED_ERRORS:
        return ToolResult(content, True, value["error"])  # the rehearser refused the call, as validation would
    failed = is_error(content)
    return ToolResult(content, failed, "TOOL_ERROR" if failed else "")


class Rehearser:
    """Rehearses batches of pending calls with one backend call each; see the module docstring.

    `frozen` generates with the base weights (adapters off): the rehearser of caller-only training. `is_error` is
    the benchmark's failure convention (`Benchmark.is_error`). `backend` is the rehearser's own model when it is
    not the policy's (a frozen external simulator, or the gold: `RolloutConfig.rehearser_model`), with
    `renderer` its tokenizer's; None generates through the sampler's backend, the policy.

    `max_context` bounds prompt + rehearsal (the server's context, or training's packing budget): a rehearsal
    gets what is left of it when that is less than `max_new_tokens`, and a prompt with nothing left gets no
    tokens at all (an empty, malformed rehearsal) instead of a request the server would refuse.
    """

    def __init__(self, sampler: Sampler, renderer: ChatRenderer, examples: ExampleBank, options: RehearserOptions,
                 frozen: bool = False, is_error: Callable[[str], bool] = json_error, backend: Backend | None = None,
                 max_context: int | None = None) -> None:
        self.sampler, self.renderer, self.examples, self.options, self.frozen = \
            sampler, renderer, examples, options, frozen
        self.is_error, self.backend, self.max_context = is_error, backend, max_context

    def reseeded(self, sampler: Sampler, options: RehearserOptions, frozen: bool) -> Rehearser:
        """The same rehearser (model, renderer, grounding, error rule, context) drawing through another sampler."""
        return Rehearser(sampler, self.renderer, self.examples, options, frozen, self.is_error, self.backend,
                         self.max_context)

    def _budgets(self, prompts: list[list[int]]) -> list[int]:
        """Each prompt's token budget: `max_new_tokens`, clamped to what is left of `max_context` (0: none left)."""
        wanted = self.options.max_new_tokens
        if self.max_context is None:
            return [wanted] * len(prompts)
        return [max(0, min(wanted, self.max_context - len(p))) for p in prompts]

    def _generate(self, pending: list[Pending], prompts: list[list[int]]) -> list[Generation]:
        """One backend call per distinct budget (one call unless the context clamps some prompts)."""
        budgets = self._budgets(prompts)
        out: list[Generation | None] = [None] * len(prompts)
        for budget in sorted(set(budgets), reverse=True):
            picked = [i for i, b in enumerate(budgets) if b == budget]
            if budget == 0:
                for i in picked:
                    out[i] = Generation([], "", "length", [])
                continue
            gens = self.sampler([prompts[i] for i in picked], budget, frozen=self.frozen and self.backend is None,
                                backend=self.backend, tasks=[pending[i].episode.task.uid for i in picked],
                                temperature=self.options.temperature)
            for i, gen in zip(picked, gens, strict=True):
                out[i] = gen
        return [g for g in out if g is not None]

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
        gens = self._generate(pending, prompts)
        out = []
        for p, prompt, gen, examples in zip(pending, prompts, gens, shown, strict=True):
            parsed = parse_execution_result(strip_thinking(gen.text))
            p.episode.record(Role.REHEARSER, gen, len(prompt), prompt_ids=prompt, call_index=p.index,
                             parse_error=parsed.error, parse_detail=parsed.detail or None)
            out.append(Rehearsal(as_result(parsed, self.is_error), parsed, examples))
        return out
