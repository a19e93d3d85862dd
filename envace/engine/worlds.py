"""Worlds: who answers the caller's calls. The engine hands every pending call of a step to its world.

    World.answer(pending) -> one Answer per call: the result fed back to the caller, who wrote it, whether
                             a checker counts the call as executed, and the real and rehearsed responses
                             it holds (both present: a pair for the fidelity ledger)

- `RealWorld`: each episode's own environment executes the call.
- `RehearsedWorld`: the policy as rehearser answers every call of every episode in one backend call; no
  environment is touched, and the schema alone says which calls a checker would have executed.
- `DynaMix(real, rehearsed, fraction)`: a share of calls goes to the real world instead (Dyna-style).
- `Shadow(fed, beside)`: `fed` answers and is fed back; `beside` answers the same calls for the ledger
  only (on a share of episodes, or all). Its pairs carry the fidelity metrics, and a sampled share is
  forked (`Forks`): the caller's next action after the real and after the rehearsed response.

A new world is a class, not a branch in the engine. The CLI's modes map to worlds in one place
(`envace.build.world_for`). Worlds compose: `Shadow(DynaMix(...), RealWorld())` answers each call once in each
world (a call the mix already sent to the real environment is not executed twice). A world's random draws go
through `streams.draws`: its own generator, or under the per-episode loop the episode's, so that no episode's
draws depend on another's timing.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from envace import fidelity
from envace.engine import streams
from envace.engine.episode import Episode, Pending
from envace.engine.prompts import ChatRenderer
from envace.engine.rehearser import Rehearsal, Rehearser
from envace.engine.sampler import Sampler
from envace.envs.benchmark import json_error
from envace.envs.validate import check_call
from envace.formats import parse_tool_calls, strip_thinking
from envace.types import ToolResult


@dataclass
class Answer:
    """One call's answer. `ends` names a termination it forces on its episode (a malformed rehearsal fed
    back under `on_error = end_episode`)."""

    fed: ToolResult
    source: str  # real | rehearsed: who wrote what the caller sees
    dispatched: bool  # a checker counts the call as executed (validation refused it otherwise)
    real: ToolResult | None = None
    rehearsal: Rehearsal | None = None
    ends: str | None = None


class World:
    """Answers pending calls; `finish` runs once after a batch of episodes has played out.

    `kind` says which response an answer of this world holds (`real`, `rehearsed`), `mixed` when it varies;
    `touches_env` whether it may ask an episode's environment anything.
    """

    kind = "mixed"
    touches_env = True

    def answer(self, pending: list[Pending]) -> list[Answer]:
        raise NotImplementedError

    def finish(self) -> None:
        """Work deferred to the end of a batch (decision forks, embeddings)."""


class RealWorld(World):
    kind = "real"

    def answer(self, pending: list[Pending]) -> list[Answer]:
        out = []
        for p in pending:
            result = p.episode.env.execute(p.call)
            out.append(Answer(result, "real", result.dispatched, real=result))
        return out


class RehearsedWorld(World):
    """The rehearser answers; `on_error = end_episode` ends an episode fed a malformed rehearsal."""

    kind = "rehearsed"
    touches_env = False

    def __init__(self, rehearser: Rehearser) -> None:
        self.rehearser = rehearser

    def answer(self, pending: list[Pending]) -> list[Answer]:
        ends = self.rehearser.options.on_error == "end_episode"
        return [Answer(r.result, "rehearsed", _dispatchable(p), rehearsal=r,
                       ends="rehearsal_error" if ends and r.parsed.error else None)
                for p, r in zip(pending, self.rehearser.rehearse(pending), strict=True)]


def _dispatchable(p: Pending) -> bool:
    """Whether the episode's environment would have run the call (its own validation rule; an imagined attempt,
    which has no environment, the full schema check)."""
    env = p.episode.env
    return (env.dispatchable(p.call, p.episode.tools) if env is not None else check_call(p.call, p.episode.tools)) \
        is None


class DynaMix(World):
    """Each call goes to `real` with probability `fraction`, else to `rehearsed`."""

    def __init__(self, real: World, rehearsed: World, fraction: float, rng: random.Random) -> None:
        self.real, self.rehearsed, self.fraction, self.rng = real, rehearsed, fraction, rng
        self.touches_env = fraction > 0

    def answer(self, pending: list[Pending]) -> list[Answer]:
        rng = streams.draws(self.rng)  # the episode's own under the per-episode loop
        to_real = [rng.random() < self.fraction for _ in pending]
        return _merge(to_real, self.real.answer([p for p, r in zip(pending, to_real, strict=True) if r]),
                      self.rehearsed.answer([p for p, r in zip(pending, to_real, strict=True) if not r]))

    def finish(self) -> None:
        self.real.finish()
        self.rehearsed.finish()


def _merge(first: list[bool], answers_a: list[Answer], answers_b: list[Answer]) -> list[Answer]:
    """Answers back in pending order: `first[k]` says call k was answered in `answers_a`."""
    a, b = iter(answers_a), iter(answers_b)
    return [next(a) if take else next(b) for take in first]


class Forks:
    """Decision-relevant fidelity: for a sampled share of pairs, the caller's next action (greedy) after the
    real and after the rehearsed response, all forks of a batch in one backend call."""

    def __init__(self, sampler: Sampler, renderer: ChatRenderer, share: float, max_new_tokens: int,
                 rng: random.Random) -> None:
        self.sampler, self.renderer, self.share, self.max_new_tokens, self.rng = \
            sampler, renderer, share, max_new_tokens, rng
        self.open: list[tuple[dict[str, Any], list[int], list[int], str]] = []

    def maybe(self, pair: dict[str, Any], base: list[int], fed: list[ToolResult], i: int, real: ToolResult,
              rehearsed: ToolResult, task_uid: str = "") -> None:
        if streams.draws(self.rng).random() >= self.share:
            return

        def swapped(result: ToolResult) -> list[int]:
            return base + self.renderer.tool_results(fed[:i] + [result] + fed[i + 1:])

        self.open.append((pair, swapped(real), swapped(rehearsed), task_uid))

    def resolve(self) -> None:
        if not self.open:
            return
        prompts = [p for _, after_real, after_rehearsed, _ in self.open for p in (after_real, after_rehearsed)]
        tasks = [uid for *_, uid in self.open for _ in (0, 1)]
        gens = self.sampler(prompts, self.max_new_tokens, greedy=True, tasks=tasks)
        for n, (pair, *_) in enumerate(self.open):
            a, b = (parse_tool_calls(strip_thinking(gens[2 * n + j].text)) for j in (0, 1))
            changed = fidelity.call_key(a.calls) != fidelity.call_key(b.calls)
            pair["decision_changed"] = changed or (a.error is None) != (b.error is None)
        self.open = []


class Shadow(World):
    """`fed` answers and is fed back; `beside` answers the same calls for the fidelity ledger only.

    `share` < 1 shadows that share of episodes (drawn once per episode, so a shadowed episode's real
    environment sees every call of it, in order). `which` narrows it to some calls of those episodes (the
    user turns of `RolloutConfig.shadow_turns`); `beside` must then be a world without state of its own (the
    rehearser), or its environment would miss calls. A call `fed` already answered in `beside`'s kind (a
    Dyna-mixed real call) is not answered again.
    """

    def __init__(self, fed: World, beside: World, share: float = 1.0, rng: random.Random | None = None,
                 forks: Forks | None = None, embedding: bool = False,
                 is_error: Callable[[str], bool] = json_error, which: Callable[[Pending], bool] | None = None
                 ) -> None:
        if which is not None and beside.touches_env:
            raise ValueError("Shadow: a real world beside must see every call of its episode (no `which`)")
        self.which = which
        self.fed, self.beside, self.share, self.rng = fed, beside, share, rng or random.Random(0)
        self.is_error = is_error  # the benchmark's failure convention, for the real side of error agreement
        self.touches_env = fed.touches_env or (beside.touches_env and share > 0)
        self.forks, self.embedding = forks, embedding
        self.pairs: list[dict[str, Any]] = []

    def _shadowed(self, ep: Episode) -> bool:
        if ep.shadowed is None:
            ep.shadowed = self.share >= 1 or streams.draws(self.rng).random() < self.share
        return ep.shadowed

    def answer(self, pending: list[Pending]) -> list[Answer]:
        fed = self.fed.answer(pending)
        ask = [self._shadowed(p.episode) and (self.which is None or self.which(p))
               and (a.real if self.beside.kind == "real" else a.rehearsal) is None
               for p, a in zip(pending, fed, strict=True)]
        beside = iter(self.beside.answer([p for p, k in zip(pending, ask, strict=True) if k]))
        answers = []
        for a, k in zip(fed, ask, strict=True):
            if k:
                other = next(beside)
                a = replace(a, real=a.real or other.real, rehearsal=a.rehearsal or other.rehearsal)
            answers.append(a)
        for p, a in zip(pending, answers, strict=True):
            if a.real is not None and a.rehearsal is not None and p.episode.shadowed:
                self._pair(p, a, [b.fed for q, b in zip(pending, answers, strict=True) if q.episode is p.episode])
        return answers

    def _pair(self, p: Pending, a: Answer, fed: list[ToolResult]) -> None:
        ep, rehearsal = p.episode, a.rehearsal
        rehearsed = None if rehearsal.parsed.error else rehearsal.result.content
        rehearsed_error = None if rehearsal.parsed.error else rehearsal.result.is_error
        real_error = fidelity.real_error(a.real, self.is_error)
        pair = {
            "episode_id": ep.episode_id, "turn": ep.turn, "turn_step": ep.turn_step, "call_index": p.index,
            "name": p.call.name, "arguments": json.dumps(p.call.arguments, ensure_ascii=False),
            "fed_back": a.source, "real_response": a.real.content, "rehearsed_response": rehearsed,
            "real_is_error": real_error, "rehearsed_is_error": rehearsed_error,
            "rehearsal_error": rehearsal.parsed.error,
            **fidelity.score_pair(a.real.content, rehearsed, real_error, rehearsed_error, rehearsal.examples),
            "embed_cos": None, "decision_changed": None,
        }
        ep.pairs.append(pair)
        self.pairs.append(pair)
        if self.forks is not None and rehearsed is not None:
            # `ep.ids` still ends at the caller's message: the engine appends the results after `answer`
            self.forks.maybe(pair, ep.ids, fed, p.index, a.real, rehearsal.result, ep.task.uid)

    def finish(self) -> None:
        self.fed.finish()
        self.beside.finish()
        if self.forks is not None:
            self.forks.resolve()
        scored = [p for p in self.pairs if p["rehearsed_response"] is not None]
        if self.embedding and scored:
            from envace.embedding import cosine

            sims = cosine([p["real_response"] for p in scored], [p["rehearsed_response"] for p in scored])
            for pair, sim in zip(scored, sims, strict=True):
                pair["embed_cos"] = sim
        self.pairs = []
