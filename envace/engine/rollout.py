"""The batched rollout engine: many episodes advance together, one backend call per step and role.

    while an episode is playing:
        open user turns wait for their private-rehearsal memory (`before_turn`), if any
        episodes waiting on a simulated user get their next user message (`user.UserSimulator`)
        every episode waiting on the caller goes to the backend in ONE call (save a turn's first message that
            private rehearsal chose among its imagined attempts: committed as written, `memory = select`)
        each message is parsed: a plain answer ends the user turn; its calls go to the WORLD
        the world answers every pending call of every episode (`worlds.World.answer`)
        the answers are appended to each caller context as token ids; the episode waits on the caller again

Every episode waits here for the slowest one of its step (`Episode.wait_s`: its share of the phases it had no
part in, and of backend calls it had finished first). With `episode_loop = "per_episode"` the engine plays
this loop for one episode at a time instead, each on its own thread (`per_episode.py`).

Who answers a call is the world's business alone (real environment, rehearser, both, a mix), and what
happens before a user turn is the hook's; the engine only plays the turns. Generated ids are appended
verbatim (token-in-token-out), so step k+1's prompt starts with step k's prompt and completion (across user
turns too, unless `past_thinking = "drop"` re-renders the past messages when a turn starts: `past_thinking.py`).

A turn task (`Task.start_turn` = k > 0, `envace.units`) starts after its gold prefix: turns 0..k-1 are
replayed as the reference played them (each gold call its own caller message, the recorded real response
fed back, a closing "Done."), the environment executing the calls too when the world may consult it, and
the policy plays turn k alone.

Terminations: `completed`, `step_limit` (max_steps_per_turn caller messages in one turn; BFCL
force-terminates there), `context_exceeded`, `parse_error` (malformed call, on_parse_error =
end_episode), `rehearsal_error` (malformed rehearsal fed back, rehearser.on_error = end_episode),
`user_turn_limit` (a simulated user still talking after max_user_turns).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Protocol

from envace.config import RolloutConfig
from envace.engine.episode import Episode, Pending
from envace.engine.examples import ExampleBank
from envace.engine.past_thinking import drop_past_thinking
from envace.engine.per_episode import play_each
from envace.engine.prompts import ChatRenderer
from envace.engine.sampler import Sampler
from envace.engine.user import UserSimulator
from envace.engine.worlds import Answer, World
from envace.envs.registry import Benchmark
from envace.formats import parse_tool_calls, render_tool_call, strip_thinking
from envace.policy.backend import Generation
from envace.types import Role, Task, ToolCall

# Rehearsed answers that refuse a call or fail to answer it (`rehearser.as_result`'s error kinds).
REFUSALS = {"INVALID_TOOL_CALL_FORMAT", "TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS", "INVALID_EXECUTION_RESULT"}


class BeforeTurn(Protocol):
    """Runs before chosen user turns are rendered and writes a memory for each (private rehearsal)."""

    def wants(self, ep: Episode) -> bool: ...

    def memories(self, engine: RolloutEngine, episodes: list[Episode]) -> list[str]: ...


class RolloutEngine:
    """Plays episodes of one benchmark in `world`; see the module docstring for the loop.

    `build.build_engine` assembles one from a config (the mode's world, the rehearser, the simulated
    user, private rehearsal). `id_prefix` keeps episode ids unique across a training run's steps.
    """

    def __init__(self, sampler: Sampler, benchmark: Benchmark, config: RolloutConfig, world: World,
                 renderer: ChatRenderer | None = None, examples: ExampleBank | None = None,
                 users: UserSimulator | None = None, before_turn: BeforeTurn | None = None,
                 max_context: int | None = None, id_prefix: str = "") -> None:
        if not isinstance(config.max_new_tokens, int):
            raise ValueError("max_new_tokens = auto must be resolved on the gold data first (envace.units)")
        self.sampler, self.benchmark, self.config, self.world = sampler, benchmark, config, world
        self.renderer = renderer or ChatRenderer(sampler.tokenizer, config.tool_docs, config.thinking)
        self.examples = examples or ExampleBank()
        self.users = users or UserSimulator(sampler, self.renderer, None, config.user_max_new_tokens,
                                            config.max_steps_per_turn)
        self.before_turn = before_turn
        self.max_context = max_context
        self.id_prefix = id_prefix
        self.on_step: Callable[[int, int], None] | None = None  # (episodes generated for, tokens so far)

    # -- one episode's transitions ------------------------------------------------------------------

    def start(self, task: Task, group_index: int) -> Episode:
        env = self.benchmark.make_env()
        env.reset(task)
        demo = self.examples.demonstration(task) if self.config.caller_demo else None
        if task.simulated_user is not None:  # the episode's own copy: its user turns are written as it goes
            task = replace(task, user_turns=[])
        episode_id = f"{self.id_prefix}{task.uid.replace('/', '.')}#{group_index}"
        ep = Episode(episode_id, task, group_index, env, env.tools, demo=demo)
        if task.simulated_user is not None:
            self.users.start(ep)
            return ep
        ep.history.append(("User", task.user_turns[0]))
        if task.start_turn:
            self._replay_gold_prefix(ep)
        self.open(ep)
        return ep

    def _replay_gold_prefix(self, ep: Episode) -> None:
        """Turns 0..start_turn-1 as the reference played them; see the module docstring."""
        for _ in range(ep.task.start_turn):
            self._past_turns(ep)
            ep.ids = self.turn_ids(ep)
            ep.prompt_tokens = ep.prompt_tokens or len(ep.ids)  # the opening's
            for step in ep.task.reference[ep.turn]:
                self._append_message(ep, render_tool_call(step.call))
                if self.world.touches_env:  # the real world's state must be the one the played turn starts in
                    ep.env.execute(step.call)
                ep.calls.append(self._call_row(ep, 0, step.call, "gold", step.result))
                ep.history.append((f"Tool[{step.call.name}]", step.result.content))
                ep.issued[ep.turn].append(step.call)
                ep.steps[ep.turn].append([step.call] if step.result.dispatched else [])
                ep.ids.extend(self.renderer.tool_results([step.result]))
                ep.turn_step += 1
            self._append_message(ep, "Done.")
            ep.texts.append("Done.")
            ep.turn, ep.turn_step = ep.turn + 1, 0
            ep.steps.append([])
            ep.issued.append([])
            ep.history.append(("User", ep.task.user_turns[ep.turn]))

    def _append_message(self, ep: Episode, text: str) -> None:
        """A caller message the policy did not write (the gold prefix), as the tokenizer spells it."""
        start = len(ep.ids)
        ep.ids.extend(self.renderer.encode(text) + [self.renderer.end_of_message])
        ep.caller_spans.append((start, len(ep.ids)))
        ep.history.append(("Assistant", text))

    @staticmethod
    def _call_row(ep: Episode, index: int, call: ToolCall, source: str, result) -> dict:
        return {"episode_id": ep.episode_id, "turn": ep.turn, "turn_step": ep.turn_step, "call_index": index,
                "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False), "source": source,
                "response": result.content, "is_error": result.is_error, "error_kind": result.error_kind}

    def step_limit(self, ep: Episode) -> int:
        """Caller messages allowed in the current turn: the config's, or the turn's gold calls + 1 (`auto`), and
        never more than the task's own limit (`Task.max_steps_per_turn`)."""
        if self.config.max_steps_per_turn != "auto":
            limit = self.config.max_steps_per_turn
        else:
            turn = min(ep.turn, len(ep.task.reference) - 1)
            limit = len(ep.task.reference[turn]) + 1 if turn >= 0 else 1
        return limit if ep.task.max_steps_per_turn is None else min(limit, ep.task.max_steps_per_turn)

    def turn_ids(self, ep: Episode, memory: str = "") -> list[int]:
        """The caller context with the current user turn rendered (with a private-rehearsal memory)."""
        if ep.turn == 0:
            return self.renderer.opening(ep.task, ep.demo, memory)
        text = ep.task.user_turns[ep.turn]
        return ep.ids + self.renderer.user_turn(text, ep.task.tools_added.get(ep.turn), memory)

    def _past_turns(self, ep: Episode) -> None:
        """A user turn starts: the caller's messages so far become past ones (`past_thinking`)."""
        if self.config.past_thinking == "drop":
            drop_past_thinking(ep, self.renderer)

    def open(self, ep: Episode, memory: str | None = None) -> None:
        """Render the current user turn, or leave it open for the before-turn hook to write a memory first."""
        self._past_turns(ep)  # before the hook too: an imagined attempt starts from the context the turn will have
        if memory is None and self.before_turn is not None and self.before_turn.wants(ep):
            ep.open_turn = True
            return
        ep.ids = self.turn_ids(ep, memory or "")
        ep.open_turn = False
        if ep.turn == 0:
            ep.prompt_tokens = len(ep.ids)

    def _on_generation(self, ep: Episode, gen: Generation) -> list[ToolCall]:
        """Append the caller's message; return the calls to answer (empty when the turn ended)."""
        prompt_len = len(ep.ids)
        ep.ids.extend(gen.ids)
        if gen.finish == "length":  # close the cut-off message so the next delta renders after it
            ep.ids.append(self.renderer.end_of_message)
        ep.caller_spans.append((prompt_len, len(ep.ids)))
        text = strip_thinking(gen.text)  # a call inside the model's thinking is no action
        parsed = parse_tool_calls(text)
        ep.record(Role.CALLER, gen, prompt_len, n_calls=len(parsed.calls), parse_error=parsed.error,
                  parse_detail=parsed.detail or None,
                  user_message=ep.task.user_turns[ep.turn] if ep.turn_step == 0 else None)
        ep.latest = text
        if parsed.error and self.config.on_parse_error == "end_episode":
            ep.termination = "parse_error"
            return []
        if parsed.calls:
            return parsed.calls
        ep.history.append(("Assistant", text))
        ep.texts.append(text)
        self._end_turn(ep)
        return []

    def _on_answers(self, ep: Episode, calls: list[ToolCall], answers: list[Answer]) -> None:
        ep.history.append(("Assistant", ep.latest))
        for index, (call, answer) in enumerate(zip(calls, answers, strict=True)):
            ep.calls.append(self._call_row(ep, index, call, answer.source, answer.fed))
            ep.history.append((f"Tool[{call.name}]", answer.fed.content))
        # a call the rehearser refused (or answered with a malformed result) did not happen in the world the
        # caller played in: it cannot pass its checklist item
        ep.issued[ep.turn].extend(c for c, a in zip(calls, answers, strict=True)
                                  if not (a.source == "rehearsed" and a.fed.error_kind in REFUSALS))
        ep.steps[ep.turn].append([c for c, a in zip(calls, answers, strict=True) if a.dispatched])
        ep.ids.extend(self.renderer.tool_results([a.fed for a in answers]))
        ep.turn_step += 1
        if ep.turn_step >= self.step_limit(ep):
            ep.termination = "step_limit"
        ends = next((a.ends for a in answers if a.ends), None)
        if ends and ep.termination is None:
            ep.termination = ends

    def _end_turn(self, ep: Episode) -> None:
        ep.turn += 1
        ep.turn_step = 0
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
            self.users.hear(ep, ep.texts[-1])
            return
        ep.history.append(("User", ep.task.user_turns[ep.turn]))
        self.open(ep)

    # -- the batched loop ---------------------------------------------------------------------------

    def run_batch(self, batch: list[tuple[Task, int]]) -> list[Episode]:
        """Play a batch of (task, group index) episodes to the end; return them, finished. `episode_loop` says how:
        all together in lock-step (`play`), or each on its own thread (`per_episode.play_each`)."""
        episodes = [self.start(task, g) for task, g in batch]
        if self.config.episode_loop == "per_episode":
            play_each(self, episodes)
        else:
            self.play(episodes)
        self.world.finish()
        return episodes

    def play(self, episodes: list[Episode]) -> None:
        """Advance started episodes until each terminates (the before-turn hook opens turns on the way)."""
        while True:
            opening = [ep for ep in episodes if ep.open_turn and ep.termination is None]
            if opening:
                with _holding(episodes, opening):
                    memories = self.before_turn.memories(self, opening)
                for ep, memory in zip(opening, memories, strict=True):
                    self.open(ep, memory)
            for ep in episodes:
                if ep.termination is None and self.max_context and \
                        len(ep.ids) + self.config.max_new_tokens > self.max_context:
                    ep.termination = "context_exceeded"
            users = [ep for ep in episodes if ep.awaiting_user and ep.termination is None]
            if users:
                with _holding(episodes, users):
                    opened = self.users.respond(users)
                for ep in opened:
                    self.open(ep)
                continue
            now = time.perf_counter()
            for ep in episodes:  # each episode's own end, however long the others still run
                if ep.termination is not None and ep.ended is None:
                    ep.ended = now
            waiting = [ep for ep in episodes if ep.termination is None and not ep.open_turn]
            if not waiting:
                break
            gens = self._generate(waiting)
            pending = [(ep, calls) for ep, gen in zip(waiting, gens, strict=True)
                       if (calls := self._on_generation(ep, gen))]
            if pending:
                with _holding(episodes, [ep for ep, _ in pending]):
                    answers = iter(self.world.answer([Pending(ep, i, c) for ep, calls in pending
                                                      for i, c in enumerate(calls)]))
                for ep, calls in pending:
                    self._on_answers(ep, calls, [next(answers) for _ in calls])
            if self.on_step:
                self.on_step(len(waiting), self.sampler.tokens)

    def _generate(self, waiting: list[Episode]) -> list[Generation]:
        """The next caller message of each waiting episode: one backend call, save for a first message private
        rehearsal already chose (`Episode.chosen`), which is committed as it was written."""
        fresh = [ep for ep in waiting if ep.chosen is None]
        sampled = iter(self.sampler([list(ep.ids) for ep in fresh], self.config.max_new_tokens,
                                    tasks=[ep.task.uid for ep in fresh]) if fresh else [])
        gens = [ep.chosen if ep.chosen is not None else next(sampled) for ep in waiting]
        for ep in waiting:
            ep.chosen = None
        return gens

    def batches(self, tasks: list[Task]) -> Iterator[list[tuple[Task, int]]]:
        """Every task `group_size` times, `batch_size` episodes at a time (a task's group stays together)."""
        items = [(t, g) for t in tasks for g in range(self.config.group_size)]
        size = self.config.batch_size
        for i in range(0, len(items), size):
            yield items[i: i + size]


@contextmanager
def _holding(episodes: list[Episode], busy: list[Episode]) -> Iterator[None]:
    """A phase of the loop that only `busy` take part in: every other episode still playing waits through it, its
    next request ready (`Episode.wait_s`). With one episode (the per-episode loop's) nothing waits."""
    taking_part = {id(ep) for ep in busy}
    held = [ep for ep in episodes if ep.termination is None and id(ep) not in taking_part]
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - started
        for ep in held:
            ep.wait_s += seconds
