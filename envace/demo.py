"""`make demo`: the whole pipeline as far as it exists, on the embedded default model.

1. SmolLM2-135M-Instruct plays BFCL test-split episodes against the real tools in `real+shadow` mode
   (the real response is fed back; the same policy, prompted as the environment, rehearses every call
   beside it), scored by BFCL's official checker and the checklist reward, stored as Parquet shards.
2. The run is read back through DuckDB: summary and per-tool world-model fidelity; then the world-model
   benchmark on a handful of gold calls (the same model rehearses each in its real, recorded context).
3. Training: a LoRA SFT warm-up on train-split reference rows, then one role-wise GRPO step in the
   rehearsed world (no environment in the loop), on turn-level episodes: the gold prefix is replayed and
   the policy plays each of 3 train turns G = 4 times, so a group's rewards can differ.
4. The trained checkpoint is evaluated with private rehearsal: one imagined attempt per user turn,
   condensed into a memory (a transcript of the attempt: a 135M model cannot summarise), then one committed
   real execution.
5. The command that opens the app (`envace app`) on the rollout, and what else to try.
"""

from __future__ import annotations

import sys
import time

from envace.cli import main as envace


def step(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run() -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name, trained, private = f"demo-{stamp}", f"demo-train-{stamp}", f"demo-private-{stamp}"
    measured = f"demo-world-model-{stamp}"
    step("1/5 rollout: the default model acts on 3 BFCL multi_turn_base test episodes against the real tools,\n"
         "    and rehearses every call it makes (real+shadow)")
    print("(first run converts the embedded GGUF to a trainable checkpoint, ~30 s; the caller is shown one\n"
          " worked call from a train task, since a 135M model never calls tools zero-shot)", flush=True)
    rc = envace(["rollout", "--env", "bfcl", "--category", "multi_turn_base", "--split", "test", "--limit", "3",
                 "--mode", "real+shadow", "--model", "default", "--config", "experiments/demo.toml",
                 "--run-name", name])
    if rc:
        return rc
    step("2/5 the stored run, read back through DuckDB: world-model fidelity per tool")
    envace(["fidelity", name])
    from envace.store import connect

    con = connect("runs")
    sql = ("SELECT name, real_response, rehearsed_response, structure_f1 FROM pairs WHERE run_id = ? "
           "ORDER BY episode_id, turn, turn_step, call_index LIMIT 3")
    print(f"SQL> {sql}")
    for tool, real, rehearsed, f1 in con.execute(sql, [name]).fetchall():
        print(f"  {tool}\n    real      {real[:90]!r}\n    rehearsed {str(rehearsed)[:90]!r}  (struct F1 {f1:.2f})")
    print("\nThe world-model benchmark: the gold calls of the first user turn of 2 test tasks, each rehearsed by the "
          "model\nin its real context (the scripted reference caller plays the gold; the real tools answer)")
    rc = envace(["world-model", "default", "--env", "bfcl", "--category", "multi_turn_base", "--split", "test",
                 "--limit", "2", "--turns", "0", "--config", "experiments/demo.toml", "--run-name", measured])
    if rc:
        return rc
    step("3/5 training: LoRA SFT warm-up on 2 train tasks, then one role-wise GRPO step in the rehearsed world\n"
         "    on turn-level episodes (gold prefix replayed, 3 train turns × G = 4)")
    rc = envace(["train", "experiments/demo.toml", "--run-name", trained])
    if rc:
        return rc
    step("4/5 private rehearsal: the trained policy imagines each user turn once, keeps a transcript of the attempt\n"
         "    as its memory, then acts for real")
    rc = envace(["eval", f"runs/{trained}/checkpoint", "--config", "experiments/bfcl_smollm_cpu.toml", "--limit", "2",
                 "--private", "parallel", "--budget", "1", "--private-memory", "transcript", "--run-name", private])
    if rc:
        return rc
    con = connect("runs")
    sql = ("SELECT episode_id, turn, memory, memory_error, private_tokens FROM (SELECT m.*, m.caller_tokens + "
           "m.rehearser_tokens + m.summariser_tokens AS private_tokens FROM memories m) WHERE run_id = ? "
           "ORDER BY episode_id, turn LIMIT 3")
    print(f"SQL> {sql}")
    for episode, turn, memory, error, tokens in con.execute(sql, [private]).fetchall():
        print(f"  {episode} turn {turn}: {tokens} private tokens, memory {memory[:160]!r}"
              + (f" ({error})" if error else ""))
    step("5/5 open the app on the result")
    print(f".venv/bin/envace app --root runs             # then http://127.0.0.1:7860/?run={name}")
    print("envace runs                                   # every stored run")
    print(f"envace show {trained}            # the training run")
    print(f"envace world-model runs/{trained}/checkpoint --limit 2 --turns 0 --config experiments/demo.toml\n"
          f"envace world-model-compare {measured} RUN   # did training change the world model? (paired by call)")
    print("envace sweep --name s --models base=default --budgets 0,1,2 --config experiments/bfcl_smollm_cpu.toml")
    print("python -c \"from workbench import Workbench; print(Workbench('runs').episodes())\"  # the workbench API")
    print("make lab                                      # the notebooks: launch runs, SQL over pairs")
    return 0


if __name__ == "__main__":
    sys.exit(run())
