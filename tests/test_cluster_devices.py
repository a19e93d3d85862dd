"""What crosses between a learner rank on a GPU and Ray's driver (`training/cluster/workers.py`), checked without a
GPU or a cluster: a rank whose learner hands out tensors that say they live on cuda:0 must return plain CPU tensors
(a CPU-only head node cannot hold CUDA tensors, and a GPU head must not hold k + 1 policy versions in GPU memory),
and what the driver sends it must land on the rank's own device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envace.training.cluster.workers import LearnerRank, to_host
from envace.training.distributed import Processes
from envace.training.learner import Learner


class OnCuda(torch.Tensor):
    """A CPU tensor that reports cuda:0, as a GPU rank's would; moving it anywhere gives a plain tensor."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)

    @property
    def is_cuda(self) -> bool:
        return True

    def to(self, *args, **kwargs) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).to(*args, **kwargs)

    def cpu(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor).cpu()


def _cuda(*shape: int) -> torch.Tensor:
    return torch.randn(shape).as_subclass(OnCuda)


class GpuLearner:
    """A learner whose weights, optimiser state and statistics are all "on cuda:0"."""

    def weights(self) -> dict[str, torch.Tensor]:
        return {"a.lora_A": _cuda(2, 3), "a.lora_B": _cuda(3, 2)}

    def state(self) -> dict:
        return {"model": self.weights(), "fsdp": False,
                "optimizer": {"state": {0: {"step": _cuda(), "exp_avg": _cuda(2, 3), "exp_avg_sq": _cuda(2, 3)}},
                              "param_groups": [{"params": [0], "lr": 1e-3, "betas": (0.9, 0.999)}]}}

    def update(self, rows, advantages) -> dict:
        return {"loss": 0.5, "grad_norm": _cuda(), "updated": True, "pair": (_cuda(1), [_cuda(1)])}


def _rank(learner) -> LearnerRank:
    rank = LearnerRank.__new__(LearnerRank)  # what Ray builds, without Ray: rank 0 of 1, its learner joined
    rank.cfg, rank.rank, rank.world, rank.learner, rank.procs = None, 0, 1, learner, Processes()
    return rank


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


def test_a_gpu_rank_returns_only_plain_cpu_tensors_to_the_driver():
    """What it returns (its statistics) and what it publishes: `host_weights` is what rank 0 puts in the object
    store (`weights`, which needs Ray, hands the driver only the reference: test_ray). Its state, where the driver
    must take it (a rank does not see the run folder), reaches the driver as the pieces of a file: no tensor."""
    rank = _rank(GpuLearner())
    for returned in (rank.host_weights(), rank.update([], [])):
        tensors = _tensors(returned)
        assert tensors and all(type(t) is torch.Tensor and t.device.type == "cpu" for t in tensors), \
            [(type(t).__name__, t.device) for t in tensors]
    assert rank.update([], [])["loss"] == 0.5 and isinstance(rank.update([], [])["pair"], tuple)
    folder = rank.save_state(None, 1, {})
    sent = list(rank.send(folder))
    assert sent and {name for name, _ in sent} == {"state.pt"} and all(type(p) is bytes for _, p in sent)
    assert not Path(folder).exists()  # removed from the rank's node once sent


def test_to_host_keeps_values_and_structure():
    weights = {"w": torch.arange(6.0).reshape(2, 3), "nested": [torch.ones(2), (torch.zeros(1), 3)], "n": None}
    moved = to_host(weights)
    assert torch.equal(moved["w"], weights["w"]) and moved["n"] is None
    assert isinstance(moved["nested"], list) and isinstance(moved["nested"][1], tuple) and moved["nested"][1][1] == 3
    assert to_host(_cuda(2)).device.type == "cpu"


@pytest.mark.filterwarnings("ignore:for .*copying from a non-meta parameter")
def test_a_saved_state_lands_on_the_ranks_device(tmp_path):
    """`state.pt` is read onto the CPU (the driver's pieces, or the run folder); the rank's parameters live
    elsewhere (the meta device stands in for its GPU): weights and AdamW's moments end up beside the parameters."""
    model = torch.nn.Linear(3, 2, device="meta")
    learner = Learner.__new__(Learner)
    learner.cfg, learner.model, learner.procs = None, model, Processes()
    learner.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rank = _rank(learner)
    state = {"model": {"weight": torch.randn(2, 3), "bias": torch.randn(2)}, "fsdp": False,
             "optimizer": {"state": {i: {"step": torch.tensor(3.0), "exp_avg": torch.randn(*p.shape),
                                         "exp_avg_sq": torch.rand(*p.shape)} for i, p in enumerate(model.parameters())},
                           "param_groups": [{**learner.optimizer.param_groups[0], "params": [0, 1]}]}}
    torch.save({"next_step": 2, **state, "versions": {}}, tmp_path / "state.pt")
    assert rank.load_state(str(tmp_path / "state.pt")) == (2, {})
    moments = [t for s in learner.optimizer.state.values() for k, t in s.items() if k != "step"]
    assert len(moments) == 4 and all(t.device.type == "meta" for t in moments)
