"""Partial rollouts' backend (`envace.training.partial`): a version switch waits for the calls in flight, holds new
ones off, and every generation is stamped with the version it was sampled with."""

from __future__ import annotations

import threading
import time

from envace.policy.backend import Generation, SamplingParams
from envace.training.partial import Offers, PartialBackend


class Slow:
    """A backend whose calls block until released, answering with the weights it holds when the call starts."""

    concurrent = True

    def __init__(self) -> None:
        self.weights, self.release, self.started = "w0", threading.Event(), threading.Event()
        self.tokenizer = None

    def generate(self, prompts, params):
        held = self.weights
        self.started.set()
        assert self.release.wait(10)
        assert self.weights == held, "the weights changed under a call in flight"
        return [Generation([1], held, "stop") for _ in prompts]


def test_a_switch_waits_for_the_call_in_flight_and_stamps_each_generation():
    backend, offers, held, loads = Slow(), Offers(), [0], []

    def load(weights, version):
        backend.weights, held[0] = weights, version
        loads.append(version)

    partial = PartialBackend(backend, offers, load, lambda: held[0])
    out = {}
    first = threading.Thread(target=lambda: out.setdefault("first", partial.generate([[1]], SamplingParams())))
    first.start()
    assert backend.started.wait(10)
    offers.offer("w1", 1)
    offers.offer("w0.5", 0)  # older than what is held: never taken
    second = threading.Thread(target=lambda: out.setdefault("second", partial.generate([[2]], SamplingParams())))
    second.start()
    time.sleep(0.3)
    assert loads == [] and "second" not in out  # the switch waits for the call in flight
    backend.release.set()
    first.join(10), second.join(10)
    assert [(g.text, g.version) for g in out["first"]] == [("w0", 0)]
    assert [(g.text, g.version) for g in out["second"]] == [("w1", 1)] and loads == [1]
    assert partial.concurrent and partial.tokenizer is None  # the rest is the backend's


def test_only_a_newer_offer_is_taken():
    offers = Offers()
    offers.offer("a", 2)
    offers.offer("b", 1)
    assert offers.newer_than(1) and not offers.newer_than(2)
    assert offers.take(1) == ("a", 2) and offers.take(1) is None
    offers.offer("c", 3)
    assert offers.take(3) is None and not offers.newer_than(0)  # consumed, though not newer than what is held
