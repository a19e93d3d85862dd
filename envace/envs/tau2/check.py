"""Gold replay: every task's gold actions, run through the adapter, must earn τ²'s reward 1.0.

The method of τ²'s perfect-agent check: the gold actions in order (agent and, in telecom, user), each
dispatched as its own step, then one assistant message carrying every `communicate_info` string.
"""

from __future__ import annotations

from envace.envs.tau2.env import Tau2Env
from envace.envs.tau2.scoring import score_trajectory
from envace.types import Score, Task


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
