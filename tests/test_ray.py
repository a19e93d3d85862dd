"""Actors and a learner placed by Ray (`[train.ray]`, `envace/training/cluster/`), on a real Ray cluster of two
nodes simulated on this machine (`ray_cluster.loopback_cluster`).

The cluster's worker processes start with `tests/ray_workers` on their PYTHONPATH: the tiny model's messages
are half swapped for the gold ones there (as tests/test_staleness.py does in-process), so groups have signal
and updates happen; any file operation of a worker under the driver's runs folder raises, as on a node without
the driver's disk (the learner ranks find the driver's probe unreadable, so rank 0 writes `state.pt` and the
checkpoint on its own side and streams them to the driver in pieces), so a run that passes gave no actor or learner
rank another path of the driver's; and a test
removes the file `_marker(runs)` to make the next actor that plays step 2 raise once, as a served backend whose
vLLM server answered 503; and one writes `_slow(runs)` to make an actor sleep before each group it plays (the
work queue routes around it).
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from processes import running
from ray_cluster import loopback_cluster
from replay import same, stored
from safetensors.torch import load_file

from envace.cli import main
from envace.store import connect

HOOKS = Path(__file__).parent / "ray_workers"
STALE = ["--set", "grpo.max_staleness=1", "--set", "grpo.importance_cap=2.0", "--set", "sft.tasks=0",
         "--set", "rollout.group_size=4", "--set", "rollout.temperature=1.0", "--set", "grpo.lr=5e-2",
         "--set", "packing.flat_row_metrics=true", "--set", "grpo.tasks_per_step=2"]
# an actor on each node, a learner of two ranks (gloo): 2 × 1 + 2 × 0.5 of the cluster's 4 CPUs
TWO_NODES = ["--set", "ray.actors=2", "--set", "ray.actor_placement=STRICT_SPREAD", "--set", "ray.learners=2",
             "--set", "ray.learner_cpus=0.5"]


def _marker(runs: Path) -> Path:
    """While this file is missing, the next actor to play step 2 raises once (and makes it)."""
    return runs.parent / f"played-{runs.name}"  # beside the runs folder, which workers may not touch


def _hold(runs: Path) -> Path:
    """While this file exists, each actor's chunk of step 2 waits after its first call for a newer version."""
    return runs.parent / f"hold-{runs.name}"


def _slow(runs: Path) -> Path:
    """While this file holds "I S", Ray actor I sleeps S seconds a group before it plays (`ray_workers`)."""
    return runs.parent / f"slow-{runs.name}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    runs = tmp_path_factory.mktemp("ray-runs")
    _marker(runs).touch()  # no failure until a test asks for one
    # the nodes' raylets keep this environment for every worker they start
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH")) if p),
           "ENVACE_TEST_HALF_GOLD": "1", "ENVACE_TEST_FORBIDDEN": str(runs),
           "ENVACE_TEST_PLAY_FAILS": str(_marker(runs)), "ENVACE_TEST_SLOW_ACTOR": str(_slow(runs)),
           "ENVACE_TEST_HOLD_FOR_OFFER": str(_hold(runs))}
    with loopback_cluster({"num_cpus": 2, "env_vars": env}, {"num_cpus": 2, "env_vars": env}) as (address, _):
        yield address, runs


def _train(address: str, runs: Path, name: str, steps: int, *extra: str) -> int:
    return main(["train", "experiments/smoke.toml", "--root", str(runs), "--ray", address, "--run-name", name,
                 "--set", f"grpo.steps={steps}", *STALE, *extra])


def _weights(runs: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(runs / name / "checkpoint" / "model.safetensors")


def _stored_once(con, run: str, steps: int) -> int:
    """Every group of the run's `steps` stored exactly once (2 tasks × G = 4 episodes per step, each with its
    generations once); its actor restarts."""
    per_step = con.execute("SELECT step, count(*), count(DISTINCT episode_id) FROM episodes WHERE run_id = ? "
                           "GROUP BY step ORDER BY step", [run]).fetchall()
    assert per_step == [(step, 8, 8) for step in range(steps)]
    dupes = con.execute("SELECT count(*) FROM (SELECT episode_id, role, turn, turn_step, call_index, count(*) AS n "
                        "FROM generations WHERE run_id = ? GROUP BY ALL) WHERE n > 1", [run]).fetchall()[0][0]
    assert dupes == 0
    restarts = con.execute("SELECT sum(value) FROM metrics WHERE run_id = ? AND name = 'actor_restarts'", [run])
    return restarts.fetchall()[0][0]


@pytest.mark.heavy
def test_two_nodes_resume_exactly_after_a_killed_actor_driver_or_learner_rank_or_a_serving_timeout(
        cluster, monkeypatch, capsys, tmp_path):
    import ray

    from envace.training.cluster import driver

    address, runs = cluster
    killed: list[int] = []
    play = driver.RayWorkers.play

    def play_and_kill_actor_zero(self, i, work, tasks, weights):
        if work.step == 1 and not killed:  # SIGKILL actor 0 half a second into its first chunk of step 2
            _, pid = ray.get(self.handles[0].where.remote())
            threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
            killed.append(pid)
        return play(self, i, work, tasks, weights)

    monkeypatch.setattr(driver.RayWorkers, "play", play_and_kill_actor_zero)
    assert _train(address, runs, "whole", 3, *TWO_NODES) == 0
    out = capsys.readouterr().out
    assert "2 actor(s) on node 0" in out and "node 1" in out.split("actor(s) on")[1].split(";")[0]  # one per node
    assert "a learner rank does not see the run folder: state.pt and the checkpoint come here in pieces" in out
    assert "a learner of 2 rank(s)" in out and killed and "actor 0 died" in out
    con = connect(runs)
    assert _stored_once(con, "whole", 3) >= 1
    versions = con.execute("SELECT step, min(policy_version), max(policy_version) FROM generations "
                           "WHERE run_id = 'whole' GROUP BY step ORDER BY step").fetchall()
    assert versions == [(0, 0, 0), (1, 0, 0), (2, 1, 1)]  # step b sampled by version max(0, b − 1)
    trained, oldest = con.execute("SELECT count(*), max(step - policy_version) FROM generations "
                                  "WHERE run_id = 'whole' AND trained").fetchall()[0]
    assert trained > 0 and oldest <= 1  # updates happened, never on a row sampled more than 1 version ago

    assert main(["show", "whole", "--root", str(runs)]) == 0
    shown = capsys.readouterr().out
    assert "actor 1 playing its share" in shown and "actors restarted" in shown and "0: 1, 1: 2" in shown
    # Resumed where no rank sees the run folder: `state.pt` reaches the ranks in pieces through the object store
    # (`send_state`) and the checkpoint comes back in pieces; no step is left, so it holds the very same weights.
    trained_weights = _weights(runs, "whole")
    assert main(["train", "experiments/smoke.toml", "--root", str(runs), "--ray", address, "--resume", "whole",
                 "--set", "grpo.steps=3", *STALE, *TWO_NODES]) == 0
    assert "resuming at GRPO step 4" in capsys.readouterr().out
    again = _weights(runs, "whole")
    assert again.keys() == trained_weights.keys() and all(torch.equal(again[k], trained_weights[k]) for k in again)

    # The same run, cut twice before it ends where "whole" did, in a runs folder the workers see (as on one machine
    # or a shared filesystem): learner rank 0 writes `state.pt` there and reads it back on `--resume` itself. First
    # the driver (its own process) gets `kill -9` while step 2's work queue is half played (actor 1 five seconds a
    # group slower): Ray ends the dead driver's actors and learner ranks, and `--resume` at once, on the same
    # cluster and under the same actor names, goes on from the state saved after step 1.
    monkeypatch.setattr(driver.RayWorkers, "play", play)
    shared = tmp_path / "shared"
    command = [sys.executable, "-m", "envace.cli", "train", "experiments/smoke.toml", "--root", str(shared), "--ray",
               address, "--run-name", "cut", "--set", "grpo.steps=3", *STALE, *TWO_NODES]
    _slow(runs).write_text("1 5")
    try:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stored_first, deadline = shared / "cut" / "episodes", time.time() + 300  # step 1 recorded, then saved
        while not list(stored_first.glob("*.parquet")) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # its state saved; step 2's queue under way (actor 1 still asleep on its group)
        os.kill(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        _slow(runs).unlink()
    assert proc.returncode == -signal.SIGKILL, err[-2000:]  # killed, not ended on its own
    assert connect(shared).execute(
        "SELECT max(step) FROM episodes WHERE run_id = 'cut'").fetchall() == [(0,)]  # step 1 stored, 2 lost
    # Then, resumed, a learner rank killed before its first update (rank 0 then waits on it in the update's
    # collective): the run stops in one line, exit 1, marked interrupted, its saved state kept.
    update, updates = driver.RemoteLearner.update, []

    def update_with_rank_one_killed(self, rows, advantages):
        updates.append(len(rows))
        if len(updates) == 1:
            _, pid = ray.get(self.handles[1].where.remote())
            os.kill(pid, signal.SIGKILL)
            while running(pid):
                time.sleep(0.05)
        return update(self, rows, advantages)

    resume = ["train", "experiments/smoke.toml", "--root", str(shared), "--ray", address, "--resume", "cut",
              "--set", "grpo.steps=3", *STALE, *TWO_NODES]
    monkeypatch.setattr(driver.RemoteLearner, "update", update_with_rank_one_killed)
    through_driver = []  # the driver's own way to state.pt and back, and to the checkpoint: never taken here
    for name in ("take", "send_state"):
        monkeypatch.setattr(driver.RemoteLearner, name, lambda *a, name=name: through_driver.append(name))
    capsys.readouterr()
    assert main(resume) == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert said[-1].startswith("stopped: ray: learner rank ") and "in `update`" in said[-1], said
    assert "--resume cut" in said[-1] and not any("Traceback" in line for line in said)
    assert connect(shared).execute("SELECT status FROM runs WHERE run_id = 'cut'").fetchall() == [("interrupted",)]
    # Resumed again, with a serving timeout inside the `play` of the first actor to play step 2 (the served
    # backend's request to a server that never answers: `ray_workers` hook). It reaches the driver as a
    # `RayTaskError`: that actor is restarted (Ray's `max_restarts`) and sent the version again, and its chunk goes
    # back to the work queue (a 5xx answer takes the same path: `test_a_failed_actor_call_is_named_in_one_line`).
    # The run finishes: every group of its three steps stored once, step 2 replayed with the version its first
    # try had, and the same rows and weights as "whole".
    monkeypatch.setattr(driver.RemoteLearner, "update", update)
    _marker(runs).unlink()
    assert main(resume) == 0
    out = capsys.readouterr().out
    assert _marker(runs).exists()  # the hook did fail a play
    assert re.search(r"failed \(Unavailable: http://127.0.0.1:\d+/v1/completions did not answer within 1 s\)", out), out
    assert "resuming at GRPO step" in out and "writes state.pt and the checkpoint in the run folder" in out
    assert through_driver == [], through_driver
    assert _stored_once(connect(shared), "cut", 3) == 1  # one failure, one restart: none spent on the old process
    versions = connect(shared).execute("SELECT step, min(policy_version), max(policy_version) FROM generations "
                                     "WHERE run_id = 'cut' GROUP BY step ORDER BY step").fetchall()
    assert versions == [(0, 0, 0), (1, 0, 0), (2, 1, 1)]
    same(stored(connect(runs), "whole", step=2), stored(connect(shared), "cut", step=2))
    whole, cut = _weights(runs, "whole"), _weights(shared, "cut")  # one written by the driver, one by rank 0
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)




@pytest.mark.heavy
def test_a_slow_actor_plays_fewer_groups_and_partial_rollouts_reach_the_actors_mid_chunk(cluster, monkeypatch):
    """The scheduler (`dispatch.Dispatcher`): with actor 1 four seconds a group slower, actor 0 plays more of a step's
    6 groups (the static split gave each 3), and the step's episodes are its tasks × G, each once, in order.
    With `grpo.partial_rollouts`, the version the first update publishes is offered to the actors while they play
    step 2 (`offer` runs beside `play`: the actors take two calls at once), and each goes on with it from its next
    call: actor 0's first chunk of step 2 starts on version 0 and ends on version 1 (`_hold`: such a chunk waits
    after its first call until the offer is in; actor 1, asleep, may take the offer before its first call). Every
    generation stores its own version, within the bound."""
    from envace.training.cluster import driver

    address, runs = cluster
    seen = []
    take = driver.Dispatcher.take

    def watched(self, step):
        out = take(self, step)
        handed = [actor for _, actor, kind, at, _ in self.s.log if kind == "rollout" and at == step]  # 1 group each
        seen.append(([handed.count(i) for i in range(len(self.s.actors))], [t.uid for t in self.tasks_of(step)],
                     [ep.episode_id for ep in out[0].episodes]))
        return out

    monkeypatch.setattr(driver.Dispatcher, "take", watched)
    _slow(runs).write_text("1 4")
    _hold(runs).touch()
    try:
        assert _train(address, runs, "slow-actor", 2, *TWO_NODES, "--set", "grpo.tasks_per_step=6",
                      "--set", "grpo.partial_rollouts=true") == 0
    finally:
        _slow(runs).unlink()
        _hold(runs).unlink()
    (groups, uids, ids), _ = seen
    assert ids == [f"s0:{uid.replace('/', '.')}#{g}" for uid in uids for g in range(4)]
    assert groups[0] > groups[1] >= 1 and sum(groups) == 6, groups
    con = connect(runs)
    stored = con.execute("SELECT count(*), count(DISTINCT episode_id) FROM episodes WHERE run_id = 'slow-actor' "
                         "AND step = 0")
    assert stored.fetchall() == [(24, 24)]
    busy = dict(con.execute("SELECT name, value FROM metrics WHERE run_id = 'slow-actor' AND phase = 'grpo' "
                            "AND step = 0 AND name IN ('actor0_rollout_s', 'actor1_rollout_s')").fetchall())
    assert busy["actor1_rollout_s"] >= 4 * groups[1]  # each actor's busy time on the step: actor 1 slept
    chunks = con.execute("SELECT split_part(episode_id, '#', 1), min(policy_version), max(policy_version) FROM "
                         "generations WHERE run_id = 'slow-actor' AND step = 1 GROUP BY ALL").fetchall()
    assert any((low, high) == (0, 1) for _, low, high in chunks), chunks  # a group straddles the publish
    assert con.execute("SELECT min(step - policy_version), max(step - policy_version) FROM generations WHERE "
                       "run_id = 'slow-actor'").fetchall() == [(0, 1)]


def test_a_failed_actor_call_is_named_in_one_line():
    """What the driver says of an actor's failed call (`driver.failure`): the exception's type and first line, whether
    Ray sent the exception back or only its traceback (an exception that does not unpickle). A served backend's
    HTTP error (`vllm.Refused`) unpickles whole, its status code included."""
    import pickle

    import ray.exceptions

    from envace.policy.vllm import Refused
    from envace.training.cluster.driver import failure

    served = Refused("http://h:1/v1/completions failed while serving (answered 503): EngineDeadError\nmore", 503)
    back = pickle.loads(pickle.dumps(served))  # as Ray sends it to the driver
    assert (type(back), str(back), back.code) == (Refused, str(served), 503)
    line = "Refused: http://h:1/v1/completions failed while serving (answered 503): EngineDeadError"
    assert failure(ray.exceptions.RayTaskError("play", "Traceback (most recent call last): ...", back)) == line
    lost = ray.exceptions.UnserializableException("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                                  "envace.policy.vllm." + line + "\n")
    assert failure(lost) == line


@pytest.mark.heavy
def test_synchronous_ray_run_is_the_single_process_run(cluster, monkeypatch, tmp_path, capsys):
    """grpo.max_staleness = 0 with one actor and one learner rank: the same rows, advantages, store and weights as
    `envace train` in one process (whose backend takes the same half-gold messages, in-process). Its runs folder
    is one the workers may touch, as on one machine or a shared filesystem: rank 0 writes `state.pt` and the
    checkpoint there itself, and nothing of either passes through the driver (the other tests' folder is the
    driver's alone: there both do; `--resume` from a state rank 0 wrote and reads: the kill test's "cut")."""
    import ray

    from envace.policy.hf import HFBackend
    from envace.training.cluster import driver

    address, _ = cluster
    runs = tmp_path / "shared"
    sent, ref, through_driver = [], driver.RayWorkers._ref, []

    def watched(self, weights):  # what the driver hands the actors: a reference, never the weights
        sent.append(type(weights))
        return ref(self, weights)

    monkeypatch.setattr(driver.RayWorkers, "_ref", watched)
    for name in ("take", "send_state"):  # the driver's way to state.pt and the checkpoint, and back
        monkeypatch.setattr(driver.RemoteLearner, name, lambda *a, name=name: through_driver.append(name))
    sync = ["--set", "grpo.max_staleness=0", "--set", "sft.tasks=1", "--set", "sft.epochs=1"]
    assert _train(address, runs, "ray-sync", 2, *sync) == 0
    assert "learner rank 0 writes state.pt and the checkpoint in the run folder" in capsys.readouterr().out
    assert through_driver == [] and (runs / "ray-sync" / "state.pt").exists()
    assert not list(runs.glob("ray-sync/.probe-*"))
    assert sent and set(sent) == {ray.ObjectRef}, sent  # rank 0 put each version in the object store itself
    spec = importlib.util.spec_from_file_location("ray_worker_hooks", HOOKS / "sitecustomize.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)  # neither variable is set here: only `half_gold` is defined
    monkeypatch.setattr(HFBackend, "generate", HFBackend.generate)  # restored after the test
    hooks.half_gold(HFBackend)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the actor and the learner rank (1 CPU each): the same order of float additions
    try:
        assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path / "one"), "--run-name", "local", "--set",
                     "grpo.steps=2", *STALE, *sync]) == 0
    finally:
        torch.set_num_threads(threads)
    ray_con, local_con = connect(runs), connect(tmp_path / "one")

    g_ray = same(stored(ray_con, "ray-sync"), stored(local_con, "local"))
    assert any(trained for *_, trained in g_ray)
    remote, local = _weights(runs, "ray-sync"), _weights(tmp_path / "one", "local")
    assert all(torch.allclose(remote[k], local[k], atol=1e-6) for k in local)


@pytest.mark.heavy
def test_a_placement_the_cluster_cannot_satisfy_is_one_line(cluster, capsys):
    address, runs = cluster
    assert _train(address, runs, "greedy", 1, "--set", "ray.actor_gpus=4") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "4 GPU" in err[0] and "the cluster has 0" in err[0]
    assert _train(address, runs, "spread", 1, "--set", "ray.actors=3", "--set", "ray.actor_cpus=0.5",
                  "--set", "ray.actor_placement=STRICT_SPREAD") == 2
    assert "the cluster has 2" in capsys.readouterr().err
    assert not (runs / "greedy").exists() and not (runs / "spread").exists()  # refused before a run folder exists


def test_a_ray_address_that_does_not_answer_is_one_line(tmp_path, capsys):
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--ray", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no Ray cluster answers at 127.0.0.1:{port}" in err[0]
