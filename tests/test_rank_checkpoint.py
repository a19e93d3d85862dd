"""A learner rank under FSDP (`cluster.workers.LearnerRank`, what Ray places) keeps its shards and no whole copy of
the model, writes the final checkpoint a whole generation copy, synced after the update, would have written, and
saves `state.pt` as its own shards, which it reads back.

Also a worker: `torchrun --nproc_per_node 2 tests/test_rank_checkpoint.py OUT LORA…` (each LORA `true` or `false`, in
turn in the one launch, into `OUT.<LORA>`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


LORA = ["true", "false"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("ranks") / "result"
    done = subprocess.run([*TORCHRUN, __file__, str(out), *LORA], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return {lora: json.loads(Path(f"{out}.{lora}").read_text()) for lora in LORA}


@pytest.mark.heavy
@pytest.mark.parametrize("lora", LORA)
def test_fsdp_ranks_hold_no_whole_copy_and_write_the_checkpoint_a_synced_copy_would(results, lora):
    """LoRA (the adapters gathered, merged into the host copy's base) and a full fine-tune (every weight)."""
    result = results[lora]
    assert result["copies"] == [False, False]  # neither rank holds a generation copy beside its shards
    assert result["held"] < 0.75  # each holds about half the trainable weights, not all of them
    assert result["moved"] > 0  # the update changed the trained weights
    assert result["files"] and result["equal"] == result["tensors"] > 0, result  # every tensor of the checkpoint
    # state.pt names the folder each rank wrote its own shards into, and each rank reads its own back
    assert result["run_files"] == ["shards-1/.metadata", "shards-1/__0_0.distcp", "shards-1/__1_0.distcp",
                                   "state.pt"]
    assert result["restored"] == [True, True] and result["next_step"] == 1


def _worker(out: str, lora: bool):  # -> the LearnerRank, to leave the group once every case ran
    from safetensors.torch import load_file

    from envace.config import TrainConfig
    from envace.training import fsdp
    from envace.training.checkpoint import write_checkpoint
    from envace.training.cluster.workers import LearnerRank
    from envace.training.grpo import Row
    from envace.training.pool import seen_groups
    from envace.training.setup import build_policy

    rank_index = int(os.environ["RANK"])
    cfg = TrainConfig.from_dict({"model": "tiny", "distributed": {"fsdp": True}, "grpo": {"lr": 1e-2},
                                 "policy": {"lora": lora, "lora_rank": 4}})
    rank = LearnerRank(cfg, rank_index, 2)
    rank.join("127.0.0.1", int(os.environ["MASTER_PORT"]))
    whole = build_policy(cfg, threads=1)  # the same seed: the whole copy the rank used to hold, for the old save
    before = {n: p.detach().clone() for n, p in whole.model.named_parameters() if p.requires_grad}
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(rank_index))
    rows = [Row(f"t{rank_index}", "caller", ids[i, :8].tolist(), ids[i, 8:].tolist(), 1.0) for i in range(2)]
    rank.update(rows, [1.0, -1.0])
    local = sum(p.to_local().numel() for p in rank.learner.model.parameters() if p.requires_grad)
    total = sum(w.numel() for w in before.values())
    held = [None, None]
    torch.distributed.all_gather_object(held, (rank.generator is not None, local / total))
    fsdp.sync(rank.learner.model, whole.model)  # the old path: the whole copy takes the trained weights
    written = rank.checkpoint()  # rank 0's folder on its own node (the driver would take it in pieces)
    if rank_index == 0:
        moved = max((whole.model.get_parameter(n) - w).abs().max().item() for n, w in before.items())
        with tempfile.TemporaryDirectory() as folder:
            old = write_checkpoint(Path(folder) / "old", whole.model, whole.tok, seen_groups(cfg, whole.train_tasks),
                                   cfg.policy.lora)
            expected = load_file(old / "model.safetensors")
        folder = Path(written) / "checkpoint"
        files = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
        written = load_file(folder / "model.safetensors")
        shutil.rmtree(folder.parent)
        equal = sum(torch.equal(written[k], expected[k]) for k in expected) if written.keys() == expected.keys() else -1
    state = _state_round_trip(rank, Path(f"{out}.run"), rows)
    if rank_index == 0:
        json.dump({"copies": [c for c, _ in held], "held": max(h for _, h in held), "moved": moved,
                   "files": sorted(files), "equal": equal, "tensors": len(expected), **state}, open(out, "w"))
    return rank


def _state_round_trip(rank, run: Path, rows) -> dict:
    """`state.pt` saved by the ranks (`LearnerRank.save_state`, as Ray's driver asks where the ranks see the run
    folder), the weights moved on by another update, then read back (`load_state`): what each rank holds again
    and what the run folder holds."""
    run.mkdir(exist_ok=True)
    trained = [p for p in rank.learner.model.parameters() if p.requires_grad]
    saved = [p.to_local().clone() for p in trained]
    rank.save_state(str(run / "state.pt"), 1, {})
    rank.update(rows, [-1.0, 1.0])
    moved = any(not torch.equal(a, p.to_local()) for a, p in zip(saved, trained, strict=True))
    resumed = rank.load_state(str(run / "state.pt"))
    back = [None, None]
    torch.distributed.all_gather_object(back, moved and all(torch.equal(a, p.to_local())
                                                           for a, p in zip(saved, trained, strict=True)))
    return {"restored": back, "next_step": resumed and resumed[0],
            "run_files": sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())}


if __name__ == "__main__":
    for lora in sys.argv[2:]:
        last = _worker(f"{sys.argv[1]}.{lora}", lora == "true")
    last.leave()
