"""A backend that generates one call at a time (the in-process HF backend) behind the per-episode loop's threads.

    an episode's call joins the queue
    whoever finds the backend free takes every call waiting and runs them:
        calls with the same settings as one call (a padded batch on an accelerator; on a CPU the HF backend
        runs its prompts one at a time, each continuing its prefix cache, as in lock-step); a seeded sampled
        call's prompts each carry a seed of their own (`SamplingParams.seeds`: prompt i of a call seeded s samples
        from s · 65,537 + i, as a served backend's requests do), so the backend samples each row from its own
        generator and an episode's tokens never depend on which calls it met
        a sampled call without a seed alone
    each caller gets its own generations back (or the exception its call raised)

While one batch generates, the episodes whose answers came back play on (tools, rehearsals, the next prompt) and
queue again: the backend is never left waiting for the slowest episode of a step, as lock-step leaves it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from envace.policy.backend import Backend, Generation, SamplingParams


@dataclass
class _Call:
    prompts: list[list[int]]
    params: SamplingParams
    result: list[Generation] | None = None
    error: BaseException | None = None


def queued(backend: Backend | None, wrapped: dict[int, Backend] | None = None) -> Backend | None:
    """`backend` as many threads may call it: itself when it takes concurrent calls (`Backend.concurrent`), else
    behind a queue, one per backend object (`wrapped`: those made already, so two roles on one model share one)."""
    if backend is None or getattr(backend, "concurrent", False):
        return backend
    wrapped = {} if wrapped is None else wrapped
    return wrapped.setdefault(id(backend), Queued(backend))


class Queued:
    """`backend` behind a queue (module docstring); anything else is the backend's."""

    concurrent = True

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._waiting: list[_Call] = []
        self._mutex = threading.Lock()  # guards `_waiting`
        self._free = threading.Lock()  # held while the backend generates
        self.batches = 0  # backend calls made: fewer than the calls queued when greedy calls met

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        call = _Call(prompts, params)
        with self._mutex:
            self._waiting.append(call)
        with self._free:
            if call.result is None and call.error is None:  # not run by the thread that held the backend before
                with self._mutex:
                    taken, self._waiting = self._waiting, []
                for group in batches(taken):
                    self._run(group)
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def _run(self, group: list[_Call]) -> None:
        prompts = [p for c in group for p in c.prompts]
        tasks = tuple(t for c in group for t in c.params.tasks) \
            if all(len(c.params.tasks) == len(c.prompts) for c in group) else ()
        params = replace(group[0].params, tasks=tasks)
        if params.temperature > 0 and params.seed is not None:
            params = replace(params, seeds=tuple(s for c in group for s in seeds(c)))
        self.batches += 1
        try:
            out = self.backend.generate(prompts, params)
        except Exception as exc:  # each caller of the batch raises it in its own thread
            for c in group:
                c.error = exc
            return
        start = 0
        for c in group:
            c.result, start = out[start: start + len(c.prompts)], start + len(c.prompts)


def seeds(call: _Call) -> tuple[int, ...]:
    """A seeded sampled call's seed per prompt: its own `seeds`, else prompt i of seed s gets s · 65,537 + i."""
    p = call.params
    return p.seeds or tuple(p.seed * 65_537 + i for i in range(len(call.prompts)))


def batches(calls: list[_Call]) -> list[list[_Call]]:
    """`calls` in the order they came, those with equal settings together (greedy, or sampled with a seed), each
    sampled one without a seed alone."""
    out: list[list[_Call]] = []
    together: dict[tuple, list[_Call]] = {}
    for c in calls:
        p = c.params
        if p.temperature > 0 and p.seed is None:
            out.append([c])
            continue
        key = (p.max_new_tokens, p.temperature if p.temperature > 0 else 0.0, p.top_p, p.logprobs, p.frozen)
        if key not in together:
            together[key] = []
            out.append(together[key])
        together[key].append(c)
    return out
