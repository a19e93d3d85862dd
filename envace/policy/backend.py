"""The backend interface: batched generation from token ids to token ids (token-in, token-out).

Backends never see chat messages: prompts arrive as token ids built by the rollout engine, and the
generated ids come back verbatim so nothing the model wrote is ever re-tokenized. `remote.py`
implements the same `generate` over an OpenAI-compatible server taking `prompt` token ids (vLLM);
that server returns text, so there the ids are the local tokenizer's encoding of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch. `temperature == 0` means greedy."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # One seed per prompt: each prompt samples from a generator of its own, so its tokens do not depend on the
    # other prompts of its batch (a backend that shares one random stream per call reads `seed` instead). Empty:
    # the call's one `seed`. The queue in front of the in-process backend sets them (`policy.queued`).
    seeds: tuple[int, ...] = ()
    logprobs: bool = False
    frozen: bool = False  # generate with the base weights (adapters disabled): a frozen role
    # The uid of the task each prompt belongs to. A model never reads it; a backend that replays tasks (the
    # scripted reference policy) finds its task by it, since tasks may open with the same text.
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generation:
    """One completion: its token ids (through the stop token when it stopped), text and finish reason; the sampled
    tokens' log-probabilities, and the temperature and top-p they were sampled at (`engine.sampler.Sampler` records
    them; None when generated outside it). The learner reads both (`training.grpo.aligned`).

    `elapsed_s` is the backend's own seconds on this one completion, where each prompt is its own request (a served
    backend), and `held_s` the seconds it then sat finished while the rest of its call's prompts were still being
    generated (`Sampler`): an episode's share of waiting for others (`Episode.wait_s`). Neither is compared.
    `version` is the policy version that sampled it, where a step's versions may change between calls (partial
    rollouts: `training.partial`); None elsewhere."""

    ids: list[int]
    text: str
    finish: str  # "stop" (emitted the stop token) or "length" (hit max_new_tokens)
    logprobs: list[float] | None = None
    temperature: float | None = None
    top_p: float | None = None
    elapsed_s: float | None = field(default=None, compare=False)
    held_s: float | None = field(default=None, compare=False)
    version: int | None = None


class Backend(Protocol):
    """Anything that turns a batch of prompts (token ids) into completions.

    A backend that may be called from several threads at once says so with a class attribute `concurrent = True`
    (a served one: every prompt is an HTTP request); the per-episode loop (`engine.per_episode`) queues the calls
    of others (`policy.queued`).
    """

    tokenizer: object
    calls: int  # generate() calls so far; the rollout engine makes one per step and role

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]: ...
