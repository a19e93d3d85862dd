"""`envace train` under `[train.ray]`: the driver's side of the actors and the learner ranks.

The loop is `loop.overlapped`, the same one a single process runs with `grpo.max_staleness ≥ 1`; here its actor
is `RemoteActors` (every actor plays its share of a step's tasks) and its learner `RemoteLearner` (every
rank updates on its share of the groups; the gradients are summed in their torch.distributed group). With
`grpo.max_staleness = 0` the pipeline hands step k to the actors only once version k is published: the
synchronous algorithm, each step's tasks and seeds the same as in one process.

An actor that dies is restarted by Ray (`max_restarts`), and one whose call raised (a serving error inside it:
its vLLM server died, timed out or answered 5xx) is killed to be restarted alike; the driver sends it the current
version again and replays its share of the step. The store is written once a whole step is back, by the driver
alone, so a group is stored exactly once however often its actor died or failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from envace.config import TrainConfig
from envace.store import Run
from envace.training.actor import Played
from envace.training.checkpoint import start_or_resume, write_files
from envace.training.cluster.placement import Placement
from envace.training.distributed import Processes
from envace.training.evaluate import evaluate
from envace.training.grpo import Row
from envace.training.learner import ADDITIVE, BaseLearner
from envace.training.loop import Trainer, overlapped
from envace.training.recorder import Recorder


class RemoteActors:
    """The actors as one `RolloutActor` for `AheadPipeline`: `load` a version into all, `play` a step across them."""

    def __init__(self, handles: list, max_restarts: int, say: Callable[[str], None]) -> None:
        self.handles, self.max_restarts, self.say = handles, max_restarts, say
        self.version, self.published = -1, None  # (object ref of the weights, version)
        self.restarts = 0

    def load(self, weights: dict[str, torch.Tensor], version: int) -> float:
        import ray

        started = time.perf_counter()
        self.published = (ray.put(weights), version)  # one copy in the object store, read by every actor
        self._each(range(len(self.handles)), lambda h, i: h.load.remote(*self.published))
        self.version = version
        return time.perf_counter() - started

    def play(self, step: int, tasks: list) -> Played:
        """Every actor plays tasks[i::n]; the groups come back in the order of `tasks`, as one process plays them."""
        started, clock, restarts, n = time.perf_counter(), time.time(), self.restarts, len(self.handles)
        busy = [i for i in range(n) if tasks[i::n]]
        shares = dict(zip(busy, self._each(busy, lambda h, i: h.play.remote(step, tasks[i::n], self.version)),
                          strict=True))
        size = len(shares[busy[0]].episodes) // len(tasks[busy[0]::n])  # G episodes per task
        episodes, scored = [], []
        for j in range(len(tasks)):
            part, at = shares[j % n], (j // n) * size
            episodes += part.episodes[at: at + size]
            scored += part.scored[at: at + size]
        return Played(step, self.version, episodes, scored, shares[busy[0]].real_fraction,
                      time.perf_counter() - started, clock, self.restarts - restarts,
                      [shares[i].seconds for i in busy])

    def evaluate(self, updates: int) -> tuple[list, list]:
        n = len(self.handles)
        parts = self._each(range(n), lambda h, i: h.evaluate.remote(updates, self.version, i, n))
        return [ep for p in parts for ep in p[0]], [row for p in parts for row in p[1]]

    def _each(self, indices, call: Callable[[Any, int], Any]) -> list:
        """`call(handle, i)` on every actor in `indices` at once. An actor that died, whose call raised (a task
        error: restarted first, `_restart`), or that came back without the published version (answered None) is
        sent the version again and asked again."""
        import ray

        refs = {i: call(self.handles[i], i) for i in indices}
        out = []
        for i, ref in refs.items():
            for attempt in range(self.max_restarts + 2):
                failed = False
                try:
                    result = ray.get(ref)
                    if result is not None:
                        break
                    why = "came back without the policy weights"
                except ray.exceptions.RayActorError as exc:
                    why = f"died ({type(exc).__name__})"
                except (ray.exceptions.RayTaskError, ray.exceptions.UnserializableException) as exc:
                    why, failed = f"failed ({failure(exc)})", True
                if attempt > self.max_restarts:
                    raise RuntimeError(f"ray: actor {i} {why} {attempt + 1} times; giving up (max_restarts = "
                                       f"{self.max_restarts})")
                self.restarts += 1
                self.say(f"  actor {i} {why}: " + ("restarting it, " if failed else "") + "sending it policy "
                         f"version {self.published[1]} again and replaying its share")
                if failed:
                    self._restart(i)
                self._reload(i)
                ref = call(self.handles[i], i)
            out.append(result)
        return out

    def _restart(self, i: int, restart_s: float = 600.0) -> None:
        """Kill actor `i` for Ray to restart it (counted against `max_restarts`, as a death is): after a task error
        its process may hold a dead server or half a step. Returns once a new process answers (up to `restart_s`;
        sooner if the actor stays dead: the next attempt finds out), so no call reaches the old one."""
        import ray

        handle = self.handles[i]
        try:
            before = ray.get(handle.where.remote(), timeout=60)[1]
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            before = None  # already gone, or stuck
        ray.kill(handle, no_restart=False)
        deadline, dead = time.monotonic() + restart_s, 0
        while time.monotonic() < deadline and dead < 20:
            try:
                if ray.get(handle.where.remote(), timeout=max(deadline - time.monotonic(), 1))[1] != before:
                    return
            except ray.exceptions.ActorUnavailableError:
                pass  # restarting
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                dead += 1  # the old process going, or the actor out of restarts
            time.sleep(0.5)


    def _reload(self, i: int, restart_s: float = 600.0) -> None:
        """Send actor `i` the published version again. While Ray restarts it, a call fails at once with
        `ActorUnavailableError`: wait for it (up to `restart_s`) instead of spending a restart on each failure."""
        import ray

        deadline = time.monotonic() + restart_s
        while True:
            try:
                ray.get(self.handles[i].load.remote(*self.published))
                return
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    return  # the next attempt finds out
                time.sleep(0.5)
            except ray.exceptions.RayActorError:
                return  # died again: the next attempt finds out


def failure(exc: Exception) -> str:
    """What an actor's failed call raised, in one line: its exception's type and first line (the last line of the
    traceback Ray sends when the exception itself could not be sent back)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: " + (str(cause).splitlines() or [""])[0]
    kind, _, message = (str(exc).strip().splitlines() or [""])[-1].partition(": ")
    return f"{kind.rsplit('.', 1)[-1]}: {message}"


class RemoteLearner(BaseLearner):
    """The learner ranks as one `learner.Learner`: rank r updates on the groups of every r-th task."""

    def __init__(self, cfg: TrainConfig, handles: list) -> None:
        self.cfg, self.handles = cfg, handles

    def _all(self, method: str, *args) -> list:
        import ray

        return ray.get([getattr(h, method).remote(*args) for h in self.handles])

    def update(self, rows: list[Row], advantages: list[float]) -> dict[str, Any]:
        import ray

        order = list(dict.fromkeys(r.task_uid for r in rows))  # tasks in the order they were played
        rank_of = {uid: j % len(self.handles) for j, uid in enumerate(order)}
        refs = []
        for rank, h in enumerate(self.handles):
            picked = [i for i, r in enumerate(rows) if rank_of[r.task_uid] == rank]
            refs.append(h.update.remote([rows[i] for i in picked], [advantages[i] for i in picked]))
        stats = ray.get(refs)
        return {**stats[0], **{k: sum(s[k] for s in stats) for k in ADDITIVE if k in stats[0]}}

    def weights(self) -> dict[str, torch.Tensor]:
        return self._all("weights")[0]

    def state(self) -> dict | None:
        return self._all("state")[0]

    def load(self, state: dict) -> None:
        import ray

        self._all("load", ray.put(state))


def _ranks(cfg: TrainConfig, placement: Placement) -> list:
    import ray

    from envace.training.cluster.workers import LearnerRank

    rc = cfg.ray
    return [ray.remote(LearnerRank).options(num_cpus=rc.learner_cpus, num_gpus=rc.learner_gpus,
                                            scheduling_strategy=placement.learner(r)).remote(cfg, r, rc.learners)
            for r in range(rc.learners)]


def _actors(cfg: TrainConfig, placement: Placement, run: Run) -> list:
    """The actors, each in its bundle, named `<run>-actor-<i>` (namespace envace); `cfg` with its budgets resolved."""
    import ray

    from envace.training.cluster.workers import ActorWorker

    rc = cfg.ray
    return [ray.remote(ActorWorker).options(num_cpus=rc.actor_cpus, num_gpus=rc.actor_gpus,
                                            max_restarts=rc.max_restarts, name=f"{run.run_id}-actor-{i}",
                                            namespace="envace", scheduling_strategy=placement.actor(i))
            .remote(cfg, i) for i in range(rc.actors)]


def train_on_ray(cfg: TrainConfig, run: Run, say: Callable[[str], None], resume: bool,
                 placement: Placement) -> dict[str, Any]:
    """SFT then GRPO with Ray's actors and learner ranks (module docstring) in `placement`, reserved and its nodes
    checked before the run existed (`placement.reserved`); the summary, as `loop.train`."""
    import ray

    cfg, ranks, actors = cfg.resolve(), [], []  # the workers build from the config the run stores
    try:
        ranks = _ranks(cfg, placement)
        host, port = ray.get(ranks[0].endpoint.remote())
        cfg, pool = ray.get([r.join.remote(host, port) for r in ranks])[0]  # `auto` budgets resolved on rank 0
        actors = _actors(cfg, placement, run)
        nodes = {}  # Ray node id → a short name, in order of appearance
        named = [nodes.setdefault(node, f"node {len(nodes)} ({node[:8]})")
                 for node, _ in ray.get([h.where.remote() for h in actors + ranks])]
        say(f"ray: {len(actors)} actor(s) on " + ", ".join(named[: len(actors)]) + f"; a learner of {len(ranks)} "
            "rank(s) on " + ", ".join(named[len(actors):]))
        procs = Processes()  # the driver alone: world 1, writes everything
        learner = RemoteLearner(cfg, ranks)
        t = Trainer(cfg, run, procs, learner, Recorder.open(cfg, run, procs, say), pool)

        def warm() -> dict[str, Any]:  # SFT on the ranks; its metrics recorded here
            nll, logged = ray.get([r.sft.remote() for r in ranks])[0]
            for step, values in logged:
                t.recorder.sft(step, values)
            return nll

        start, versions, summary = start_or_resume(cfg, run, procs, learner, say, resume, lambda: "cpu", warm)
        remote = RemoteActors(actors, cfg.ray.max_restarts, say)
        if cfg.eval.every and start == 0:
            evaluate(remote, t.recorder, 0, learner.weights())
        overlapped(t, remote, start, versions)
        files = ray.get([r.checkpoint.remote() for r in ranks])[0]
        summary["checkpoint"] = str(write_files(run.path / "checkpoint", files))
        say(f"saved {summary['checkpoint']}")
        t.recorder.close()
        return summary
    finally:
        # close() stops an actor's vLLM server and removes its folder; an actor still busy in play() is killed after
        # the timeout, and its server dies with its process (`vllm.launch`), so nothing outlives the run
        ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=60)
        for handle in actors + ranks:
            ray.kill(handle, no_restart=True)
