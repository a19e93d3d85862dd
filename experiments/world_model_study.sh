#!/usr/bin/env bash
# "The world model, measured" (docs/log/results-earlier.md): does GRPO training change the world model, and does
# task+fidelity change it more? From one SFT checkpoint (16 train tasks), the pool screened (its 53 turns) and
# capped at POOL_MAX turns spread over its scenarios, the arms EnvACE, the lr = 1e-12 control, task+fidelity,
# caller-only and real-env, STEPS GRPO steps each, for each seed of SEEDS (experiments/bfcl_turns_cpu.sh: every
# arm is then evaluated on the 24 test turns and screens its pool again). Before and after: the world-model
# benchmark on the gold calls of the first WM_LIMIT BFCL test tasks (20: 130 calls, the same for every
# checkpoint). After the control arm (PRIVATE_AFTER), private rehearsal with the SFT checkpoint and the best arm
# trained so far (most scored episodes on the pool's screen after training) on the 24 test turns: N = 0, 1, 2,
# parallel and sequential, a summary and a transcript memory; once all arms of that seed are in, the best of them
# as well (`private-MEMORY-TAG-ARM`) if it is not the one swept. A re-run keeps every finished run; the tables:
# experiments/world_model_report.py.
#   bash experiments/world_model_study.sh
#   SEEDS=0 STEPS=10 bash experiments/world_model_study.sh   # one seed first
set -euo pipefail
CONFIG=experiments/bfcl_turns_cpu.toml
ROOT=${ENVACE_RUNS:-runs}
TAG=${TAG:-wm}
SEEDS=${SEEDS:-0 1 2}
ARMS=${ARMS:-envace control fidelity caller_only real_env}  # the control early: every arm is read against it
WM_LIMIT=${WM_LIMIT:-20}
envace() { .venv/bin/envace "$@"; }
done_run() { grep -qs '"status": "completed"' "$ROOT/$1/run.json"; }
measure() {  # the world-model benchmark of one checkpoint: wm-NAME
  done_run "wm-$1" || envace world-model "$2" --config "$CONFIG" --limit "$WM_LIMIT" --run-name "wm-$1"
}

FIRST=${SEEDS%% *}
private() {  # private rehearsal with the SFT checkpoint and the best arm trained so far, both memory kinds
  local best
  best=$(.venv/bin/python experiments/world_model_report.py --root "$ROOT" --tag "$TAG" --seed "$1" --best)
  for memory in summary transcript; do
    done_run "private-$memory-$TAG" || envace sweep --name "private-$memory-$TAG" --config "$CONFIG" \
      --models "sft=$ROOT/sft-$TAG/checkpoint,best=$ROOT/$best/checkpoint" --budgets 0,1,2 \
      --modes parallel,sequential --private-memory "$memory"
  done
}
private_best() {  # once every arm of the seed is in: the best arm too, if the sweeps above ran with another one
  local best arm
  best=$(.venv/bin/python experiments/world_model_report.py --root "$ROOT" --tag "$TAG" --seed "$1" --best)
  arm=${best%%-screened-*}
  grep -qs "$best/checkpoint" "$ROOT/private-summary-$TAG/run.json" && return
  for memory in summary transcript; do
    done_run "private-$memory-$TAG-$arm" || envace sweep --name "private-$memory-$TAG-$arm" --config "$CONFIG" \
      --models "$arm=$ROOT/$best/checkpoint" --budgets 0,1,2 --modes parallel,sequential --private-memory "$memory"
  done
}
for seed in $SEEDS; do
  measure "sft-$TAG" "$ROOT/sft-$TAG/checkpoint"
  for arm in $ARMS; do  # one arm at a time, measured as soon as it is trained: what finishes is reported
    TAG=$TAG SEED=$seed SFT_TASKS=16 SCREEN_LIMIT=53 POOL_MAX=${POOL_MAX:-8} STEPS=${STEPS:-10} ARMS=$arm \
      bash experiments/bfcl_turns_cpu.sh
    measure "$arm-screened-$TAG-s$seed" "$ROOT/$arm-screened-$TAG-s$seed/checkpoint"
    # once, on the first seed, as soon as the control is in (the rest of the arms after it)
    if [ "$seed" = "$FIRST" ] && [ "$arm" = "${PRIVATE_AFTER:-control}" ]; then private "$seed"; fi
  done
  if [ "$seed" = "$FIRST" ]; then private_best "$seed"; fi
done
envace runs
