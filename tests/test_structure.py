"""The training job's rooms keep their shape: the loop on one screen, one learner for SFT and GRPO, and a Ray
driver that composes the same public pieces instead of borrowing private ones.
"""

import ast
from pathlib import Path

TRAINING = Path("envace/training")


def _calls(path: Path) -> set[str]:
    """The names a module calls: `f(...)` as `f`, `x.f(...)` as `f`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            fn = node.func
            names.add(fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else "")
    return names


def test_the_loop_reads_on_one_screen():
    lines = (TRAINING / "loop.py").read_text().splitlines()
    assert len(lines) <= 150, f"envace/training/loop.py has {len(lines)} lines: keep the loop on one screen"


def _imported(path: Path, module: str) -> set[str]:
    return {a.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)
            and node.module == module for a in node.names}


def test_sft_and_grpo_both_update_through_the_learner():
    """Only `learner.py` takes the update functions of `grpo.py` (the loss, its backward pass, the optimiser
    step): SFT calls `Learner.sft_step`, GRPO `Learner.step`."""
    for path in sorted(TRAINING.rglob("*.py")):
        if path.name != "learner.py":
            taken = _imported(path, "envace.training.grpo") & {"grpo_step", "backward"}
            assert not taken, f"{path} updates the model outside the learner ({taken})"
    assert "sft_step" in _calls(TRAINING / "sft.py")
    assert "step" in _calls(TRAINING / "loop.py")


def test_the_ray_driver_and_workers_import_no_private_name():
    for path in (TRAINING / "cluster").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("envace"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path} imports {private} from {node.module}"
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and isinstance(node.value, ast.Name) and node.value.id not in ("self", "cls"):
                raise AssertionError(f"{path}:{node.lineno} reaches into {node.value.id}.{node.attr}")


def test_the_architecture_page_stays_short():
    size = len(Path("docs/architecture.md").read_bytes())
    assert size <= 8192, f"docs/architecture.md is {size} bytes: keep it ≤ 8 KB (details belong in docstrings)"
