"""`policy.queued`: a backend that generates one call at a time, called from the per-episode loop's threads."""

from __future__ import annotations

import threading
import time

import pytest

from envace.policy.backend import Generation, SamplingParams
from envace.policy.queued import Queued, batches, queued


class OneAtATime:
    """Records each call's prompts and seed; the first call blocks until released, so the others queue behind it.
    Raises on a prompt [0]; fails the test if two calls ever overlap."""

    def __init__(self) -> None:
        self.calls, self.release, self.inside = [], threading.Event(), threading.Lock()
        self.tokenizer = "tok"

    def generate(self, prompts, params):
        assert self.inside.acquire(blocking=False), "two calls at once"
        try:
            self.calls.append(([p[0] for p in prompts], params.seed, params.tasks))
            if len(self.calls) == 1:
                assert self.release.wait(10)
            if [0] in prompts:
                raise ValueError("bad prompt")
            return [Generation([p[0]], str(p[0]), "stop") for p in prompts]
        finally:
            self.inside.release()


def _call(queue, prompt, out, temperature=0.0, seed=None):
    params = SamplingParams(temperature=temperature, seed=seed, tasks=(f"t{prompt}",))
    try:
        out[prompt] = [g.text for g in queue.generate([[prompt]], params)]
    except ValueError as exc:
        out[prompt] = str(exc)


def test_calls_that_wait_run_together_when_greedy_and_alone_when_sampled():
    backend = OneAtATime()
    queue, out = Queued(backend), {}
    first = threading.Thread(target=_call, args=(queue, 1, out))
    first.start()
    while not backend.calls:
        time.sleep(0.01)
    waiting = [threading.Thread(target=_call, args=args) for args in
               ((queue, 2, out), (queue, 3, out), (queue, 4, out, 1.0, 44), (queue, 0, out, 1.0, 7))]
    for t in waiting:
        t.start()
    while len(queue._waiting) < len(waiting):  # all queued behind the first call
        time.sleep(0.01)
    backend.release.set()
    for t in [first, *waiting]:
        t.join(10)
    assert out == {1: ["1"], 2: ["2"], 3: ["3"], 4: ["4"], 0: "bad prompt"}  # each its own answer, or its error
    greedy = next(c for c in backend.calls if 2 in c[0])
    assert sorted(greedy[0]) == [2, 3] and sorted(greedy[2]) == ["t2", "t3"]  # the greedy ones that waited: one call
    assert ([4], 44, ("t4",)) in backend.calls and ([0], 7, ("t0",)) in backend.calls  # sampled: alone, own seed
    assert queue.batches == len(backend.calls) == 4 and queue.tokenizer == "tok"


def test_one_queue_per_backend_and_none_for_a_concurrent_one():
    backend, served = OneAtATime(), type("Served", (), {"concurrent": True})()
    wrapped = {}
    assert queued(backend, wrapped) is queued(backend, wrapped) and queued(None, wrapped) is None
    assert queued(served, wrapped) is served


@pytest.mark.parametrize(("temperatures", "groups"), [([0, 0, 0], [[0, 1, 2]]), ([0, 1, 0], [[0, 2], [1]]),
                                                      ([1, 1], [[0], [1]])])
def test_batches_keep_the_order_calls_came_in(temperatures, groups):
    from envace.policy.queued import _Call

    calls = [_Call([[i]], SamplingParams(temperature=t)) for i, t in enumerate(temperatures)]
    assert [[c.prompts[0][0] for c in group] for group in batches(calls)] == groups
