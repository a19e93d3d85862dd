"""`policy.queued`: a backend that generates one call at a time, called from the per-episode loop's threads."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

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


def test_calls_that_wait_run_together_when_their_settings_match():
    backend = OneAtATime()
    queue, out = Queued(backend), {}
    first = threading.Thread(target=_call, args=(queue, 1, out))
    first.start()
    while not backend.calls:
        time.sleep(0.01)
    waiting = [threading.Thread(target=_call, args=args) for args in
               ((queue, 2, out), (queue, 3, out), (queue, 4, out, 1.0, 44), (queue, 0, out, 0.5, 7))]
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
    # sampled at other temperatures: one call each, with its own seed
    assert ([4], 44, ("t4",)) in backend.calls and ([0], 7, ("t0",)) in backend.calls
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


def test_seeded_sampled_calls_that_wait_run_together_each_prompt_under_its_own_seed():
    """Sampled calls with a seed and equal settings are one backend call; prompt i of a call seeded s carries
    s · 65,537 + i (as a served backend's requests do), so the backend samples each row on its own."""
    from envace.policy.queued import _Call

    calls = [_Call([[1], [2]], SamplingParams(temperature=1.0, seed=5)),
             _Call([[3]], SamplingParams(temperature=1.0, seed=9)),
             _Call([[4]], SamplingParams(temperature=0.7, seed=9)),  # another temperature: its own call
             _Call([[5]], SamplingParams(temperature=1.0))]  # no seed: alone, the backend's own stream
    assert [[c.prompts[0][0] for c in group] for group in batches(calls)] == [[1, 3], [4], [5]]
    seen = []

    class Records:
        def generate(self, prompts, params):
            seen.append((prompts, params.seeds))
            return [Generation([p[0]], str(p[0]), "stop") for p in prompts]

    q = Queued(Records())
    q._run(calls[:2])
    assert seen == [([[1], [2], [3]], (5 * 65_537, 5 * 65_537 + 1, 9 * 65_537))]
    assert [g.text for g in calls[0].result] == ["1", "2"] and [g.text for g in calls[1].result] == ["3"]


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_the_hf_backend_samples_a_prompt_the_same_alone_or_batched(tiny, prefix_cache):
    """`SamplingParams.seeds` on the in-process backend: a prompt's sampled tokens (and log-probs) are the same
    whether it runs alone or in a batch with others (CPU's one-at-a-time path and the padded batch of an
    accelerator), and differ with its seed; without per-prompt seeds a batch shares one stream (the old path)."""
    from envace.policy.hf import HFBackend

    model, tok = tiny
    backend = HFBackend(model, tok, prefix_cache=prefix_cache)
    prompts = [tok.encode("hello there, what is the weather"), tok.encode("list the files"), tok.encode("cd /tmp")]
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, logprobs=True)
    both = backend.generate(prompts, replace(params, seeds=(11, 22, 33)))
    alone = [backend.generate([p], replace(params, seeds=(s,)))[0] for p, s in zip(prompts, (11, 22, 33), strict=True)]
    assert [g.ids for g in both] == [g.ids for g in alone]
    for b, a in zip(both, alone, strict=True):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    other = backend.generate(prompts[:1], replace(params, seeds=(12,)))[0]
    again = backend.generate(prompts[:1], replace(params, seeds=(11,)))[0]
    assert again.ids == alone[0].ids and other.ids != alone[0].ids
    with pytest.raises(ValueError, match="one seed per prompt"):
        backend.generate(prompts, replace(params, seeds=(1,)))
