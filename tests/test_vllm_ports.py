"""Servers launched at once on one machine get ports of their own, and die with the process that launched them:
no real vLLM, a stand-in that never binds.

`vllm.launch` runs `ENVACE_VLLM_PYTHON`; here that is a shell script logging its arguments and `VLLM_PORT`, then
sleeping like a server still importing (vLLM binds its HTTP port only after seconds of imports, its own ports
later still): the window in which another launch could pick the same ports.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import running

from envace.errors import UsageError
from envace.policy import vllm

LAUNCHER = """
import itertools, sys, time
from pathlib import Path
from envace.policy import vllm
vllm.on_gpu = lambda: False
vllm.RESERVATIONS = Path(sys.argv[5])
# Every launch offered the same ports in the same order, as if the kernel had handed them all the same choice.
vllm._candidate = lambda host, _next=itertools.count(int(sys.argv[4])).__next__: _next()
go = Path(sys.argv[1])
while not go.exists():
    time.sleep(0.005)
server = vllm.launch(sys.argv[2], "base", log_dir=Path(sys.argv[3]), gpu_memory=0.5)
print(server.url, flush=True)
sys.stdin.read()  # the launching process lives on as a trainer does, holding its reservation
server.stop()
"""

# A trainer with its server: started in a session of its own, so the test can signal its group as a terminal would.
TRAINER = """
import sys
from pathlib import Path
from envace.policy import vllm
vllm.on_gpu = lambda: False
vllm.RESERVATIONS = Path(sys.argv[3])
server = vllm.launch(sys.argv[1], "base", log_dir=Path(sys.argv[2]), gpu_memory=0.5)
try:  # the test's Ctrl-C may come as soon as the pid is out: the line that prints it is inside
    print(server.process.pid, flush=True)
    sys.stdin.read()
except KeyboardInterrupt:  # the terminal's Ctrl-C: this process stops its server itself, once it is done
    print("server answering" if server.alive() else "server gone", flush=True)
    server.stop()
"""


@pytest.fixture()
def stand_in(tmp_path, monkeypatch):
    """A model folder and a stand-in vLLM interpreter that never binds a port."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "VLLM_PORT=$VLLM_PORT $*"\nexec sleep 120\n')
    fake.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    monkeypatch.setenv("ENVACE_VLLM_PYTHON", str(fake))
    monkeypatch.setattr(vllm, "RESERVATIONS", tmp_path / "ports.json")  # this test's launches alone
    monkeypatch.setenv("VLLM_PORT", "41000")  # one value for every process: each server must get its own
    return model


def _ports(log: str) -> set[int]:
    """The HTTP port and vLLM's own ports (from VLLM_PORT, `PORT_SPAN` of them) of one launched server."""
    internal = int(re.search(r"VLLM_PORT=(\d+)", log).group(1))
    return {int(re.search(r"--port (\d+)", log).group(1)), *range(internal, internal + vllm.PORT_SPAN)}


def test_servers_launched_at_once_by_several_processes_get_disjoint_ports(stand_in, tmp_path):
    n, go, logs = 6, tmp_path / "go", tmp_path / "logs"
    first = vllm._candidate("127.0.0.1")  # the same first offer for all: only the reservation separates them
    args = [str(go), str(stand_in), str(logs), str(first), str(vllm.RESERVATIONS)]
    launchers = [subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        time.sleep(1.0)  # every launcher imported and waiting
        go.touch()
        urls = [p.stdout.readline().strip() for p in launchers]
        deadline = time.time() + 30
        while len([f for f in logs.glob("*.log") if f.stat().st_size]) < n and time.time() < deadline:
            time.sleep(0.05)
        texts = [f.read_text() for f in logs.glob("*.log")]
    finally:
        errors = [p.communicate("", timeout=60)[1] for p in launchers]
    assert all(urls) and len(set(urls)) == n, (urls, errors)
    assert len(texts) == n, texts  # one log per HTTP port: none shared
    blocks = [_ports(t) for t in texts]
    assert sum(map(len, blocks)) == len(set().union(*blocks)) == n * (1 + vllm.PORT_SPAN)  # pairwise disjoint
    assert not json.loads(vllm.RESERVATIONS.read_text())  # stopped servers free their ports


def test_a_reserved_port_is_refused_until_released_and_a_dead_launchers_ports_are_free(stand_in, tmp_path):
    port, internal = vllm.reserve_ports()
    with pytest.raises(UsageError, match="already in use"):
        vllm.reserve_ports(port=port)  # nothing is bound to it yet, but another launch has it
    held = json.loads(vllm.RESERVATIONS.read_text())
    assert {str(port), str(internal)} <= set(held) and set(held.values()) == {os.getpid()}
    vllm.release_ports([port])
    assert vllm.reserve_ports(port=port)[0] == port
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    vllm.RESERVATIONS.write_text(json.dumps({"1": int(dead.stdout)}))
    with vllm._reservations() as held:
        assert held == {}  # its process is gone: so is its reservation


def _trainer(stand_in, tmp_path) -> tuple[subprocess.Popen, int]:
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(stand_in), str(tmp_path / "logs"),
                                str(vllm.RESERVATIONS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    return trainer, int(trainer.stdout.readline())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_server_dies_with_the_process_that_started_it_and_outlives_a_ctrl_c_to_it(stand_in, tmp_path):
    trainer, server = _trainer(stand_in, tmp_path)
    try:
        os.killpg(trainer.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole foreground group
        assert trainer.stdout.readline().strip() == "server answering"
        assert trainer.wait(30) == 0 and not running(server)  # stopped by the trainer itself
    finally:
        trainer.kill()
    trainer, server = _trainer(stand_in, tmp_path)
    try:
        trainer.kill()  # SIGKILL: no Python code of the trainer runs again
        trainer.wait(30)
        deadline = time.time() + 5
        while running(server) and time.time() < deadline:
            time.sleep(0.05)
        assert not running(server), f"server {server} outlived the process that started it"
    finally:
        if running(server):
            os.kill(server, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_stopping_a_server_that_was_killed_stops_its_engine_process(stand_in, tmp_path, monkeypatch):
    """A server killed (or crashed) runs no shutdown, and its engine process (vLLM's EngineCore, holding the model's
    memory) lives on in the server's process group: `stop` ends the group all the same. The stand-in forks an
    "engine" that sleeps, writes its pid, then sleeps itself."""
    engine_pid = tmp_path / "engine.pid"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nsleep 120 &\necho $! > {engine_pid}\nexec sleep 120\n')
    monkeypatch.setattr(vllm, "on_gpu", lambda: False)
    server = vllm.launch(stand_in, "base", log_dir=tmp_path / "logs", gpu_memory=0.5)
    deadline = time.time() + 10
    while not engine_pid.exists() or not engine_pid.read_text().strip():
        assert time.time() < deadline, "the stand-in did not start its engine"
        time.sleep(0.02)
    engine = int(engine_pid.read_text())
    try:
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(10)
        assert running(engine)  # the orphan the server left
        server.stop(grace_s=1)
        deadline = time.time() + 5
        while running(engine) and time.time() < deadline:
            time.sleep(0.05)
        assert not running(engine), "the killed server's engine process outlived stop()"
    finally:
        if running(engine):
            os.kill(engine, signal.SIGKILL)
