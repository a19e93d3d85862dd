import subprocess
import sys
import textwrap
import time

import pytest

from envace import store
from envace.errors import UsageError


def _call_row(run, step, i):
    return {"run_id": run.run_id, "step": step, "episode_id": f"e{i}", "turn": 0, "turn_step": 0, "call_index": 0,
            "name": "ls", "arguments": "{}", "source": "real", "response": "ü" * i, "is_error": False,
            "error_kind": ""}


def test_round_trip_and_idempotent_rewrite(tmp_path):
    run = store.Run.create(tmp_path, "rollout", {"limit": 2}, "tiny", name="r1")
    run.write("calls", "batch-00000", [_call_row(run, 0, i) for i in range(3)])
    run.write("calls", "batch-00000", [_call_row(run, 0, i) for i in range(3)])  # same shard again
    con = store.connect(tmp_path)
    rows = con.execute("SELECT episode_id, response FROM calls ORDER BY episode_id").fetchall()
    assert rows == [("e0", ""), ("e1", "ü"), ("e2", "üü")]
    assert con.execute("SELECT count(*) FROM episodes").fetchall()[0] == (0,)  # empty tables still query
    assert con.execute("SELECT run_id, kind, status FROM runs").fetchall() == [("r1", "rollout", "running")]


def test_run_names_are_validated(tmp_path):
    for bad in ("../escape", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(UsageError):
            store.Run.create(tmp_path, "rollout", {}, "tiny", name=bad)
    store.Run.create(tmp_path, "rollout", {}, "tiny", name="ok")
    with pytest.raises(UsageError):
        store.Run.create(tmp_path, "rollout", {}, "tiny", name="ok")


def test_reader_queries_while_a_writer_appends(tmp_path):
    writer = textwrap.dedent(f"""
        import time
        from envace import store
        run = store.Run.create({str(tmp_path)!r}, "rollout", {{}}, "tiny", name="live")
        for b in range(30):
            rows = [{{"run_id": "live", "step": b, "episode_id": f"e{{b}}-{{i}}", "turn": 0, "turn_step": 0,
                      "call_index": 0, "name": "ls", "arguments": "{{}}", "source": "real",
                      "response": "x" * 1000, "is_error": False, "error_kind": ""}} for i in range(200)]
            run.write("calls", f"batch-{{b:05d}}", rows)
            time.sleep(0.02)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    con = store.connect(tmp_path)
    seen = []
    deadline = time.time() + 60
    while proc.poll() is None and time.time() < deadline:
        if not any(tmp_path.glob("*/calls/*.parquet")):
            continue
        store.refresh(con, tmp_path)
        n = con.execute("SELECT count(*) FROM calls").fetchall()[0][0]
        assert n % 200 == 0  # whole shards only: a reader never sees half a file
        seen.append(n)
    assert proc.wait() == 0
    assert seen == sorted(seen) and len(set(seen)) > 1
    assert con.execute("SELECT count(*) FROM calls").fetchall()[0][0] == 30 * 200


def test_interrupted_runs_are_reported(tmp_path):
    run = store.Run.create(tmp_path, "rollout", {}, "tiny", name="dead")
    run.update(pid=2**22 + 12345)  # no such process
    assert store.get_run(tmp_path, "dead")["status"] == "interrupted"


def test_a_store_under_the_old_names_is_refused_clearly_then_migrated(tmp_path):
    """Runs written before `turns` → `generations` and `batch` → `step`: skipped with a warning that names
    `envace migrate`, never misread; `migrate` rewrites them and every table then reads under the new names."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from envace.cli import main

    old = tmp_path / "old"
    for folder in ("episodes", "turns", "calls"):
        (old / folder).mkdir(parents=True)
    (old / "run.json").write_text(json.dumps({"run_id": "old", "kind": "train", "status": "completed",
                                              "created_at": 1.0, "summary": {}}))
    key = {"run_id": "old", "batch": 3, "episode_id": "e"}
    pq.write_table(pa.Table.from_pylist([{**key, "task_uid": "t", "success": True, "checklist": 1.0}]),
                   old / "episodes" / "step-00003.parquet")
    pq.write_table(pa.Table.from_pylist([{**key, "turn": 1, "step": 2, "role": "caller", "completion_ids": [1, 2]}]),
                   old / "turns" / "step-00003.parquet")
    pq.write_table(pa.Table.from_pylist([{**key, "turn": 1, "step": 2, "call_index": 0, "name": "ls"}]),
                   old / "calls" / "step-00003.parquet")
    con, index = store.open_store(tmp_path)
    assert any("envace migrate" in w and "old" in w for w in index.warnings)
    assert con.execute("SELECT count(*) FROM episodes").fetchall() == [(0,)]  # skipped, not misread
    assert main(["migrate", "--root", str(tmp_path)]) == 0
    con, index = store.open_store(tmp_path)
    assert index.warnings == [] and not (old / "turns").exists()
    assert con.execute("SELECT step, turn, turn_step, role FROM generations").fetchall() == [(3, 1, 2, "caller")]
    assert con.execute("SELECT step, turn_step FROM calls").fetchall() == [(3, 2)]
    assert con.execute("SELECT step, phase, start_turn FROM episodes").fetchall() == [(3, "grpo", 0)]
