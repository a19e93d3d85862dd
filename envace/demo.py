"""`make demo`: the whole pipeline as far as it exists, on the embedded default model.

Today: a real rollout of SmolLM2-135M-Instruct on BFCL test-split episodes, scored by BFCL's official
checker and stored as Parquet shards, then read back through DuckDB.
"""

from __future__ import annotations

import sys
import time

from envace.cli import main as envace


def step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run() -> int:
    name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    step("1/3 rollout: the default model plays 4 BFCL multi_turn_base test episodes against the real tools")
    print("(first run converts the embedded GGUF to a trainable checkpoint, ~30 s)", flush=True)
    rc = envace(["rollout", "--env", "bfcl", "--category", "multi_turn_base", "--split", "test", "--limit", "4",
                 "--mode", "real", "--model", "default", "--max-new-tokens", "96", "--max-steps-per-turn", "3",
                 "--run-name", name])
    if rc:
        return rc
    step("2/3 the stored run, read back through DuckDB")
    envace(["show", name])
    from envace.store import connect

    con = connect("runs")
    print("SQL> SELECT episode_id, success, termination, n_turns, n_calls FROM episodes WHERE run_id = ?")
    for row in con.execute("SELECT episode_id, success, termination, n_turns, n_calls FROM episodes "
                           "WHERE run_id = ? ORDER BY episode_id", [name]).fetchall():
        print("   ", row)
    first = con.execute("SELECT completion_text FROM turns WHERE run_id = ? ORDER BY episode_id, turn, step "
                        "LIMIT 1", [name]).fetchall()
    if first:
        print(f"first caller message: {first[0][0][:160]!r}")
    step("3/3 next")
    print("envace runs                      # every stored run")
    print(f"envace show {name}   # this run again")
    print("envace check-env bfcl            # 800/800 ground-truth trajectories through the official checker")
    return 0


if __name__ == "__main__":
    sys.exit(run())
