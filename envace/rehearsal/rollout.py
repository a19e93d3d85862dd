"""The batched rollout engine: many episodes advance together, one backend call per step and role.

Each step, every episode waiting on the caller goes to the backend in one batch. The calls it emits
are answered according to the mode: by each episode's real environment (`real`), by the policy as
rehearser (`rehearse`: every pending call of every episode in one batch, no environment touched), or
by one of them while the other is recorded beside it (`rehearse+shadow`, `real+shadow`) as a *pair*
for the fidelity ledger. The fed-back responses are appended to the caller's context as token ids
and the episode waits on the caller again. A plain answer ends the user turn; the next scripted user
turn is appended, or the episode ends and is scored (checklist reward, official checker).

Terminations: `completed`, `step_limit` (max_steps_per_turn caller messages in one turn; BFCL
force-terminates there), `context_exceeded`, `parse_error` (malformed call, on_parse_error =
end_episode), `rehearsal_error` (malformed rehearsal fed back, rehearser.on_error = end_episode).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from envace import fidelity, rewards
from envace.config import RolloutConfig
from envace.envs.base import Environment
from envace.envs.registry import Benchmark
from envace.envs.validate import check_call
from envace.formats import ParsedResult, content_of, is_error_value, parse_execution_result, parse_tool_calls
from envace.policy.backend import Backend, Generation, SamplingParams
from envace.rehearsal.examples import ExampleBank
from envace.rehearsal.private import PrivateRehearsal
from envace.rehearsal.prompts import ChatRenderer, encode_messages, rehearser_prompt
from envace.store import Run
from envace.types import Mode, Role, Task, ToolCall, ToolResult

_NAMED_ERRORS = {"INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS"}


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
    steps: list[list[list[ToolCall]]] = field(default_factory=lambda: [[]])  # dispatched calls, for the checker
    issued: list[list[ToolCall]] = field(default_factory=lambda: [[]])  # every call per turn, for the checklist
    history: list[tuple[str, str]] = field(default_factory=list)  # the conversation as the rehearser reads it
    latest: str = ""
    texts: list[str] = field(default_factory=list)  # the caller's plain answers, for checkers that read them
    awaiting_user: bool = False  # a simulated user writes the next user turn before the caller goes on
    user_view: list[dict[str, Any]] = field(default_factory=list)  # the conversation as the simulated user sees it
    turns: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    n_parse_errors: int = 0
    n_well_formed: int = 0
    n_tool_errors: int = 0
    n_rehearsal_errors: int = 0
    generated_tokens: int = 0
    termination: str | None = None
    started: float = field(default_factory=time.perf_counter)
    demo: list[dict[str, Any]] | None = None  # the caller's worked example, re-rendered with a memory
    open_turn: bool = False  # the current user turn awaits its private-rehearsal memory before rendering
    memories: list[dict[str, Any]] = field(default_factory=list)  # one per privately rehearsed turn
    imagined: list[dict[str, Any]] = field(default_factory=list)  # one per imagined attempt


@dataclass
class Rehearsal:
    """The rehearser's answer to one call: what the caller would see, and how it parsed."""

    result: ToolResult
    parsed: ParsedResult
    examples: list[str]


@dataclass
class Fork:
    """A pair whose next caller action is generated after the real and after the rehearsed response."""

    pair: dict[str, Any]
    after_real: list[int]
    after_rehearsed: list[int]


@dataclass
class Summary:
    """Counters over a whole rollout, for the closing table and `run.json`."""

    episodes: int = 0
    successes: int = 0
    checklist: float = 0.0
    turns: int = 0
    caller_messages: int = 0
    calls: int = 0
    parse_errors: int = 0
    well_formed: int = 0
    pairs: int = 0
    generated_tokens: int = 0
    private_tokens: int = 0
    generation_s: float = 0.0
    wall_s: float = 0.0
    terminations: dict[str, int] = field(default_factory=dict)

    def add(self, row: dict[str, Any], pairs: int) -> None:
        self.episodes += 1
        self.successes += bool(row["success"])
        self.checklist += row["checklist"]
        self.turns += row["n_turns"]
        self.caller_messages += row["n_steps"]
        self.calls += row["n_calls"]
        self.parse_errors += row["n_parse_errors"]
        self.well_formed += row["n_well_formed"]
        self.pairs += pairs
        self.generated_tokens += row["generated_tokens"]
        self.private_tokens += row["private_tokens"]
        self.terminations[row["termination"]] = self.terminations.get(row["termination"], 0) + 1

    def as_dict(self) -> dict[str, Any]:
        def per(a: float, b: float) -> float:
            return round(a / b, 4) if b else 0.0

        return {
            "episodes": self.episodes, "success_rate": per(self.successes, self.episodes),
            "checklist": per(self.checklist, self.episodes),
            "calls_per_turn": per(self.calls, self.turns),
            "parse_error_rate": per(self.parse_errors, self.caller_messages),
            "well_formed_rate": per(self.well_formed, self.caller_messages),
            "caller_messages": self.caller_messages, "calls": self.calls, "pairs": self.pairs,
            "generated_tokens": self.generated_tokens, "private_tokens": self.private_tokens,
            "tokens_per_s": per(self.generated_tokens, self.generation_s), "wall_s": round(self.wall_s, 2),
            "terminations": self.terminations,
        }


class RolloutEngine:
    """Runs episodes of one benchmark with one backend; see the module docstring for the loop."""

    def __init__(self, backend: Backend, benchmark: Benchmark, config: RolloutConfig,
                 max_context: int | None = None, examples: ExampleBank | None = None,
                 user_backend: Backend | None = None) -> None:
        self.backend = backend
        self.user_backend = user_backend  # plays simulated users; None: the policy plays them too
        self.benchmark = benchmark
        self.config = config
        self.mode = Mode(config.mode)
        self.renderer = ChatRenderer(backend.tokenizer, config.tool_docs)
        self.max_context = max_context
        self.examples = examples or ExampleBank()
        self.generation_s = 0.0
        self.on_step: Callable[[int, int], None] | None = None  # (episodes generated for, tokens so far)
        self._tokens = 0
        self._sampling_step = 0
        self._forks: list[Fork] = []
        self._rng = random.Random(config.seed)
        self.private = PrivateRehearsal(config.private) if config.private.active else None

    # -- one episode's transitions ------------------------------------------------------------------

    def _start(self, task: Task, group_index: int) -> Episode:
        env = self.benchmark.make_env()
        env.reset(task)
        demo = self.examples.demonstration(task) if self.config.caller_demo else None
        if task.simulated_user is not None:  # the episode's own copy: its user turns are written as it goes
            task = replace(task, user_turns=[])
        ep = Episode(f"{task.uid.replace('/', '.')}#{group_index}", task, group_index, env, [], 0, demo=demo)
        if task.simulated_user is not None:
            ep.user_view.append({"role": "user", "content": task.simulated_user.greeting})
            ep.awaiting_user = True
            return ep
        ep.history.append(("User", task.user_turns[0]))
        self._open(ep)
        return ep

    def turn_ids(self, ep: Episode, memory: str = "") -> list[int]:
        """The caller context with the current user turn rendered (with a private-rehearsal memory)."""
        if ep.turn == 0:
            return self.renderer.opening(ep.task, ep.demo, memory)
        text = ep.task.user_turns[ep.turn]
        return ep.ids + self.renderer.user_turn(text, ep.task.tools_added.get(ep.turn), memory)

    def _open(self, ep: Episode, memory: str | None = None) -> None:
        """Render the current user turn, or leave it open for private rehearsal to write a memory first."""
        if memory is None and self.private and (self.config.private.scope == "turn" or ep.turn == 0):
            ep.open_turn = True
            return
        ep.ids = self.turn_ids(ep, memory or "")
        ep.open_turn = False
        if ep.turn == 0:
            ep.prompt_tokens = len(ep.ids)

    def _row(self, ep: Episode, role: Role, gen: Generation, **fields: Any) -> dict[str, Any]:
        self._tokens += len(gen.ids)
        ep.generated_tokens += len(gen.ids)
        return {"episode_id": ep.episode_id, "turn": ep.turn, "step": ep.step, "role": role.value,
                "completion_ids": gen.ids, "completion_text": gen.text, "finish": gen.finish,
                "logprobs": gen.logprobs, **fields}

    def _on_generation(self, ep: Episode, gen: Generation) -> list[ToolCall]:
        """Append the caller's message; return the calls to answer (empty when the turn ended)."""
        prompt_len = len(ep.ids)
        ep.ids.extend(gen.ids)
        if gen.finish == "length":  # close the cut-off message so the next delta renders after it
            ep.ids.append(self.renderer.end_of_message)
        parsed = parse_tool_calls(gen.text)
        ep.turns.append(self._row(
            ep, Role.CALLER, gen, user_message=ep.task.user_turns[ep.turn] if ep.step == 0 else None,
            prompt_len=prompt_len, n_calls=len(parsed.calls), parse_error=parsed.error,
            parse_detail=parsed.detail or None))
        ep.latest = gen.text
        ep.n_well_formed += bool(parsed.calls) and parsed.error is None
        if parsed.error:
            ep.n_parse_errors += 1
            if self.config.on_parse_error == "end_episode":
                ep.termination = "parse_error"
                return []
        if parsed.calls:
            return parsed.calls
        ep.history.append(("Assistant", gen.text))
        ep.texts.append(gen.text)
        self._end_turn(ep)
        return []

    def _on_results(self, ep: Episode, calls: list[ToolCall], results: list[ToolResult], sources: list[str],
                    dispatched: list[bool]) -> None:
        ep.history.append(("Assistant", ep.latest))
        for index, (call, result, source) in enumerate(zip(calls, results, sources, strict=True)):
            ep.calls.append({
                "episode_id": ep.episode_id, "turn": ep.turn, "step": ep.step, "call_index": index,
                "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False), "source": source,
                "response": result.content, "is_error": result.is_error, "error_kind": result.error_kind,
            })
            ep.history.append((f"Tool[{call.name}]", result.content))
            ep.n_tool_errors += result.is_error
        ep.issued[ep.turn].extend(calls)
        ep.steps[ep.turn].append([c for c, ok in zip(calls, dispatched, strict=True) if ok])
        ep.ids.extend(self.renderer.tool_results(results))
        ep.step += 1
        if ep.step >= self.config.max_steps_per_turn:
            ep.termination = "step_limit"

    def _end_turn(self, ep: Episode) -> None:
        ep.turn += 1
        ep.step = 0
        simulated = ep.task.simulated_user is not None
        if simulated and ep.turn >= self.config.max_user_turns:
            ep.termination = "user_turn_limit"
            return
        if not simulated and ep.turn >= len(ep.task.user_turns):
            ep.termination = "completed"
            return
        ep.steps.append([])
        ep.issued.append([])
        if simulated:  # the user answers the caller's reply (its tool calls stay hidden from the user)
            ep.user_view.append({"role": "user", "content": ep.texts[-1]})
            ep.awaiting_user = True
            return
        ep.history.append(("User", ep.task.user_turns[ep.turn]))
        self._open(ep)

    # -- the simulated user -------------------------------------------------------------------------

    def _simulate_users(self, waiting: list[Episode]) -> None:
        """The user role writes the next message of every episode waiting on its user, in one backend call.

        It sees its instructions and the conversation with roles flipped (the caller's answers as `user`).
        A message with a stop signal ends the episode (scored as a normal end); one with calls to the
        user's own tools runs them and lets the user go on, at most `max_steps_per_turn` times a turn;
        otherwise the message opens the caller's next turn.
        """
        backend = self.user_backend or self.backend

        def prompt(ep: Episode) -> list[int]:
            user = ep.task.simulated_user
            return encode_messages(backend.tokenizer, [{"role": "system", "content": user.system_prompt},
                                                       *ep.user_view], user.tools or None)

        prompts = [prompt(ep) for ep in waiting]
        gens = self._generate(prompts, self._sampling(self.config.user_max_new_tokens), backend)
        for ep, prompt, gen in zip(waiting, prompts, gens, strict=True):
            ep.turns.append(self._row(ep, Role.USER, gen, prompt_ids=prompt, call_index=0))
            text = gen.text.strip()
            ep.user_view.append({"role": "assistant", "content": text})
            user = ep.task.simulated_user
            calls = parse_tool_calls(text).calls if user.tools else []
            if user.stopped(text):
                ep.termination = "completed"
            elif calls:
                results = [ep.env.execute_user(call) for call in calls]
                ep.steps[ep.turn].append([c for c, r in zip(calls, results, strict=True) if r.dispatched])
                ep.user_view.extend({"role": "tool", "content": r.content} for r in results)
                if sum(t["role"] == Role.USER and t["turn"] == ep.turn for t in ep.turns) >= \
                        self.config.max_steps_per_turn:
                    ep.termination = "step_limit"
            else:
                ep.awaiting_user = False
                ep.task.user_turns.append(text)
                ep.history.append(("User", text))
                self._open(ep)

    def episode_row(self, ep: Episode) -> dict[str, Any]:
        score = ep.env.score(ep.task, ep.steps, texts=ep.texts, termination=ep.termination or "completed")
        # a simulated conversation has no scripted turns to align: its reference is one turn
        issued = [[c for turn in ep.issued for c in turn]] if ep.task.simulated_user else ep.issued
        checklist, detail = rewards.checklist(ep.task, issued)  # one entry per turn reached
        return {
            "episode_id": ep.episode_id, "task_uid": ep.task.uid, "env": ep.task.env,
            "category": ep.task.category, "split": ep.task.split, "group_index": ep.group_index,
            "mode": self.mode.value, "success": score.success, "score_detail": score.detail,
            "checklist": checklist, "checklist_detail": json.dumps(detail),
            "termination": ep.termination, "n_turns": min(ep.turn, len(ep.task.user_turns)),
            "n_ref_turns": len(ep.task.user_turns),
            "n_steps": sum(t["role"] == Role.CALLER for t in ep.turns), "n_calls": len(ep.calls),
            "n_parse_errors": ep.n_parse_errors, "n_tool_errors": ep.n_tool_errors, "n_well_formed": ep.n_well_formed,
            "n_rehearsals": sum(t["role"] == Role.REHEARSER for t in ep.turns),
            "n_rehearsal_errors": ep.n_rehearsal_errors, "env_executions": ep.env.executions,
            "prompt_tokens": ep.prompt_tokens, "generated_tokens": ep.generated_tokens,
            "private_tokens": sum(m["caller_tokens"] + m["rehearser_tokens"] + m["summariser_tokens"]
                                  for m in ep.memories),
            "imagined_steps": sum(m["imagined_steps"] for m in ep.memories),
            "context_ids": ep.ids, "wall_s": time.perf_counter() - ep.started,
        }

    # -- answering calls ----------------------------------------------------------------------------

    def _sampling(self, max_new_tokens: int, greedy: bool = False, frozen: bool = False) -> SamplingParams:
        self._sampling_step += 1
        c = self.config
        return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else c.temperature,
                              top_p=c.top_p, seed=c.seed * 1_000_003 + self._sampling_step, frozen=frozen)

    @property
    def sampling_step(self) -> int:
        return self._sampling_step

    def generate_role(self, prompts: list[list[int]], max_new_tokens: int, greedy: bool = False) -> list[Generation]:
        """One backend call for a role outside the caller/rehearser loop (the summariser)."""
        return self._generate(prompts, self._sampling(max_new_tokens, greedy=greedy))

    def _generate(self, prompts: list[list[int]], params: SamplingParams,
                  backend: Backend | None = None) -> list[Generation]:
        start = time.perf_counter()
        gens = (backend or self.backend).generate(prompts, params)
        self.generation_s += time.perf_counter() - start
        return gens

    def _rehearse(self, items: list[tuple[Episode, int, ToolCall]]) -> list[Rehearsal]:
        """Every pending call of every episode, rehearsed in one backend call."""
        if not items:
            return []
        options = self.config.rehearser
        shown, prompts = [], []
        for ep, _, call in items:
            examples = self.examples.for_call(ep.task, call, options)
            shown.append([e.content for e in examples])
            messages = rehearser_prompt(ep.task, call, examples, ep.history, ep.latest, options)
            prompts.append(encode_messages(self.backend.tokenizer, messages))
        gens = self._generate(prompts, self._sampling(options.max_new_tokens, frozen=self.config.frozen_rehearser))
        out = []
        for (ep, index, _), prompt, gen, examples in zip(items, prompts, gens, shown, strict=True):
            parsed = parse_execution_result(gen.text)
            ep.turns.append(self._row(ep, Role.REHEARSER, gen, call_index=index, prompt_ids=prompt,
                                      prompt_len=len(prompt), parse_error=parsed.error,
                                      parse_detail=parsed.detail or None))
            if parsed.error:
                ep.n_rehearsal_errors += 1
                message = f"INVALID_EXECUTION_RESULT: {parsed.error}"
                result = ToolResult(json.dumps({"error": message}), True, "INVALID_EXECUTION_RESULT")
            else:
                value = parsed.value
                failed = is_error_value(value)
                kind = value["error"] if failed and value["error"] in _NAMED_ERRORS else "TOOL_ERROR"
                result = ToolResult(content_of(value), failed, kind if failed else "")
            out.append(Rehearsal(result, parsed, examples))
        return out

    def _pair(self, ep: Episode, index: int, call: ToolCall, real: ToolResult, rehearsal: Rehearsal,
              fed: str) -> dict[str, Any]:
        rehearsed = None if rehearsal.parsed.error else rehearsal.result.content
        rehearsed_error = None if rehearsal.parsed.error else rehearsal.result.is_error
        return {
            "episode_id": ep.episode_id, "turn": ep.turn, "step": ep.step, "call_index": index,
            "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False), "fed_back": fed,
            "real_response": real.content, "rehearsed_response": rehearsed,
            "real_is_error": real.is_error, "rehearsed_is_error": rehearsed_error,
            "rehearsal_error": rehearsal.parsed.error,
            **fidelity.score_pair(real.content, rehearsed, real.is_error, rehearsed_error, rehearsal.examples),
            "embed_cos": None, "decision_changed": None,
        }

    def _answer(self, pending: list[tuple[Episode, list[ToolCall]]]) -> None:
        items = [(ep, i, call) for ep, calls in pending for i, call in enumerate(calls)]
        # Dyna-style mix: in `rehearse` mode a share of calls goes to the real environment instead.
        mixed = [self.mode == Mode.REHEARSE and self._rng.random() < self.config.real_fraction for _ in items]
        to_env = [k for k, m in enumerate(mixed) if m or self.mode != Mode.REHEARSE]
        to_rehearser = [k for k, m in enumerate(mixed) if not m and self.mode != Mode.REAL]
        real = {k: items[k][0].env.execute(items[k][2]) for k in to_env}
        rehearsed = dict(zip(to_rehearser, self._rehearse([items[k] for k in to_rehearser]), strict=True))
        feed_real = self.mode in (Mode.REAL, Mode.REAL_SHADOW)
        cursor = 0
        for ep, calls in pending:
            span = range(cursor, cursor + len(calls))
            cursor += len(calls)
            fed = [real[k] if feed_real or mixed[k] else rehearsed[k].result for k in span]
            # Without the environment, the schema alone decides what the checker would have executed.
            dispatched = [real[k].dispatched if k in real else check_call(items[k][2], ep.env.tools) is None
                          for k in span]
            sources = ["real" if feed_real or mixed[k] else "rehearsed" for k in span]
            base = ep.ids  # forks copy it before `_on_results` extends it
            for i, k in enumerate(span):
                if k in real and k in rehearsed:
                    pair = self._pair(ep, i, calls[i], real[k], rehearsed[k], sources[i])
                    ep.pairs.append(pair)
                    if pair["rehearsed_response"] is not None and self._rng.random() < self.config.decision_sample:
                        self._fork(pair, base, fed, i, real[k], rehearsed[k].result)
            self._on_results(ep, calls, fed, sources, dispatched)
            if not feed_real and self.config.rehearser.on_error == "end_episode" and ep.termination is None and \
                    any(rehearsed[k].parsed.error for k in span if k in rehearsed):
                ep.termination = "rehearsal_error"

    def _fork(self, pair: dict[str, Any], base: list[int], fed: list[ToolResult], i: int,
              real: ToolResult, rehearsed: ToolResult) -> None:
        def swapped(result: ToolResult) -> list[int]:
            return base + self.renderer.tool_results(fed[:i] + [result] + fed[i + 1:])

        self._forks.append(Fork(pair, swapped(real), swapped(rehearsed)))

    def _resolve_forks(self) -> None:
        """Generate the next caller action after each forked pair's real and rehearsed response (greedy)."""
        if not self._forks:
            return
        prompts = [p for f in self._forks for p in (f.after_real, f.after_rehearsed)]
        gens = self._generate(prompts, self._sampling(self.config.max_new_tokens, greedy=True))
        for n, fork in enumerate(self._forks):
            a, b = (parse_tool_calls(gens[2 * n + j].text) for j in (0, 1))
            changed = fidelity.call_key(a.calls) != fidelity.call_key(b.calls)
            fork.pair["decision_changed"] = changed or (a.error is None) != (b.error is None)
        self._forks = []

    # -- the batched loop ---------------------------------------------------------------------------

    def run_batch(self, batch: list[tuple[Task, int]]) -> list[Episode]:
        """Play a batch of (task, group index) episodes to the end; return them, finished."""
        episodes = [self._start(task, g) for task, g in batch]
        self.play(episodes)
        self._resolve_forks()
        self._embed([p for ep in episodes for p in ep.pairs])
        return episodes

    def play(self, episodes: list[Episode]) -> None:
        """Advance started episodes until each terminates (private rehearsal opens turns on the way)."""
        while True:
            opening = [ep for ep in episodes if ep.open_turn and ep.termination is None]
            if opening and self.private:
                for ep, memory in zip(opening, self.private.memories(self, opening), strict=True):
                    self._open(ep, memory)
            for ep in episodes:
                if ep.termination is None and self.max_context and \
                        len(ep.ids) + self.config.max_new_tokens > self.max_context:
                    ep.termination = "context_exceeded"
            users = [ep for ep in episodes if ep.awaiting_user and ep.termination is None]
            if users:
                self._simulate_users(users)
                continue
            waiting = [ep for ep in episodes if ep.termination is None and not ep.open_turn]
            if not waiting:
                break
            gens = self._generate([list(ep.ids) for ep in waiting], self._sampling(self.config.max_new_tokens))
            pending = [(ep, calls) for ep, gen in zip(waiting, gens, strict=True)
                       if (calls := self._on_generation(ep, gen))]
            if pending:
                self._answer(pending)
            if self.on_step:
                self.on_step(len(waiting), self._tokens)

    def _embed(self, pairs: list[dict[str, Any]]) -> None:
        scored = [p for p in pairs if p["rehearsed_response"] is not None]
        if self.config.embedding and scored:
            from envace.embedding import cosine

            sims = cosine([p["real_response"] for p in scored], [p["rehearsed_response"] for p in scored])
            for pair, sim in zip(scored, sims, strict=True):
                pair["embed_cos"] = sim

    def batches(self, tasks: list[Task]) -> Iterator[list[tuple[Task, int]]]:
        items = [(t, g) for t in tasks for g in range(self.config.group_size)]
        size = self.config.batch_size
        for i in range(0, len(items), size):
            yield items[i: i + size]

    def run_summary(self, episodes: list[Episode]) -> dict[str, Any]:
        """Summary counters of finished episodes played outside `run` (scores them)."""
        summary = Summary()
        for ep in episodes:
            summary.add(self.episode_row(ep), len(ep.pairs))
        summary.generation_s = self.generation_s
        return summary.as_dict()

    def run(self, tasks: list[Task], run: Run | None = None,
            on_episode: Callable[[dict[str, Any]], None] | None = None) -> Summary:
        """Play every task `group_size` times, writing one shard per batch and table to `run`."""
        summary = Summary()
        started = time.perf_counter()
        for index, batch in enumerate(self.batches(tasks)):
            episodes = self.run_batch(batch)
            rows = [self.episode_row(ep) for ep in episodes]
            if run is not None:
                key = {"run_id": run.run_id, "batch": index}
                shard = f"batch-{index:05d}"
                run.write("episodes", shard, [{**key, **r} for r in rows])
                for table in ("turns", "calls", "pairs") + (("memories", "imagined") if self.private else ()):
                    run.write(table, shard, [{**key, **r} for ep in episodes for r in getattr(ep, table)])
            for ep, row in zip(episodes, rows, strict=True):
                summary.add(row, len(ep.pairs))
                if on_episode:
                    on_episode(row)
        summary.generation_s = self.generation_s
        summary.wall_s = time.perf_counter() - started
        return summary
