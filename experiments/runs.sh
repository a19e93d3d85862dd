# Sourced by the experiment scripts that share experiments/demo.toml's SFT checkpoint (async_cpu.sh, queue_cpu.sh):
# the runs folder, and the helpers that make a re-run keep each completed run and resume an unfinished one.
CONFIG=experiments/demo.toml
ROOT=${ENVACE_RUNS:-runs}
STEPS=${STEPS:-4}
envace() { .venv/bin/envace "$@"; }
done_run() { grep -qs '"status": "completed"' "$ROOT/$1/run.json"; }
start_or_resume() { if [ -e "$ROOT/$1/run.json" ]; then echo --resume "$1"; else echo --run-name "$1"; fi; }
# the SFT run every arm starts from
done_run async-sft || envace train "$CONFIG" --root "$ROOT" $(start_or_resume async-sft) --set grpo.steps=0
