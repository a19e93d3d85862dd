"""A `[train.ray]` run is refused in one line, exit 2, before its run folder exists: GPU shares that NCCL ranks and
vLLM cannot use, a placement the cluster cannot hold, and a node that differs from the driver's machine.

The cluster is real: two Ray nodes on loopback (`ray.cluster_utils.Cluster`), each with one GPU's worth of Ray
resource (the GPUs are never touched: every run here is refused before anything loads). The second node is
another installation: its workers import envace from a copy of the package (their raylet's PYTHONPATH, as a node
whose project lives elsewhere), a project root without `.venv-vllm`, and read an HF cache of their own.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
from ray_cluster import loopback_cluster

from envace.cli import main

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "experiments" / "smoke.toml")
# an actor on each node (their nodes are the ones checked), a learner rank beside one of them
SPREAD = ["ray.actors=2", "ray.actor_placement=STRICT_SPREAD", "ray.actor_cpus=0.5", "ray.learner_cpus=0.5",
          "grpo.steps=1"]


def _refused(capsys, root: Path, address: str, *settings: str) -> str:
    """The one line a refused `envace train --ray ADDRESS` printed; the run root holds no run folder."""
    assert main(["train", SMOKE, "--root", str(root), "--ray", address,
                 *(a for s in settings for a in ("--set", s))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not root.exists() or not any(root.iterdir()), sorted(p.name for p in root.iterdir())
    return err[0]


def _closed_port() -> int:
    with socket.socket() as sock:  # a port nothing listens on: joining it would be refused too, but later
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("settings, says", [
    (["ray.learner_gpus=0.5"], "ray.learner_gpus: a learner rank trains on one GPU (0 or 1"),
    (["ray.learner_gpus=2"], "ray.learner_gpus: a learner rank trains on one GPU (0 or 1"),
    (["rollout.backend=vllm", "ray.actor_gpus=1.5"], "ray.actor_gpus: an actor's vLLM server takes whole GPUs"),
])
def test_gpu_shares_no_rank_or_server_can_use_are_refused_by_the_config(tmp_path, capsys, settings, says):
    line = _refused(capsys, tmp_path / "runs", f"127.0.0.1:{_closed_port()}", *settings)
    assert says in line


def _weights(path: Path, tensors: int = 1) -> Path:
    import torch
    from safetensors.torch import save_file

    save_file({f"w{i}": torch.arange(64, dtype=torch.float32) for i in range(tensors)}, str(path))
    return path


def test_a_model_whose_weights_are_cut_short_or_missing_is_refused(tmp_path):
    """`specs.check_weights`, run on every node: a file shorter than its header says, a shard its index names
    that is not there, no weights at all; a whole model passes."""
    import json

    from envace.errors import UsageError
    from envace.policy.specs import check_weights

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="no weights"):
        check_weights(tmp_path)
    whole = _weights(tmp_path / "model-00001-of-00002.safetensors", tensors=2)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"w0": whole.name, "w1": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(UsageError, match="1 of the 2 weight files its index names are missing"):
        check_weights(tmp_path)
    _weights(tmp_path / "model-00002-of-00002.safetensors")
    check_weights(tmp_path)
    data = whole.read_bytes()
    whole.write_bytes(data[:-100])  # a download cut off before its end
    with pytest.raises(UsageError, match=f"cut short, {len(data) - 100:,} of its {len(data):,} bytes"):
        check_weights(tmp_path)


def test_nodes_with_other_package_nccl_or_vllm_versions_are_named(monkeypatch):
    import ray

    from envace.training.cluster import nodes

    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": n * 8, "NodeManagerAddress": f"10.0.0.{i}"}
                                               for i, n in enumerate("abc")])
    mine = {"torch": "2.13.0", "transformers": "5.17.0", "peft": "0.21.2", "ray": "2.60.0", "nccl": None}
    same = {"versions": {**mine, "nccl": "2.27.3"}, "vllm_version": "0.33.0"}
    found = {"a" * 8: same, "b" * 8: {"versions": {**mine, "transformers": "5.24.0", "nccl": "2.26.2"},
                                      "vllm_version": "0.33.0"},
             "c" * 8: {"versions": {**mine, "nccl": "2.27.3"}, "vllm_version": "0.32.0"}}
    said = nodes.differences(found, mine)
    assert said[0] == "node 10.0.0.1 (bbbbbbbb) has transformers 5.24.0 (here 5.17.0)"
    assert said[1].startswith("the nodes run NCCL 2.27.3 (node 10.0.0.0 (aaaaaaaa)), 2.26.2 (node 10.0.0.1")
    assert said[2].startswith("the nodes run vLLM 0.33.0") and "0.32.0 (node 10.0.0.2 (cccccccc))" in said[2]
    assert nodes.differences({"a" * 8: same}, mine) == []


def test_a_vllm_environment_that_does_not_import_vllm_is_named(monkeypatch, tmp_path):
    import sys

    from envace.errors import UsageError
    from envace.training.cluster import nodes

    monkeypatch.setenv("ENVACE_VLLM_PYTHON", sys.executable)  # an interpreter that exists, without vLLM
    with pytest.raises(UsageError, match="a vLLM environment that cannot import vllm: .*No module named 'vllm'"):
        nodes.vllm_version()


def _hf_cache(root: Path, repo: str | None) -> Path:
    """An HF hub cache holding `repo`'s config.json, as a download leaves it (None: an empty cache)."""
    if repo is not None:
        folder, revision = root / f"models--{repo.replace('/', '--')}", "0" * 40
        (folder / "snapshots" / revision).mkdir(parents=True)
        (folder / "snapshots" / revision / "config.json").write_text("{}")
        _weights(folder / "snapshots" / revision / "model.safetensors")
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(revision)
    root.mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, the second node's Ray node id, its copy of the envace package, the first node's HF cache)."""
    here = tmp_path_factory.mktemp("nodes")
    other = here / "other-project"
    shutil.copytree(REPO / "envace", other / "envace", ignore=shutil.ignore_patterns("__pycache__"))
    head_cache, other_cache = _hf_cache(here / "hf-head", "envace-test/tiny"), _hf_cache(here / "hf-other", None)
    gpu = {"num_cpus": 2, "num_gpus": 2}
    with loopback_cluster({**gpu, "env_vars": {"HF_HUB_CACHE": str(head_cache)}},
                          {**gpu, "env_vars": {"PYTHONPATH": str(other), "HF_HUB_CACHE": str(other_cache)}}) \
            as (address, (_, second)):
        yield address, second, other / "envace", head_cache


@pytest.fixture
def driver(cluster, tmp_path, monkeypatch):
    """The cluster's address, with this process where a user's driver would be: outside the project (Ray puts the
    driver's working directory first on every worker's path, which would hide the second node's own copy)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENVACE_VLLM_PYTHON", raising=False)
    return cluster[0]


@pytest.mark.heavy
def test_a_placement_the_cluster_cannot_hold_leaves_no_run_folder(driver, tmp_path, capsys):
    line = _refused(capsys, tmp_path / "runs", driver, "ray.actor_gpus=8")
    assert "8 GPU" in line and "the cluster has 4" in line


@pytest.mark.heavy
def test_vllm_actors_without_gpus_on_a_cluster_with_gpus_are_refused(driver, tmp_path, capsys):
    line = _refused(capsys, tmp_path / "runs", driver, "rollout.backend=vllm", "ray.actor_gpus=0")
    assert "ray.actor_gpus = 1 or more" in line and "Ray does not account for" in line


@pytest.mark.heavy
def test_a_node_without_the_vllm_environment_is_named(driver, cluster, tmp_path, capsys):
    line = _refused(capsys, tmp_path / "runs", driver, "rollout.backend=vllm", "ray.actor_gpus=1", *SPREAD)
    assert f"({cluster[1][:8]}) hosts a vLLM actor but has no vLLM environment at " in line
    assert "other-project/.venv-vllm/bin/python" in line and line.count("hosts a vLLM actor") == 1


@pytest.mark.heavy
def test_a_node_running_other_code_is_named(driver, cluster, tmp_path, capsys):
    changed = cluster[2] / "config.py"
    original = changed.read_text()
    changed.write_text(original + "# edited on one node only\n")
    try:
        line = _refused(capsys, tmp_path / "runs", driver, *SPREAD)
    finally:
        changed.write_text(original)
    assert f"({cluster[1][:8]}) runs other code ({cluster[2]}, version " in line
    assert line.count("runs other code") == 1


@pytest.mark.heavy
def test_a_model_missing_on_a_node_is_named(driver, cluster, tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cluster[3]))  # the driver's cache is the first node's
    line = _refused(capsys, tmp_path / "runs", driver, "model=envace-test/tiny", *SPREAD)
    assert f"({cluster[1][:8]}) cannot load the model: model 'envace-test/tiny' is neither" in line
    assert line.count("cannot load the model") == 1


@pytest.mark.parametrize("reserved, sees", [([], ""), (["3"], "3"), (["1", "5"], "1,5")])
def test_every_worker_sees_only_the_gpus_ray_reserved_for_it(monkeypatch, reserved, sees):
    """Ray leaves CUDA_VISIBLE_DEVICES alone for a worker granted no GPU (since 2.4x), so a CPU actor or learner
    rank saw every GPU of its node (here the node's "0,1,2,3") and put its model on cuda:0. Both workers set it
    from what Ray reserved before anything else runs (`workers.see_reserved_gpus`)."""
    import ray

    from envace.config import TrainConfig
    from envace.training.cluster import workers

    context = type("Context", (), {"get_accelerator_ids": lambda self: {"GPU": reserved, "TPU": []}})()
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    seen = {}

    def build_policy(cfg, **_):
        seen["actor"] = os.environ["CUDA_VISIBLE_DEVICES"]
        raise RuntimeError("stop here")

    monkeypatch.setattr(workers, "build_policy", build_policy)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with pytest.raises(RuntimeError, match="stop here"):
        workers.ActorWorker(TrainConfig(model="tiny"), 0)
    assert seen["actor"] == sees
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    workers.LearnerRank(TrainConfig(model="tiny"), 0, 1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == sees


@pytest.mark.heavy
def test_the_learner_is_packed_on_as_few_nodes_as_hold_it_before_the_actors_spread(driver):
    """The module's 2 nodes of 2 (simulated) GPUs, 2 actors spread, 2 learner ranks of one GPU: the learner is
    reserved first and packed on one node, the actors on the other. Reserved together, the spread actors could take a
    GPU of each node first and push the learner's ranks, and each of its all-reduces, across both."""
    import ray

    from envace.config import RayConfig
    from envace.training.cluster.placement import place

    ray.init(address=driver, logging_level="ERROR")
    try:
        rc = RayConfig(address=driver, actors=2, actor_cpus=0.5, actor_gpus=1, actor_placement="SPREAD",
                       learners=2, learner_cpus=0.5, learner_gpus=1)
        placement = place(rc)
        actors, learners = placement.nodes()
        placement.remove()
    finally:
        ray.shutdown()
    assert len(learners) == 2 and len(set(learners)) == 1
    assert len(actors) == 2 and not set(actors) & set(learners)  # the actors on the node left
