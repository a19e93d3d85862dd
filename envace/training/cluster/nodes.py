"""What every node of a `[train.ray]` run must have, checked before the run folder exists.

A node that runs other code than the driver's, lacks the model, or lacks the vLLM environment its actors
serve with would otherwise fail only inside an actor's or a learner rank's constructor, after the learner has
loaded, as a traceback. `check` sends a small task pinned to each node the placement reserved
(`NodeAffinitySchedulingStrategy`); on the node it reports what that node's own installation holds
(`inspect`), and the driver refuses in one line naming every node that differs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from envace.config import TrainConfig
from envace.errors import UsageError


def code_version(package: Path | None = None) -> str:
    """A hash of the envace package's files (sources and the data they ship) as this process imports them: two
    nodes with the same value run the same code, whether or not either is a git checkout."""
    if package is None:
        import envace

        package = Path(envace.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix != ".pyc"):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(package).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def inspect(model: str, needs_vllm: bool) -> dict[str, Any]:
    """Runs on the node under test: its code version, where its envace lives, and why the model or the vLLM
    environment would fail there (None: it would not)."""
    import envace
    from envace.policy import vllm
    from envace.policy.specs import check_model_spec

    found: dict[str, Any] = {"code": code_version(), "package": str(Path(envace.__file__).resolve().parent),
                             "model": None, "vllm": None}
    try:
        check_model_spec(model)
    except UsageError as exc:
        found["model"] = str(exc)
    if needs_vllm:
        try:
            vllm.python()
        except UsageError as exc:
            found["vllm"] = str(exc)
    return found


def describe(node_id: str) -> str:
    """A node as the refusals name it: its address and the start of its Ray node id."""
    import ray

    address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), "?")
    return f"node {address} ({node_id[:8]})"


def check(cfg: TrainConfig, actor_nodes: list[str], learner_nodes: list[str], timeout_s: float) -> None:
    """Inspect every node hosting an actor or a learner rank (the vLLM environment only where actors serve with
    it); a `UsageError` naming each node that differs from this process."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    vllm_nodes = set(actor_nodes) if cfg.rollout.backend == "vllm" else set()
    task = ray.remote(num_cpus=0)(inspect)  # beside the reserved bundles, which may hold every CPU
    refs = {node: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
            .remote(cfg.model, node in vllm_nodes) for node in dict.fromkeys(actor_nodes + learner_nodes)}
    ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    mine, problems = code_version(), []
    for node, ref in refs.items():
        try:
            found = ray.get(ref, timeout=0)
        except ray.exceptions.GetTimeoutError:
            problems.append(f"{describe(node)} did not answer the node check within {timeout_s:g} s")
            continue
        except ray.exceptions.RayError as exc:  # e.g. a node whose envace predates this check
            cause = " ".join(str(exc).split())[-200:]
            problems.append(f"{describe(node)} could not run the node check (does it run this machine's code?): "
                            f"{cause}")
            continue
        if found["code"] != mine:
            problems.append(f"{describe(node)} runs other code ({found['package']}, version {found['code']}; this "
                            f"machine's is {mine}): install the same commit on every node")
        if found["model"]:
            problems.append(f"{describe(node)} cannot load the model: {found['model']}")
        if found["vllm"]:
            problems.append(f"{describe(node)} hosts a vLLM actor but has {found['vllm']}")
    if problems:
        raise UsageError("[train.ray]: " + "; ".join(problems))
