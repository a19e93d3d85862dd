#!/usr/bin/env bash
# The prepared device check: one table (experiments/gpu_check.py says what it measures), under 8 minutes on
# one GPU with no network. The device image has torch, transformers and peft; the project also needs trl
# (for its ChatML tool template), carried as a wheel. Before the call, here:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform any -d .whl trl==1.16.0
# then run this script through the device tool with `carry: [".whl"]`; ENVACE_VLLM_PYTHON=<python with vLLM>
# adds the vLLM rows where such an interpreter exists.
set -euo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 ENVACE_HOME=/tmp/envace-home
timeout 480 python3 experiments/gpu_check.py
