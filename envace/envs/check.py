"""Self-check of an environment adapter: ground truth replayed through it must pass the official checker."""

from __future__ import annotations

from envace.envs.registry import Benchmark
from envace.types import Split


def replay_reference_scores(bench: Benchmark, category: str) -> tuple[int, int, list[str]]:
    """(passed, total, failed task uids) over every task of `category`, both splits.

    Each ground-truth call is issued as its own step on a fresh environment, as a caller would.
    """
    passed, failures = 0, []
    tasks = bench.load_tasks(category, Split.ALL)
    for task in tasks:
        env = bench.make_env()
        env.reset(task)
        steps = [[[ref.call] for ref in turn] for turn in task.reference]
        # A perfect caller also says what the benchmark checks was said (τ²'s communicate_info).
        score = env.score(task, steps, texts=task.payload.get("reference_texts"))
        passed += score.success
        if not score.success:
            failures.append(task.uid)
    return passed, len(tasks), failures
