#!/usr/bin/env bash
# base vs SFT vs SFT+EnvACE vs SFT+caller-only vs SFT+real-env GRPO at equal steps, on BFCL test
# scenarios, with experiments/bfcl_smollm_cpu.toml. Every arm's evaluation is an `envace rollout` run
# (real environment, rehearser as shadow, greedy) named eval-<arm>; `envace runs` lists them.
set -euo pipefail
CONFIG=experiments/bfcl_smollm_cpu.toml
ROOT=${ENVACE_RUNS:-runs}
TAG=${TAG:-cpu}
envace() { .venv/bin/envace "$@"; }
# A re-run skips every step whose run already completed.
done_run() { grep -qs '"status": "completed"' "$ROOT/$1/run.json"; }

done_run "eval-base-$TAG" || envace eval default --config "$CONFIG" --run-name "eval-base-$TAG"
done_run "sft-$TAG" || envace train "$CONFIG" --run-name "sft-$TAG" --set grpo.steps=0 --set eval.every=0
SFT="$ROOT/sft-$TAG/checkpoint"
done_run "eval-sft-$TAG" || envace eval "$SFT" --config "$CONFIG" --run-name "eval-sft-$TAG"
for VARIANT in envace caller_only real_env; do
  done_run "$VARIANT-$TAG" || envace train "$CONFIG" --run-name "$VARIANT-$TAG" --set model=\""$SFT"\" \
    --set sft.tasks=0 --set grpo.variant="$VARIANT" --set eval.every=0
  done_run "eval-$VARIANT-$TAG" || envace eval "$ROOT/$VARIANT-$TAG/checkpoint" --config "$CONFIG" \
    --run-name "eval-$VARIANT-$TAG"
done
envace runs
