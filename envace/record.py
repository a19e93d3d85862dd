"""The one recording path: finished episodes → rows of `episodes`, `generations`, `calls`, `pairs`,
`memories` and `imagined`, one shard per table and step. Rollouts, evaluations, sweeps and training all
write through `write_step`, so every job's store holds the same tables, and each generation row keeps
what the trainer used (reward, advantage, trained) instead of leaving it to be re-derived.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
from dataclasses import dataclass, field
from typing import Any

from envace import rewards
from envace.engine.episode import Episode, Generated
from envace.store import Run
from envace.types import Role


def score(ep: Episode, mode: str, phase: str = "rollout") -> dict[str, Any]:
    """The `episodes` row of a finished episode: the benchmark's verdict, the checklist and the counters."""
    result = ep.env.score(ep.task, ep.steps, texts=ep.texts, termination=ep.termination or "completed")
    # a simulated conversation has no scripted turns to align: its reference is one turn
    issued = [[c for turn in ep.issued for c in turn]] if ep.task.simulated_user else ep.issued
    checklist, detail = rewards.checklist(ep.task, issued)  # one entry per turn reached
    callers, rehearsals = ep.of_role(Role.CALLER), ep.of_role(Role.REHEARSER)
    return {
        "episode_id": ep.episode_id, "task_uid": ep.task.uid, "env": ep.task.env,
        "category": ep.task.category, "split": ep.task.split, "group_index": ep.group_index,
        "mode": mode, "phase": phase, "start_turn": ep.task.start_turn,
        "success": result.success, "score_detail": result.detail, "score_value": result.graded,
        "score_parts": json.dumps(result.subscores, sort_keys=True),
        "checklist": checklist, "checklist_detail": json.dumps(detail),
        "termination": ep.termination, "n_turns": min(ep.turn, len(ep.task.user_turns)) - ep.task.start_turn,
        "n_ref_turns": len(ep.task.user_turns) - ep.task.start_turn, "n_steps": len(callers),
        "n_calls": sum(c["source"] != "gold" for c in ep.calls),
        "n_parse_errors": sum(g.parse_error is not None for g in callers),
        "n_tool_errors": sum(c["is_error"] for c in ep.calls),
        "n_well_formed": sum(bool(g.n_calls) and g.parse_error is None for g in callers),
        "n_rehearsals": len(rehearsals), "n_rehearsal_errors": sum(g.parse_error is not None for g in rehearsals),
        "env_executions": ep.env.executions, "prompt_tokens": ep.prompt_tokens,
        "generated_tokens": sum(len(g.gen.ids) for g in ep.generations),
        "private_tokens": sum(m["caller_tokens"] + m["rehearser_tokens"] + m["summariser_tokens"]
                              for m in ep.memories),
        "imagined_steps": sum(m["imagined_steps"] for m in ep.memories),
        "context_ids": ep.ids, "wall_s": ep.wall_s, "wait_s": ep.wait_s,
        "started_at": ep.started_at, "ended_at": ep.started_at + ep.wall_s, "actor": ep.actor,
    }


def generation_row(ep: Episode, g: Generated) -> dict[str, Any]:
    return {"episode_id": ep.episode_id, "turn": g.turn, "turn_step": g.turn_step, "role": g.role,
            "call_index": g.call_index, "user_message": g.user_message, "prompt_len": g.prompt_len,
            "prompt_ids": g.prompt_ids, "completion_ids": g.gen.ids, "completion_text": g.gen.text,
            "finish": g.gen.finish, "n_calls": g.n_calls, "parse_error": g.parse_error, "parse_detail": g.parse_detail,
            "logprobs": g.gen.logprobs, "temperature": g.gen.temperature, "top_p": g.gen.top_p, "reward": g.reward,
            "advantage": g.advantage, "trained": g.trained, "policy_version": g.policy_version}


@contextlib.contextmanager
def _signals_deferred():
    """Ctrl-C and SIGTERM wait until the block is done: a step's shards are written together or not at all.

    The handlers raise in the main thread between two bytecodes, so without this a signal landing between two
    tables' shards left an episode stored without its generations. kill -9 cannot be deferred; `episodes` is
    written last, so readers, which start from episodes, never see a half-stored step, and a resumed run
    rewrites the step's shards under the same names."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = {signal.SIGINT, signal.SIGTERM}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def actor_metric(index: int) -> str:
    """The GRPO metric holding Ray actor `index`'s own seconds on its share of a step's rollouts."""
    return f"actor{index}_rollout_s"


def actor_of(name: str) -> int | None:
    """The actor index an `actor_metric` name holds; None for any other metric."""
    found = re.fullmatch(r"actor(\d+)_rollout_s", name)
    return int(found[1]) if found else None


def write_step(run: Run, step: int, episodes: list[Episode], rows: list[dict[str, Any]], shard: str) -> None:
    """Every table of one step's finished episodes as one shard each (written whole, then renamed)."""
    key = {"run_id": run.run_id, "step": step}
    with _signals_deferred():
        run.write("generations", shard, [{**key, **generation_row(ep, g)} for ep in episodes
                                         for g in ep.generations])
        for table in ("calls", "pairs", "memories", "imagined"):
            records = [{**key, **r} for ep in episodes for r in getattr(ep, table)]
            if records or table in ("calls", "pairs"):
                run.write(table, shard, records)
        run.write("episodes", shard, [{**key, **row} for row in rows])


# The episode row's columns a job adds up, by the name of their total (`summary.calls`, `summary.turns`, …).
SUMMED = {"checklist": "checklist", "turns": "n_turns", "caller_messages": "n_steps", "calls": "n_calls",
          "parse_errors": "n_parse_errors", "well_formed": "n_well_formed", "generated_tokens": "generated_tokens",
          "private_tokens": "private_tokens"}


@dataclass
class Summary:
    """Counters over a whole job, for the closing table and `run.json`."""

    episodes: int = 0
    successes: int = 0
    pairs: int = 0
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SUMMED, 0))
    terminations: dict[str, int] = field(default_factory=dict)
    generation_s: float = 0.0
    wall_s: float = 0.0

    def __getattr__(self, name: str) -> float:  # only for names that are not fields: the SUMMED totals
        totals = self.__dict__.get("totals", {})
        if name not in totals:
            raise AttributeError(name)
        return totals[name]

    def add(self, row: dict[str, Any], pairs: int) -> None:
        self.episodes += 1
        self.successes += bool(row["success"])
        self.pairs += pairs
        for name, column in SUMMED.items():
            self.totals[name] += row[column]
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


def summarise(episodes: list[Episode], rows: list[dict[str, Any]], generation_s: float = 0.0) -> Summary:
    summary = Summary(generation_s=generation_s)
    for ep, row in zip(episodes, rows, strict=True):
        summary.add(row, len(ep.pairs))
    return summary
