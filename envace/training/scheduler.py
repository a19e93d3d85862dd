"""One scheduler for every actor: what each plays next, decided from the events it is told and nothing else.

Work comes in *chunks*: `size` consecutive groups of one GRPO step (chunk c is sampled from the seeds of
`rollout_at(step, c)`, whoever plays it), or one shard of an evaluation. The scheduler has no thread, no Ray and no
clock of its own: the caller reports `published`, `done`, `lost`, `faulted` and `restarted` with the time they
happened, and asks `assign` what to start. The Ray driver reports real events (`cluster/dispatch.py`), the pipeline
model simulated ones (`envace.bench.pipeline`): both run this code.

Rules, with k = `grpo.max_staleness`, v = the newest published version, T = an actor's in-flight target
(`ray.in_flight` episodes):

    step b opens once b − k ≤ v: its chunks join the queue, sampled by version max(0, b − k)
    an evaluation after u updates is queued when asked (`evaluate`), sampled by version u, after the steps' chunks
        of that version (the learner waits on those)
    an actor with nothing in flight takes the oldest queued chunk of any version (loading that version first);
        one with chunks in flight takes the oldest chunk of the version it holds while its episodes in flight plus
        the chunk's stay ≤ T (a chunk larger than T goes alone); idle actors are served fewest-in-flight first
    a chunk whose actor was lost (died, or its server failed: 5xx, timeout) goes back to the queue, oldest first; the
        actor restarts beside the queue while the others keep pulling, and its fault past `max_restarts` drops it
        (the run goes on with the rest; `stopped` once none is left)
    a chunk that failed deterministically (a 4xx answer, an environment's exception) is recorded as failed once,
        with why; nobody restarts, and the step is complete without its groups
    step b is complete once each of its chunks is done or failed; the learner takes steps in order

So there is no barrier but staleness: at k = 0 step b + 1 opens only once b's update is published (the synchronous
algorithm); at k ≥ 1 the actors play step b + 1 (and b + k) while b's last chunks and its update still run.

Slot-time idle (`idle`): an actor up offers T slots; an episode holds one from its chunk's hand-out for its own
seconds, then the slot is idle until a new chunk refills it. Over a window [t0, t1]:

    idle = 1 − Σ_episodes |[start, start + seconds] ∩ [t0, t1]| ÷ Σ_actors not dropped  T × (t1 − t0)
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Literal

from envace.errors import UsageError

ROLLOUT, EVAL = "rollout", "eval"


def chunk_size(groups: int, actors: int, chunk: int | None = None) -> int:
    """Groups a chunk holds: `chunk` (`ray.chunk_groups`) when set; else with one actor the whole step (played as one
    process plays it), else `groups // (4 × actors)`, at least 1: about four chunks per actor, so a slow actor's last
    chunks go to the others while each still batches a few groups. Chunks no longer wait for each other (several
    are in flight per actor), so a small chunk costs no batching."""
    if chunk is not None:
        return max(1, min(chunk, groups))
    return groups if actors == 1 else max(1, groups // (4 * actors))


@dataclass(frozen=True)
class Work:
    """One chunk: groups [start, stop) of `step`'s tasks (rollout), or shard `chunk` of `shards` of the evaluation
    after `step` updates (eval); sampled by `version`; `episodes` slots it holds while in flight."""

    kind: Literal["rollout", "eval"]
    step: int
    chunk: int
    start: int
    stop: int
    version: int
    episodes: int
    shards: int = 1


@dataclass
class Actor:
    """What the scheduler knows of one actor."""

    state: Literal["up", "restarting", "dropped"] = "up"
    held: int | None = None  # the version it holds (None: none yet, or restarted)
    running: list[tuple[Work, float]] = field(default_factory=list)  # (chunk, handed out at)
    faults: int = 0  # lost chunks (deaths, serving failures) over the run
    since: float = 0.0  # restarting since

    @property
    def in_flight(self) -> int:
        return sum(w.episodes for w, _ in self.running)


@dataclass
class Span:
    """An episode's slot: actor, from its chunk's hand-out, for its own seconds (`idle`)."""

    actor: int
    start: float
    seconds: float


class Scheduler:
    """The module docstring's rules. `groups(step)` is a step's number of groups, `group_size` its episodes each."""

    def __init__(self, actors: int, staleness: int, start: int, end: int, groups, group_size: int,
                 in_flight: int, chunk: int | None = None, max_restarts: int = 3) -> None:
        if in_flight < 1:
            raise UsageError(f"ray.in_flight: an actor needs room for at least one episode, got {in_flight}")
        if staleness < 0:
            raise UsageError(f"grpo.max_staleness: must be >= 0, got {staleness}")
        self.staleness, self.end, self.groups, self.group_size = staleness, end, groups, group_size
        self.target, self.chunk, self.max_restarts = in_flight, chunk, max_restarts
        self.actors = [Actor() for _ in range(actors)]
        self.version = start  # the learner holds version `start` when the run (or its resume) begins
        self.opened = start  # the next step to open
        self.queue: list[tuple[tuple, Work]] = []  # sorted by (version, kind, step, chunk)
        self.results: dict[tuple[str, int], dict[int, Any]] = {}  # (kind, step) → {chunk: result}
        self.failed: dict[tuple[str, int], dict[int, str]] = {}  # (kind, step) → {chunk: why}
        self.chunks: dict[tuple[str, int], int] = {}  # (kind, step) → its number of chunks
        self.spans: list[Span] = []
        self.log: list[tuple[float, int, str, int, int]] = []  # every hand-out: (at, actor, kind, step, chunk)
        self.lines: list[str] = []  # what happened that a person should read (faults, drops)
        self._seq = count()
        self.open()

    # -- what the caller tells ---------------------------------------------------------------------------------

    def sampling_version(self, step: int) -> int:
        return max(0, step - self.staleness)

    def open(self) -> None:
        """Queue the chunks of every step the published version allows (b − k ≤ v)."""
        while self.opened < self.end and self.sampling_version(self.opened) <= self.version:
            b, n = self.opened, self.groups(self.opened)
            size = chunk_size(n, len(self.actors), self.chunk)
            chunks = [Work(ROLLOUT, b, c, c * size, min(n, (c + 1) * size), self.sampling_version(b),
                           (min(n, (c + 1) * size) - c * size) * self.group_size) for c in range(-(-n // size))]
            self.chunks[(ROLLOUT, b)] = len(chunks)
            for w in chunks:
                self._queue(w)
            self.opened += 1

    def published(self, version: int) -> None:
        """The learner published `version`: steps it unlocks open."""
        self.version = max(self.version, version)
        self.open()

    def evaluate(self, updates: int, episodes: int) -> None:
        """Queue the evaluation after `updates` updates (version `updates`), one shard per actor still in the run,
        `episodes` in all."""
        shards = max(1, sum(a.state != "dropped" for a in self.actors))
        self.chunks[(EVAL, updates)] = shards
        for i in range(shards):
            self._queue(Work(EVAL, updates, i, i, i + 1, updates, max(1, -(-episodes // shards)), shards))

    def done(self, actor: int, work: Work, now: float, result: Any = None,
             episode_seconds: list[float] | tuple[float, ...] = ()) -> None:
        """`work` came back from `actor` at `now`; each of its episodes held a slot for its own seconds."""
        handed = self._release(actor, work)
        self.results.setdefault((work.kind, work.step), {})[work.chunk] = result
        for s in episode_seconds:
            self.spans.append(Span(actor, handed, min(float(s), now - handed)))

    def lost(self, actor: int, work: Work, now: float, why: str) -> str | None:
        """`actor` died or its server failed while playing `work`: the chunk goes back to the queue. Returns
        "restart" when the actor is to be restarted now, "drop" when this fault is one past `max_restarts` (the run
        goes on without it), None when it was already restarting or dropped (its other chunks come back lost too)."""
        self._release(actor, work)
        self._queue(work)
        a = self.actors[actor]
        if a.state != "up":
            return None
        a.faults += 1
        if a.faults > self.max_restarts:
            self.drop(actor, now, f"{why}: fault {a.faults}, past max_restarts = {self.max_restarts}")
            return "drop"
        a.state, a.since, a.held = "restarting", now, None
        self.lines.append(f"actor {actor} {why}: restarting it beside the queue (fault {a.faults} of "
                          f"{self.max_restarts} it may restart from); its chunk goes to the next free actor")
        return "restart"

    def faulted(self, actor: int, work: Work, now: float, why: str) -> None:
        """`work` failed for a reason playing it again would not change (a 4xx, an environment's exception): recorded
        on its groups once; `actor` plays on."""
        self._release(actor, work)
        self.failed.setdefault((work.kind, work.step), {})[work.chunk] = why
        what = f"step {work.step + 1}" if work.kind == ROLLOUT else f"the evaluation after {work.step} update(s)"
        self.lines.append(f"actor {actor}: {what}, groups {work.start + 1}–{work.stop} failed ({why}): recorded on "
                          "them, not played again, no restart")

    def playing(self, actor: int, work: Work) -> bool:
        """Whether `actor` is still playing `work` (a dropped actor's chunks were requeued: what it returns is not
        counted)."""
        return any(w is work for w, _ in self.actors[actor].running)

    def requeue(self, actor: int, work: Work) -> None:
        """`actor` came back from `work` holding no version (restarted unseen): the chunk is played again, the actor
        sent its version first; no fault."""
        self._release(actor, work)
        self._queue(work)
        self.actors[actor].held = None

    def restarted(self, actor: int, now: float) -> None:
        """`actor` answers again, holding no version."""
        a = self.actors[actor]
        if a.state == "restarting":
            a.state, a.held = "up", None

    def drop(self, actor: int, now: float, why: str) -> None:
        """`actor` leaves the run (out of restarts, or its restart never answered); its chunks were requeued."""
        a = self.actors[actor]
        for w, _ in list(a.running):
            self._release(actor, w)
            self._queue(w)
        a.state, a.held = "dropped", None
        left = sum(x.state != "dropped" for x in self.actors)
        self.lines.append(f"actor {actor} dropped ({why}); the run goes on with {left} actor(s)")

    # -- what the caller asks ----------------------------------------------------------------------------------

    def assign(self, now: float) -> list[tuple[int, Work, bool]]:
        """The chunks to start now: (actor, chunk, whether the actor loads the chunk's version first). Idle room is
        filled fewest-in-flight first, one chunk at a time, so actors share the queue evenly."""
        out = []
        while True:
            best = None
            for i, a in enumerate(self.actors):
                if a.state != "up":
                    continue
                j = self._fits(a)
                if j is not None and (best is None or a.in_flight < self.actors[best[0]].in_flight):
                    best = (i, j)
            if best is None:
                return out
            i, j = best
            a, (_, w) = self.actors[i], self.queue.pop(j)
            loads = a.held != w.version
            a.held = w.version
            a.running.append((w, now))
            self.log.append((now, i, w.kind, w.step, w.chunk))
            out.append((i, w, loads))

    def complete(self, kind: str, step: int) -> bool:
        """Whether every chunk of (kind, step) is done or failed."""
        n = self.chunks.get((kind, step))
        return n is not None and len(self.results.get((kind, step), {})) + len(self.failed.get((kind, step), {})) == n

    def take(self, kind: str, step: int) -> tuple[list[Any], dict[int, str]]:
        """A complete (kind, step): its results in chunk order, and its failed chunks' reasons (forgotten after)."""
        results, failed = self.results.pop((kind, step), {}), self.failed.pop((kind, step), {})
        self.chunks.pop((kind, step), None)
        return [results[c] for c in sorted(results)], failed

    @property
    def stopped(self) -> bool:
        """No actor is left to play."""
        return all(a.state == "dropped" for a in self.actors)

    def versions_needed(self) -> set[int]:
        """The versions some queued or running chunk is sampled by (the caller keeps their weights)."""
        return {w.version for _, w in self.queue} | {w.version for a in self.actors for w, _ in a.running}

    def idle(self, t0: float, t1: float) -> float | None:
        """Slot-time idle over [t0, t1] (module docstring); None for an empty window. Spans that end before `t0`
        are forgotten: windows are asked in order."""
        actors = sum(a.state != "dropped" for a in self.actors)
        if t1 <= t0 or not actors:
            return None
        held = sum(max(0.0, min(s.start + s.seconds, t1) - max(s.start, t0)) for s in self.spans)
        self.spans = [s for s in self.spans if s.start + s.seconds > t1]
        return max(0.0, 1.0 - held / (actors * self.target * (t1 - t0)))

    # -- inside ------------------------------------------------------------------------------------------------

    def _queue(self, w: Work) -> None:
        # oldest version first (its weights go soonest); within one, a step's chunks before an evaluation's shards
        # (the learner waits on the step, nobody on the evaluation), then in order
        bisect.insort(self.queue, ((w.version, w.kind == EVAL, w.step, w.chunk, next(self._seq)), w),
                      key=lambda item: item[0])

    def _fits(self, a: Actor) -> int | None:
        """The queue index of the chunk `a` takes next, if any."""
        if not a.running:
            return 0 if self.queue else None
        room = self.target - a.in_flight
        for j, (_, w) in enumerate(self.queue):
            if w.version == a.held and w.episodes <= room:
                return j
        return None

    def _release(self, actor: int, work: Work) -> float:
        a = self.actors[actor]
        for j, (w, handed) in enumerate(a.running):
            if w is work:
                del a.running[j]
                return handed
        raise ValueError(f"actor {actor} was not playing {work}")
