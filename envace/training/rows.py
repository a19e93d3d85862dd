"""Training rows: the generations an update trains on, and the rows a perfect policy would produce (SFT)."""

from __future__ import annotations

from envace.config import RehearserOptions, RolloutConfig
from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.policy.scripted import ReferencePolicy
from envace.rehearsal.build import build_engine
from envace.rehearsal.episode import Episode, Generated
from envace.rehearsal.prompts import reference_memory, reference_transcript, summariser_prompt
from envace.training.grpo import Row
from envace.types import Task


def training_rows(episodes: list[Episode], roles: tuple[str, ...]) -> tuple[list[Generated], list[Row]]:
    """The generations of `roles` in the episodes, and each as a `Row` with the reward it was given.

    A caller row's prompt is the caller context up to that message (token ids exactly as generated);
    a rehearser row's prompt is its own rehearser prompt.
    """
    picked = [(ep, g) for ep in episodes for g in ep.generations if g.role in roles]
    return [g for _, g in picked], [Row(ep.task.uid, g.role, list(g.prompt(ep.ids)), list(g.gen.ids), g.reward,
                                        g.gen.logprobs) for ep, g in picked]


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
    rows: list[Row] = []
    for task in tasks:
        cfg = RolloutConfig(env=benchmark.name, category=task.category, split="train", mode="real+shadow",
                            batch_size=1, embedding=False, rehearser=rehearser, caller_demo=caller_demo,
                            tool_docs=tool_docs)
        # one scripted policy per task: it finds its task by the first user message, which tasks may
        # share (τ² telecom has 5 distinct tickets among 114 tasks)
        engine = build_engine(ReferencePolicy(tokenizer, [task]), benchmark, cfg, examples)
        for episode in engine.run_batch([(task, 0)]):
            _, episode_rows = training_rows([episode], ("caller", "rehearser"))
            rows += [Row(r.task_uid, r.role, r.prompt_ids, r.completion_ids, 1.0) for r in episode_rows]
        rows += summariser_rows(task, engine.renderer)
    return rows


def summariser_rows(task: Task, renderer) -> list[Row]:
    """One row per turn: the summariser prompt private rehearsal sends after one imagined attempt that played the
    reference, and the reference memory of that turn as its target (so an SFT'd policy writes a plain-text memory
    when asked for one, not a tool call)."""
    end = renderer.end_of_message
    return [Row(task.uid, "summariser",
                renderer.messages(summariser_prompt(task.user_turns[k], [reference_transcript(steps)], "")),
                renderer.encode(reference_memory(steps)) + [end], 1.0)
            for k, steps in enumerate(task.reference)]
