"""Bounded staleness: the actor samples ahead of the learner, never more than `k` policy versions behind it.

Version v is the trained weights after v updates. With `grpo.max_staleness = k`, step b is sampled by version
max(0, b − k), so while the learner computes update u (on step u's episodes) the actor already plays steps
u + 1 … u + k with versions that exist:

    actor thread:   play b = u+1 with version u+1−k │ play u+2 …        (its own copy of the weights)
    learner:        update u with step u (sampled by u−k) → publish version u+1

A group is at most k versions old when it is trained on (`staleness = u − version ≤ k`; one older would be
dropped and counted, which this schedule never produces), and the update corrects for the gap with truncated
importance sampling against the stored behaviour log-probs: w = min(π_θ / π_behaviour, cap) per token
(`grpo.importance_cap`). The schedule is fixed by (seed, step, k) alone, so a run is reproducible and
`--resume` exact: `state.pt` keeps the versions the next steps are sampled with. `k = 0` is the synchronous
loop of `loop.py` (`synchronous`: no thread, no copy), not this class.

Why one actor thread and not a pool: the engine already batches every episode of a step into one backend
call per role; the overlap that matters is rollout against update. A step still waits for its slowest
episode (episodes kept in flight across steps are not built yet). With `grpo.partial_rollouts` each version
published is also offered to the actor at once, and the step in flight takes it between two backend calls
(`partial.py`): its tail is sampled by a fresher version, and that run no longer replays exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from envace.errors import UsageError
from envace.training.actor import Played, RolloutActor


class AheadPipeline:
    """Runs `actor` up to `k` steps ahead of the learner (module docstring); `tasks_of(step)` is a step's tasks.

    `versions` holds the published weights the coming steps are sampled with ({version: trainable weights});
    the learner `publish`es each new one and `take`s each step in order."""

    def __init__(self, actor: RolloutActor, k: int, start: int, end: int, versions: dict[int, dict[str, torch.Tensor]],
                 tasks_of: Callable[[int], list], partial: bool = False) -> None:
        self.actor, self.k, self.end, self.tasks_of, self.partial = actor, k, end, tasks_of, partial
        self.versions = dict(versions)
        self.next = start  # the next step to hand the actor
        self.pending: dict[int, Future] = {}
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="envace-actor")

    def sampling_version(self, step: int) -> int:
        return max(0, step - self.k)

    def fill(self, learner_version: int) -> None:
        """Hand the actor every step whose sampling version the learner has published (b − k ≤ its version)."""
        while self.next < self.end and self.sampling_version(self.next) <= learner_version:
            step, version = self.next, self.sampling_version(self.next)
            if version not in self.versions:
                raise UsageError(f"grpo.max_staleness: step {step + 1} is sampled by policy version {version}, which "
                                 f"this run did not keep (resume with the grpo.max_staleness it was saved with)")
            self.pending[step] = self.executor.submit(self._play, step, version, self.versions[version])
            self.next += 1

    def _play(self, step: int, version: int, weights: dict[str, torch.Tensor]) -> tuple[Played, float]:
        load_s = 0.0 if self.actor.holds(version) else self.actor.load(weights, version)
        return self.actor.play(step, self.tasks_of(step)), load_s

    def take(self, step: int) -> tuple[Played, float, float]:
        """Step `step`'s episodes, the seconds the learner waited for them, and the actor's weight-load seconds."""
        started = time.perf_counter()
        played, load_s = self.pending.pop(step).result()
        return played, time.perf_counter() - started, load_s

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """The learner's new version; versions no coming step is sampled with are let go."""
        self.versions[version] = weights
        for old in [v for v in self.versions if v < self.sampling_version(version)]:
            del self.versions[old]

    def advance(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Publish the learner's new version and hand the actor the steps it unlocks, at once (before the learner
        writes the step's rows: the actor plays while the store is written); under partial rollouts, offer it to
        the step in flight too."""
        self.publish(version, weights)
        if self.partial:
            self.actor.offer(weights, version)
        self.fill(version)

    def kept(self, next_step: int) -> dict[int, dict[str, torch.Tensor]]:
        """The versions a run resumed at `next_step` samples with, other than its own weights (for `state.pt`)."""
        return {v: w for v, w in self.versions.items() if self.sampling_version(next_step) <= v < next_step}

    def submit(self, job: Callable[[], object]) -> Future:
        """Run `job` on the actor's thread after the steps already handed to it (an evaluation of a version)."""
        return self.executor.submit(job)

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.executor.shutdown(wait=True, cancel_futures=True)
