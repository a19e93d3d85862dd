#!/usr/bin/env bash
# The "learning you can see" recipe (experiments/bfcl_turns_cpu.toml): one SFT checkpoint, then five GRPO arms
# with the same number of steps from it, every arm evaluated on the same 24 BFCL test turns, plus base and SFT.
# A re-run keeps every run that already completed. TAG names the set (default: turns); STEPS overrides the
# GRPO steps; SEED the seed of the GRPO arms; SFT a checkpoint to start from instead of the SFT stage; ARMS picks arms (default: all five, in this order);
# the base model's evaluation comes last.
set -euo pipefail
CONFIG=experiments/bfcl_turns_cpu.toml
ROOT=${ENVACE_RUNS:-runs}
TAG=${TAG:-turns}
SEED=${SEED:-0}
envace() { .venv/bin/envace "$@"; }
done_run() { grep -qs '"status": "completed"' "$ROOT/$1/run.json"; }

if [ -z "${SFT:-}" ]; then  # SFT=CHECKPOINT starts the arms from a checkpoint trained elsewhere
  done_run "sft-$TAG" || envace train "$CONFIG" --run-name "sft-$TAG" --set grpo_steps=0
  SFT="$ROOT/sft-$TAG/checkpoint"
fi
done_run "eval-sft-$TAG" || envace eval "$SFT" --config "$CONFIG" --run-name "eval-sft-$TAG"
arm() {  # name, then --set overrides
  local name=$1; shift
  done_run "$name-$TAG-s$SEED" || envace train "$CONFIG" --run-name "$name-$TAG-s$SEED" --set model="\"$SFT\"" \
    --set sft_tasks=0 --set seed="$SEED" ${STEPS:+--set grpo_steps=$STEPS} "$@"
  done_run "eval-$name-$TAG-s$SEED" || envace eval "$ROOT/$name-$TAG-s$SEED/checkpoint" --config "$CONFIG" \
    --run-name "eval-$name-$TAG-s$SEED"
}
for name in ${ARMS:-envace caller_only real_env dyna fidelity}; do
  case $name in
    envace) arm envace ;;
    caller_only) arm caller_only --set variant=caller_only ;;
    real_env) arm real_env --set variant=real_env ;;
    dyna) arm dyna --set rollout.real_fraction=0.5 ;;
    fidelity) arm fidelity --set rehearser_reward='"task+fidelity"' --set rollout.shadow_fraction=1.0 ;;
    *) echo "unknown arm '$name' (envace caller_only real_env dyna fidelity)" >&2; exit 2 ;;
  esac
done
done_run "eval-base-$TAG" || envace eval default --config "$CONFIG" --run-name "eval-base-$TAG"
envace runs
