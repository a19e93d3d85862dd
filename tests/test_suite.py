"""`envace suite`: the paper's benchmarks as one resumable grid of eval runs; its table beside the published rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from envace import suite
from envace.cli import main
from envace.store import connect, get_run
from workbench import Workbench

SMALL = ["--max-new-tokens", "16", "--max-steps-per-turn", "2", "--user-max-new-tokens", "16", "--max-user-turns",
         "2"]


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """The whole suite with the tiny model, one item a cell (what is checked is that every cell runs and resumes,
    not its score), and what it printed."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("suite")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["suite", "tiny", "--limit", "1", "--name", "s", "--root", str(root), *SMALL]) == 0
    return root, out.getvalue()


@pytest.mark.heavy
def test_every_cell_runs_and_the_table_stands_beside_the_papers_rows(played):
    root, out = played
    meta = get_run(root, "s")
    cells = meta["summary"]["cells"]
    assert meta["kind"] == "suite" and len(cells) == len(suite.cells()) == 13 + 4 + 3 + 3 + 2
    assert all(get_run(root, c["cell_run"])["status"] == "completed" and c["episodes"] == 1 for c in cells)
    for published in ("EnvACE-8B (published)", "Qwen3-1.7B (backbone) (published)", "this run: s"):
        assert published in out
    assert "a smoke, not a score" in out and "needs the internet" in out and "not built here" not in out
    frame = Workbench(root).suite("s")
    assert list(frame.columns) == ["model", *suite.COLUMNS.values()] and frame.iloc[0]["model"] == "this run: s"


@pytest.mark.heavy
def test_a_re_run_keeps_every_finished_cell_and_redoes_an_interrupted_one(played, capsys):
    root, _ = played
    victim = root / "s-tau2-retail" / "run.json"
    meta = json.loads(victim.read_text())
    victim.write_text(json.dumps({**meta, "status": "interrupted"}))  # as a Ctrl-C mid-cell leaves it
    before = {p.name: p.stat().st_mtime for p in root.glob("s-bfcl-*/run.json")}
    assert main(["suite", "tiny", "--limit", "1", "--name", "s", "--root", str(root), *SMALL]) == 0
    out = capsys.readouterr().out
    assert out.count("done already, kept") == len(suite.cells()) - 1 and "cell 22/25 s-tau2-retail\n" in out
    assert {p.name: p.stat().st_mtime for p in root.glob("s-bfcl-*/run.json")} == before
    assert get_run(root, "s-tau2-retail")["status"] == "completed"


def test_the_overall_follows_the_leaderboard_and_the_papers_mean():
    ones, zeros = np.ones(4), np.zeros(4)
    outcomes = {suite.Cell("bfcl", c, "all"): ones for c in ("simple_python", "multi_turn_base")}
    outcomes |= {suite.Cell("tau2", "airline", "test"): ones, suite.Cell("vitabench", "delivery", "test"): zeros}
    row = suite.summary(outcomes).set_index("column")["ours"]
    from envace.envs.bfcl import leaderboard

    bfcl = 100 * leaderboard.offline_overall({c: {"accuracy": 1.0, "total_count": 4}
                                              for c in ("simple_python", "multi_turn_base")})
    assert row[suite.COLUMNS["bfcl"]] == pytest.approx(bfcl)
    assert row[suite.COLUMNS["overall"]] == pytest.approx((bfcl + 100 + 0) / 3)


@pytest.mark.heavy
def test_with_private_rehearsal_it_prints_the_papers_second_table(tmp_path, monkeypatch, capsys):
    two = [suite.Cell("bfcl", "multi_turn_base", "all"), suite.Cell("tau2", "airline", "test")]
    monkeypatch.setattr(suite, "cells", lambda private, budget: two + [
        suite.Cell(c.env, c.category, c.split, private, budget) for c in two])
    assert main(["suite", "reference", "--limit", "1", "--name", "p", "--private", "parallel", "--budget", "1",
                 "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "this run: parallel, N = 1" in out and "parallel, EnvACE (published)" in out
    rehearsed = connect(tmp_path).execute("SELECT count(*) FROM memories WHERE run_id LIKE 'p-%-parallel1'")
    assert rehearsed.fetchone()[0] > 0  # the rehearsed cells did rehearse


@pytest.mark.parametrize("args, message", [
    (["--private", "parallel"], "--private parallel|sequential and --budget K go together"),
    (["--private", "sideways", "--budget", "1"], "--private parallel|sequential and --budget K go together"),
    (["--user-model", "/no/such/model"], "model path /no/such/model does not exist"),
    (["--limit", "0"], "--limit: must be at least 1, got 0"),
])
def test_bad_suite_input_is_one_line(tmp_path, capsys, args, message):
    assert main(["suite", "tiny", "--root", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not list(tmp_path.iterdir())  # refused before any run folder exists
