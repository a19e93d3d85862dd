import subprocess
import sys
import textwrap
import time

import pytest

from envace import store
from envace.errors import UsageError


def _call_row(run, batch, i):
    return {"run_id": run.run_id, "batch": batch, "episode_id": f"e{i}", "turn": 0, "step": 0, "call_index": 0,
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
            rows = [{{"run_id": "live", "batch": b, "episode_id": f"e{{b}}-{{i}}", "turn": 0, "step": 0,
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
