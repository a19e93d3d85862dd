"""Gold replay: every task's gold actions, run through the adapter, must earn τ²'s reward 1.0.

The method of τ²'s perfect-agent check: the gold actions in order (agent and, in telecom, user), each
dispatched as its own step, then one assistant message carrying every `communicate_info` string.
"""

from __future__ import annotations

import time

from envace.envs.tau2.data import CATEGORIES, load_tasks
from envace.envs.tau2.env import Tau2Env
from envace.envs.tau2.scoring import score_trajectory
from envace.types import Score, Split, Task


def replay_gold(task: Task) -> Score:
    """τ²'s verdict on the perfect trajectory of `task`, executed through a fresh episode.

    The responses scored are the ones the episode recorded, so τ²'s DB evaluator also checks that its own
    replay of them gives the same text.
    """
    env = Tau2Env()
    env.reset(task)
    for ref, requestor in zip(task.reference[0], task.payload["reference_requestors"], strict=True):
        result = env.execute(ref.call) if requestor == "assistant" else env.execute_user(ref.call)
        if not result.dispatched:
            return Score(False, f"gold call {ref.call.name} refused: {result.content}")
    for text in task.payload["reference_texts"]:
        env.record_text("assistant", text)
    return score_trajectory(task, env.trajectory)


def replay_gold_scores(category: str, split: str = Split.ALL,
                       limit: int | None = None) -> tuple[int, int, list[str]]:
    """(passed, total, failed uids) over the tasks of `category` (both splits unless told)."""
    tasks = load_tasks(category, split, limit)
    failures = [t.uid for t in tasks if not replay_gold(t).success]
    return len(tasks) - len(failures), len(tasks), failures


def replay_gold_all() -> dict[str, dict[str, object]]:
    """Per category: passed, total, failed uids and seconds taken (loading included)."""
    report: dict[str, dict[str, object]] = {}
    for category in CATEGORIES:
        start = time.perf_counter()
        passed, total, failures = replay_gold_scores(category)
        report[category] = {"passed": passed, "total": total, "failures": failures,
                            "seconds": round(time.perf_counter() - start, 1)}
    return report
