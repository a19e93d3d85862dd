"""`docs/environments.md`'s walk-through, run as written: its files written into a folder of their own, its
commands run from there, as an outside author would (the plugin imports the stable surface and nothing else)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port

from envace.store import connect

pytestmark = pytest.mark.heavy  # every test reads the walk-through's commands, run once as subprocesses

DOC = Path(__file__).resolve().parents[1] / "docs" / "environments.md"
STABLE = {"envace.envs.base": {"Environment"}, "envace.envs.registry": {"Benchmark"},
          "envace.types": {"Task", "Score", "ToolCall", "ToolResult", "ReferenceStep"}}


def _blocks() -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", DOC.read_text(), flags=re.DOTALL | re.MULTILINE)



@pytest.fixture(scope="module")
def walked(tmp_path_factory):
    """The folder the walk-through ran in, and each command's (argv, completed process)."""
    here = tmp_path_factory.mktemp("author")
    for block in _blocks():
        first, _, body = block.partition("\n")
        if first.startswith("# file: "):
            path = here / first.removeprefix("# file: ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    (here / "piggy" / "piggy" / "__init__.py").touch()
    commands = next(b for b in _blocks() if b.startswith("# run it\n")).splitlines()[1:]
    env = dict(os.environ)
    done = []
    for line in commands:
        argv = shlex.split(line, comments=True)
        if argv[0] == "export":
            key, _, value = argv[1].partition("=")
            env[key] = value.replace("$PWD", str(here))
            continue
        assert argv[0] == "envace", line
        argv = [sys.executable, "-m", "envace.cli", *argv[1:]]
        if argv[3] == "app":  # served until it answers, then stopped
            port = str(free_port())
            argv[argv.index("--port") + 1] = port
            server = subprocess.Popen(argv, cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                deadline, answered = time.time() + 180, None
                while answered is None and time.time() < deadline and server.poll() is None:
                    try:
                        answered = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5).status
                    except OSError:
                        time.sleep(1)
            finally:
                server.terminate()
                server.wait(60)
            done.append((argv, answered))
            continue
        done.append((argv, subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=900)))
    return here, done


def _run(walked, *words):
    return next(result for argv, result in walked[1] if all(w in argv for w in words))


def test_the_plugin_imports_only_the_stable_surface(walked):
    tree = ast.parse((walked[0] / "piggy" / "piggy" / "bank.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("envace"):
            assert {a.name for a in node.names} <= STABLE.get(node.module, set()), node.module
        assert not (isinstance(node, ast.Import) and any(a.name.startswith("envace") for a in node.names))


def test_every_command_of_the_walk_through_succeeds(walked):
    for argv, result in walked[1]:
        if isinstance(result, subprocess.CompletedProcess):
            assert result.returncode == 0 and "Traceback" not in result.stderr, (argv, result.stdout[-2000:],
                                                                                 result.stderr[-2000:])
        else:
            assert result == 200, argv  # the app answered


def test_envs_checks_the_spec_and_the_entry_point_found_without_installing(walked):
    out = _run(walked, "envs").stdout
    assert re.search(r"piggy\.bank:benchmark\s+spec\s+coins", out) and re.search(r"\npiggy\s+entry point", out)


def test_check_env_replays_the_gold_and_names_where_the_control_did_not_fall(walked):
    out = _run(walked, "check-env").stdout
    assert "4/4  negative control fell 2/4" in out and "did not fall on 2 (piggy/…): 0, 3" in out
    assert "4/4 ground-truth trajectories pass" in out and "problem:" not in out


def test_the_gold_rehearsing_itself_scores_one_and_reads_the_refusal_as_a_failure(walked):
    con = connect(walked[0] / "runs")
    pairs = con.execute("SELECT exact, structure_f1, value_acc, error_agree, real_is_error, rehearsed_is_error "
                        "FROM pairs WHERE run_id IN ('piggy-gold', 'piggy-world')").fetchall()
    assert len(pairs) == 2 * 4 and all(row[:4] == (1.0, 1.0, 1.0, 1.0) for row in pairs)
    assert sum(real and rehearsed for *_, real, rehearsed in pairs) == 2  # withdraw 4 of 2, in both runs
    assert con.execute("SELECT bool_and(success) FROM episodes WHERE run_id = 'piggy-gold'").fetchone()[0]
    assert "1.00" in _run(walked, "fidelity").stdout
