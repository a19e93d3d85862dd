"""`envace train` under `[train.ray]`: the driver's side of the actors and the learner ranks.

The loop is `loop.overlapped`, the same one a single process runs; here its rollouts are `dispatch.Dispatcher`
over `RayWorkers` (the actors) and its learner `RemoteLearner` (every rank updates on its share of the groups; the
gradients are summed in their torch.distributed group). One `scheduler.Scheduler` decides what each actor plays:
chunks of `chunk_size` groups of every step the staleness bound opens (at `grpo.max_staleness = 0`, step k only
once version k is published: the synchronous algorithm), as many at once per actor as `ray.in_flight` episodes
allow, with no join per chunk or step. Chunk c is sampled from the seeds of `rollout_at(step, c)` (its index, not
its actor's), so what a step plays depends on the tasks and the number of actors alone; with one actor the step is
one chunk, as one process plays it.

An actor that dies, or whose server fails (5xx, a timeout), has its chunks played again by whichever actor is free
while it restarts beside the queue (Ray restarts the process; the dispatcher probes it among the calls); its fault
past `ray.max_restarts` drops it and the run goes on with the rest. A chunk that fails for a reason playing it
again would not change (a 4xx, an environment's exception) is recorded on its groups (`failed_groups`) and
restarts nobody. The store is written once a whole step is back, by the driver alone, so a group is stored exactly
once however often its actor died or failed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from envace.config import TrainConfig
from envace.errors import Stopped
from envace.policy.vllm import transient
from envace.store import Run
from envace.training.actor import Played
from envace.training.checkpoint import file_pieces, receive, replace_folder, start_or_resume
from envace.training.cluster.placement import Placement
from envace.training.dispatch import Dispatcher
from envace.training.distributed import Processes
from envace.training.grpo import Row
from envace.training.learner import ADDITIVE, BaseLearner
from envace.training.loop import Trainer, overlapped
from envace.training.recorder import Recorder
from envace.training.scheduler import Scheduler, Work, chunk_size

T, R = TypeVar("T"), TypeVar("R")


class RayWorkers:
    """Ray's rollout actors as `dispatch.Workers`: each call a Ray call, each wait `ray.wait`, a restart `ray.kill`
    (Ray restarts the process, up to `max_restarts`) and a probe of `where` until a new process answers."""

    def __init__(self, handles: list) -> None:
        import ray

        self.handles = handles
        self.pids = [pid for _, pid in ray.get([h.where.remote() for h in handles])]
        self.refused = [0] * len(handles)  # probes a dying process refused, per actor (`answered`)
        self.played = [0] * len(handles)  # groups each actor has played and returned, over the run
        self.groups: dict[Any, tuple[int, int]] = {}  # a play call → (actor, its groups)
        self.refs: dict[int, Any] = {}  # id(weights) → their reference in the object store

    def _ref(self, weights) -> list:
        """`[reference]` to `weights` (a learner rank's reference, or weights the driver holds, put once): nested, so
        Ray hands the actor the reference and the actor reads the weights only when it loads them."""
        import ray

        if not isinstance(weights, ray.ObjectRef):
            weights = self.refs.setdefault(id(weights), ray.put(weights))
        return [weights]

    def play(self, i: int, work: Work, tasks: list, weights) -> Any:
        ref = self.handles[i].play.remote(work.step, tasks, work.version, work.chunk,
                                          None if weights is None else self._ref(weights))
        self.groups[ref] = (i, len(tasks))
        return ref

    def evaluate(self, i: int, work: Work, weights) -> Any:
        return self.handles[i].evaluate.remote(work.step, work.version, work.chunk, work.shards,
                                               None if weights is None else self._ref(weights))

    def wait(self, handles: list, timeout: float) -> list:
        import ray

        ready, _ = ray.wait(handles, num_returns=1, timeout=timeout)
        return ready

    def outcome(self, ref) -> tuple[Any, str | None, str]:
        result, kind, why = _outcome(ref)
        i, groups = self.groups.pop(ref, (None, 0))
        if kind is None and i is not None:
            self.played[i] += groups
        return result, kind, why

    def restart(self, i: int, raised: bool) -> None:
        """A call of actor `i` raised (its server failed): kill it for Ray to restart (a death Ray restarts alone)."""
        import ray

        self.refused[i] = 0
        if raised:
            ray.kill(self.handles[i], no_restart=False)

    def probe(self, i: int) -> Any:
        return self.handles[i].where.remote()

    def answered(self, i: int, ref) -> str:
        """"up" once a new process answers; "again" while Ray restarts it (or the old one is still going); "gone"
        once it is out of Ray's restarts (the old process refusing 20 probes in a row)."""
        import ray

        try:
            pid = ray.get(ref)[1]
        except ray.exceptions.ActorUnavailableError:
            return "again"
        except ray.exceptions.RayActorError:
            self.refused[i] += 1
            return "gone" if self.refused[i] >= 20 else "again"
        if pid == self.pids[i]:
            return "again"
        self.pids[i] = pid
        return "up"

    def retire(self, i: int) -> None:
        import ray

        ray.kill(self.handles[i], no_restart=True)

    def offer(self, weights, version: int) -> None:
        """Partial rollouts: the version to every actor, taken between two backend calls of its chunks (`offer` runs
        beside `play`); not waited on: an actor that does not take it loads it with its next version."""
        ref = self._ref(weights)[0]
        for h in self.handles:
            h.offer.remote(ref, version)

    def seconds(self, result) -> list[float]:
        return [ep.wall_s for ep in result.episodes] if isinstance(result, Played) else []

    def close(self) -> None:
        pass  # the actors go in `close_workers`, after the final checkpoint


def _outcome(ref) -> tuple[Any, str | None, str]:
    """(result, None, "") for a call that answered; else (None, kind, why): "lost" when the actor died or its server
    failed (`vllm.transient`: the chunk is played again, the actor restarted), "fault" when its call raised anything
    else (a 4xx, an environment's exception: playing again would fail again), "empty" when it held no version."""
    import ray

    try:
        result = ray.get(ref)
    except ray.exceptions.RayActorError as exc:
        return None, "lost", f"died ({type(exc).__name__})"
    except (ray.exceptions.RayTaskError, ray.exceptions.UnserializableException) as exc:
        cause = getattr(exc, "cause", None)
        served = transient(cause) if isinstance(cause, BaseException) else "Refused: " in failure(exc) and \
            "failed while serving" in failure(exc)
        return None, "lost" if served else "fault", (f"failed ({failure(exc)})" if served else failure(exc))
    if result is None:
        return None, "empty", "came back without the policy weights"
    return result, None, ""


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
        return self.gather(self._each(method, *args), method)

    def _each(self, method: str, *args) -> list:
        """Every rank's reference to one call, not waited for."""
        return [getattr(h, method).remote(*args) for h in self.handles]

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
        """`state.pt` sent to every rank in pieces, each written on the rank's own node as it comes
        (`LearnerRank.receive`), then read there (`LearnerRank.load_received`). At most `SENT_AHEAD` pieces are
        in the object store at once: a piece is put only once every rank has written the one that many before it,
        so the driver's node never holds the state whole."""
        import ray

        self._all("receive_begin")
        windowed(file_pieces(path), lambda piece: self._each("receive", ray.put(piece)),
                 lambda calls: self.gather(calls, "receive"))
        return self._all("load_received")[0]


SENT_AHEAD = 4  # pieces of `state.pt` (`checkpoint.PIECE` each) on their way to the ranks at once


def windowed(items: Iterable[T], send: Callable[[T], R], wait: Callable[[R], object], ahead: int = SENT_AHEAD) -> None:
    """`send` each item in order, `wait`ing for the oldest one sent whenever `ahead` are outstanding: at most
    `ahead` items sent and not yet done at any time, the last ones waited for at the end."""
    outstanding: deque[R] = deque()
    for item in items:
        if len(outstanding) >= ahead:
            wait(outstanding.popleft())
        outstanding.append(send(item))
        del item  # the piece itself: only its reference is kept while it travels
    while outstanding:
        wait(outstanding.popleft())


def _ranks(cfg: TrainConfig, placement: Placement) -> list:
    import ray

    from envace.training.cluster.workers import LearnerRank

    rc = cfg.ray
    return [ray.remote(LearnerRank).options(num_cpus=rc.learner_cpus, num_gpus=rc.learner_gpus,
                                            scheduling_strategy=placement.learner(r)).remote(cfg, r, rc.learners)
            for r in range(rc.learners)]


def _actors(cfg: TrainConfig, placement: Placement, run: Run) -> list:
    """The actors, each in its bundle, named `<run>-actor-<i>` (namespace envace); `cfg` with its budgets resolved.
    Each takes as many calls at once as chunks fit its in-flight target (`calls_at_once`), plus a probe and an
    offer beside them."""
    import ray

    from envace.training.cluster.workers import ActorWorker

    rc = cfg.ray
    return [ray.remote(ActorWorker).options(num_cpus=rc.actor_cpus, num_gpus=rc.actor_gpus,
                                            max_restarts=rc.max_restarts, name=f"{run.run_id}-actor-{i}",
                                            namespace="envace", scheduling_strategy=placement.actor(i),
                                            max_concurrency=calls_at_once(cfg) + 2)
            .remote(cfg, i) for i in range(rc.actors)]


AUTO_CALLS = 64  # calls at once an actor is made for under `ray.in_flight = auto` with a server (known once it runs)


def calls_at_once(cfg: TrainConfig) -> int:
    """Chunks an actor may play at once: its in-flight target over a chunk's episodes (rounded up, and one more for a
    chunk that does not fill it); one with `auto` and no server (an in-process model plays one chunk at a time)."""
    if cfg.ray.in_flight == "auto":
        return AUTO_CALLS if cfg.rollout.backend == "vllm" else 1
    chunk = chunk_size(cfg.grpo.tasks_per_step, cfg.ray.actors, cfg.ray.chunk_groups) * cfg.rollout.group_size
    return -(-cfg.ray.in_flight // chunk) + 1


def in_flight(cfg: TrainConfig, actors: list, say: Callable[[str], None]) -> int:
    """Episodes in flight per actor: `ray.in_flight`, or with `auto` what actor 0's vLLM server holds at once (its
    KV capacity: `ActorWorker.capacity`), at most `AUTO_CALLS` chunks; without a server, one chunk."""
    import ray

    chunk = chunk_size(cfg.grpo.tasks_per_step, cfg.ray.actors, cfg.ray.chunk_groups) * cfg.rollout.group_size
    if cfg.ray.in_flight != "auto":
        return cfg.ray.in_flight
    capacity = ray.get(actors[0].capacity.remote()) if cfg.rollout.backend == "vllm" else None
    target = chunk if capacity is None else max(chunk, min(capacity, AUTO_CALLS * chunk))
    say(f"ray: {target} episode(s) in flight per actor (ray.in_flight = auto: "
        + ("one chunk: an in-process model plays one at a time)" if capacity is None else
           f"the server holds {capacity} sequence(s) at once)"))
    return target


def train_on_ray(cfg: TrainConfig, run: Run, say: Callable[[str], None], resume: bool,
                 placement: Placement) -> dict[str, Any]:
    """SFT then GRPO with Ray's actors and learner ranks (module docstring) in `placement`, reserved and its nodes
    checked before the run existed (`placement.reserved`); the summary, as `loop.train`."""
    import ray

    cfg, ranks, actors = cfg.resolve(), [], []  # the workers build from the config the run stores
    try:
        ranks = _ranks(cfg, placement)
        forming = RemoteLearner(cfg, ranks, run.run_id)  # a rank that fails while the group forms: one line too
        host, port = forming.gather([ranks[0].endpoint.remote()], "endpoint")[0]
        cfg, pool = forming.gather([r.join.remote(host, port) for r in ranks], "join")[0]  # `auto` resolved on rank 0
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
        pipe = dispatcher(t, RayWorkers(actors), start, {**versions, start: learner.weights()},
                          in_flight(cfg, actors, say), say)
        if cfg.eval.every and start == 0:
            pipe.evaluate(0, t.recorder, cfg.eval.limit)  # queued beside step 1's chunks, on version 0
        overlapped(t, pipe, start)
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


def dispatcher(t: Trainer, workers, start: int, versions: dict, target: int, say: Callable[[str], None],
               **options) -> Dispatcher:
    """The run's rollouts from step `start` on: `workers` under one scheduler (module docstring)."""
    cfg = t.cfg
    s = Scheduler(len(workers.handles), cfg.grpo.max_staleness, start, cfg.grpo.steps,
                  lambda step: len(t.tasks_of(step)), cfg.rollout.group_size, target, cfg.ray.chunk_groups,
                  cfg.ray.max_restarts)
    return Dispatcher(workers, s, t.tasks_of, versions, say, cfg.grpo.partial_rollouts, **options)


def close_workers(actors: list, ranks: list, timeout_s: float = 60.0) -> None:
    """Let the workers go. `close()` stops an actor's vLLM server and removes its folder; an actor still busy in
    `play()` (or killed while its `close()` waits) is killed after `timeout_s`, and its server dies with its process
    (`vllm.launch`: the server's parent-death signal), so nothing outlives the run."""
    import ray

    ray.wait([a.close.remote() for a in actors], num_returns=len(actors), timeout=timeout_s)
    for handle in actors + ranks:
        ray.kill(handle, no_restart=True)
