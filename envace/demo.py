"""`make demo`: the whole pipeline as far as it exists, on the embedded default model.

Today: SmolLM2-135M-Instruct plays BFCL test-split episodes against the real tools in `real+shadow`
mode (the real response is fed back; the same policy, prompted as the environment, rehearses every
call beside it), scored by BFCL's official checker and the checklist reward, stored as Parquet
shards, read back through DuckDB, and summarised as a per-tool world-model fidelity table.
"""

from __future__ import annotations

import sys
import time

from envace.cli import main as envace


def step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run() -> int:
    name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    step("1/4 rollout: the default model acts on 4 BFCL multi_turn_base test episodes against the real tools,\n"
         "    and rehearses every call it makes (real+shadow)")
    print("(first run converts the embedded GGUF to a trainable checkpoint, ~30 s; the caller is shown one\n"
          " worked call from a train task, since a 135M model never calls tools zero-shot)", flush=True)
    rc = envace(["rollout", "--env", "bfcl", "--category", "multi_turn_base", "--split", "test", "--limit", "4",
                 "--mode", "real+shadow", "--model", "default", "--config", "experiments/demo.toml",
                 "--run-name", name])
    if rc:
        return rc
    step("2/4 the stored run, read back through DuckDB")
    envace(["show", name])
    step("3/4 world-model fidelity: real vs rehearsed tool responses, per tool")
    envace(["fidelity", name])
    from envace.store import connect

    con = connect("runs")
    sql = ("SELECT name, real_response, rehearsed_response, structure_f1 FROM pairs WHERE run_id = ? "
           "ORDER BY episode_id, turn, step, call_index LIMIT 3")
    print(f"SQL> {sql}")
    for tool, real, rehearsed, f1 in con.execute(sql, [name]).fetchall():
        print(f"  {tool}\n    real      {real[:90]!r}\n    rehearsed {str(rehearsed)[:90]!r}  (struct F1 {f1:.2f})")
    step("4/4 next")
    print("envace runs                       # every stored run")
    print(f"envace fidelity {name}   # this table again")
    print("envace check-env bfcl             # 800/800 ground-truth trajectories through the official checker")
    print("envace train experiments/smoke.toml   # SFT + role-wise GRPO on the tiny model, ~20 s; on the default")
    print("                                      # model a training row costs about a minute here (docs/benchmarks.md)")
    print("private rehearsal and the app are not built yet")
    return 0


if __name__ == "__main__":
    sys.exit(run())
