"""`docs/multi-node.md`, run as written: its commands, read from the page, start a head node and a second node with
`ray start`, take the cluster's token as the page says, and run the page's one-step cluster check on them.

What the test changes in the commands, and only that: `HEAD_IP` is 127.0.0.1 and port 6379 a free port (both
nodes are this machine); `envace` is this interpreter's; `TOKEN` is what the page's `ray get-auth-token` printed
(with `--generate`, as the page says, since a fresh HOME has none). Every command runs with a HOME of its own (so
the token and `~/.ray` are the test's) and `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`, without which Ray refuses a
second node on one machine. The run folder goes to `ENVACE_RUNS`, not the project's `runs/`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from ports import free_port

from envace.paths import envace_home

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "multi-node.md"
BIN = Path(sys.executable).parent


def commands(page: Path) -> list[str]:
    """Every command line of the page's code blocks (continuation lines joined, comments dropped)."""
    blocks = re.findall(r"```\n(.*?)```", page.read_text(), flags=re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [" ".join(line.split()) for line in lines if line]


def _one(found: list[str], what: str) -> str:
    assert len(found) == 1, f"docs/multi-node.md should have one command that {what}: {found}"
    return found[0]



def test_the_page_has_the_commands_this_test_runs():
    page = commands(PAGE)
    assert _one([c for c in page if c.startswith(".venv/bin/ray start --head")], "starts the head")
    assert _one([c for c in page if c.startswith(".venv/bin/ray start --address HEAD_IP:")], "joins a node")
    assert _one([c for c in page if "--ray HEAD_IP:6379" in c and "smoke.toml" in c], "checks the cluster")


def test_the_pages_commands_start_two_nodes_and_run_its_cluster_check(tmp_path):
    page = commands(PAGE)
    port = str(free_port())

    def literal(command: str, token: str = "") -> list[str]:
        words = shlex.split(command.replace("HEAD_IP", "127.0.0.1").replace("6379", port))
        words = [re.sub(r"(^|=)TOKEN$", rf"\g<1>{token}", w) if token else w for w in words]
        return [str(BIN / "envace"), *words[1:]] if words[0] == "envace" else words

    env = {**os.environ, "HOME": str(tmp_path / "home"), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
           "ENVACE_HOME": str(envace_home()), "ENVACE_RUNS": str(tmp_path / "runs"), "OMP_NUM_THREADS": "1"}
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)

    def run(argv: list[str], extra: dict[str, str] | None = None, timeout: int = 300) -> str:
        done = subprocess.run(argv, cwd=REPO, env={**env, **(extra or {})}, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
        return done.stdout

    get_token = _one([c for c in page if c.startswith(".venv/bin/ray get-auth-token")], "prints the token")
    head = _one([c for c in page if c.startswith(".venv/bin/ray start --head")], "starts the head")
    join = _one([c for c in page if c.startswith(".venv/bin/ray start --address HEAD_IP:")], "joins a node")
    exports = _one([c for c in page if c.startswith("export RAY_AUTH_MODE=token")], "exports the token")
    check = _one([c for c in page if "--ray HEAD_IP:6379" in c and "smoke.toml" in c], "checks the cluster")

    token = run([*literal(get_token), "--generate"]).strip().splitlines()[-1]
    assert re.fullmatch(r"[0-9a-f]{32,}", token), token
    # `export A=B C=D` on the other node and for the driver
    exported = dict(word.split("=", 1) for word in literal(exports, token)[1:])
    assert exported == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    try:
        run(literal(head))  # the head finds the token in ~/.ray and requires it
        run(literal(join), exported)
        out = run(literal(check), exported, timeout=600)
        # one actor on each of the two nodes, the learner's two ranks, one step stored, the run completed
        placed = re.search(r"2 actor\(s\) on node 0.*?;", out, flags=re.S)
        assert placed and "node 1" in placed.group(0), out[-3000:]
        assert "a learner of 2 rank(s)" in out
        meta = json.loads((tmp_path / "runs" / "cluster-check" / "run.json").read_text())
        assert meta["status"] == "completed" and meta["config"]["ray"]["actor_placement"] == "STRICT_SPREAD"
        # the driver without the token is refused by the cluster, in one line, before a run folder exists
        refused = subprocess.run(literal(check.replace("cluster-check", "no-token")), cwd=REPO, env=env,
                                 capture_output=True, text=True, timeout=300)
        said = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(said) == 1 and "requires its token" in said[0], refused.stderr[-2000:]
        assert "RAY_AUTH_MODE=token" in said[0]
        assert not (tmp_path / "runs" / "no-token").exists()
    finally:
        _stop_cluster(port)


def _stop_cluster(port: str) -> None:
    """Kill this test's Ray processes and theirs: its GCS server (`--gcs_server_port`), every process whose command
    line names the cluster's session or its address, and their children (the agents, the workers). Not `ray stop`,
    which kills every Ray process of the machine, a driver's own local cluster among them."""
    import psutil

    def args(proc) -> list[str]:
        try:
            return proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return []

    everyone = list(psutil.process_iter())
    gcs = [p for p in everyone if f"--gcs_server_port={port}" in args(p)]
    marks = {f":{port}"} | {a.split("=", 1)[1] for p in gcs for a in args(p) if a.startswith("--session-name=")}
    procs = {p.pid: p for p in everyone if any(m in " ".join(args(p)) for m in marks)}
    for proc in list(procs.values()):
        try:
            procs.update({c.pid: c for c in proc.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    procs.pop(os.getpid(), None)
    for proc in procs.values():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(procs.values()), timeout=30)
    current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"  # `ray start`'s address, as ray stop does
    if current.exists() and current.read_text().strip().endswith(f":{port}"):
        current.unlink()
