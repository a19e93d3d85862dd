"""`envace train`, top to bottom: SFT, then role-wise GRPO with no environment in the loop.

    build the policy (+ LoRA), the learner, the recorder            # `setup.py`, `learner.py`, `recorder.py`
    SFT on the reference rows, or resume from `state.pt`             # `sft.py`, `checkpoint.py`
    for each GRPO step k:
        played = actor.play(k, tasks drawn from (seed, k))   # G rollouts per task in the rehearsed world
        result = learner.step(played)                        # A = reward − mean per (task, role); one update
        push the new weights to the generator and its vLLM servers
        recorder.record(result)                              # the advantages on the very generations, every table
        evaluate every `eval.every` updates, save `state.pt` every `grpo.save_every`
    save the final weights (LoRA merged) to <run>/checkpoint

With `grpo.max_staleness = s ≥ 1` (`overlapped`) the actor plays on a thread with its own copy of the weights, step k
with version max(0, k − s), while the learner updates (`staleness.py`); `[train.ray]` runs the same `overlapped`
with Ray's actors and learner ranks (`cluster/driver.py`). Resume is exact: nothing random carries over steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace.config import TrainConfig
from envace.store import Run
from envace.training.actor import Played, RolloutActor
from envace.training.checkpoint import final_checkpoint, save_state, start_or_resume
from envace.training.distributed import Processes
from envace.training.evaluate import evaluate
from envace.training.fsdp import launcher_fsdp
from envace.training.learner import BaseLearner, Learner
from envace.training.pool import grpo_pool, seen_groups
from envace.training.recorder import Recorder
from envace.training.setup import build_policy, processes, publisher, start_servers, step_tasks
from envace.training.sft import eta, sft_place, warm_up
from envace.training.staleness import local_dispatcher


@dataclass
class Trainer:
    """What the loop drives: the `learner` updates, the `recorder` keeps, steps draw their units from `pool`."""
    cfg: TrainConfig
    run: Run
    procs: Processes
    learner: BaseLearner
    recorder: Recorder
    pool: list

    def tasks_of(self, step: int) -> list:
        return self.procs.share(step_tasks(self.cfg, self.pool, step))


def train(cfg: TrainConfig, run: Run, say: Callable[[str], None] = print, resume: bool = False) -> dict[str, Any]:
    """SFT then GRPO into `run` in this process (and its `accelerate launch` peers): the module docstring."""
    cfg, launcher = cfg.resolve(), launcher_fsdp(cfg.distributed.shard_optimizer)  # resolved: as run.json keeps it
    procs = processes(cfg, launcher, say)
    if not procs.main:
        say = lambda _: None  # noqa: E731  (process 0 speaks for all)
    policy = build_policy(cfg, checkpointing=bool(launcher and launcher["activation_checkpointing"]))
    model, tok = policy.model, policy.tok
    cfg, pool = grpo_pool(cfg, policy.benchmark, policy.train_tasks, policy.bank, model, tok, say)
    generator = procs.prepare(model)  # what rollouts generate with: `model` itself unless FSDP shards it
    learner = Learner(cfg, model, procs, tok.pad_token_id)
    t = Trainer(cfg, run, procs, learner, Recorder.open(cfg, run, procs, say), pool)
    start, versions, summary = start_or_resume(cfg, run, procs, learner, say, resume, lambda: generator.device,
                                               lambda: warm_up(cfg, policy, learner, t.recorder.sft, say,
                                                               sft_place(cfg, run.path, procs)))
    served = start_servers(cfg, procs, run, tok, say) if cfg.grpo.steps > start or cfg.eval.every else None
    push = publisher(cfg, procs, model, generator, served)
    synced = push()
    if served is not None:
        say(f"vLLM: weights synced in {synced:.2f} s")
    actor = RolloutActor.local(cfg, policy.benchmark, policy.bank, generator, tok, served, say, procs)
    try:
        if cfg.eval.every and start == 0:
            evaluate(actor, t.recorder, 0)
        if cfg.grpo.max_staleness:
            overlapped(t, local_dispatcher(t, actor.detached(), start, {**versions, start: t.learner.weights()}),
                       start)
        else:
            synchronous(t, actor, start, push)
    finally:
        if served is not None:
            served.close()
        t.recorder.close()
    summary["checkpoint"] = str(final_checkpoint(run, procs, generator, tok, seen_groups(cfg, policy.train_tasks),
                                                 cfg.policy.lora))
    say(f"saved {summary['checkpoint']}")
    return summary


def synchronous(t: Trainer, actor: RolloutActor, start: int, push: Callable[[], float | None]) -> None:
    """`grpo.max_staleness = 0`: play step k with the weights after k updates, update, push, then play step k + 1."""
    started = time.perf_counter()
    for step in range(start, t.cfg.grpo.steps):
        actor.version = step  # the generation weights are the trained ones
        learn(t, actor.play(step, t.tasks_of(step)), push=push)
        t.recorder.say(f"  {eta(started, step + 1 - start, t.cfg.grpo.steps - start)}")
        if due(t.cfg, step + 1, t.cfg.eval.every):
            evaluate(actor, t.recorder, step + 1)
        if due(t.cfg, step + 1, t.cfg.grpo.save_every):
            save_state(t.learner, t.procs, t.run, step + 1)


def overlapped(t: Trainer, pipe, start: int) -> None:
    """The learner's loop while `pipe` (`dispatch.Dispatcher`: one actor on a thread, or Ray's) plays ahead: take each
    step in order, update, publish (what it unlocks starts at once), queue evaluations beside rollouts, save."""
    cfg, evaluations, started = t.cfg, [], time.perf_counter()
    try:
        for step in range(start, cfg.grpo.steps):
            played, wait_s, load_s = pipe.take(step)
            learn(t, played, push=lambda v=step + 1: pipe.advance(v, t.learner.weights()),
                  timings={"wait_s": wait_s, "load_s": load_s}, since=started)
            started = time.perf_counter()
            t.recorder.waited_for(played, wait_s)
            if due(cfg, step + 1, cfg.eval.every):
                evaluations.append(pipe.evaluate(step + 1, t.recorder, cfg.eval.limit))
            if due(cfg, step + 1, cfg.grpo.save_every):
                save_state(t.learner, t.procs, t.run, step + 1, pipe.kept(step + 1))
        pipe.finish(evaluations)
    finally:
        pipe.close()


def learn(t: Trainer, played: Played, push: Callable[[], float | None] | None = None,
          timings: dict[str, float] | None = None, since: float | None = None) -> None:
    """One update on `played` and its record, with the step's spans for the app's timeline. A step sampled more
    than `grpo.max_staleness` versions ago is dropped and counted, never trained on. `push` hands the new weights on
    before the step's rows are written (the next steps wait on them); `since`: the step's wall time runs from."""
    if played.step - played.version > t.cfg.grpo.max_staleness:
        t.recorder.dropped(played.step, played.version)
        return None if push is None else push()  # the version number moves on all the same
    if played.failed:
        t.recorder.failed(played)
        if not played.episodes:  # every group of the step failed for good: nothing to update on
            return None if push is None else push()
    started, clock = time.perf_counter(), time.time()
    result = t.learner.step(played)
    stats, update_s = result.stats, time.perf_counter() - started
    if push is not None and (synced := push()) is not None:
        stats["sync_s"] = synced
    stats.update(played.spans(), update_s=update_s, staleness=result.staleness, update_start_t=clock,
                 **(timings or {}))
    stats["step_s"] = time.perf_counter() - (since if since is not None else started - played.seconds)
    t.recorder.record(result)


def due(cfg: TrainConfig, updates: int, every: int) -> bool:
    return bool(every) and (updates % every == 0 or updates == cfg.grpo.steps)
