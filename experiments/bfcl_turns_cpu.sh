#!/usr/bin/env bash
# The "learning you can see" recipe (experiments/bfcl_turns_cpu.toml): one SFT checkpoint, a pass-rate screen
# of GRPO's pool with it, then five GRPO arms and a control with the same number of steps from it on the
# screened turns, every arm evaluated on the same 24 BFCL test turns and screened again, plus base and SFT.
# A re-run keeps every run that already completed. TAG names the set (default: turns); STEPS overrides the
# GRPO steps; SEED the seed of the GRPO arms; SFT a checkpoint to start from instead of the SFT stage; ARMS
# picks arms (default: all five and the control, in this order); SCREEN=0 skips the screen (every step then
# draws its turns from the whole pool, and most groups are flat: docs/log/results-earlier.md); the base model's
# evaluation comes last. SFT_TASKS widens the pool: SFT on that many train tasks and GRPO on their turns
# (default: the config's 6); SCREEN_LIMIT is then the number of their turns the screen plays (16 tasks: 53
# turns); POOL_MAX caps the screened pool, spread over as many scenarios as it can (screen_units.py --max).
set -euo pipefail
CONFIG=experiments/bfcl_turns_cpu.toml
ROOT=${ENVACE_RUNS:-runs}
TAG=${TAG:-turns}
SEED=${SEED:-0}
envace() { .venv/bin/envace "$@"; }
done_run() { grep -qs '"status": "completed"' "$ROOT/$1/run.json"; }

if [ -z "${SFT:-}" ]; then  # SFT=CHECKPOINT starts the arms from a checkpoint trained elsewhere
  done_run "sft-$TAG" || envace train "$CONFIG" --run-name "sft-$TAG" --set grpo.steps=0 \
    ${SFT_TASKS:+--set sft.tasks=$SFT_TASKS}
  SFT="$ROOT/sft-$TAG/checkpoint"
fi
done_run "eval-sft-$TAG" || envace eval "$SFT" --config "$CONFIG" --run-name "eval-sft-$TAG"
# The screen samples the pool as GRPO will (experiments/bfcl_turns_screen.toml); a turn whose 8 rewards are all
# equal gives no group a signal, so the arms train on the others, all of them every step.
POOL=(${SFT_TASKS:+--set grpo.tasks=$SFT_TASKS}) SUFFIX=""
SCREENED=(${SCREEN_LIMIT:+--limit $SCREEN_LIMIT})
if [ "${SCREEN:-1}" != 0 ]; then
  done_run "screen-sft-$TAG" || envace rollout --config experiments/bfcl_turns_screen.toml --model "$SFT" \
    --run-name "screen-sft-$TAG" "${SCREENED[@]}"
  UNITS=$(.venv/bin/python experiments/screen_units.py "screen-sft-$TAG" --root "$ROOT" ${POOL_MAX:+--max $POOL_MAX})
  COUNT=$(.venv/bin/python -c 'import json, sys; print(len(json.load(sys.stdin)))' <<<"$UNITS")
  POOL+=(--set "grpo.units=$UNITS" --set "grpo.tasks_per_step=$COUNT")
  SUFFIX=-screened
fi
arm() {  # name, then --set overrides
  local run=$1$SUFFIX-$TAG-s$SEED; shift
  local start=(--run-name "$run")  # a run stopped part-way (Ctrl-C, kill, a session's end) goes on where it stopped
  grep -qs '"status": "interrupted"' "$ROOT/$run/run.json" && start=(--resume "$run")
  done_run "$run" || envace train "$CONFIG" "${start[@]}" --set model="\"$SFT\"" \
    --set sft.tasks=0 --set seed="$SEED" ${STEPS:+--set grpo.steps=$STEPS} "${POOL[@]}" "$@"
  done_run "eval-$run" || envace eval "$ROOT/$run/checkpoint" --config "$CONFIG" --run-name "eval-$run"
  # the screen again with the trained policy (same seed, so the same random draws): did the trained turns'
  # pass rate move, and the other turns'? (experiments/turns_report.py compares it with the SFT's screen)
  [ -z "$SUFFIX" ] || done_run "screen-$run" || envace rollout --config experiments/bfcl_turns_screen.toml \
    --model "$ROOT/$run/checkpoint" --run-name "screen-$run" "${SCREENED[@]}"
}
for name in ${ARMS:-envace caller_only real_env dyna fidelity control}; do
  case $name in
    envace) arm envace ;;
    caller_only) arm caller_only --set grpo.variant=caller_only ;;
    real_env) arm real_env --set grpo.variant=real_env ;;
    dyna) arm dyna --set rollout.real_fraction=0.5 ;;
    fidelity) arm fidelity --set grpo.rehearser_reward='"task+fidelity"' --set rollout.shadow_fraction=1.0 ;;
    # the control: the same steps and random draws with a learning rate too small to move a weight, so its
    # training reward per step is what the draws alone give (caller-only: cheaper, and the same samples)
    control) arm control --set grpo.variant=caller_only --set grpo.lr=1e-12 ;;
    *) echo "unknown arm '$name' (envace caller_only real_env dyna fidelity control)" >&2; exit 2 ;;
  esac
done
done_run "eval-base-$TAG" || envace eval default --config "$CONFIG" --run-name "eval-base-$TAG"
envace runs
