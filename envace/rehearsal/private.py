"""Test-time private rehearsal: imagine a turn N times, write down what was learned, then act once for real.

When a real episode opens a user turn (or only its first turn, with scope = episode), the policy first
plays imagined attempts of it in the rehearsed world, as caller and as environment, starting from the
real history so far; then, as summariser, it condenses them into a *rehearsal memory*; the turn is
then rendered with the memory appended to the user's message and executed for real, once.

- parallel: N independent attempts, summarised together.
- sequential: N rounds of one attempt; attempt k sees the memory of attempts 1..k−1 in its user
  message, and the summariser revises that memory after it.

All attempts of all episodes that open a turn at the same step advance together in a sub-engine
(one backend call per step and role), and all their summaries go in one call. The sub-engine runs in
`rehearse` mode against a `SealedEnvironment`: the tools' schemas and an `execute` that raises, so no
real call can happen during rehearsal. Budget 0 never gets here: the plain policy, unchanged.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from envace.config import PrivateOptions
from envace.fidelity import call_key
from envace.formats import parse_tool_calls
from envace.rehearsal.prompts import encode_messages, summariser_prompt
from envace.types import Role, ToolCall, ToolResult

if TYPE_CHECKING:
    from envace.rehearsal.rollout import Episode, RolloutEngine


class SealedEnvironment:
    """All an imagined attempt may know of the real environment: its tools' schemas."""

    executions = 0

    def __init__(self, tools: dict[str, dict[str, Any]]) -> None:
        self.tools = tools

    def execute(self, call: ToolCall) -> ToolResult:
        raise RuntimeError(f"private rehearsal tried to execute {call.name} in the real environment")


def parse_memory(text: str) -> tuple[str, str | None]:
    """(memory, error): plain text, tags stripped; empty or call-like output is no memory."""
    body = re.sub(r"</?(rehearsal_memory|memory)>", "", text).strip()
    if parse_tool_calls(body).calls or "<tool_call>" in body:
        return "", "tool_call_in_memory"
    if not body:
        return "", "empty_memory"
    return body, None


class PrivateRehearsal:
    """Writes one rehearsal memory per episode opening a turn; see the module docstring."""

    def __init__(self, options: PrivateOptions) -> None:
        self.options = options

    def _sub_engine(self, engine: RolloutEngine) -> RolloutEngine:
        o = self.options
        config = replace(engine.config, mode="rehearse", real_fraction=0.0, max_steps_per_turn=o.max_steps,
                         temperature=o.temperature, private=PrivateOptions(), decision_sample=0.0, embedding=False,
                         seed=engine.config.seed * 7_919 + engine.sampling_step)
        return type(engine)(engine.backend, engine.benchmark, config, engine.max_context, engine.examples)

    def _imagine(self, engine: RolloutEngine, ep: Episode, memory: str, attempt: int) -> Episode:
        from envace.rehearsal.rollout import Episode

        last = len(ep.task.user_turns) if self.options.scope == "episode" else ep.turn + 1
        task = replace(ep.task, user_turns=ep.task.user_turns[:last])  # the attempt ends where the rehearsal does
        return Episode(f"{ep.episode_id}~t{ep.turn}a{attempt}", task, ep.group_index, SealedEnvironment(ep.env.tools),
                       engine.turn_ids(ep, memory), 0, turn=ep.turn, steps=[[] for _ in range(ep.turn + 1)],
                       issued=[[] for _ in range(ep.turn + 1)], history=list(ep.history), demo=ep.demo)

    def memories(self, engine: RolloutEngine, episodes: list[Episode]) -> list[str]:
        o = self.options
        started = time.perf_counter()
        sub = self._sub_engine(engine)
        memory = ["" for _ in episodes]
        errors: list[list[str]] = [[] for _ in episodes]
        cost = [{"caller_tokens": 0, "rehearser_tokens": 0, "summariser_tokens": 0, "imagined_steps": 0}
                for _ in episodes]
        rounds, width = (1, o.budget) if o.mode == "parallel" else (o.budget, 1)
        for r in range(rounds):
            attempts = [(i, self._imagine(engine, ep, memory[i] if o.mode == "sequential" else "", r * width + k))
                        for i, ep in enumerate(episodes) for k in range(width)]
            sub.play([a for _, a in attempts])
            transcripts: list[list[list[tuple[str, str]]]] = [[] for _ in episodes]
            for i, attempt in attempts:
                ep = episodes[i]
                transcript = attempt.history[len(ep.history):]
                transcripts[i].append(transcript)
                tokens = {role: sum(len(t["completion_ids"]) for t in attempt.turns if t["role"] == role)
                          for role in (Role.CALLER, Role.REHEARSER)}
                steps = sum(t["role"] == Role.CALLER for t in attempt.turns)
                cost[i]["caller_tokens"] += tokens[Role.CALLER]
                cost[i]["rehearser_tokens"] += tokens[Role.REHEARSER]
                cost[i]["imagined_steps"] += steps
                ep.imagined.append({
                    "episode_id": ep.episode_id, "turn": ep.turn, "attempt": len(ep.imagined), "round": r,
                    "memory_seen": memory[i] if o.mode == "sequential" else "",
                    "transcript": "\n".join(f"{who}: {text}" for who, text in transcript),
                    "termination": attempt.termination, "n_steps": steps, "n_calls": len(attempt.calls),
                    "caller_tokens": tokens[Role.CALLER], "rehearser_tokens": tokens[Role.REHEARSER]})
            prompts = [encode_messages(engine.backend.tokenizer, summariser_prompt(
                ep.task.user_turns[ep.turn], transcripts[i], memory[i])) for i, ep in enumerate(episodes)]
            gens = engine.generate_role(prompts, o.memory_tokens, greedy=True)
            for i, gen in enumerate(gens):
                cost[i]["summariser_tokens"] += len(gen.ids)
                text, error = parse_memory(gen.text)
                if error:  # recorded; the memory so far stands (nothing, in parallel mode)
                    errors[i].append(error)
                else:
                    memory[i] = text
        engine.generation_s += sub.generation_s
        changed = self._decision_changed(engine, episodes, memory) if o.measure_change else [None] * len(episodes)
        wall = (time.perf_counter() - started) / len(episodes)  # the phase is shared by the episodes batched in it
        for i, ep in enumerate(episodes):
            ep.memories.append({"episode_id": ep.episode_id, "turn": ep.turn, "mode": o.mode, "budget": o.budget,
                                "scope": o.scope, "memory": memory[i], "memory_error": ",".join(errors[i]) or None,
                                **cost[i], "wall_s": wall, "decision_changed": changed[i]})
        return memory

    def _decision_changed(self, engine: RolloutEngine, episodes: list[Episode], memory: list[str]) -> list[bool]:
        """Greedy first action of each committed turn without and with its memory: did the memory change it?"""
        prompts = [engine.turn_ids(ep, m) for ep, m in zip(episodes, memory, strict=True) for m in ("", m)]
        gens = engine.generate_role(prompts, engine.config.max_new_tokens, greedy=True)
        key = [call_key(parse_tool_calls(g.text).calls) for g in gens]
        return [key[2 * i] != key[2 * i + 1] for i in range(len(episodes))]
