"""The one scheduler (`envace.training.scheduler`) and the dispatcher that runs it over Ray's actors
(`dispatch.Dispatcher` + `driver.RayWorkers`), on a small fake of Ray's API with a simulated clock: actors that play
several chunks at once (each a set number of simulated seconds), restarts that take simulated minutes, faults of
every kind. tests/test_ray.py checks the same on a real two-node cluster."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import ray.exceptions

from envace.bench.pipeline import Costs, Schedule, simulate
from envace.errors import Stopped, UsageError
from envace.policy.vllm import Refused
from envace.training.actor import Played
from envace.training.cluster.driver import RayWorkers
from envace.training.dispatch import Dispatcher
from envace.training.scheduler import ROLLOUT, Scheduler, chunk_size

G = 2  # episodes per group


class ObjectRef:
    def __init__(self, value) -> None:
        self.value = value


class Ref:
    def __init__(self, seq: int, ends: float, value=None, error: Exception | None = None) -> None:
        self.seq, self.ends, self.value, self.error = seq, ends, value, error


class FakeRay:
    """`ray.wait`, `ray.get`, `ray.kill`, `ray.put` and `ray.exceptions` on a simulated clock."""

    exceptions = ray.exceptions
    ObjectRef = ObjectRef

    def __init__(self) -> None:
        self.clock, self.calls, self.killed = 0.0, 0, []

    def call(self, seconds: float, value=None, error: Exception | None = None, at: float | None = None) -> Ref:
        self.calls += 1
        return Ref(self.calls, (self.clock if at is None else at) + seconds, value, error)

    def wait(self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None):
        first = min(refs, key=lambda r: (r.ends, r.seq))
        if timeout is not None and first.ends > self.clock + timeout:
            self.clock += timeout
            return [], refs
        self.clock = max(self.clock, first.ends)
        return [first], [r for r in refs if r is not first]

    def get(self, ref):
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.error is not None:
            raise ref.error
        return ref.value

    def put(self, value) -> ObjectRef:
        return ObjectRef(value)

    def kill(self, handle, no_restart: bool = False) -> None:
        self.killed.append((handle.index, no_restart))
        if not no_restart:
            handle.down(self.clock)


class Method:
    def __init__(self, run) -> None:
        self.remote = run


@dataclass
class Ep:
    episode_id: str
    wall_s: float


def served_503() -> Exception:
    return ray.exceptions.RayTaskError("play", "Traceback ...", Refused("http://h/v1 failed while serving "
                                                                       "(answered 503): EngineDeadError", 503),
                                       proctitle="actor", pid=1, ip="127.0.0.1")


def env_bug() -> Exception:
    return ray.exceptions.RayTaskError("play", "Traceback ...", ValueError("the environment raised: no such file"),
                                       proctitle="actor", pid=1, ip="127.0.0.1")


class Actor:
    """A rollout actor: each chunk takes `seconds` (chunks in flight at once do not slow each other: its server batches
    them); `faults` holds what its next chunks raise ("die", "serve", "env"); a restart takes `restart_s`."""

    def __init__(self, fake: FakeRay, index: int, seconds: float, faults: list[str] | None = None,
                 restart_s: float = 1.0) -> None:
        self.fake, self.index, self.seconds, self.faults, self.restart_s = fake, index, seconds, faults or [], restart_s
        self.pid, self.up_at = 100 * index, 0.0
        self.chunks: list[tuple[int, int]] = []
        self.play, self.where = Method(self._play), Method(self._where)

    def down(self, at: float) -> None:
        self.pid += 1
        self.up_at = at + self.restart_s

    def _where(self) -> Ref:
        return self.fake.call(0.0, ("node", self.pid), at=max(self.fake.clock, self.up_at))

    def _play(self, step: int, tasks: list, version: int, chunk: int, weights) -> Ref:
        start = max(self.fake.clock, self.up_at)
        if self.faults:
            fault = self.faults.pop(0)
            if fault == "die":  # Ray restarts a process that died by itself
                ref = self.fake.call(self.seconds / 2, error=ray.exceptions.RayActorError(), at=start)
                self.down(ref.ends)
                return ref
            return self.fake.call(self.seconds / 2, error=served_503() if fault == "serve" else env_bug(), at=start)
        self.chunks.append((step, chunk))
        episodes = [Ep(f"s{step}:{t}#{g}", self.seconds * (g + 1) / G) for t in tasks for g in range(G)]
        return self.fake.call(self.seconds, Played(step, version, episodes, [e.episode_id for e in episodes], 1.0,
                                                   self.seconds, start), at=start)


def fleet(monkeypatch, seconds: list[float], faults: dict[int, list[str]] | None = None, restart_s: float = 1.0,
          staleness: int = 0, steps: int = 2, tasks: int = 12, in_flight: int = 2 * G, max_restarts: int = 3):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    actors = [Actor(fake, i, s, (faults or {}).get(i), restart_s) for i, s in enumerate(seconds)]
    said: list[str] = []
    s = Scheduler(len(actors), staleness, 0, steps, lambda step: tasks, G, in_flight, max_restarts=max_restarts)
    d = Dispatcher(RayWorkers(actors), s, lambda step: [f"t{j}" for j in range(tasks)], {0: {"w": 0}}, said.append,
                   threaded=False, clock=lambda: fake.clock, restart_s=600.0)
    return fake, actors, said, d


def run(d: Dispatcher, fake: FakeRay, steps: int) -> tuple[list[Played], list[float]]:
    """The learner's loop with instant updates: each step taken, then its version published; when each ended."""
    played, ended = [], []
    for step in range(steps):
        played.append(d.take(step)[0])
        ended.append(fake.clock)
        d.advance(step + 1, {"w": step + 1})
    return played, ended


def every_group_once(played: list[Played], tasks: int) -> bool:
    ids = [e.episode_id for p in played for e in p.episodes]
    return sorted(ids) == sorted(f"s{p.step}:t{j}#{g}" for p in played for j in range(tasks) for g in range(G))


def test_groups_per_chunk():
    assert chunk_size(6, 1) == 6  # one actor: the step whole, as one process plays it
    assert [chunk_size(2, 2), chunk_size(8, 2), chunk_size(32, 4), chunk_size(33, 4)] == [1, 1, 2, 2]
    assert [chunk_size(6, 1, 2), chunk_size(8, 2, 3), chunk_size(2, 2, 5)] == [2, 3, 2]  # ray.chunk_groups


def test_an_actor_keeps_its_in_flight_target_full_across_chunks_and_steps(monkeypatch):
    """Two chunks in flight per actor (in_flight = 2 groups), and at staleness 1 step 2's chunks start while step
    1's last ones still play: no join per chunk, no barrier per step."""
    fake, actors, said, d = fleet(monkeypatch, [1.0, 1.0], staleness=1, steps=3, tasks=4)
    played, _ = run(d, fake, 3)
    assert every_group_once(played, 4) and not said
    at = {(step, chunk): t for t, _, kind, step, chunk in d.s.log if kind == ROLLOUT}
    assert at[0, 0] == at[0, 1] == at[0, 2] == at[0, 3] == 0.0  # four one-group chunks on two actors at once
    assert min(t for (step, _), t in at.items() if step == 1) == 1.0  # step 2 begins as step 1's first chunks end


def test_an_actor_whose_restart_takes_600_s_does_not_stop_the_others(monkeypatch):
    fake, actors, said, d = fleet(monkeypatch, [1.0, 1.0, 1.0], {0: ["serve"]}, restart_s=600.0)
    played, ended = run(d, fake, 2)
    assert every_group_once(played, 12)
    # step 1: 12 one-group chunks, two at a time on each of three actors, one lost and replayed: ~3 s, not 600
    assert ended[0] <= 4.0 and ended[1] <= 8.0, ended
    assert (0, False) in fake.killed  # its call raised: killed for Ray to restart it, beside the queue
    assert any("actor 0 failed (Refused: " in line and "restarting it beside the queue" in line for line in said)
    assert sum(len(a.chunks) for a in actors[1:]) >= 20 and played[0].restarts == 1


def test_an_actors_fourth_fault_drops_it_and_the_run_finishes_on_the_rest(monkeypatch):
    # one chunk in flight per actor: each death is one fault (the chunks beside a dying one die with it, uncounted)
    fake, actors, said, d = fleet(monkeypatch, [1.0, 1.0], {1: ["die"] * 4}, restart_s=5.0, steps=3, in_flight=G)
    played, _ = run(d, fake, 3)
    assert every_group_once(played, 12)  # every group played (and so stored and trained) exactly once
    assert d.s.actors[1].state == "dropped" and (1, True) in fake.killed
    assert sum("actor 1 died" in line for line in said) == 3
    assert any(line.startswith("  actor 1 dropped (died (RayActorError): fault 4, past max_restarts = 3); the run "
                               "goes on with 1 actor(s)") for line in said), said


def test_the_last_actor_dropped_stops_the_run_in_one_line(monkeypatch):
    fake, actors, said, d = fleet(monkeypatch, [1.0], {0: ["die"] * 2}, max_restarts=1)
    with pytest.raises(Stopped, match="every actor is out of restarts; the run stops, every step it saved is kept"):
        run(d, fake, 1)


def test_a_deterministic_error_is_recorded_on_its_group_and_restarts_nobody(monkeypatch, tmp_path):
    fake, actors, said, d = fleet(monkeypatch, [1.0, 1.0], {0: ["env"]})
    played, _ = run(d, fake, 2)
    assert not fake.killed and all(a.state == "up" for a in d.s.actors)
    assert [(f["task"], f["error"]) for f in played[0].failed] == \
        [("t0", "ValueError: the environment raised: no such file")]  # actor 0's first chunk: group 1, once
    assert len(played[0].episodes) == 11 * G and not played[1].failed  # the rest trained; nothing replayed
    assert any("groups 1–1 failed (ValueError" in line and "no restart" in line for line in said)

    from envace.store import Run, connect
    from envace.training.recorder import Recorder

    class Procs:
        main, rank, world = True, 0, 1

    Recorder(Run.create(tmp_path, "train", {}, "tiny", name="r"), Procs(), lambda line: None).failed(played[0])
    rows = connect(str(tmp_path)).execute("SELECT step, task_uid, error FROM failures").fetchall()
    assert rows == [(0, "t0", "ValueError: the environment raised: no such file")]


def test_a_finished_episodes_slot_counts_as_idle_until_refilled():
    """One actor, 2 slots, a chunk of one group of 2 episodes handed out at 0 and back at 10 s: one episode took 10 s,
    the other 2 s and then held an empty slot for 8 s. The old figure (an episode's wait ÷ its own wall time) reads
    0 here; slot time reads 1 − (10 + 2) ÷ (2 × 10)."""
    s = Scheduler(1, 0, 0, 1, lambda step: 1, 2, in_flight=2)
    [(actor, work, loads)] = s.assign(0.0)
    s.done(actor, work, 10.0, "played", [10.0, 2.0])
    assert s.idle(0.0, 10.0) == pytest.approx(0.4)
    s2 = Scheduler(1, 0, 0, 1, lambda step: 1, 2, in_flight=4)  # two slots never filled count too
    [(actor, work, _)] = s2.assign(0.0)
    s2.done(actor, work, 10.0, "played", [10.0, 10.0])
    assert s2.idle(0.0, 10.0) == pytest.approx(0.5)


def test_the_scheduler_gives_the_same_schedule_in_the_driver_and_in_the_model(monkeypatch):
    """The same costs (a chunk takes its actor's seconds, whatever else it plays; updates instant) through the
    driver's dispatcher on the fake cluster and through the pipeline model: the same hand-outs, at the same times."""
    speeds, steps, tasks = [1.0, 1.37], 4, 8
    fake, actors, said, d = fleet(monkeypatch, speeds, staleness=1, steps=steps, tasks=tasks, in_flight=2 * G)
    run(d, fake, steps)
    work = [[[((0, 1),)] * G for _ in range(tasks)] for _ in range(steps)]  # an episode: one request of one token
    model = simulate(work, Costs(decode_s=1.0), Schedule(staleness=1, per_episode=True, actors=2, slots=2 * G,
                                                         speeds=tuple(speeds)))
    assert [x[1:] for x in d.s.log] == [x[1:] for x in model.log]
    assert [x[0] for x in d.s.log] == pytest.approx([x[0] for x in model.log])
    assert len(model.log) == steps * tasks


def test_an_in_flight_target_below_one_is_refused():
    with pytest.raises(UsageError, match="ray.in_flight: an actor needs room for at least one episode, got 0"):
        Scheduler(2, 0, 0, 1, lambda step: 4, G, in_flight=0)


@pytest.mark.parametrize("value", ["0", "-3"])
def test_an_in_flight_target_of_0_or_below_is_one_line_and_exit_2(tmp_path, capsys, value):
    from envace.cli import main

    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", f"ray.in_flight={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ray.in_flight: episodes an actor keeps in flight, at least 1" in err[0], err
    assert not list(tmp_path.iterdir())


def test_a_chunk_of_no_groups_is_one_line_and_exit_2(tmp_path, capsys):
    from envace.cli import main

    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "ray.chunk_groups=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("ray.chunk_groups: must be at least 1, got 0"), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("sharding", ["distributed.fsdp=true", "distributed.shard_optimizer=true"])
def test_a_staleness_the_actors_cannot_honour_is_one_line_and_exit_2(tmp_path, capsys, sharding):
    """Without Ray the rollouts ahead of the update run on one actor thread beside one learner process: a sharded
    learner (several processes) leaves no actor to play ahead, so staleness ≥ 1 there is refused before a run
    folder exists."""
    from envace.cli import main

    args = ["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "grpo.max_staleness=1",
            "--set", "grpo.importance_cap=2.0", "--set", sharding]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grpo.max_staleness: rollouts ahead of the update run in one process" in err[0], err
    assert not list(tmp_path.iterdir())


def test_the_kv_cache_a_server_reports_is_read_from_its_metrics():
    from envace.policy.vllm import kv_tokens

    line = ('vllm:cache_config_info{block_size="128",engine="0",kv_cache_max_concurrency="5.6875",'
            'kv_cache_size_tokens="46592",num_gpu_blocks="364"} 1.0')
    assert kv_tokens("# HELP x\n" + line + "\n") == 46_592
    assert kv_tokens('vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0') == 1600  # older gauges
    assert kv_tokens("vllm:request_success_total 3.0") is None
