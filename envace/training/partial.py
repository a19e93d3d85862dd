"""Partial rollouts (`grpo.partial_rollouts`): a step in flight takes each newer policy version between two calls.

    the actor plays step b from version v = max(0, b − k)        (`scheduler.Scheduler`)
    the learner publishes v + 1 while b is in flight             → offered to the actor (`Offers.offer`)
    the next backend call of any of b's episodes waits for the calls in flight, loads v + 1, and goes on
    each generation is stamped with the version that sampled it: b − version ≤ k holds for every one

A group may so start on version v and finish on v + 1, as verl's partial rollouts and AReaL's interruptible
generation do: every row keeps its own behaviour log-probs, which the learner's importance weights read, so a
row sampled by v + 1 is corrected against v + 1. What changes is only how fresh the tail of a step is. Which
call takes the new version depends on when the update finished, so a partial run does not replay bit for bit
after `--resume` (the synchronous and plain staleness-k runs do).

The switch waits for the calls in flight (the per-episode loop has several at once on a served backend): no
generation is stamped with one version and sampled with another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from envace.policy.backend import Backend, Generation, SamplingParams


def may_play(held: int, wanted: int, partial: bool) -> bool:
    """Whether weights of version `held` may play a step (or chunk) asked of version `wanted` without loading it:
    the same version, or under partial rollouts a newer one (the step is then only fresher)."""
    return held == wanted or (partial and held > wanted)


class Offers:
    """The newest version offered to an actor (from any thread) that it has not taken yet."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._newest: tuple[Any, int] | None = None  # (weights, version)

    def offer(self, weights: Any, version: int) -> None:
        with self._lock:
            if self._newest is None or version > self._newest[1]:
                self._newest = (weights, version)

    def newer_than(self, held: int) -> bool:
        newest = self._newest
        return newest is not None and newest[1] > held

    def take(self, held: int) -> tuple[Any, int] | None:
        """The newest offer if it is newer than `held`; the offer is consumed either way."""
        with self._lock:
            newest, self._newest = self._newest, None
        return newest if newest is not None and newest[1] > held else None


class Gate:
    """Backend calls share it; a version switch waits until the calls in flight are back and holds new ones off
    until it is done (a writer-first read-write lock)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._calls, self._switching = 0, False

    @contextmanager
    def call(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._switching)
            self._calls += 1
        try:
            yield
        finally:
            with self._cond:
                self._calls -= 1
                self._cond.notify_all()

    @contextmanager
    def switch(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._switching)
            self._switching = True
            self._cond.wait_for(lambda: self._calls == 0)
        try:
            yield
        finally:
            with self._cond:
                self._switching = False
                self._cond.notify_all()


class PartialBackend:
    """`backend` as a step's episodes call it under partial rollouts: before a call, the newest offered version
    is loaded (`load(weights, version)`) once the calls in flight are back; every generation comes back stamped
    with `held()`, the version it was sampled with (`Generation.version`). Anything else is the backend's."""

    def __init__(self, backend: Backend, offers: Offers, load: Callable[[Any, int], object],
                 held: Callable[[], int]) -> None:
        self.backend, self.offers, self.load, self.held = backend, offers, load, held
        self.gate = Gate()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if self.offers.newer_than(self.held()):
            with self.gate.switch():
                newest = self.offers.take(self.held())
                if newest is not None:
                    self.load(*newest)
        with self.gate.call():
            version = self.held()
            out = self.backend.generate(prompts, params)
        return [replace(g, version=version) for g in out]
