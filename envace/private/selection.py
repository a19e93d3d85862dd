"""`[rollout.private] memory = "select"` (DyMo-style self-verification): no memory is written. Each of the N
imagined attempts is scored by its imagined outcome, and the best attempt's first caller message is committed as
the real turn's first message, as it was written (the engine commits `Episode.chosen` instead of sampling); the
turn goes on from there with the plain policy, no summariser and no `<rehearsal_memory>` in its prompt.

How an attempt is scored (`select_by`):

- `judge` (the default): the rehearser, the model that imagined the tools' answers, reads the user's request and
  the attempt's transcript (`judge_prompt`) and answers yes or no: did the attempt do what was asked? Its greedy
  answer scores the probability of yes: the verdict token's probability for a yes, one minus it for a no (1 or 0
  when the backend gives no log-probabilities); an answer that is neither scores 0.5, uninformed. It needs no gold
  and no checker, so every environment has it: this is the method.
- `checklist`: the task's checklist (`rewards.checklist`) on the calls the attempt issued in the rehearsed turns,
  a call the rehearser refused not counted, as in rehearse mode. An environment's own checker compares the real
  state after an episode, which an imagined attempt does not have; the checklist is what scores an imagined
  trajectory. It reads the task's gold calls: an oracle ceiling of selection (as `rehearser_model = "reference"`
  is of rehearsal), not a method.

Ties break to the first attempt. An attempt that wrote no caller message (its context was full) is never chosen;
when none wrote one, the turn samples its first message as the plain policy would.
"""

from __future__ import annotations

import math
import re
from typing import Any

from envace import rewards
from envace.config import PrivateOptions
from envace.engine.episode import Episode
from envace.engine.prompts import flatten_history
from envace.engine.rehearser import Rehearser
from envace.formats import strip_thinking
from envace.policy.backend import Generation
from envace.types import Role

JUDGE_SYSTEM = """You simulated the tools of a conversation. Below are the user's request and one imagined attempt at it, played against your simulation: the assistant's messages and the results you imagined for its calls.
Judge the attempt's outcome: did it do what the user asked, with the right calls and arguments, given those results?
Reply with one word: yes or no."""  # noqa: E501

JUDGE_HEADER = "## Attempt to judge\n"  # the scripted reference policy finds a judge's prompt by it
UNINFORMED = 0.5  # the score of an answer that is neither yes nor no


def judge_prompt(request: str, transcript: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Chat messages asking the rehearser whether one imagined attempt did what `request` asked."""
    return [{"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": f"## User request\n{request}\n\n{JUDGE_HEADER}{flatten_history(transcript)}"}]


def verdict(gen: Generation, decode) -> tuple[float, str | None]:
    """(score, error) of a judge's answer: the probability of yes (module docstring); error `judge_unparsed`
    when the answer is neither yes nor no. `decode` turns token ids into text (the judge's tokenizer)."""
    word = re.match(r"[a-z]+", strip_thinking(gen.text).strip().lower())
    said = word[0] if word and word[0] in ("yes", "no") else None
    if said is None:
        return UNINFORMED, "judge_unparsed"
    p = 1.0
    for k, token in enumerate(gen.ids):  # the first token that shows text: the verdict's, when it starts it
        shown = decode([token]).strip().lower()
        if shown:
            if gen.logprobs is not None and k < len(gen.logprobs) and said.startswith(shown):
                p = math.exp(gen.logprobs[k])
            break
    return (p if said == "yes" else 1.0 - p), None


def checklist_score(ep: Episode, attempt: Episode) -> float:
    """The checklist of the turns `attempt` rehearsed (from `ep`'s current one), on the calls it issued: each
    turn's share of gold calls matched, a turn it did not reach 0, averaged over the rehearsed turns."""
    if ep.task.simulated_user is not None:  # a conversation's reference is one turn: every call counts
        return rewards.checklist(ep.task, [[c for turn in attempt.issued for c in turn]])[0]
    _, detail = rewards.checklist(attempt.task, attempt.issued)
    start, turns = attempt.task.start_turn, range(ep.turn, len(attempt.task.user_turns))
    shares = [(sum(detail[k - start]) / len(detail[k - start]) if detail[k - start] else 1.0)
              if k < len(attempt.issued) else 0.0 for k in turns]
    return sum(shares) / len(shares) if shares else 0.0


def first_message(attempt: Episode) -> Generation | None:
    """The attempt's first caller message (written from the very context the real turn opens with)."""
    return next((g.gen for g in attempt.generations if g.role == Role.CALLER), None)


def score(options: PrivateOptions, rehearser: Rehearser, episodes: list[Episode],
          played: list[list[Episode]]) -> list[list[dict[str, Any]]]:
    """Per episode, per attempt: `score`, `judgement` (the judge's answer; None for the checklist), `error` and
    `judge_tokens`. All judgements of all episodes go in one backend call."""
    if options.select_by == "checklist":
        return [[{"score": checklist_score(ep, a), "judgement": None, "error": None, "judge_tokens": 0}
                 for a in attempts] for ep, attempts in zip(episodes, played, strict=True)]
    asked = [(ep, a) for ep, attempts in zip(episodes, played, strict=True) for a in attempts]
    prompts = [rehearser.renderer.messages(judge_prompt(ep.task.user_turns[ep.turn], a.history[len(ep.history):]))
               for ep, a in asked]
    gens = rehearser.sampler(prompts, rehearser.options.max_new_tokens, greedy=True,
                             frozen=rehearser.frozen and rehearser.backend is None, backend=rehearser.backend,
                             tasks=[ep.task.uid for ep, _ in asked]) if prompts else []
    decode = rehearser.renderer.tokenizer.decode
    out: list[list[dict[str, Any]]] = [[] for _ in episodes]
    index = {id(ep): i for i, ep in enumerate(episodes)}
    for (ep, _), gen in zip(asked, gens, strict=True):
        value, error = verdict(gen, decode)
        out[index[id(ep)]].append({"score": value, "judgement": gen.text, "error": error,
                                   "judge_tokens": len(gen.ids)})
    return out


def best(scores: list[float], messages: list[Generation | None]) -> int | None:
    """The attempt to commit: the highest score among those that wrote a message, the first of equals."""
    ranked = [k for k, m in enumerate(messages) if m is not None]
    return max(ranked, key=lambda k: (scores[k], -k)) if ranked else None
