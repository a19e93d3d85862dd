#!/usr/bin/env bash
# The private-rehearsal ladder on this CPU: why one imagined attempt lowered the 135M policy's checklist
# (docs/results.md). On the study's seed-0 SFT and EnvACE checkpoints (`envace study experiments/private_cpu.toml`
# trains them: runs/private_cpu-sft-n12-s0, runs/private_cpu-envace-s0), each model plays the 117 1-call BFCL
# multi_turn_base test turns once per rung, with the evaluation of [rollout] in experiments/private_cpu.toml (greedy,
# the real environment answering, a vLLM-CPU server): N = 0, the empty memory block, the reference memory (this
# turn's gold), the real-world memory (the imagined attempt on a copy of the real state), today's rehearsed memory
# (N = 1, parallel) and select; every rung paired with N = 0 and with the rehearsed memory, turn by turn.
#   bash experiments/private_ladder_cpu.sh             # refuses until both checkpoints exist
#   WAIT=1 bash experiments/private_ladder_cpu.sh      # waits for the study to complete, then runs
# A re-run keeps every finished cell and plays the others: stop it (Ctrl-C, kill) and start it again at will.
# The memory-aware SFT checkpoint (runs/private_cpu-sft-n12-memref-s0) joins as a third model once its run has
# completed. SEEDS (default 0; e.g. "0,1,2") adds seeds to the rungs that sample; RUNGS picks rungs (default: all);
# MODELS replaces the models (LABEL=RUN,...); NAME names the ladder (default private_cpu-ladder); ENVACE_RUNS the
# runs folder. The tables: `envace show $NAME` (and $ROOT/$NAME/ladder.csv, diagnosis.csv).
set -euo pipefail
CONFIG=experiments/private_cpu.toml
ROOT=${ENVACE_RUNS:-runs}
NAME=${NAME:-private_cpu-ladder}
SEEDS=${SEEDS:-0}
STUDY=private_cpu
done_run() { grep -qs '"status": "completed"' "$ROOT/$1/run.json"; }

if [ "${WAIT:-0}" = 1 ]; then  # the study and the ladder would share the two cores: one after the other
  until done_run "$STUDY"; do
    echo "$(date +%H:%M) waiting for the study $ROOT/$STUDY to complete …"
    sleep 300
  done
fi
if [ -z "${MODELS:-}" ]; then
  MODELS=sft=$ROOT/$STUDY-sft-n12-s0,envace=$ROOT/$STUDY-envace-s0
  # the memory-aware SFT of the same tasks and seed ([train.sft] memory = "reference"), once it is trained: a re-run
  # adds its cells to the ladder's table
  if done_run "$STUDY-sft-n12-memref-s0"; then
    MODELS+=,sft_memref=$ROOT/$STUDY-sft-n12-memref-s0
  fi
fi
for model in ${MODELS//,/ }; do
  run=${model#*=}
  if [ -f "$run/run.json" ] && [ ! -f "$run/checkpoint/config.json" ]; then
    echo "no checkpoint in $run yet: let \`envace study $CONFIG\` train it (or run with WAIT=1)" >&2
    exit 2
  fi
done
exec .venv/bin/envace private-ladder --name "$NAME" --config "$CONFIG" --root "$ROOT" --models "$MODELS" \
  --seeds "$SEEDS" ${RUNGS:+--rungs "$RUNGS"}
