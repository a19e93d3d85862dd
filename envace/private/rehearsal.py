"""Test-time private rehearsal: imagine a turn N times, write down what was learned, then act once for real.

When a real episode opens a user turn (or only its first turn, with scope = episode), the policy first
plays imagined attempts of it in the rehearsed world, as caller and as environment, starting from the
real history so far; then the attempts are condensed into a *rehearsal memory* (`memory.py`: written by the
policy as summariser, or a deterministic transcript); the turn is then rendered with the memory appended to
the user's message and executed for real, once.

- parallel: N independent attempts, summarised together.
- sequential: N rounds of one attempt; attempt k sees the memory of attempts 1..k−1 in its user
  message, and the summariser revises that memory after it.
- memory = select (parallel): no memory; the attempts are scored by their imagined outcome and the best one's
  first message is committed as the turn's first (`selection.py`).

`PrivateRehearsal` is the engine's before-turn hook. All attempts of all episodes that open a turn at
the same step advance together in a sub-engine whose world is a `RehearsedWorld` (one backend call per
step and role), and all their summaries go in one call. An imagined attempt carries the tools' schemas
but no environment, so no real call can happen during rehearsal; it is rehearsed by the engine's own
rehearser (the policy, or `rehearser_model`). Budget 0 never gets here: the plain policy, unchanged.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

from envace.config import PrivateOptions
from envace.engine.episode import Episode
from envace.engine.prompts import summariser_prompt
from envace.engine.rehearser import Rehearser
from envace.engine.rollout import RolloutEngine
from envace.engine.sampler import Sampler
from envace.engine.worlds import RehearsedWorld
from envace.fidelity import call_key
from envace.formats import parse_tool_calls, strip_thinking
from envace.private import selection
from envace.private.memory import attempt_lines, parse_memory, transcript_memory
from envace.types import Role


class PrivateRehearsal:
    """Writes one rehearsal memory per episode opening a turn; see the module docstring.

    Safe to call from several threads at once (`concurrent`, the per-episode loop): each call imagines in a
    sub-engine of its own, and the rehearser that judges a thread's attempts is that thread's (`imagining`).
    """

    concurrent = True

    def __init__(self, options: PrivateOptions, rehearser: Rehearser | None = None) -> None:
        self.options, self.rehearser = options, rehearser  # the engine's rehearser (None: the policy's own)
        self._local = threading.local()

    @property
    def imagining(self) -> Rehearser | None:
        """This thread's last sub-engine's rehearser (`_sub_engine`)."""
        return getattr(self._local, "imagining", None)

    @imagining.setter
    def imagining(self, rehearser: Rehearser | None) -> None:
        self._local.imagining = rehearser

    def wants(self, ep: Episode) -> bool:
        return self.options.scope == "turn" or ep.turn == 0

    def _sub_engine(self, engine: RolloutEngine) -> RolloutEngine:
        o = self.options
        config = replace(engine.config, mode="rehearse", real_fraction=0.0, shadow_fraction=0.0,
                         max_steps_per_turn=o.max_steps, temperature=o.temperature, private=PrivateOptions(),
                         decision_sample=0.0, embedding=False,
                         seed=engine.config.seed * 7_919 + engine.sampler.position)
        # the engine's clock: the attempts' backend time is the job's generation time
        sampler = Sampler(engine.sampler.backend, config.temperature, config.top_p, config.seed, engine.sampler.clock)
        rehearser = self.rehearser.reseeded(sampler, config.rehearser, config.frozen_rehearser) if self.rehearser \
            else Rehearser(sampler, engine.renderer, engine.examples, config.rehearser,
                           frozen=config.frozen_rehearser, is_error=engine.benchmark.is_error,
                           max_context=engine.max_context)
        self.imagining = rehearser  # the rehearser of the attempts: select's judge, whatever world plays them
        return RolloutEngine(sampler, engine.benchmark, config, RehearsedWorld(rehearser), engine.renderer,
                             engine.examples, max_context=engine.max_context)

    def _imagine(self, engine: RolloutEngine, ep: Episode, memory: str, attempt: int) -> Episode:
        last = len(ep.task.user_turns) if self.options.scope == "episode" else ep.turn + 1
        # the attempt ends where the rehearsal does, and a simulated user does not go on talking in it
        task = replace(ep.task, user_turns=ep.task.user_turns[:last], simulated_user=None)
        return Episode(f"{ep.episode_id}~t{ep.turn}a{attempt}", task, ep.group_index, None, ep.tools,
                       engine.turn_ids(ep, memory), turn=ep.turn, steps=[[] for _ in range(ep.turn + 1)],
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
        seen: list[list[list[str]]] = [[] for _ in episodes]  # each episode's attempts so far, as memory lines
        played: list[list[Episode]] = [[] for _ in episodes]  # each episode's attempts, for memory = select
        for r in range(rounds):
            attempts = [(i, self._imagine(engine, ep, memory[i] if o.mode == "sequential" else "", r * width + k))
                        for i, ep in enumerate(episodes) for k in range(width)]
            sub.play([a for _, a in attempts])
            transcripts: list[list[list[tuple[str, str]]]] = [[] for _ in episodes]
            for i, attempt in attempts:
                ep = episodes[i]
                transcript = attempt.history[len(ep.history):]
                transcripts[i].append(transcript)
                seen[i].append(attempt_lines(attempt.calls, attempt.texts, attempt.termination))
                played[i].append(attempt)
                tokens = {role: sum(len(g.gen.ids) for g in attempt.of_role(role))
                          for role in (Role.CALLER, Role.REHEARSER)}
                steps = len(attempt.of_role(Role.CALLER))
                cost[i]["caller_tokens"] += tokens[Role.CALLER]
                cost[i]["rehearser_tokens"] += tokens[Role.REHEARSER]
                cost[i]["imagined_steps"] += steps
                ep.imagined.append({
                    "episode_id": ep.episode_id, "turn": ep.turn, "attempt": len(ep.imagined), "round": r,
                    "memory_seen": memory[i] if o.mode == "sequential" else "",
                    "transcript": "\n".join(f"{who}: {text}" for who, text in transcript),
                    "termination": attempt.termination, "n_steps": steps, "n_calls": len(attempt.calls),
                    "caller_tokens": tokens[Role.CALLER], "rehearser_tokens": tokens[Role.REHEARSER]})
            if o.memory == "select":  # no memory: the attempts are scored and one is chosen, below
                continue
            if o.memory == "transcript":  # every attempt so far, condensed; nothing generated
                memory = [transcript_memory(seen[i], engine.renderer.encode, o.memory_tokens)
                          for i in range(len(episodes))]
                continue
            prompts = [engine.renderer.messages(summariser_prompt(ep.task.user_turns[ep.turn], transcripts[i],
                                                                  memory[i])) for i, ep in enumerate(episodes)]
            gens = engine.sampler(prompts, o.memory_tokens, greedy=True, tasks=[ep.task.uid for ep in episodes])
            for i, gen in enumerate(gens):
                cost[i]["summariser_tokens"] += len(gen.ids)
                text, error = parse_memory(gen.text)
                if error:  # recorded; the memory so far stands (nothing, in parallel mode)
                    errors[i].append(error)
                else:
                    memory[i] = text
        chosen = self._choose(episodes, played, cost) if o.memory == "select" else [{} for _ in episodes]
        changed = self._decision_changed(engine, episodes, memory) if o.measure_change else [None] * len(episodes)
        wall = (time.perf_counter() - started) / len(episodes)  # the phase is shared by the episodes batched in it
        for i, ep in enumerate(episodes):
            ep.memories.append({"episode_id": ep.episode_id, "turn": ep.turn, "mode": o.mode, "budget": o.budget,
                                "scope": o.scope, "memory_kind": o.memory, "memory": memory[i],
                                "memory_error": ",".join(errors[i]) or None,
                                **cost[i], "wall_s": wall, "decision_changed": changed[i], **chosen[i]})
        return memory

    def _choose(self, episodes: list[Episode], played: list[list[Episode]],
                cost: list[dict[str, int]]) -> list[dict[str, object]]:
        """memory = select: score each episode's attempts (the rehearser judging, or the checklist), record the
        scores on their `imagined` rows, and hand the best attempt's first message to the engine to commit
        (`Episode.chosen`). Returns each episode's `memories` columns for the choice."""
        scored = selection.score(self.options, self.imagining, episodes, played)
        out = []
        for ep, attempts, marks, spent in zip(episodes, played, scored, cost, strict=True):
            rows = ep.imagined[len(ep.imagined) - len(attempts):]
            for row, mark in zip(rows, marks, strict=True):
                row.update(score=mark["score"], judgement=mark["judgement"])
                row["rehearser_tokens"] += mark["judge_tokens"]  # the judge is the rehearser
                spent["rehearser_tokens"] += mark["judge_tokens"]
            messages = [selection.first_message(a) for a in attempts]
            k = selection.best([m["score"] for m in marks], messages)
            ep.chosen = messages[k] if k is not None else None
            errors = ",".join(sorted({m["error"] for m in marks if m["error"]})) or None
            out.append({"select_by": self.options.select_by, "memory_error": errors,
                        "selected_attempt": rows[k]["attempt"] if k is not None else None,
                        "selected_score": marks[k]["score"] if k is not None else None})
        return out

    def _decision_changed(self, engine: RolloutEngine, episodes: list[Episode], memory: list[str]) -> list[bool]:
        """Greedy first action of each committed turn without and with its memory: did the memory change it?
        With memory = select: does the chosen attempt's first action differ from the plain greedy one?"""
        if self.options.memory == "select":
            gens = engine.sampler([engine.turn_ids(ep) for ep in episodes], engine.config.max_new_tokens,
                                  greedy=True, tasks=[ep.task.uid for ep in episodes])
            return [ep.chosen is not None and call_key(parse_tool_calls(strip_thinking(g.text)).calls) !=
                    call_key(parse_tool_calls(strip_thinking(ep.chosen.text)).calls)
                    for ep, g in zip(episodes, gens, strict=True)]
        prompts = [engine.turn_ids(ep, m) for ep, m in zip(episodes, memory, strict=True) for m in ("", m)]
        gens = engine.sampler(prompts, engine.config.max_new_tokens, greedy=True,
                              tasks=[ep.task.uid for ep in episodes for _ in ("", "memory")])
        key = [call_key(parse_tool_calls(strip_thinking(g.text)).calls) for g in gens]
        return [key[2 * i] != key[2 * i + 1] for i in range(len(episodes))]
