import os
import signal
import subprocess
import sys
import time

import pytest

from envace.cli import main
from envace.store import connect

FAST = ["--model", "tiny", "--max-new-tokens", "8", "--max-steps-per-turn", "2"]


def envace(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_rollout_runs_show_and_sql(tmp_path, capsys):
    root = str(tmp_path)
    assert main(["rollout", "--limit", "2", "--run-name", "smoke", "--root", root, *FAST]) == 0
    out = capsys.readouterr().out
    assert "official success" in out and "generated tokens/s" in out and "envace show smoke" in out
    assert main(["runs", "--root", root]) == 0
    assert "smoke" in capsys.readouterr().out
    assert main(["show", "smoke", "--root", root]) == 0
    assert "multi_turn_base" in capsys.readouterr().out
    con = connect(root)
    episodes = con.execute("SELECT task_uid, split, termination FROM episodes ORDER BY task_uid").fetchall()
    assert sorted(e[0] for e in episodes) == ["bfcl/multi_turn_base_3", "bfcl/multi_turn_base_7"]
    assert all(e[1] == "test" for e in episodes)
    assert con.execute("SELECT count(*) FROM generations WHERE run_id = 'smoke'").fetchall()[0][0] >= 2
    assert con.execute("SELECT status FROM runs").fetchall()[0] == ("completed",)


def test_config_file_and_flag_override(tmp_path, capsys):
    cfg = tmp_path / "r.toml"
    cfg.write_text('[rollout]\nmodel = "tiny"\nlimit = 1\nmax_new_tokens = 4\ncategory = "multi_turn_miss_param"\n')
    assert main(["rollout", "--config", str(cfg), "--max-steps-per-turn", "1", "--root", str(tmp_path / "runs"),
                 "--run-name", "c"]) == 0
    con = connect(tmp_path / "runs")
    assert con.execute("SELECT category FROM episodes").fetchall() == [("multi_turn_miss_param",)]


@pytest.mark.parametrize("args, message", [
    (["rollout", "--mode", "bogus"], "mode: unknown choice 'bogus' (choose from real, rehearse"),
    (["rollout", "--env", "nope"], "unknown env 'nope'"),
    (["rollout", "--category", "simple"], "unknown bfcl category"),
    (["rollout", "--split", "dev"], "split: unknown choice 'dev'"),
    (["rollout", "--model", "/no/such/model"], "does not exist"),
    (["rollout", "--model", "some-org/not-cached"], "neither a local directory"),
    (["rollout", "--limit", "0"], "limit: must be at least 1, got 0"),
    (["rollout", "--limit", "x"], "limit: expected an integer, got 'x'"),
    (["rollout", "--config", "/no/such.toml"], "does not exist"),
    (["rollout", "--run-name", "../x", "--model", "tiny", "--limit", "1"], "invalid run name"),
    (["show", "missing"], "no run 'missing'"),
    (["check-env", "nope"], "unknown env"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = envace(*args, "--root", str(tmp_path)) if args[0] != "check-env" else envace(*args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.stderr


def test_malformed_config_is_rejected_before_loading(tmp_path):
    bad = tmp_path / "bad.toml"
    for text, message in (("[rollout]\nlimt = 2\n", "unknown key(s) limt"),
                          ("[rollout]\nlimit = 'two'\n", "limit: expected an integer, got 'two'"),
                          ("[rollout\n", "malformed TOML")):
        bad.write_text(text)
        result = envace("rollout", "--config", str(bad), "--root", str(tmp_path))
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.heavy
def test_check_env_passes_every_bfcl_gold_with_its_control():
    """Every reference call goes through execute() as BFCL's harness runs it (no schema check first): the 800
    multi-turn items all pass, with every negative control falling; of the single-turn items, only the 8 whose
    answers BFCL's own checker cannot accept fail, each named with why; live_relevance has no gold; the 465 memory
    answers pass, and each falls when the caller says it does not know."""
    result = envace("check-env", "bfcl")
    assert result.returncode == 0, result.stdout
    assert "4882/4890 ground-truth trajectories pass" in result.stdout and "8 fail by known defects" in result.stdout
    assert result.stdout.count("155/155  negative control fell 155/155") == 3
    assert "Loading weights" not in result.stdout  # the vector backend's encoder loads quietly
    assert result.stdout.count("known defect: bfcl/") == 8 and "multi_turn" not in \
        "".join(line for line in result.stdout.splitlines() if line.startswith("known defect"))
    assert not [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert result.stdout.count("negative control fell 200/200") == 4 + 3  # multi-turn, multiple and parallel ones
    assert "live_relevance               no gold answers to replay" in result.stdout


def test_a_killed_run_keeps_its_completed_batches(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "envace.cli", "rollout", "--limit", "6", "--batch-size", "1",
                             "--root", str(tmp_path), "--run-name", "killed", *FAST],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not list(tmp_path.glob("killed/episodes/*.parquet")) and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    con = connect(tmp_path)
    stored = con.execute("SELECT count(*) FROM episodes").fetchall()[0][0]
    assert 1 <= stored < 6
    assert con.execute("SELECT count(DISTINCT episode_id) FROM generations").fetchall()[0][0] == stored
    assert con.execute("SELECT status FROM runs").fetchall()[0] == ("interrupted",)


def test_shadow_rollout_and_fidelity_table(tmp_path, capsys):
    root = str(tmp_path)
    assert main(["rollout", "--mode", "real+shadow", "--limit", "1", "--run-name", "sh", "--root", root,
                 "--max-steps-per-turn", "1", "--model", "tiny", "--max-new-tokens", "4"]) == 0
    capsys.readouterr()
    con = connect(root)
    calls = con.execute("SELECT count(*) FROM calls").fetchall()[0][0]
    assert con.execute("SELECT count(*) FROM pairs").fetchall()[0][0] == calls
    assert main(["fidelity", "sh", "--root", root]) == 0
    out = capsys.readouterr().out
    assert ("world-model fidelity" in out and "all" in out) if calls else "has no pairs" in out
    assert main(["rollout", "--limit", "1", "--run-name", "plain", "--root", root, *FAST]) == 0
    capsys.readouterr()
    assert main(["fidelity", "plain", "--root", root]) == 0
    assert "has no pairs" in capsys.readouterr().out


def test_eval_stores_an_eval_run_of_the_test_split(tmp_path, capsys):
    root = str(tmp_path)
    assert main(["eval", "tiny", "--limit", "1", "--max-new-tokens", "4", "--max-steps-per-turn", "1",
                 "--root", root, "--run-name", "ev"]) == 0
    assert "well-formed-call rate" in capsys.readouterr().out
    con = connect(root)
    assert con.execute("SELECT kind FROM runs WHERE run_id = 'ev'").fetchall() == [("eval",)]
    assert con.execute("SELECT DISTINCT split FROM episodes").fetchall() == [("test",)]
    assert main(["eval", "tiny", "--model", "default", "--root", root]) == 2
