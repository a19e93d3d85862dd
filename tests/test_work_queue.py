"""The Ray actors' work queue (`driver.RemoteActors.play`) on a small fake of Ray's API: actors whose calls run one
at a time and take a set number of simulated seconds per group, and `ray.wait` that answers the call to end first.
tests/test_ray.py checks the same on a real two-node cluster."""

from __future__ import annotations

import pytest
import ray.exceptions

from envace.training.actor import Played
from envace.training.cluster import driver
from envace.training.cluster.driver import RemoteActors, chunk_size

G = 2  # episodes per group


class Ref:
    def __init__(self, seq: int, ends: float, value=None, error: Exception | None = None) -> None:
        self.seq, self.ends, self.value, self.error = seq, ends, value, error


class FakeRay:
    """`ray.wait`, `ray.get` and `ray.exceptions` on a simulated clock."""

    exceptions = ray.exceptions

    def __init__(self) -> None:
        self.clock, self.calls = 0.0, 0

    def call(self, actor: Actor, seconds: float, value=None, error: Exception | None = None) -> Ref:
        self.calls += 1
        actor.free = max(self.clock, actor.free) + seconds  # an actor runs its calls one at a time
        return Ref(self.calls, actor.free, value, error)

    def wait(self, refs: list[Ref], num_returns: int = 1):
        first = min(refs, key=lambda r: (r.ends, r.seq))
        self.clock = max(self.clock, first.ends)
        return [first], [r for r in refs if r is not first]

    def get(self, ref: Ref):
        if ref.error is not None:
            raise ref.error
        return ref.value


class Method:
    def __init__(self, run) -> None:
        self.remote = run


class Actor:
    """A rollout actor taking `per_group` simulated seconds a group; `fail` holds what its next plays raise."""

    def __init__(self, fake: FakeRay, index: int, per_group: float, fail: list[Exception] | None = None) -> None:
        self.fake, self.index, self.per_group, self.fail, self.free = fake, index, per_group, fail or [], 0.0
        self.chunks: list[int] = []
        self.play = Method(self._play)

    def _play(self, step: int, tasks: list, version: int, chunk: int) -> Ref:
        seconds = self.per_group * len(tasks)
        if self.fail:
            return self.fake.call(self, seconds / 2, error=self.fail.pop(0))
        self.chunks.append(chunk)
        # what a chunk plays depends on its tasks and its index (its seeds), never on the actor
        episodes = [f"s{step}:{t}#{g}@{chunk}" for t in tasks for g in range(G)]
        return self.fake.call(self, seconds, Played(step, version, episodes, list(episodes), 1.0, seconds))


def _actors(monkeypatch, per_group: list[float], fail: dict[int, list[Exception]] | None = None):
    fake = FakeRay()
    monkeypatch.setitem(__import__("sys").modules, "ray", fake)
    actors = [Actor(fake, i, s, (fail or {}).get(i)) for i, s in enumerate(per_group)]
    said: list[str] = []
    remote = RemoteActors(actors, max_restarts=2, say=said.append)
    remote.version, remote.published = 3, (None, 3)
    recovered: list[tuple[str, int]] = []
    monkeypatch.setattr(remote, "_restart", lambda i: recovered.append(("restart", i)))
    monkeypatch.setattr(remote, "_reload", lambda i: recovered.append(("reload", i)))
    return remote, actors, said, recovered


def _expected(step: int, tasks: list[str], actors: int) -> list[str]:
    size = chunk_size(len(tasks), actors)
    return [f"s{step}:{t}#{g}@{j // size}" for j, t in enumerate(tasks) for g in range(G)]


def test_groups_per_pull():
    assert chunk_size(6, 1) == 6  # one actor: the step whole, as one process plays it
    assert [chunk_size(2, 2), chunk_size(8, 2), chunk_size(32, 4), chunk_size(33, 4)] == [1, 1, 2, 2]
    assert [chunk_size(6, 1, 2), chunk_size(8, 2, 3), chunk_size(2, 2, 5)] == [2, 3, 2]  # ray.chunk_groups


def test_a_chunk_of_no_groups_is_one_line_and_exit_2(tmp_path, capsys):
    from envace.cli import main

    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "ray.chunk_groups=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("ray.chunk_groups: must be at least 1, got 0"), err
    assert not list(tmp_path.iterdir())


def test_a_slow_actor_plays_fewer_groups_and_every_group_comes_back_once_in_order(monkeypatch):
    """The static split (actor i plays tasks[i::n]) gives each of two actors 4 of 8 groups, however slow one is."""
    tasks = [f"t{j}" for j in range(8)]
    remote, actors, said, recovered = _actors(monkeypatch, [1.0, 3.0])
    played = remote.play(5, tasks)
    assert played.episodes == played.scored == _expected(5, tasks, 2)  # each group once, in the order of tasks
    assert remote.played[0] > remote.played[1] >= 1 and sum(remote.played) == 8
    assert sorted(actors[0].chunks + actors[1].chunks) == list(range(8))
    assert (played.step, played.version, played.restarts, len(played.actor_seconds)) == (5, 3, 0, 2)
    assert not said and not recovered

    # the same step with the other actor slow: other actors play other chunks, the step's episodes are the same
    remote2, actors2, *_ = _actors(monkeypatch, [3.0, 1.0])
    assert remote2.play(5, tasks).episodes == played.episodes
    assert actors2[1].chunks != actors[1].chunks


def test_a_failed_or_dead_actor_is_recovered_and_its_chunk_played_once(monkeypatch):
    served = ray.exceptions.RayTaskError("play", "Traceback (most recent call last): ...", RuntimeError("answered 503"))
    tasks = [f"t{j}" for j in range(6)]
    remote, actors, said, recovered = _actors(monkeypatch, [1.0, 1.0],
                                              {0: [served], 1: [ray.exceptions.RayActorError()]})
    played = remote.play(0, tasks)
    assert played.episodes == _expected(0, tasks, 2) and played.restarts == 2 and remote.restarts == 2
    assert sorted(actors[0].chunks + actors[1].chunks) == list(range(6))  # no chunk played twice
    assert recovered == [("restart", 0), ("reload", 0), ("reload", 1)]  # only the raised call's actor is killed
    assert said[0].startswith("  actor 0 failed (RuntimeError: answered 503): restarting it, sending it policy "
                              "version 3 again; its groups go back to the queue")
    assert said[1].startswith("  actor 1 died (RayActorError)")


def test_an_actor_failing_past_max_restarts_stops_the_run(monkeypatch):
    dead = [ray.exceptions.RayActorError() for _ in range(4)]
    remote, *_ = _actors(monkeypatch, [1.0, 1.0], {1: dead})
    with pytest.raises(RuntimeError, match=r"actor 1 died \(RayActorError\) 4 times; giving up \(max_restarts = 2\)"):
        remote.play(0, [f"t{j}" for j in range(4)])


def test_one_actor_plays_the_step_in_one_call(monkeypatch):
    tasks = ["a", "b", "c"]
    remote, actors, *_ = _actors(monkeypatch, [1.0])
    assert remote.play(1, tasks).episodes == [f"s1:{t}#{g}@0" for t in tasks for g in range(G)]
    assert actors[0].chunks == [0]  # chunk 0: the seeds of rollout_at(step, 0), a single process's
    assert driver.chunk_size(len(tasks), 1) == 3
