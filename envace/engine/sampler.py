"""The engine's one door to a backend: sampling settings, a fresh seed per call, time and tokens spent."""

from __future__ import annotations

import time
from dataclasses import replace

from envace.policy.backend import Backend, Generation, SamplingParams


class Sampler:
    """Generates for every role of a rollout through one backend (or another one passed per call).

    Call k uses seed `seed * 1_000_003 + k`, so a rollout with the same seed and the same sequence of
    calls samples the same tokens: what makes a resumed training step replay exactly. Each call asks
    for the sampled tokens' log-probabilities, which the store keeps with every generation, and stamps each
    generation with the temperature and top-p it was sampled at (what its log-probs are read against:
    `training.grpo.aligned`).
    """

    def __init__(self, backend: Backend, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> None:
        self.backend = backend
        self.temperature, self.top_p, self.seed = temperature, top_p, seed
        self.calls = 0
        self.generation_s = 0.0  # wall time inside backends
        self.tokens = 0  # tokens generated

    @property
    def tokenizer(self):
        return self.backend.tokenizer

    def __call__(self, prompts: list[list[int]], max_new_tokens: int, greedy: bool = False, frozen: bool = False,
                 backend: Backend | None = None, tasks: list[str] | None = None,
                 temperature: float | None = None) -> list[Generation]:
        """One backend call; `tasks` names each prompt's task (`SamplingParams.tasks`); `temperature` overrides
        the job's for this call (a role sampled at its own temperature)."""
        self.calls += 1
        own = self.temperature if temperature is None else temperature
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0 if greedy else own,
                                top_p=self.top_p, seed=self.seed * 1_000_003 + self.calls, logprobs=True,
                                frozen=frozen, tasks=tuple(tasks or ()))
        start = time.perf_counter()
        gens = [replace(g, temperature=params.temperature, top_p=params.top_p)
                for g in (backend or self.backend).generate(prompts, params)]
        self.generation_s += time.perf_counter() - start
        self.tokens += sum(len(g.ids) for g in gens)
        return gens
