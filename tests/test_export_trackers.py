"""A run leaves the store as a Hugging Face dataset, Parquet or JSONL, and its metrics reach experiment trackers."""

import pytest

from envace.cli import main
from envace.store import connect


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracked")
    assert main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "tb",
                 "--set", "report_to=tensorboard", "--set", "sft.epochs=1"]) == 0
    return root


@pytest.mark.heavy
def test_a_run_exports_as_a_hugging_face_dataset_parquet_and_jsonl(trained, tmp_path, capsys):
    from datasets import load_from_disk

    root = str(trained)
    assert main(["export", "tb", str(tmp_path / "hf"), "--root", root]) == 0
    data = load_from_disk(str(tmp_path / "hf"))
    stored = connect(root).execute("SELECT count(*) FROM generations WHERE run_id = 'tb'").fetchall()[0][0]
    assert len(data["generations"]) == stored > 0
    assert {"completion_ids", "advantage", "trained", "reward"} <= set(data["generations"].column_names)
    for fmt in ("parquet", "jsonl"):
        assert main(["export", "tb", str(tmp_path / fmt), "--format", fmt, "--root", root]) == 0
        assert (tmp_path / fmt / f"generations.{fmt}").stat().st_size > 0
    capsys.readouterr()
    assert main(["export", "tb", str(tmp_path / "x"), "--format", "xlsx", "--root", root]) == 2
    assert main(["export", "tb", str(tmp_path / "hf"), "--root", root]) == 2  # never over a folder with files
    assert "not empty" in capsys.readouterr().err


@pytest.mark.heavy
def test_tensorboard_gets_the_stored_metrics(trained):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained / "tb" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"grpo/caller/reward_mean", "grpo/all/loss", "sft/all/nll"} <= tags
    losses = [e.value for e in events.Scalars("grpo/all/loss")]
    stored = [v for (v,) in connect(trained).execute(
        "SELECT value FROM metrics WHERE phase = 'grpo' AND role = 'all' AND name = 'loss' ORDER BY step").fetchall()]
    assert losses == pytest.approx(stored)


def test_trackio_gets_a_sweeps_table(tmp_path, monkeypatch):
    import sqlite3

    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    assert main(["sweep", "--name", "s", "--models", "tiny=tiny", "--budgets", "0,1", "--modes", "parallel",
                 "--config", "experiments/smoke.toml", "--limit", "1", "--report-to", "trackio",
                 "--root", str(tmp_path / "runs")]) == 0
    databases = list((tmp_path / "trackio").glob("*.db"))
    assert databases
    with sqlite3.connect(databases[0]) as db:
        rows = db.execute("SELECT count(*) FROM metrics").fetchone()[0]
    assert rows >= 2  # one step per cell
