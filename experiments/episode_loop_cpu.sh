#!/usr/bin/env bash
# Lock-step vs per-episode rollouts, side by side on this CPU with the vLLM-CPU backend (issue #49): the same BFCL
# test tasks played greedily by the default model through its own vLLM server, once per entry of ORDER (default
# A B B A, so neither loop always runs first on a cold machine), one after the other; then, per run and per loop,
# from the store: the run's wall time (first episode start to last episode end), the idle share of episode slots
# (SUM(wait_s) / SUM(wall_s): an episode's time finished inside a backend call while others still generated, or
# held out of a phase it had no part in), the engine-round idle share (1 − Σ caller messages / (episodes × the
# longest), what lock-step rounds would leave empty if every message cost the same) and the tokens generated.
#   bash experiments/episode_loop_cpu.sh      # LIMIT tasks (default 8) in one batch, MAX_NEW_TOKENS (default 128),
#                                             # ROOT (default runs/), ORDER (default "lockstep per_episode
#                                             # per_episode lockstep")
# Each run is its own (names carry the time and the position in ORDER); nothing is replaced.
set -euo pipefail
ROOT=${ROOT:-runs}
LIMIT=${LIMIT:-8}
TOKENS=${MAX_NEW_TOKENS:-128}
ORDER=${ORDER:-lockstep per_episode per_episode lockstep}
STAMP=$(date +%Y%m%d-%H%M%S)
PY=${PY:-.venv/bin/python}
i=0
for loop in $ORDER; do
  i=$((i + 1))
  $PY -m envace.cli rollout --backend vllm --model default --category multi_turn_base --limit "$LIMIT" \
    --batch-size "$LIMIT" --max-new-tokens "$TOKENS" --max-steps-per-turn 2 --tool-docs compact --mode real \
    --episode-loop "$loop" --root "$ROOT" --run-name "loop-$STAMP-$i-$loop"
done
$PY - "$ROOT" "$STAMP" <<'EOF'
import sys

from envace.store import connect

root, stamp = sys.argv[1], sys.argv[2]
con = connect(root)
runs = [r for (r,) in con.execute("SELECT run_id FROM runs WHERE run_id LIKE ? ORDER BY run_id", [f"loop-{stamp}-%"])
        .fetchall()]
print(f"{'run':<40} {'run wall s':>10} {'idle share':>10} {'round idle':>10} {'tokens':>7}")
by_loop: dict[str, list[float]] = {}
for run in runs:
    span, wait, wall = con.execute("SELECT max(ended_at) - min(started_at), sum(wait_s), sum(wall_s) FROM episodes "
                                   "WHERE run_id = ?", [run]).fetchall()[0]
    msgs = [n for (n,) in con.execute("SELECT count(*) FROM generations WHERE run_id = ? AND role = 'caller' "
                                      "GROUP BY episode_id", [run]).fetchall()]
    tokens = con.execute("SELECT sum(len(completion_ids)) FROM generations WHERE run_id = ?", [run]).fetchall()[0][0]
    rounds = 1 - sum(msgs) / (len(msgs) * max(msgs))
    print(f"{run:<40} {span:>10.1f} {wait / wall:>10.1%} {rounds:>10.1%} {tokens:>7}")
    by_loop.setdefault(run.rsplit("-", 1)[1], []).append(span)
for loop, spans in by_loop.items():
    print(f"{loop}: mean run wall {sum(spans) / len(spans):.1f} s over {len(spans)} run(s)")
if {"lockstep", "per_episode"} <= by_loop.keys():
    ratio = (sum(by_loop["lockstep"]) / len(by_loop["lockstep"])) / (sum(by_loop["per_episode"]) /
                                                                     len(by_loop["per_episode"]))
    print(f"lock-step / per-episode wall: {ratio:.2f}x")
EOF
