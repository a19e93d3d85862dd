"""Turning finished episodes into training rows, and the rows a perfect policy would produce."""

from __future__ import annotations

from envace.config import RehearserOptions, RolloutConfig
from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.policy.scripted import ReferencePolicy
from envace.rehearsal.rollout import Episode, RolloutEngine
from envace.training.grpo import Row
from envace.types import Role, Task


def episode_rows(episode: Episode, reward: float,
                 roles: tuple[str, ...] = (Role.CALLER, Role.REHEARSER)) -> list[Row]:
    """One row per generation of the episode, each with the episode's reward.

    A caller row's prompt is the caller context up to that message (token ids exactly as generated);
    a rehearser row's prompt is its own rehearser prompt.
    """
    rows = []
    for turn in episode.turns:
        if turn["role"] not in roles:
            continue
        prompt = turn.get("prompt_ids") or episode.ids[: turn["prompt_len"]]
        rows.append(Row(episode.task.uid, turn["role"], list(prompt), list(turn["completion_ids"]), reward))
    return rows


def reference_rows(tasks: list[Task], benchmark: Benchmark, tokenizer, rehearser: RehearserOptions,
                   caller_demo: bool = False, examples=None, tool_docs: str = "full") -> list[Row]:
    """Every caller message and every rehearsal along the tasks' reference trajectories (SFT data).

    The scripted reference policy plays `real+shadow` episodes through the real engine, so the rows
    use the very prompts the policy will see in RL, and the rehearser targets are real results.
    """
    if any(t.split != "train" for t in tasks):
        raise ValueError("SFT data must come from train-split tasks only")
    if any(t.simulated_user for t in tasks):
        raise UsageError("reference rows need scripted user turns; a conversation with a simulated user "
                         "(τ² airline, retail, telecom) has none: use telecom_solo, or set sft_tasks = 0")
    cfg = RolloutConfig(mode="real+shadow", batch_size=1, embedding=False, rehearser=rehearser,
                        caller_demo=caller_demo, tool_docs=tool_docs)
    rows: list[Row] = []
    for task in tasks:
        # one scripted policy per task: it finds its task by the first user message, which tasks may
        # share (τ² telecom has 5 distinct tickets among 114 tasks)
        engine = RolloutEngine(ReferencePolicy(tokenizer, [task]), benchmark, cfg, examples=examples)
        for episode in engine.run_batch([(task, 0)]):
            rows.extend(episode_rows(episode, 1.0))
    return rows
