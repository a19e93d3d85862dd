"""Memory per GPU: a vLLM server takes 0.4 of a GPU it shares with a trainer and 0.88 of GPUs it has to itself
(`serving.gpu_memory = "auto"`); a Ray actor's server is tensor parallel over every GPU the actor was given, and
the actor's own copy of the model stays in host memory beside it (the GPU path is mocked: this machine has none)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from envace.config import OWNED_GPU, SHARED_GPU, ServingConfig, TrainConfig
from envace.errors import UsageError


def test_auto_takes_the_shared_or_the_owned_share_and_a_number_is_taken_as_given():
    assert ServingConfig().gpu_memory == "auto"
    assert ServingConfig().share(shares_gpu=True) == SHARED_GPU == 0.4
    assert ServingConfig().share(shares_gpu=False) == OWNED_GPU == 0.88
    assert ServingConfig(gpu_memory=0.55).share(shares_gpu=True) == ServingConfig(gpu_memory=0.55).share(False) == 0.55
    for bad in (1.2, 0, "half"):
        with pytest.raises(UsageError, match="gpu_memory"):
            ServingConfig(gpu_memory=bad)


@pytest.mark.parametrize(("devices", "share"), [(None, SHARED_GPU), ([1], OWNED_GPU), ([0, 1], SHARED_GPU)])
def test_one_process_server_shares_the_trainers_gpu_unless_its_devices_leave_it_out(monkeypatch, tmp_path, devices,
                                                                                    share):
    from envace.training import setup

    asked = {}
    monkeypatch.setattr(setup, "trainer_gpu", lambda: 0)
    monkeypatch.setattr(setup.ServedPolicy, "start", lambda *a, **kw: asked.update(kw))
    cfg = TrainConfig(model="tiny", rollout={"backend": "vllm"}, serving={"devices": devices})
    procs = SimpleNamespace(world=1, rank=0, main=True)
    setup.start_servers(cfg, procs, SimpleNamespace(path=tmp_path), None, print)
    assert asked["gpu_memory"] == share and asked["devices"] == devices


def test_a_ray_actor_serves_on_all_its_gpus_and_keeps_its_model_in_host_memory(monkeypatch, tiny):
    from envace.training.cluster import workers

    built, asked = {}, {}
    policy = SimpleNamespace(model=tiny[0], tok=tiny[1], benchmark=None, bank=None)
    monkeypatch.setattr(workers, "build_policy", lambda cfg, **kw: built.update(kw) or policy)
    monkeypatch.setattr(workers.ServedPolicy, "start",
                        lambda *a, **kw: asked.update(kw) or SimpleNamespace(backend=None, close=lambda: None))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)  # Ray gave this actor 4 GPUs
    cfg = TrainConfig(model="tiny", rollout={"backend": "vllm"}, ray={"actor_gpus": 4})
    worker = workers.ActorWorker(cfg, 0)
    assert built["gpu"] is False  # no HF copy on the GPUs the server serves from
    assert asked["devices"] == [0, 1, 2, 3] and asked["gpu_memory"] == OWNED_GPU
    worker.close()


def test_a_copy_that_only_carries_weights_stays_off_the_gpu(monkeypatch):
    from envace.policy.models import load_policy

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # moving to a GPU here would fail: there is none
    model, _ = load_policy("default", gpu=False)
    assert {p.device.type for p in model.parameters()} == {"cpu"}
