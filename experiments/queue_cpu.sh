#!/usr/bin/env bash
# The work queue across two Ray actors, synchronous against one step ahead (and one step ahead with partial
# rollouts), on this machine: each actor with its own vLLM-CPU server, one learner rank, a local Ray cluster per run
# (`--ray`). The recipe is experiments/async_cpu.sh's (experiments/demo.toml's [train]: the default model, LoRA,
# single-call turn units, 3 groups of G = 4 a step, so the queue has more groups than actors; every arm samples at
# temperature 1, caller and rehearser, as the importance correction of the staleness arms needs), from the same SFT
# checkpoint (runs/async-sft: made here when missing). The arms run in the order A B C, then C B A, so each arm has a
# run early and late on the machine; then one table (experiments/async_report.py, which also draws
# docs/figures/queue_cpu.html). A re-run keeps every run that completed and resumes one that did not.
# STEPS sets the GRPO steps (default 4); ENVACE_RUNS the runs folder.
set -euo pipefail
source experiments/runs.sh  # CONFIG, ROOT, STEPS, envace, done_run, start_or_resume; the SFT run
arm() {  # NAME K PARTIAL
  done_run "$1" || envace train "$CONFIG" --root "$ROOT" --ray $(start_or_resume "$1") \
    --set model="$ROOT/async-sft/checkpoint" --set sft.tasks=0 --set grpo.steps="$STEPS" \
    --set rollout.backend=vllm --set rollout.shadow_fraction=1.0 --set grpo.rehearser_reward=task+fidelity \
    --set grpo.importance_cap=2.0 --set rollout.temperature=1.0 --set rollout.rehearser.temperature=1.0 \
    --set grpo.max_staleness="$2" --set grpo.partial_rollouts="$3" \
    --set ray.actors=2 --set ray.actor_cpus=0.5 --set ray.learners=1 --set ray.learner_cpus=0.5
}
arm queue-sync-a 0 false
arm queue-ahead1-a 1 false
arm queue-partial-a 1 true
arm queue-partial-b 1 true
arm queue-ahead1-b 1 false
arm queue-sync-b 0 false
.venv/bin/python experiments/async_report.py --root "$ROOT" --figure docs/figures/queue_cpu.html \
  queue-sync-a queue-sync-b queue-ahead1-a queue-ahead1-b queue-partial-a queue-partial-b
