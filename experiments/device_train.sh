#!/usr/bin/env bash
# The device training check: `envace train`'s own job on one GPU (a random-init Qwen3-1.7B, the example shop,
# LoRA, tree packing at 16,384 tokens, sync / resume / staleness-1 runs, merge + reload, recompiles, the log-prob
# gap), one table printed as it goes, exit 1 when a row failed (experiments/device_train.py says what each row
# checks). Under 10 minutes on one H100 or H200, no network, only the device image's packages plus the wheels
# experiments/device-wheels.txt names: when it names any, run `make device-wheels` here and carry
# experiments/wheels (git ignores it) with the working tree; they are installed into a folder on PYTHONPATH only
# where missing. Files go under $OUT when it is set. CPU rehearsal (tiny shapes, same checks): `--cpu`
# (tests/test_gpu_rehearsal.py runs it with the packages the device lacks made unimportable).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 ENVACE_HOME=${ENVACE_HOME:-/tmp/envace-home}

missing=$("$PYTHON" - experiments/device-wheels.txt <<'PY'
import importlib.metadata as md, re, sys
for line in open(sys.argv[1]):
    name = re.split(r"[=<>!~\[; @]", line.split("#", 1)[0].strip())[0]
    try:
        name and md.distribution(name)
    except md.PackageNotFoundError:
        print(name)
PY
)
if [ -n "$missing" ]; then
  wheels=(experiments/wheels/*.whl)
  if [ ! -e "${wheels[0]}" ]; then
    echo "device_train: missing $(echo $missing) and no experiments/wheels (run make device-wheels, carry it)" >&2
    exit 2
  fi
  target=${TMPDIR:-/tmp}/envace-device-wheels
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$target" "${wheels[@]}"
  export PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}"
fi

status=0
timeout 570 "$PYTHON" experiments/device_train.py "$@" || status=$?
# a run cut short by the timeout leaves its weights behind: the table and logs come back from $OUT, not gigabytes
if [ -n "${OUT:-}" ]; then
  find "$OUT" -path '*device-train-*' \( -name '*.safetensors' -o -name '*.pt' \) -delete 2>/dev/null || true
fi
exit $status
