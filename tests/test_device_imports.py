"""The training job imports on the GPU machine's image: torch, transformers, peft, accelerate, safetensors, pyarrow
and pandas (with what they depend on), and the wheels `experiments/device-wheels.txt` names, but no duckdb, ray,
vllm, trl, datasets, gradio nor benchmark packages.

A fresh interpreter of this virtualenv runs with every other installed distribution made unimportable by a
`sys.meta_path` finder, so an import that only this machine satisfies fails here as it would there.
"""

from __future__ import annotations

import importlib.metadata as md
import json
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
BLOCK = """
import importlib.abc, json, sys
absent = set(json.loads(sys.argv[1]))
class Absent(importlib.abc.MetaPathFinder):  # not on the device image
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in absent:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the device image)", name=name)
sys.meta_path.insert(0, Absent())
import importlib
for module in sys.argv[2:]:
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
    done = subprocess.run([sys.executable, "-c", BLOCK, json.dumps(absent), *modules], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr[-3000:]
