"""Assembling a rollout engine from a config: the one place where a mode becomes a world.

| mode              | world                                                                  |
|-------------------|------------------------------------------------------------------------|
| `real`            | `RealWorld`                                                            |
| `rehearse`        | `RehearsedWorld`, or `DynaMix(RealWorld, RehearsedWorld, real_fraction)`; |
|                   | wrapped in `Shadow(…, RealWorld, shadow_fraction)` when that is > 0   |
| `rehearse+shadow` | `Shadow(RehearsedWorld, RealWorld)`                                    |
| `real+shadow`     | `Shadow(RealWorld, RehearsedWorld)`                                    |

Decision forks (`decision_sample`) and embedding cosines (`embedding`) belong to the shadow, and so does
`shadow_turns` (only those user turns' calls are paired). Each role may have its own backend: the caller's
(the policy), the rehearser's (`rehearser_model`: a frozen external simulator, or the gold) and the simulated
user's (`user_model`).

This module sits above `envace.engine` and `envace.private`: private rehearsal plays its imagined attempts in an
engine of its own, so the engine cannot import it, and only here do the two meet.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from envace.config import PrivateOptions, RolloutConfig, turn_range
from envace.engine.examples import ExampleBank
from envace.engine.prompts import ChatRenderer
from envace.engine.rehearser import Rehearser
from envace.engine.rollout import BeforeTurn, RolloutEngine
from envace.engine.sampler import Sampler
from envace.engine.user import UserSimulator
from envace.engine.worlds import DynaMix, Forks, RealWorld, RehearsedWorld, Shadow, World
from envace.envs.registry import Benchmark
from envace.policy.backend import Backend
from envace.policy.queued import queued
from envace.private.rehearsal import PrivateRehearsal


def world_for(config: RolloutConfig, sampler: Sampler, renderer: ChatRenderer, rehearser: Rehearser) -> World:
    """The world of `config.mode` (see the table above); its random draws derive from `config.seed`."""
    rng = random.Random(config.seed)
    forks = Forks(sampler, renderer, config.decision_sample, config.max_new_tokens, rng) \
        if config.decision_sample > 0 else None

    first, last = turn_range(config.shadow_turns)  # real+shadow only (`RolloutConfig.validate`)
    which = (lambda p: first <= p.episode.turn and (last is None or p.episode.turn <= last)) \
        if config.shadow_turns else None

    def shadow(fed: World, beside: World, share: float = 1.0) -> Shadow:
        return Shadow(fed, beside, share, rng, forks, config.embedding, rehearser.is_error, which)

    real, rehearsed = RealWorld(), RehearsedWorld(rehearser)
    if config.mode == "real":
        return real
    if config.mode == "real+shadow":
        return shadow(real, rehearsed)
    if config.mode == "rehearse+shadow":
        return shadow(rehearsed, real)
    world: World = DynaMix(real, rehearsed, config.real_fraction, rng) if config.real_fraction > 0 else rehearsed
    return shadow(world, real, config.shadow_fraction) if config.shadow_fraction > 0 else world


def build_engine(backend: Backend, benchmark: Benchmark, config: RolloutConfig, examples: ExampleBank | None = None,
                 user_backend: Backend | None = None, max_context: int | None = None,
                 id_prefix: str = "", rehearser_backend: Backend | None = None,
                 private_hook: Callable[[PrivateOptions, Rehearser], BeforeTurn] | None = None) -> RolloutEngine:
    """A rollout engine for `config` on `backend`: its world, rehearser, simulated user and private rehearsal.

    `examples` (train tasks) ground the rehearser and the caller's demonstration; `user_backend` plays
    simulated users and `rehearser_backend` rehearses (the policy itself when None); `max_context` defaults to
    the backend's. `private_hook(options, rehearser)` builds the before-turn hook of an active
    `[rollout.private]` instead of `PrivateRehearsal` (a rung of the private-rehearsal ladder).
    """
    if config.episode_loop == "per_episode":  # called from a thread per episode: one call at a time behind a queue
        wrapped: dict[int, Backend] = {}
        backend, user_backend, rehearser_backend = (queued(b, wrapped) for b in (backend, user_backend,
                                                                                rehearser_backend))
    sampler = Sampler(backend, config.temperature, config.top_p, config.seed)
    renderer = ChatRenderer(backend.tokenizer, config.tool_docs, config.thinking)
    examples = examples or ExampleBank()
    rehearser_renderer = ChatRenderer(rehearser_backend.tokenizer, thinking=config.thinking) \
        if rehearser_backend else renderer
    context = max_context or getattr(backend, "max_context", None)
    rehearser = Rehearser(sampler, rehearser_renderer, examples, config.rehearser, frozen=config.frozen_rehearser,
                          is_error=benchmark.is_error, backend=rehearser_backend,
                          max_context=_rehearser_context(context, max_context, rehearser_backend))
    user_renderer = ChatRenderer(user_backend.tokenizer, thinking=config.thinking) if user_backend else renderer
    users = UserSimulator(sampler, user_renderer, user_backend, config.user_max_new_tokens, config.max_steps_per_turn)
    # what runs before a turn opens: private rehearsal, or what the benchmark plays first (never both: validate)
    before_turn = (private_hook or PrivateRehearsal)(config.private, rehearser) if config.private.active else \
        benchmark.before_turn(config.category) if benchmark.before_turn else None
    return RolloutEngine(sampler, benchmark, config, world_for(config, sampler, renderer, rehearser), renderer,
                         examples, users, before_turn, context, id_prefix)


def _rehearser_context(context: int | None, bound: int | None, own: Backend | None) -> int | None:
    """The rehearser's context: the policy's, or its own backend's, never past an explicit bound (training's
    packing budget)."""
    if own is None:
        return context
    limits = [c for c in (getattr(own, "max_context", None), bound) if c]
    return min(limits) if limits else None
