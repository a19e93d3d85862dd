#!/usr/bin/env bash
# The prepared device check: one table (experiments/gpu_check.py says what it measures), under 8 minutes on
# one GPU with no network. It needs only what the device image has (torch, transformers, peft) and the
# project's own code, so nothing is carried beside the working tree. Each row is printed as it is measured and
# rows past the script's own budget (--budget-s, 420 s) are skipped, so the timeout below keeps every finished
# row. ENVACE_VLLM_PYTHON=<python with vLLM> adds the vLLM rows where such an interpreter exists. Its CPU
# rehearsal: `make gpu-rehearsal`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 ENVACE_HOME=/tmp/envace-home
timeout 480 python3 experiments/gpu_check.py "$@"
