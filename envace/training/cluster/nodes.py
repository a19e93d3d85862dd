"""What every node of a `[train.ray]` run must have, checked before the run folder exists.

A node that runs other code or other torch, transformers, peft or Ray than the driver's (or another NCCL or vLLM
than the other nodes), lacks the model or holds it cut short, or lacks a vLLM environment that imports would
otherwise fail only inside an actor's or a learner rank's constructor, after the learner has
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


PACKAGES = ("torch", "transformers", "peft", "ray")  # what must match the driver's: they pickle what travels


def versions() -> dict[str, str | None]:
    """This process's versions of `PACKAGES` and the NCCL its torch was built with (None without CUDA)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    import torch

    try:
        nccl = torch.cuda.nccl.version() if torch.version.cuda else None
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else (None if nccl is None else str(nccl))
    except (RuntimeError, AttributeError):  # a CUDA build whose NCCL cannot be read
        out["nccl"] = None
    return out


VLLM_IMPORT_S = 180.0  # the most an `import vllm` may take on a node (a first import compiles its modules)


def vllm_version(timeout_s: float = VLLM_IMPORT_S) -> str:
    """vLLM's version as `.venv-vllm` imports it (a UsageError when it is missing or does not import there)."""
    import subprocess

    from envace.policy import vllm

    try:
        done = subprocess.run([str(vllm.python()), "-c", "import vllm; print(vllm.__version__)"],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UsageError(f"a vLLM environment that did not import vllm within {timeout_s:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1][-200:]
        raise UsageError(f"a vLLM environment that cannot import vllm: {last}")
    return done.stdout.strip().splitlines()[-1]


def inspect(model: str, needs_vllm: bool) -> dict[str, Any]:
    """Runs on the node under test: its code version, where its envace lives, its package versions, and why the
    model (its files, its weights whole) or the vLLM environment (vllm imported there) would fail there (None: it
    would not)."""
    import envace
    from envace.policy.specs import DEFAULT_MODEL, TINY_MODEL, check_model_spec, check_weights, is_remote, model_dir

    found: dict[str, Any] = {"code": code_version(), "package": str(Path(envace.__file__).resolve().parent),
                             "model": None, "vllm": None, "vllm_version": None, "versions": versions()}
    try:
        check_model_spec(model)
        if model not in (TINY_MODEL, DEFAULT_MODEL) and not is_remote(model):  # both built here, not downloaded
            check_weights(model_dir(model))
    except UsageError as exc:
        found["model"] = str(exc)
    if needs_vllm:
        try:
            found["vllm_version"] = vllm_version()
        except UsageError as exc:
            found["vllm"] = str(exc)
    return found


def differences(found: dict[str, dict[str, Any]], mine: dict[str, str | None]) -> list[str]:
    """Per node (`found`: what `inspect` reported, by node), the package versions that differ from this process's
    (`mine`), and the NCCL and vLLM versions that differ between the nodes that have one."""
    out = []
    for node, f in found.items():
        other = [f"{name} {f['versions'].get(name)} (here {mine[name]})" for name in PACKAGES
                 if f["versions"].get(name) != mine[name]]
        if other:
            out.append(f"{describe(node)} has " + ", ".join(other))
    for key, label in (("nccl", "NCCL"), ("vllm_version", "vLLM")):
        seen = {node: (f["versions"] if key == "nccl" else f).get(key) for node, f in found.items()}
        kinds = {v for v in seen.values() if v}
        if len(kinds) > 1:
            out.append(f"the nodes run {label} " + ", ".join(f"{v} ({describe(n)})" for n, v in seen.items() if v))
    return out


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
    timeout_s += VLLM_IMPORT_S if vllm_nodes else 0.0  # beside the check's own time, vLLM imported there
    ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    mine, problems, answered = code_version(), [], {}
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
        if "versions" in found:
            answered[node] = found
    problems += differences(answered, versions())
    if problems:
        raise UsageError("[train.ray]: " + "; ".join(problems))
