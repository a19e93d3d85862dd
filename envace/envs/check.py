"""Self-check of an environment adapter: ground truth replayed through it must pass the official checker."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

from envace.envs.registry import Benchmark
from envace.types import Split


def _replay(benchmark: Benchmark, category: str, offset: int, limit: int) -> list[tuple[str, bool]]:
    """(task uid, passed) for `limit` tasks of `category` from `offset` (both splits)."""
    out = []
    for task in benchmark.load_tasks(category, Split.ALL, limit, offset):
        env = benchmark.make_env()
        env.reset(task)
        steps = [[[ref.call] for ref in turn] for turn in task.reference]
        # A perfect caller also says what the benchmark checks was said (τ²'s communicate_info).
        out.append((task.uid, env.score(task, steps, texts=task.payload.get("reference_texts")).success))
    return out


def _replay_by_name(name: str, category: str, offset: int, limit: int) -> list[tuple[str, bool]]:
    from envace.envs import registry

    return _replay(registry.get(name), category, offset, limit)


def replay_reference_scores(benchmark: Benchmark, category: str, workers: int | None = None, chunk: int = 8
                            ) -> tuple[int, int, list[str]]:
    """(passed, total, failed task uids) over every task of `category`, both splits.

    Each ground-truth call is issued as its own step on a fresh environment, as a caller would. Chunks of
    `chunk` tasks are spread over `workers` processes (one per core by default) until a chunk comes back
    short: building and scoring τ² environments is pure-Python validation of their databases, so it
    scales with cores, and no worker builds a task it does not check.
    """
    workers = workers or len(os.sched_getaffinity(0))
    if workers <= 1:
        results = _replay(benchmark, category, 0, None)
    else:
        results, offset, done = [], 0, False
        with ProcessPoolExecutor(workers) as pool:
            running = []
            while running or not done:
                while not done and len(running) < workers:
                    running.append(pool.submit(_replay_by_name, benchmark.name, category, offset, chunk))
                    offset += chunk
                part = running.pop(0).result()
                results += part
                done = done or len(part) < chunk
    failures = [uid for uid, ok in results if not ok]
    return len(results) - len(failures), len(results), failures
