"""The learner's side of rollouts ahead of the update: a `Scheduler` run over real workers.

    advance(v, weights)   the learner published version v: steps it unlocks open, their chunks start at once
    take(b)               wait until every chunk of step b is back (or failed); its episodes as one `Played`
    evaluate(u, rec)      the evaluation after u updates, queued like any chunk (sampled by version u), recorded
                          when its shards are back; a future
    kept(b)               the versions a run resumed at step b samples with (for `state.pt`)

One `pump` hands out what the scheduler assigns, waits for the first call to end, and tells the scheduler what
happened. Under Ray (`cluster/driver.RayWorkers`) a thread pumps beside the learner, so an actor that finishes a
chunk during an update is refilled at once, and a restart is a probe among the calls (never a wait in the hand-out
loop). In one process (`LocalWorkers`: one actor on a thread of its own) each chunk is a whole step, played as
the single-process loop always has. `Workers` is the small protocol between the two.

An outcome is one of: a result; "lost" (the worker died, or its server failed: the chunk is played again, the
worker restarted beside the queue); "fault" (the chunk failed for a reason that would fail it again: recorded on
its groups); "empty" (the worker held no version and was sent none: sent again, no fault); "fatal" (stop the run).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from envace.errors import Stopped
from envace.training.actor import Played
from envace.training.evaluate import recorded
from envace.training.scheduler import EVAL, ROLLOUT, Scheduler, Work, chunk_size


class Workers(Protocol):
    """What the dispatcher needs of a fleet of rollout workers."""

    def play(self, i: int, work: Work, tasks: list, weights: Any | None) -> Any: ...  # a handle to wait on
    def evaluate(self, i: int, work: Work, weights: Any | None) -> Any: ...
    def wait(self, handles: list, timeout: float) -> list: ...  # those ended, at least one unless timed out
    def outcome(self, handle: Any) -> tuple[Any, str | None, str]: ...  # (result, None | lost | fault | ..., why)
    def restart(self, i: int, raised: bool) -> None: ...  # begin a restart (returns at once)
    def probe(self, i: int) -> Any | None: ...  # a handle that ends once worker i answers (None: cannot restart)
    def answered(self, i: int, handle: Any) -> str: ...  # "up" | "again" (probe later) | "gone"
    def retire(self, i: int) -> None: ...  # worker i leaves the run (dropped)
    def offer(self, weights: Any, version: int) -> None: ...  # partial rollouts: to every worker, not waited on
    def seconds(self, result: Any) -> list[float]: ...  # each episode's seconds in a result
    def close(self) -> None: ...  # the run is over: let go of what the workers hold here


class Dispatcher:
    """Rollouts of steps [start, end) by `workers` under `scheduler`; `tasks_of(step)` a step's tasks; `versions`
    the published weights ({version: weights}) the first steps are sampled with. `threaded`: pump on a thread of
    its own (else `take` pumps; the fake-clock tests run so). `clock`: the scheduler's time. `score`: records an
    evaluation's episodes. `lanes`: each step reports each worker's seconds (a timeline lane per actor)."""

    def __init__(self, workers: Workers, scheduler: Scheduler, tasks_of: Callable[[int], list], versions: dict,
                 say: Callable[[str], None] = print, partial: bool = False, threaded: bool = True,
                 clock: Callable[[], float] = time.monotonic, restart_s: float = 600.0,
                 score: Callable[[int, Any, list, list], Any] = recorded, lanes: bool = True) -> None:
        self.workers, self.s, self.tasks_of, self.say, self.partial = workers, scheduler, tasks_of, say, partial
        self.versions, self.clock, self.restart_s, self.score = dict(versions), clock, restart_s, score
        self.lanes = lanes  # each actor's seconds on a step, for the timeline's lane per actor
        self.calls: dict[Any, tuple[int, Work, float]] = {}  # handle → (worker, chunk, perf_counter at start)
        self.probes: dict[Any, tuple[int, float]] = {}  # handle → (worker, restart deadline)
        self.later: list[tuple[float, int, float]] = []  # (probe again at, worker, deadline)
        self.tasks: dict[int, list] = {}  # a step's tasks, asked once
        self.busy: dict[int, list[float]] = {}  # step → each worker's seconds on its chunks
        self.faults: dict[int, int] = {}  # step → workers lost while playing it
        self.evals: dict[int, tuple[Future, Any]] = {}  # updates → (its future, the recorder it is recorded by)
        self.window = clock()  # where the next step's slot-idle window begins
        self.lock, self.changed = threading.Lock(), threading.Condition()
        self.error: BaseException | None = None
        self.closed = False
        self.recording = ThreadPoolExecutor(1, thread_name_prefix="envace-eval")  # evaluations scored off the pump
        self.thread = threading.Thread(target=self._run, name="envace-dispatch", daemon=True) if threaded else None
        if self.thread is not None:
            self.thread.start()

    # -- the learner's side ------------------------------------------------------------------------------------

    def sampling_version(self, step: int) -> int:
        return self.s.sampling_version(step)

    def advance(self, version: int, weights: Any) -> None:
        """Publish `version` (module docstring); versions nothing will sample again are let go."""
        with self.lock:
            self.versions[version] = weights
            self.s.published(version)
            needed = self.s.versions_needed() | {v for v in self.versions if v >= self.sampling_version(version)}
            for old in [v for v in self.versions if v not in needed]:
                del self.versions[old]
        if self.partial:
            self.workers.offer(weights, version)
        self._poke()

    def take(self, step: int) -> tuple[Played, float, float]:
        """Step `step`'s episodes, the seconds the learner waited for them, and the actors' seconds loading its
        sampling version (inside their first chunk of it)."""
        started = time.perf_counter()
        while True:
            with self.lock:
                if self.error is not None:
                    raise self.error
                if self.s.complete(ROLLOUT, step):
                    played = self._played(step)
                    return played, time.perf_counter() - started, played.load_s
                if self.s.stopped:
                    raise Stopped("ray: every actor is out of restarts; the run stops, every step it saved is kept: "
                                  "add `--resume` with the run's name to the same command to go on")
            if self.thread is None:
                self.pump(1.0)
            else:
                with self.changed:
                    self.changed.wait(0.5)

    def evaluate(self, updates: int, recorder, episodes: int) -> Future:
        """Queue the evaluation after `updates` updates; the future ends once it is recorded."""
        future: Future = Future()
        with self.lock:
            self.evals[updates] = (future, recorder)
            self.s.evaluate(updates, episodes)
        self._poke()
        return future

    def finish(self, futures: list[Future]) -> None:
        """Wait for `futures` (`evaluate`'s) to be recorded; what one raised is raised here."""
        for future in futures:
            while not future.done():
                with self.lock:
                    if self.error is not None:
                        raise self.error
                if self.thread is None:
                    self.pump(1.0)
                else:
                    with self.changed:
                        self.changed.wait(0.5)
            future.result()

    def kept(self, next_step: int) -> dict:
        with self.lock:
            return {v: w for v, w in self.versions.items() if self.sampling_version(next_step) <= v < next_step}

    def close(self) -> None:
        self.closed = True
        self._poke()
        if self.thread is not None:
            self.thread.join(timeout=30)
        self.recording.shutdown(wait=True)
        self.workers.close()

    # -- the pump ----------------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self.closed:
                self.pump(0.2)
        except BaseException as exc:  # noqa: BLE001 - raised in the learner's thread by `take`
            with self.lock:
                self.error = exc
            self._poke()

    def _poke(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def pump(self, timeout: float) -> None:
        """Start what the scheduler assigns, then handle the first calls and probes to end (within `timeout`)."""
        with self.lock:
            self._probe_due()
            for i, work, loads in self.s.assign(self.clock()):
                self._start(i, work, loads)
            handles = list(self.calls) + list(self.probes)
            soon = min((at for at, _, _ in self.later), default=None)
        if soon is not None:
            timeout = max(0.0, min(timeout, soon - self.clock()))
        if not handles:
            with self.changed:
                self.changed.wait(timeout)
            return
        ended = self.workers.wait(handles, timeout)
        with self.lock:
            for handle in ended:
                if handle in self.calls:
                    self._ended(handle)
                elif handle in self.probes:
                    self._answered(handle)
            self._say()
        if ended:
            self._poke()

    def _start(self, i: int, work: Work, loads: bool) -> None:
        # an evaluation always carries its version: under partial rollouts the actor may hold a newer one than the
        # scheduler knows (offered mid-chunk), which a rollout chunk may play with but an evaluation may not
        weights = self.versions[work.version] if loads or work.kind == EVAL else None
        if work.kind == ROLLOUT:
            tasks = self._tasks(work.step)[work.start: work.stop]
            handle = self.workers.play(i, work, tasks, weights)
        else:
            handle = self.workers.evaluate(i, work, weights)
        self.calls[handle] = (i, work, time.perf_counter())

    def _tasks(self, step: int) -> list:
        if step not in self.tasks:
            self.tasks[step] = self.tasks_of(step)
        return self.tasks[step]

    def _ended(self, handle: Any) -> None:
        i, work, at = self.calls.pop(handle)
        now = self.clock()
        result, kind, why = self.workers.outcome(handle)
        if not self.s.playing(i, work):
            return  # its actor was dropped and the chunk handed to another
        if kind is None:
            self.s.done(i, work, now, result, self.workers.seconds(result))
            if work.kind == ROLLOUT:
                self.busy.setdefault(work.step, [0.0] * len(self.s.actors))[i] += time.perf_counter() - at
            self._collect(work)
        elif kind == "lost":
            if work.kind == ROLLOUT:
                self.faults[work.step] = self.faults.get(work.step, 0) + 1
            then = self.s.lost(i, work, now, why)
            if then == "restart":
                self.workers.restart(i, raised=why.startswith("failed"))
                self._probe(i, now + self.restart_s)
            elif then == "drop":
                self.workers.retire(i)
        elif kind == "fault":
            self.s.faulted(i, work, now, why)
            self._collect(work)
        elif kind == "empty":
            self.s.requeue(i, work)
        else:  # fatal: the run stops with what the worker raised
            raise result if isinstance(result, BaseException) else RuntimeError(why)

    def _probe(self, i: int, deadline: float) -> None:
        handle = self.workers.probe(i)
        if handle is None:
            self._drop(i, "it cannot be restarted")
        else:
            self.probes[handle] = (i, deadline)

    def _answered(self, handle: Any) -> None:
        i, deadline = self.probes.pop(handle)
        state, now = self.workers.answered(i, handle), self.clock()
        if state == "up":
            self.s.restarted(i, now)
        elif state == "gone":
            self._drop(i, "Ray will not restart it")
        elif now >= deadline:
            self._drop(i, f"its restart did not answer within {self.restart_s:g} s")
        else:
            self.later.append((now + 0.5, i, deadline))

    def _drop(self, i: int, why: str) -> None:
        self.s.drop(i, self.clock(), why)
        self.workers.retire(i)

    def _probe_due(self) -> None:
        now, due = self.clock(), [x for x in self.later if x[0] <= self.clock()]
        self.later = [x for x in self.later if x[0] > now]
        for _, i, deadline in due:
            self._probe(i, deadline)

    def _say(self) -> None:
        for line in self.s.lines:
            self.say(f"  {line}")
        self.s.lines.clear()

    def _collect(self, work: Work) -> None:
        """An evaluation whose shards are all back is scored and recorded off the pump."""
        if work.kind != EVAL or not self.s.complete(EVAL, work.step):
            return
        parts, failed = self.s.take(EVAL, work.step)
        future, recorder = self.evals.pop(work.step)
        for chunk, why in failed.items():
            self.say(f"  the evaluation after {work.step} update(s): shard {chunk + 1} failed ({why}); scored "
                     "without it")
        episodes = [ep for p in parts for ep in p[0]]
        rows = [row for p in parts for row in p[1]]

        def record() -> None:
            try:
                future.set_result(self.score(work.step, recorder, episodes, rows))
            except BaseException as exc:  # noqa: BLE001 - raised by `finish`
                future.set_exception(exc)
        self.recording.submit(record)

    def _played(self, step: int) -> Played:
        """A complete step's chunks as one `Played`, in the order of its tasks; failed chunks' groups named."""
        parts, failed = self.s.take(ROLLOUT, step)
        tasks = self._tasks(step)
        del self.tasks[step]
        failures = []
        for chunk, why in sorted(failed.items()):
            for w in [x for x in _chunks_of(step, len(tasks), self.s) if x.chunk == chunk]:
                failures += [{"task": getattr(t, "uid", str(t)), "chunk": chunk, "error": why}
                             for t in tasks[w.start: w.stop]]
        now = self.clock()
        idle = self.s.idle(self.window, now)
        self.window = now
        version = self.sampling_version(step)
        first = parts[0] if parts else None
        # the step's rollouts on the wall clock: from the first chunk's play (after its version was loaded) to the
        # last one's end, as the actors' own clocks say (`Played.started`, `Played.seconds`)
        began = min((p.started for p in parts), default=time.time())
        ended = max((p.started + p.seconds for p in parts), default=began)
        played = Played(step, min((p.version for p in parts), default=version),
                        [ep for p in parts for ep in p.episodes], [row for p in parts for row in p.scored],
                        first.real_fraction if first else 0.0, ended - began, began,
                        self.faults.pop(step, 0), self.busy.pop(step, [0.0] * len(self.s.actors)))
        played.failed, played.slot_idle, played.in_flight = failures, idle, self.s.target
        played.load_s = sum(p.load_s for p in parts)
        if not self.lanes:  # one actor in this process: the timeline's single actor lane, no restarts to count
            played.actor_seconds, played.restarts = [], 0
        return played


def _chunks_of(step: int, groups: int, s: Scheduler) -> list[Work]:
    """The chunks step `step` was cut into (as `Scheduler.open` cut them)."""
    size = chunk_size(groups, len(s.actors), s.chunk)
    return [Work(ROLLOUT, step, c, c * size, min(groups, (c + 1) * size), s.sampling_version(step), 0)
            for c in range(-(-groups // size))]
