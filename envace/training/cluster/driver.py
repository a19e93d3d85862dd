"""`envace train` under `[train.ray]`: the driver's side of the actors and the learner ranks.

The loop is `loop.overlapped`, the same one a single process runs with `grpo.max_staleness ≥ 1`; here its
actor is `RemoteActors` and its learner `RemoteLearner` (every rank updates on its share of the groups; the
gradients are summed in their torch.distributed group). With `grpo.max_staleness = 0` the pipeline hands step k
to the actors only once version k is published: the synchronous algorithm.

A step's groups (a task's G episodes) are one work queue: cut into chunks of `chunk_size` groups, each handed to
whichever actor is free (`ray.wait` over the calls out), so a slow actor plays fewer chunks instead of setting the
step's time. Chunk c is sampled from the seeds of `rollout_at(step, c)` (its index, not its actor's), so what a
step plays depends on the tasks and the number of actors alone, not on which actor took which chunk; with one
actor the step is one chunk, as one process plays it.

An actor that dies is restarted by Ray (`max_restarts`), and one whose call raised (a serving error inside it:
its vLLM server died, timed out or answered 5xx) is killed to be restarted alike; its chunk goes back to the
queue (to the next free actor) and the driver sends it the current version again. The store is written once a
whole step is back, by the driver alone, so a group is stored exactly once however often its actor died or failed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from envace.config import TrainConfig
from envace.errors import Stopped
from envace.store import Run
from envace.training.actor import Played
from envace.training.checkpoint import file_pieces, receive, replace_folder, start_or_resume
from envace.training.cluster.placement import Placement
from envace.training.distributed import Processes
from envace.training.evaluate import evaluate
from envace.training.grpo import Row
from envace.training.learner import ADDITIVE, BaseLearner
from envace.training.loop import Trainer, overlapped
from envace.training.partial import may_play
from envace.training.recorder import Recorder


class RemoteActors:
    """The actors as one `RolloutActor` for `AheadPipeline`: `load` a version into all, `play` a step across them."""

    def __init__(self, handles: list, max_restarts: int, say: Callable[[str], None], partial: bool = False,
                 chunk: int | None = None) -> None:
        self.handles, self.max_restarts, self.say, self.partial, self.chunk = handles, max_restarts, say, partial, chunk
        self.version, self.published = -1, None  # (object ref of the weights, version)
        self.restarts = 0
        self.played = [0] * len(handles)  # groups each actor has played and returned, over the run

    def load(self, weights, version: int) -> float:
        """Version `version` into every actor: `weights` is the reference a learner rank put in the object store
        (`RemoteLearner.weights`), or weights the driver holds (a resumed run's older versions, from `state.pt`),
        put there once; every actor reads the one copy."""
        import ray

        started = time.perf_counter()
        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        self.published = (ref, version)
        self._each(range(len(self.handles)), lambda h, i: h.load.remote(*self.published))
        self.version = version
        return time.perf_counter() - started

    def holds(self, version: int) -> bool:
        """As `RolloutActor.holds`, for the version last loaded into every actor (an actor that took a newer offer
        plays a chunk asked of an older version: `ActorWorker.play`)."""
        return may_play(self.version, version, self.partial)

    def offer(self, weights, version: int) -> None:
        """Partial rollouts: version `version` to every actor, taken between two backend calls of the chunk it is
        playing (an actor runs `offer` beside `play`: `max_concurrency = 2`). An actor that does not answer is
        left to the next `load`; the version the driver loads and asks chunks of stays the older one."""
        import ray

        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        refs = [h.offer.remote(ref, version) for h in self.handles]
        ray.wait(refs, num_returns=len(refs), timeout=60)

    def play(self, step: int, tasks: list) -> Played:
        """The step's groups as one work queue (module docstring): chunk c of `chunk_size` groups goes to whichever
        actor is free and is sampled from seeds of (seed, step, c), whoever plays it; a chunk whose actor died or
        failed goes back to the queue while that actor is restarted. The groups come back in the order of `tasks`."""
        import ray

        started, clock, restarts, n = time.perf_counter(), time.time(), self.restarts, len(self.handles)
        size = chunk_size(len(tasks), n, self.chunk)
        queue = deque(range(-(-len(tasks) // size)))  # chunk indices, handed out in order
        idle, running, done = deque(range(n)), {}, {}
        busy, failures = [0.0] * n, [0] * n

        def hand_out() -> None:
            while queue and idle:
                i, c = idle.popleft(), queue.popleft()
                ref = self.handles[i].play.remote(step, tasks[c * size: (c + 1) * size], self.version, c)
                running[ref] = (i, c, time.perf_counter())

        while queue or running:
            hand_out()
            ready, _ = ray.wait(list(running), num_returns=1)
            i, c, at = running.pop(ready[0])
            result, why, failed = _outcome(ready[0])
            busy[i] += time.perf_counter() - at
            if why is None:
                done[c] = result
                self.played[i] += len(tasks[c * size: (c + 1) * size])
                idle.append(i)
                continue
            failures[i] += 1
            queue.appendleft(c)  # its groups go to the next free actor
            hand_out()
            self._recover(i, why, failed, failures[i], "its groups go back to the queue")
            idle.append(i)
        parts = [done[c] for c in sorted(done)]
        return Played(step, self.version, [ep for p in parts for ep in p.episodes],
                      [row for p in parts for row in p.scored], parts[0].real_fraction, time.perf_counter() - started,
                      clock, self.restarts - restarts, busy)

    def evaluate(self, updates: int) -> tuple[list, list]:
        n = len(self.handles)
        parts = self._each(range(n), lambda h, i: h.evaluate.remote(updates, self.version, i, n))
        return [ep for p in parts for ep in p[0]], [row for p in parts for row in p[1]]

    def _each(self, indices, call: Callable[[Any, int], Any]) -> list:
        """`call(handle, i)` on every actor in `indices` at once. An actor that died, whose call raised (a task
        error: restarted first, `_restart`), or that came back without the published version (answered None) is
        sent the version again and asked again."""
        refs = {i: call(self.handles[i], i) for i in indices}
        out = []
        for i, ref in refs.items():
            attempt = 0
            while True:
                result, why, failed = _outcome(ref)
                if why is None:
                    break
                attempt += 1
                self._recover(i, why, failed, attempt, "replaying its call")
                ref = call(self.handles[i], i)
            out.append(result)
        return out

    def _recover(self, i: int, why: str, failed: bool, attempt: int, then: str) -> None:
        """Actor `i`'s `attempt`-th failure on this call or step (`why`): restarted if its call raised (`_restart`),
        sent the published version again (`_reload`); raises past `max_restarts`."""
        if attempt > self.max_restarts + 1:
            raise RuntimeError(f"ray: actor {i} {why} {attempt} times; giving up (max_restarts = "
                               f"{self.max_restarts})")
        self.restarts += 1
        self.say(f"  actor {i} {why}: " + ("restarting it, " if failed else "") + "sending it policy "
                 f"version {self.published[1]} again; {then}")
        if failed:
            self._restart(i)
        self._reload(i)

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


def chunk_size(groups: int, actors: int, chunk: int | None = None) -> int:
    """Groups per pull of the work queue: `chunk` (`ray.chunk_groups`) when set; else with one actor the whole step
    (nothing to balance; played as one process plays it), else `groups // (4 × actors)`, at least 1: about four
    pulls per actor, so a slow actor's last pulls go to the others while each pull still batches a few groups."""
    if chunk is not None:
        return max(1, min(chunk, groups))
    return groups if actors == 1 else max(1, groups // (4 * actors))


def _outcome(ref) -> tuple[Any, str | None, bool]:
    """(result, None, False) for a call that answered; else (None, why, whether its call raised): the actor died, its
    call raised (a task error: the actor is restarted first), or it came back without the published version."""
    import ray

    try:
        result = ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        return None, f"died ({type(exc).__name__})", False
    except (ray.exceptions.RayTaskError, ray.exceptions.UnserializableException) as exc:
        return None, f"failed ({failure(exc)})", True
    if result is None:
        return None, "came back without the policy weights", False
    return result, None, False


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

    def __init__(self, cfg: TrainConfig, handles: list, run_id: str) -> None:
        self.cfg, self.handles, self.run_id = cfg, handles, run_id
        self.shared = False  # whether every rank sees the run folder (`sees`)

    def sees(self, folder: Path) -> bool:
        """Whether every rank reads a file this process has just written in `folder` (a probe, removed after):
        then rank 0 writes `state.pt` and the checkpoint there itself, every rank reads `state.pt` back on
        `--resume`, and neither passes through the driver's memory; else (a rank's node without the driver's
        disk) rank 0 writes both on its own node and sends them here in pieces (`take`)."""
        token = secrets.token_hex(8)
        probe = folder / f".probe-{token}"
        probe.write_text(token)
        try:
            return all(self._all("sees", str(probe), token))
        finally:
            probe.unlink()

    def _all(self, method: str, *args) -> list:
        return self.gather([getattr(h, method).remote(*args) for h in self.handles], method)

    def gather(self, refs: list, what: str) -> list:
        """Every rank's answer to one call, rank by rank as they come. A rank that died or raised stops the run
        (`Stopped`, one line) at once: the other ranks wait for it in a collective that never ends (asking them in
        turn would wait with them), and a rank's shard of an update is replayed by no other; the run's last saved
        state (`grpo.save_every`) resumes it exactly."""
        import ray

        out, pending = [None] * len(refs), {ref: rank for rank, ref in enumerate(refs)}
        while pending:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            rank = pending.pop(ready)
            with self._stops(rank, what):
                out[rank] = ray.get(ready)
        return out

    @contextlib.contextmanager
    def _stops(self, rank: int, what: str) -> Iterator[None]:
        """A rank that died or raised inside the block: the run stops, in one line (`gather`)."""
        import ray

        try:
            yield
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError,
                ray.exceptions.UnserializableException) as exc:
            why = f"died ({type(exc).__name__})" if isinstance(exc, ray.exceptions.RayActorError) else \
                f"failed ({failure(exc)})"
            raise Stopped(f"ray: learner rank {rank} {why} in `{what}`; the run stops, every step it saved is "
                          f"kept: add `--resume {self.run_id}` to the same command to go on") from exc

    def take(self, folder: str, entry: str, to: Path) -> None:
        """`entry` of rank 0's `folder` (on its node: `LearnerRank.save_state`'s or `checkpoint`'s) as `to`, its
        pieces written beside `to` as they arrive (`LearnerRank.send`): this process holds one piece at a time,
        never a whole state or checkpoint, and nothing half-sent stays beside the run's files if rank 0 dies."""
        import ray

        here = to.with_name(f".{to.name}.{os.getpid()}.taken")
        shutil.rmtree(here, ignore_errors=True)
        try:
            with self._stops(0, "send"):
                receive((ray.get(ref) for ref in self.handles[0].send.remote(folder)), here)
            (replace_folder if (here / entry).is_dir() else os.replace)(here / entry, to)
        finally:
            shutil.rmtree(here, ignore_errors=True)

    def update(self, rows: list[Row], advantages: list[float]) -> dict[str, Any]:
        order = list(dict.fromkeys(r.task_uid for r in rows))  # tasks in the order they were played
        rank_of = {uid: j % len(self.handles) for j, uid in enumerate(order)}
        refs = []
        for rank, h in enumerate(self.handles):
            picked = [i for i, r in enumerate(rows) if rank_of[r.task_uid] == rank]
            refs.append(h.update.remote([rows[i] for i in picked], [advantages[i] for i in picked]))
        stats = self.gather(refs, "update")
        return {**stats[0], **{k: sum(s[k] for s in stats) for k in ADDITIVE if k in stats[0]}}

    def weights(self):
        """A reference to the version rank 0 put in the object store (`LearnerRank.weights`), not the weights."""
        return self._all("weights")[0][0]

    def held(self, published):
        """The weights a reference points to, fetched for `state.pt` (a resumed run's versions are tensors)."""
        import ray

        return ray.get(published) if isinstance(published, ray.ObjectRef) else published

    def save_in_place(self, path: Path, next_step: int, versions: dict) -> bool:
        """The ranks write `state.pt` where every rank sees the run folder (under FSDP each its own shards); else
        rank 0 writes it whole on its own node and it comes here in pieces (`take`). The kept versions go as
        references (nested in a dict, Ray passes them on unread)."""
        if self.shared:
            self._all("save_state", str(path), next_step, versions)
        else:
            self.take(self._all("save_state", None, next_step, versions)[0], "state.pt", path)
        return True

    def load_in_place(self, path: Path) -> tuple[int, dict] | None:
        """(next step, kept versions): every rank reads `state.pt` itself, from the run folder where it sees it,
        else from the pieces this process hands it (`send_state`)."""
        return self._all("load_state", str(path))[0] if self.shared else self.send_state(path)

    def send_state(self, path: Path) -> tuple[int, dict]:
        """`state.pt` put into Ray's object store a piece at a time (this process never holds it whole), for each
        rank to write on its own node and read (`LearnerRank.load_sent`)."""
        import ray

        return self._all("load_sent", [ray.put(piece) for piece in file_pieces(path)])[0]


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
                                            namespace="envace", scheduling_strategy=placement.actor(i),
                                            max_concurrency=2 if cfg.grpo.partial_rollouts else 1)
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
        learner = RemoteLearner(cfg, ranks, run.run_id)
        learner.shared = learner.sees(run.path)
        say("ray: learner rank 0 writes state.pt and the checkpoint in the run folder" if learner.shared else
            "ray: a learner rank does not see the run folder: state.pt and the checkpoint come here in pieces")
        t = Trainer(cfg, run, procs, learner, Recorder.open(cfg, run, procs, say), pool)

        def warm() -> dict[str, Any]:  # SFT on the ranks; its metrics recorded here
            nll, logged = learner.gather([r.sft.remote() for r in ranks], "sft")[0]
            for step, values in logged:
                t.recorder.sft(step, values)
            return nll

        start, versions, summary = start_or_resume(cfg, run, procs, learner, say, resume, lambda: "cpu", warm)
        remote = RemoteActors(actors, cfg.ray.max_restarts, say, cfg.grpo.partial_rollouts, cfg.ray.chunk_groups)
        if cfg.eval.every and start == 0:
            evaluate(remote, t.recorder, 0, learner.weights())
        overlapped(t, remote, start, versions)
        out = run.path / "checkpoint"
        written = learner.gather([r.checkpoint.remote(str(out) if learner.shared else None) for r in ranks],
                                 "checkpoint")[0]
        if not learner.shared:  # rank 0 wrote it on its own node
            learner.take(written, "checkpoint", out)
        summary["checkpoint"] = str(out)
        say(f"saved {summary['checkpoint']}")
        t.recorder.close()
        return summary
    finally:
        close_workers(actors, ranks)


def close_workers(actors: list, ranks: list, timeout_s: float = 60.0) -> None:
    """Let the workers go. `close()` stops an actor's vLLM server and removes its folder; an actor still busy in
    `play()` (or killed while its `close()` waits) is killed after `timeout_s`, and its server dies with its process
    (`vllm.launch`: the server's parent-death signal), so nothing outlives the run."""
    import ray

    ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=timeout_s)
    for handle in actors + ranks:
        ray.kill(handle, no_restart=True)
