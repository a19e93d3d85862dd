"""The rollout actor: plays a GRPO step's episodes with the weights of one policy version, and scores them.

    weights = the published version v                    # `load`: the learner's trainable weights after v updates
    episodes = G rollouts per task in the rehearsed world (`TrainConfig.rollout_at(step)`)
    reward = checklist of each episode, shared by both roles (+ fidelity for the rehearser, `task+fidelity`)
    every generation carries `policy_version = v`          # stored: what sampled it (under partial rollouts,
                                                          # a newer version taken mid-step: `partial.py`)

The actor owns its generation weights (`generator`: the trained module itself when the learner waits for it,
a copy when they overlap), its backend (in-process HF generation, or the vLLM servers its weights are pushed
to) and the engine it builds each step. The learner (`learner.py`) turns what it plays into an update; with
`grpo.max_staleness = k ≥ 1` the actor plays step b with version max(0, b − k) while the learner updates
(`staleness.py`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from envace import record, rewards
from envace.build import build_engine
from envace.config import TrainConfig
from envace.engine.episode import Episode
from envace.engine.examples import ExampleBank
from envace.envs.registry import Benchmark
from envace.policy.hf import HFBackend
from envace.policy.models import put_weights
from envace.training import evaluate, memory_episodes
from envace.training.budget import engine_context, row_budget
from envace.training.partial import Offers, PartialBackend, may_play
from envace.training.served import ServedPolicy
from envace.training.setup import heartbeat


@dataclass
class Played:
    """One GRPO step's finished episodes, scored and rewarded, and the policy version that sampled them."""

    step: int
    version: int  # the version the step started from: its generations' oldest (partial rollouts may take newer)
    episodes: list[Episode]
    scored: list[dict[str, Any]]
    real_fraction: float
    seconds: float  # the actor's wall time on this step (loading its weights included)
    started: float = 0.0  # when the actor began this step (time.time(): the run's timeline)
    restarts: int = 0  # Ray actors restarted during this step (their chunks went back to the queue)
    actor_seconds: list[float] = field(default_factory=list)  # each Ray actor's busy time on this step
    load_s: float = 0.0  # seconds its actor spent taking the sampling version in before playing
    failed: list[dict[str, Any]] = field(default_factory=list)  # groups that failed for good: task, chunk, error
    slot_idle: float | None = None  # slot-time idle of the actors over this step's window (`scheduler.idle`)
    in_flight: int | None = None  # the episodes each actor was let keep in flight (`ray.in_flight`, resolved)

    def spans(self) -> dict[str, float]:
        """The step's rollout as the app's timeline stores it (with Ray, each actor's share and its restarts)."""
        out = {"rollout_s": self.seconds, "policy_version": self.version, "rollout_start_t": self.started}
        if self.slot_idle is not None:
            out.update(actor_slot_idle=self.slot_idle, actor_in_flight=self.in_flight)
        if self.failed:
            out["failed_groups"] = float(len(self.failed))
        if self.actor_seconds:
            out.update(actor_restarts=self.restarts,
                       **{record.actor_metric(i): s for i, s in enumerate(self.actor_seconds)})
        return out


def trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the trainable weights (LoRA's adapters, or every weight): one published policy version."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


class RolloutActor:
    """Plays steps on `generator` through `backend` (pushing to `served` when it generates); see the module
    docstring. `heartbeat(what)` makes the engine's progress reporter."""

    def __init__(self, cfg: TrainConfig, benchmark: Benchmark, bank: ExampleBank, generator, backend,
                 served: ServedPolicy | None, heartbeat: Callable[[str], Callable[[int, int], None]],
                 rank: int = 0, share: Callable[[list], list] = list) -> None:
        self.cfg, self.benchmark, self.bank, self.rank, self.share = cfg, benchmark, bank, rank, share
        self.generator, self.backend, self.served, self.heartbeat = generator, backend, served, heartbeat
        self.version = 0
        self.offers = Offers()  # partial rollouts: versions published while a step is in flight

    @classmethod
    def local(cls, cfg: TrainConfig, benchmark: Benchmark, bank: ExampleBank, generator, tokenizer,
              served: ServedPolicy | None, say: Callable[[str], None], procs) -> RolloutActor:
        """The actor of a training process: its share of the tasks, generating through the servers when
        there are any, else in this process on `generator`; progress reported through `say`."""
        backend = served.backend if served else HFBackend(generator, tokenizer, cfg.rollout.max_batch_tokens)
        return cls(cfg, benchmark, bank, generator, backend, served, lambda what: heartbeat(say, what), procs.rank,
                   procs.share)

    def detached(self) -> RolloutActor:
        """An actor on its own copy of the generation weights (the servers stay shared), holding no version yet:
        it plays while the learner updates the original (`grpo.max_staleness`)."""
        generator = copy.deepcopy(self.generator).eval()
        backend = self.served.backend if self.served else \
            HFBackend(generator, self.backend.tokenizer, self.cfg.rollout.max_batch_tokens)
        actor = RolloutActor(self.cfg, self.benchmark, self.bank, generator, backend, self.served, self.heartbeat,
                             self.rank, self.share)
        actor.version = -1  # loads its first version before it plays
        return actor

    def holds(self, version: int) -> bool:
        """Whether this actor may play a step sampled by `version` without loading it: it holds that version, or
        under partial rollouts a newer one (offered mid-step: the step is then only fresher)."""
        return may_play(self.version, version, self.cfg.grpo.partial_rollouts)

    def offer(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """A version the learner just published, taken between two backend calls of the step in flight (partial
        rollouts, `partial.py`); from any thread."""
        self.offers.offer(weights, version)

    def load(self, weights: dict[str, torch.Tensor], version: int) -> float:
        """Take published version `version` into the generation weights (and the servers); seconds spent."""
        started = time.perf_counter()
        put_weights(self.generator, weights.items())
        if self.served is not None:
            self.served.sync(self.generator)
        self.version = version
        return time.perf_counter() - started

    def play(self, step: int, tasks: list, stream: int | None = None, clear: bool = True) -> Played:
        """Step `step`'s episodes (G per task), scored, rewards shared, each generation stamped with the version.
        `stream`: the seeds' index (`rollout_at(step, stream)`; this process's rank unless a chunk names its own).
        `clear`: drop the backend's caches first (they belong to the weights before the last update); an actor
        playing several chunks at once clears them when it loads a version instead (`ActorWorker.load`)."""
        cfg, started, clock, version = self.cfg, time.perf_counter(), time.time(), self.version
        self.generator.eval()
        if clear:
            self.backend.clear_caches()
        rollout = cfg.rollout_at(step, self.rank if stream is None else stream)
        backend = self.backend
        if cfg.grpo.partial_rollouts:
            backend = PartialBackend(backend, self.offers, self._take, lambda: self.version)
        engine = build_engine(backend, self.benchmark, rollout, self.bank, id_prefix=f"s{step}:",
                              max_context=engine_context(self.backend.max_context, row_budget(cfg)),  # rows fit
                              private_hook=memory_episodes.private_hook(cfg.grpo.memory_episodes,
                                                                        rollout.group_size))
        engine.on_step = self.heartbeat(f"GRPO step {step + 1} rollouts")
        episodes = engine.run_batch([(t, g) for t in tasks for g in range(rollout.group_size)])
        scored = [record.score(ep, rollout.mode, "grpo") for ep in episodes]
        for ep, row in zip(episodes, scored, strict=True):
            rewards.share(ep.generations, row["checklist"])
            if cfg.grpo.rehearser_reward == "task+fidelity":
                rewards.add_fidelity(ep.generations, ep.pairs, cfg.grpo.fidelity_weight)
            for g in ep.generations:
                g.policy_version = version if g.gen.version is None else g.gen.version
            ep.actor = self.rank  # for the app's per-actor timeline
        return Played(step, version, episodes, scored, rollout.real_fraction, time.perf_counter() - started, clock)

    def _take(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """A version offered mid-step, loaded between two backend calls; what the backend cached belongs to the
        weights before it."""
        self.load(weights, version)
        self.backend.clear_caches()

    def evaluate(self, updates: int) -> tuple[list[Episode], list[dict[str, Any]]]:
        """This process's `share` of the evaluation after `updates` updates, played greedily (`evaluate.play`)."""
        return evaluate.play(self.cfg, self.benchmark, self.bank, self.generator, self.backend, updates, self.share)
