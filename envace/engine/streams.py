"""Per-episode random streams: seeds and draws an episode makes that no other episode's timing can change.

In lock-step every sampling seed comes from one counter (`Sampler`: call k of the job) and every world draw
(a Dyna mix's coin, a shadow's, a decision fork's) from one shared `random.Random`, consumed in the loop's fixed
order. When episodes advance on threads of their own (`per_episode.py`) that order is the scheduler's, so there
each episode draws from its own stream instead, set for its thread while it plays:

    call n of the episode, by a sampler of base seed s    →  seed = hash(s, episode key, n)   (`Stream.seed`)
    a world's draw for the episode                       →  the episode's own `random.Random(key)`   (`draws`)

The key is the run's seed and the episode id, and n counts every backend call made on the episode's thread (caller,
rehearser, simulated user, private rehearsal's attempts, summaries and judgements alike). An episode's calls
follow from its own generations alone, so the same seed replays the same episodes however threads interleave:
what a resumed training step needs. Outside a stream (lock-step, and whatever runs after the threads are joined)
nothing changes.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()


class Stream:
    """One episode's draws: `calls` backend calls so far, and its own generator for world draws."""

    def __init__(self, key: str) -> None:
        self.key, self.calls = key, 0
        self.rng = random.Random(f"draws/{key}")

    def seed(self, base: int) -> int:
        """The next call's seed: the sampler's base seed, the episode, the call's position in it (32 bits)."""
        self.calls += 1
        digest = hashlib.blake2b(f"{base}/{self.key}/{self.calls}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big")


@contextmanager
def episode_stream(key: str) -> Iterator[Stream]:
    """Draw from the stream of `key` on this thread while the block runs."""
    outer = current()
    _local.stream = stream = Stream(key)
    try:
        yield stream
    finally:
        _local.stream = outer


def current() -> Stream | None:
    """This thread's episode stream, None outside one."""
    return getattr(_local, "stream", None)


def draws(shared: random.Random) -> random.Random:
    """Where a world draws: the current episode's generator, or `shared` (its own, consumed in loop order)."""
    stream = current()
    return shared if stream is None else stream.rng
