"""The per-episode loop: every episode advances on its own and never waits for another.

    episodes start in order on the calling thread (`RolloutEngine.start`: ids, environments, gold prefixes)
    for each episode, on a thread of its own, inside its own seed stream (`streams.episode_stream`):
        RolloutEngine.play([episode])   the lock-step loop of one: its next request goes out as soon as its
                                        previous tool answer (real or rehearsed) or user message is in
    every thread joined; the world finishes once (`World.finish`: decision forks, embeddings), as after a batch

Why: in lock-step (`rollout.py`) every step's caller messages go to the backend in one call, and its answers to the
world in one more, so each episode waits for the slowest generation and answers of the step. A vLLM server batches
whatever requests are in flight (continuous batching), and the served backend (`policy.remote`) already sends every
prompt as its own request, so nothing is gained by holding the quick episodes back: here each keeps one request in
flight while it plays. `batch_size` bounds the threads (one per episode), as it bounds lock-step's batch.

What the threads share, and why it is safe:
- `Sampler`: counters under a lock, a busy clock that counts overlapping calls once, and each episode's seeds from
  its own stream, so the same seed gives the same episodes however the threads interleave (`streams.py`).
- the world: real answers come from each episode's own environment; rehearsals from the rehearser through the
  sampler; a Dyna mix's, a shadow's and a fork's draws from the episode's stream (`streams.draws`); pairs and
  forks are appended whole and resolved after the join.
- the simulated user and the example bank keep no state but the episode's own.
- the before-turn hook: private rehearsal's (`concurrent = True`) runs beside the others, each episode imagining
  in a sub-engine of its own; a hook that keeps state across calls (BFCL memory's prerequisite conversations,
  the ladder's rungs) runs for one episode at a time, the time spent waiting for it counted as that episode's wait
  (what such a hook plays for several episodes draws from the stream of the one that came first: replayed exactly
  when greedy, as BFCL memory's evaluations are, not when sampled).
- `on_step` is called one at a time, with the episodes still playing.
Backends are called from many threads: one that takes that says so (`Backend.concurrent`: the served one, the
scripted reference); one that generates a call at a time (the in-process HF backend) is put behind a queue when the
engine is built (`policy.queued`), which runs the calls waiting together, greedy ones as one batch.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

from envace.engine import streams
from envace.engine.episode import Episode
from envace.policy.remote import concurrently


def play_each(engine: Any, episodes: list[Episode]) -> None:
    """Play started episodes of `engine` (a `RolloutEngine`) to the end, each on its own thread (the module
    docstring). The engine itself is left as it was: the threads play a copy whose hook and progress are shared
    safely."""
    view = copy.copy(engine)
    hook = engine.before_turn
    if hook is not None and not getattr(hook, "concurrent", False):
        view.before_turn = OneAtATime(hook)
    if engine.on_step is not None:
        view.on_step = _progress(engine.on_step, episodes, engine.sampler)

    def play(ep: Episode) -> None:
        with streams.episode_stream(f"{engine.config.seed}/{ep.episode_id}"):
            view.play([ep])

    concurrently(play, episodes, max(1, len(episodes)))


class OneAtATime:
    """A before-turn hook that keeps state across calls, called for one episode at a time; an episode's wait for its
    turn is time it was held back by others (`Episode.wait_s`)."""

    def __init__(self, hook: Any) -> None:
        # re-entrant: a hook may start and play episodes of its own through the engine, which asks it `wants` again
        self.hook, self.lock = hook, threading.RLock()

    def wants(self, ep: Episode) -> bool:
        with self.lock:
            return self.hook.wants(ep)

    def memories(self, engine: Any, episodes: list[Episode]) -> list[str]:
        asked = time.perf_counter()
        with self.lock:
            for ep in episodes:
                ep.wait_s += time.perf_counter() - asked
            return self.hook.memories(engine, episodes)


def _progress(on_step: Callable[[int, int], None], episodes: list[Episode], sampler: Any) -> Callable[[int, int], None]:
    """`on_step` for the threads: one call at a time, reporting the episodes of the batch still playing."""
    lock = threading.Lock()

    def step(_waiting: int, _tokens: int) -> None:
        with lock:
            on_step(sum(ep.termination is None for ep in episodes), sampler.tokens)
    return step
