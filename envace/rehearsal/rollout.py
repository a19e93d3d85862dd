"""The batched rollout engine: many episodes advance together, one backend call per step.

Each step, every episode waiting on the caller goes to the backend in one batch; the calls it emits
are answered (by the real environment in `real` mode), their responses are appended to that
episode's context as token ids, and the episode waits on the caller again. A plain answer (no call)
ends the user turn; the next scripted user turn is appended, or the episode ends and is scored by
the benchmark's own checker.

Termination reasons: `completed` (every user turn answered), `step_limit` (max_steps_per_turn caller
messages in one turn; BFCL force-terminates there), `context_exceeded` (the next generation would not
fit the model's window), `parse_error` (a malformed call with on_parse_error = end_episode).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from envace.config import RolloutConfig
from envace.envs.base import Environment
from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.formats import parse_tool_calls
from envace.policy.backend import Backend, Generation, SamplingParams
from envace.rehearsal.prompts import ChatRenderer
from envace.store import Run
from envace.types import Mode, Role, Task, ToolCall, ToolResult


@dataclass
class Episode:
    """One attempt at a task, with its growing caller context and what it will store."""

    episode_id: str
    task: Task
    group_index: int
    env: Environment
    ids: list[int]
    prompt_tokens: int
    turn: int = 0
    step: int = 0
    steps: list[list[list[ToolCall]]] = field(default_factory=lambda: [[]])  # executed calls, for scoring
    turns: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    n_parse_errors: int = 0
    n_tool_errors: int = 0
    generated_tokens: int = 0
    termination: str | None = None
    started: float = field(default_factory=time.perf_counter)


@dataclass
class Summary:
    """Counters over a whole rollout, for the closing table and `run.json`."""

    episodes: int = 0
    successes: int = 0
    turns: int = 0
    caller_messages: int = 0
    calls: int = 0
    parse_errors: int = 0
    generated_tokens: int = 0
    generation_s: float = 0.0
    wall_s: float = 0.0
    terminations: dict[str, int] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        self.episodes += 1
        self.successes += bool(row["success"])
        self.turns += row["n_turns"]
        self.caller_messages += row["n_steps"]
        self.calls += row["n_calls"]
        self.parse_errors += row["n_parse_errors"]
        self.generated_tokens += row["generated_tokens"]
        self.terminations[row["termination"]] = self.terminations.get(row["termination"], 0) + 1

    def as_dict(self) -> dict[str, Any]:
        per = lambda a, b: round(a / b, 4) if b else 0.0  # noqa: E731
        return {
            "episodes": self.episodes, "success_rate": per(self.successes, self.episodes),
            "calls_per_turn": per(self.calls, self.turns), "parse_error_rate": per(self.parse_errors,
                                                                                     self.caller_messages),
            "caller_messages": self.caller_messages, "calls": self.calls,
            "generated_tokens": self.generated_tokens,
            "tokens_per_s": per(self.generated_tokens, self.generation_s), "wall_s": round(self.wall_s, 2),
            "terminations": self.terminations,
        }


class RolloutEngine:
    """Runs episodes of one benchmark with one backend; see the module docstring for the loop."""

    def __init__(self, backend: Backend, benchmark: Benchmark, config: RolloutConfig,
                 max_context: int | None = None) -> None:
        if config.mode != Mode.REAL:
            raise UsageError(f"mode '{config.mode}' needs the rehearser role, which this build does not have yet")
        self.backend = backend
        self.benchmark = benchmark
        self.config = config
        self.renderer = ChatRenderer(backend.tokenizer)
        self.max_context = max_context
        self.generation_s = 0.0
        self._sampling_step = 0
        self.on_step: Callable[[int, int], None] | None = None  # (episodes generated for, tokens so far)
        self._tokens = 0

    # -- one episode's transitions ------------------------------------------------------------------

    def _start(self, task: Task, group_index: int) -> Episode:
        env = self.benchmark.make_env()
        env.reset(task)
        ids = self.renderer.opening(task)
        return Episode(f"{task.uid.replace('/', '.')}#{group_index}", task, group_index, env, ids, len(ids))

    def _record_message(self, ep: Episode, gen: Generation, prompt_len: int, n_calls: int,
                        error: str | None, detail: str) -> None:
        ep.turns.append({
            "episode_id": ep.episode_id, "turn": ep.turn, "step": ep.step, "role": Role.CALLER.value,
            "user_message": ep.task.user_turns[ep.turn] if ep.step == 0 else None,
            "prompt_len": prompt_len, "completion_ids": gen.ids, "completion_text": gen.text,
            "finish": gen.finish, "n_calls": n_calls, "parse_error": error, "parse_detail": detail or None,
            "logprobs": gen.logprobs,
        })

    def _on_generation(self, ep: Episode, gen: Generation) -> list[ToolCall]:
        """Append the caller's message; return the calls to answer (empty when the turn ended)."""
        prompt_len = len(ep.ids)
        ep.ids.extend(gen.ids)
        if gen.finish == "length":  # close the cut-off message so the next delta renders after it
            ep.ids.append(self.renderer.end_of_message)
        ep.generated_tokens += len(gen.ids)
        parsed = parse_tool_calls(gen.text)
        self._record_message(ep, gen, prompt_len, len(parsed.calls), parsed.error, parsed.detail)
        if parsed.error:
            ep.n_parse_errors += 1
            if self.config.on_parse_error == "end_episode":
                ep.termination = "parse_error"
                return []
        if parsed.calls:
            return parsed.calls
        self._end_turn(ep)
        return []

    def _on_results(self, ep: Episode, calls: list[ToolCall], results: list[ToolResult], source: str) -> None:
        for index, (call, result) in enumerate(zip(calls, results, strict=True)):
            ep.calls.append({
                "episode_id": ep.episode_id, "turn": ep.turn, "step": ep.step, "call_index": index,
                "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False), "source": source,
                "response": result.content, "is_error": result.is_error, "error_kind": result.error_kind,
            })
            ep.n_tool_errors += result.is_error
        ep.steps[ep.turn].append([c for c, r in zip(calls, results, strict=True) if r.dispatched])
        ep.ids.extend(self.renderer.tool_results(results))
        ep.step += 1
        if ep.step >= self.config.max_steps_per_turn:
            ep.termination = "step_limit"

    def _end_turn(self, ep: Episode) -> None:
        ep.turn += 1
        ep.step = 0
        if ep.turn >= len(ep.task.user_turns):
            ep.termination = "completed"
            return
        ep.steps.append([])
        ep.ids.extend(self.renderer.user_turn(ep.task.user_turns[ep.turn], ep.task.tools_added.get(ep.turn)))

    def _episode_row(self, ep: Episode) -> dict[str, Any]:
        score = ep.env.score(ep.task, ep.steps)
        return {
            "episode_id": ep.episode_id, "task_uid": ep.task.uid, "env": ep.task.env,
            "category": ep.task.category, "split": ep.task.split, "group_index": ep.group_index,
            "mode": self.config.mode, "success": score.success, "score_detail": score.detail,
            "termination": ep.termination, "n_turns": min(ep.turn, len(ep.task.user_turns)),
            "n_ref_turns": len(ep.task.user_turns), "n_steps": len(ep.turns), "n_calls": len(ep.calls),
            "n_parse_errors": ep.n_parse_errors, "n_tool_errors": ep.n_tool_errors,
            "prompt_tokens": ep.prompt_tokens, "generated_tokens": ep.generated_tokens,
            "context_ids": ep.ids, "wall_s": time.perf_counter() - ep.started,
        }

    # -- the batched loop ---------------------------------------------------------------------------

    def _sampling(self) -> SamplingParams:
        self._sampling_step += 1
        c = self.config
        return SamplingParams(max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p,
                              seed=c.seed * 1_000_003 + self._sampling_step)

    def _answer(self, pending: list[tuple[Episode, list[ToolCall]]]) -> None:
        for ep, calls in pending:
            self._on_results(ep, calls, [ep.env.execute(c) for c in calls], source="real")

    def run_batch(self, batch: list[tuple[Task, int]]) -> list[Episode]:
        """Play a batch of (task, group index) episodes to the end; return them, finished."""
        episodes = [self._start(task, g) for task, g in batch]
        while True:
            for ep in episodes:
                if ep.termination is None and self.max_context and \
                        len(ep.ids) + self.config.max_new_tokens > self.max_context:
                    ep.termination = "context_exceeded"
            waiting = [ep for ep in episodes if ep.termination is None]
            if not waiting:
                return episodes
            start = time.perf_counter()
            gens = self.backend.generate([list(ep.ids) for ep in waiting], self._sampling())
            self.generation_s += time.perf_counter() - start
            self._tokens += sum(len(g.ids) for g in gens)
            if self.on_step:
                self.on_step(len(waiting), self._tokens)
            pending = [(ep, calls) for ep, gen in zip(waiting, gens, strict=True)
                       if (calls := self._on_generation(ep, gen))]
            self._answer(pending)

    def batches(self, tasks: list[Task]) -> Iterator[list[tuple[Task, int]]]:
        items = [(t, g) for t in tasks for g in range(self.config.group_size)]
        size = self.config.batch_size
        for i in range(0, len(items), size):
            yield items[i: i + size]

    def run(self, tasks: list[Task], run: Run | None = None,
            on_episode: Callable[[dict[str, Any]], None] | None = None) -> Summary:
        """Play every task `group_size` times, writing one shard per batch to `run`."""
        summary = Summary()
        started = time.perf_counter()
        for index, batch in enumerate(self.batches(tasks)):
            episodes = self.run_batch(batch)
            rows = [self._episode_row(ep) for ep in episodes]
            if run is not None:
                key = {"run_id": run.run_id, "batch": index}
                shard = f"batch-{index:05d}"
                run.write("episodes", shard, [{**key, **r} for r in rows])
                run.write("turns", shard, [{**key, **t} for ep in episodes for t in ep.turns])
                run.write("calls", shard, [{**key, **c} for ep in episodes for c in ep.calls])
            for row in rows:
                summary.add(row)
                if on_episode:
                    on_episode(row)
        summary.generation_s = self.generation_s
        summary.wall_s = time.perf_counter() - started
        return summary
