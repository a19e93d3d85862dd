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
loop of `loop.py` (`synchronous`: no thread, no copy) in one process; under Ray it is this schedule at k = 0.

Which step the actor plays next is the one scheduler's decision (`scheduler.Scheduler`, the same the Ray driver and
the pipeline model run), here over one actor on a thread of its own (`LocalWorkers`) whose chunk is a whole step:
the engine already batches every episode of a step into one backend call per role, so the overlap that matters is
rollout against update. With `grpo.partial_rollouts` each version published is also offered to the actor at once,
and the step in flight takes it between two backend calls (`partial.py`): its tail is sampled by a fresher
version, and that run no longer replays exactly.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from envace.training.actor import Played, RolloutActor
from envace.training.dispatch import Dispatcher
from envace.training.scheduler import Scheduler, Work


class LocalWorkers:
    """One `RolloutActor` on a thread of its own as `dispatch.Workers`: a call is a future; what it raises stops the
    run (there is no process to restart)."""

    def __init__(self, actor: RolloutActor) -> None:
        self.actor = actor
        self.handles = [actor]
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="envace-actor")

    def _taken(self, work: Work, weights) -> float:
        return 0.0 if weights is None or self.actor.holds(work.version) else self.actor.load(weights, work.version)

    def play(self, i: int, work: Work, tasks: list, weights) -> Future:
        def run() -> Played:
            load_s = self._taken(work, weights)
            played = self.actor.play(work.step, tasks)
            played.load_s = load_s
            return played
        return self.pool.submit(run)

    def evaluate(self, i: int, work: Work, weights) -> Future:
        def run():
            if weights is not None and self.actor.version != work.version:
                self.actor.load(weights, work.version)
            return self.actor.evaluate(work.step)
        return self.pool.submit(run)

    def wait(self, handles: list, timeout: float) -> list:
        done, _ = wait(handles, timeout=timeout, return_when=FIRST_COMPLETED)
        return [h for h in handles if h in done]

    def outcome(self, handle: Future) -> tuple[Any, str | None, str]:
        exc = handle.exception()
        return (exc, "fatal", str(exc)) if exc is not None else (handle.result(), None, "")

    def restart(self, i: int, raised: bool) -> None:
        raise AssertionError("a local actor is never lost: what it raises stops the run")

    def probe(self, i: int) -> None:
        return None

    def answered(self, i: int, handle) -> str:
        return "gone"

    def retire(self, i: int) -> None:
        pass

    def offer(self, weights, version: int) -> None:
        self.actor.offer(weights, version)

    def seconds(self, result) -> list[float]:
        return [ep.wall_s for ep in result.episodes] if isinstance(result, Played) else []

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def local_dispatcher(t, actor: RolloutActor, start: int, versions: dict, **options) -> Dispatcher:
    """Steps [start, grpo.steps) played ahead by `actor` (a detached `RolloutActor`), one whole step a chunk; its
    in-flight target a step's episodes, so one step is in flight at a time."""
    cfg, workers = t.cfg, LocalWorkers(actor)
    episodes = max(1, len(t.tasks_of(start)) * cfg.rollout.group_size) if start < cfg.grpo.steps else 1
    s = Scheduler(1, cfg.grpo.max_staleness, start, cfg.grpo.steps, lambda step: len(t.tasks_of(step)),
                  cfg.rollout.group_size, episodes)
    return Dispatcher(workers, s, t.tasks_of, versions, t.recorder.say, cfg.grpo.partial_rollouts, lanes=False,
                      **options)
