#!/usr/bin/env bash
# base vs SFT vs SFT+EnvACE vs SFT+caller-only vs SFT+real-env GRPO at equal steps, on BFCL test
# scenarios, with experiments/bfcl_smollm_cpu.toml. Every arm's evaluation is an `envace rollout` run
# (real environment, rehearser as shadow, greedy) named eval-<arm>; `envace runs` lists them.
set -euo pipefail
CONFIG=experiments/bfcl_smollm_cpu.toml
ROOT=${ENVACE_RUNS:-runs}
TAG=${TAG:-cpu}
envace() { .venv/bin/envace "$@"; }

envace rollout --config "$CONFIG" --model default --run-name "eval-base-$TAG"
envace train "$CONFIG" --run-name "sft-$TAG" --set grpo_steps=0 --set eval_every=0
SFT="$ROOT/sft-$TAG/checkpoint"
envace rollout --config "$CONFIG" --model "$SFT" --run-name "eval-sft-$TAG"
for VARIANT in envace caller_only real_env; do
  envace train "$CONFIG" --run-name "$VARIANT-$TAG" --set model=\""$SFT"\" --set sft_tasks=0 \
    --set variant="$VARIANT" --set eval_every=0
  envace rollout --config "$CONFIG" --model "$ROOT/$VARIANT-$TAG/checkpoint" --run-name "eval-$VARIANT-$TAG"
done
envace runs
