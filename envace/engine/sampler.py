"""The engine's one door to a backend: sampling settings, a fresh seed per call, time and tokens spent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from envace.engine import streams
from envace.policy.backend import Backend, Generation, SamplingParams


class Clock:
    """Wall seconds during which at least one backend call was in flight. Calls from several threads at once (the
    per-episode loop) overlap and count once, so tokens over `busy_s` stays the backends' throughput; calls one
    after another (lock-step) simply add up. Samplers of one job share it (private rehearsal's own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active, self._since, self._busy = 0, 0.0, 0.0

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._busy += time.perf_counter() - self._since

    @property
    def busy_s(self) -> float:
        with self._lock:
            return self._busy + (time.perf_counter() - self._since if self._active else 0.0)


class Sampler:
    """Generates for every role of a rollout through one backend (or another one passed per call).

    Call k uses seed `seed * 1_000_003 + k`, so a rollout with the same seed and the same sequence of
    calls samples the same tokens: what makes a resumed training step replay exactly. A call made inside an
    episode's stream (`streams.py`: the per-episode loop, where the order of calls is the scheduler's) takes the
    stream's next seed instead. Each call asks for the sampled tokens' log-probabilities, which the store keeps
    with every generation, and stamps each generation with the temperature and top-p it was sampled at (what its
    log-probs are read against: `training.grpo.aligned`), and with the seconds it waited, finished, for the other
    prompts of its call (`Generation.held_s`, where the backend timed each). Counters are safe across threads.
    """

    def __init__(self, backend: Backend, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 clock: Clock | None = None) -> None:
        self.backend = backend
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.calls = 0
        self.tokens = 0  # tokens generated
        self.clock = clock or Clock()
        self._lock = threading.Lock()

    @property
    def tokenizer(self):
        return self.backend.tokenizer

    @property
    def generation_s(self) -> float:
        """Wall time inside backends (overlapping calls once)."""
        return self.clock.busy_s

    @property
    def position(self) -> int:
        """The calls so far that a seed derived from the sampler's history reads: this thread's episode stream's,
        or all of this sampler's."""
        stream = streams.current()
        return self.calls if stream is None else stream.calls

    def __call__(self, prompts: list[list[int]], max_new_tokens: int, greedy: bool = False, frozen: bool = False,
                 backend: Backend | None = None, tasks: list[str] | None = None,
                 temperature: float | None = None) -> list[Generation]:
        """One backend call; `tasks` names each prompt's task (`SamplingParams.tasks`); `temperature` overrides
        the job's for this call (a role sampled at its own temperature)."""
        with self._lock:
            self.calls += 1
            calls = self.calls
        stream = streams.current()
        own = self.temperature if temperature is None else temperature
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else own,
                                top_p=self.top_p, logprobs=True, frozen=frozen, tasks=tuple(tasks or ()),
                                seed=self.seed * 1_000_003 + calls if stream is None else stream.seed(self.seed))
        start = time.perf_counter()
        with self.clock.running():
            out = (backend or self.backend).generate(prompts, params)
        wall = time.perf_counter() - start
        gens = [replace(g, temperature=params.temperature, top_p=params.top_p,
                        held_s=None if g.elapsed_s is None else max(0.0, wall - g.elapsed_s)) for g in out]
        with self._lock:
            self.tokens += sum(len(g.ids) for g in gens)
        return gens
