"""Whether Ray's learner ranks write `state.pt` and the checkpoint themselves (`RemoteLearner.sees`): only where
every rank reads the driver's probe in the run folder, since every rank reads `state.pt` back on `--resume`. On a
fake of Ray's API (`test_work_queue.FakeRay`); tests/test_ray.py runs both paths on a real two-node cluster."""

from __future__ import annotations

import sys

import pytest
import torch
from test_work_queue import FakeRay, Method

from envace.errors import UsageError
from envace.training.checkpoint import read_state, write_state
from envace.training.cluster.driver import RemoteLearner
from envace.training.cluster.workers import LearnerRank


class Rank:
    """A learner rank whose node sees the driver's disk (`LearnerRank.sees` on the file itself) or not (on a path
    beside it, which no one wrote)."""

    def __init__(self, fake: FakeRay, sees_disk: bool) -> None:
        self.fake, self.free, self.probes = fake, 0.0, []
        self.elsewhere = "" if sees_disk else ".elsewhere"
        self.sees = Method(self._sees)

    def _sees(self, probe: str, token: str):
        self.probes.append(probe)
        ref = self.fake.call(0.1, LearnerRank.sees(None, probe + self.elsewhere, token),
                             at=max(self.fake.clock, self.free))  # a rank runs its calls one at a time
        self.free = ref.ends
        return ref


def _learner(monkeypatch, *sees_disk: bool) -> tuple[RemoteLearner, list[Rank]]:
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    ranks = [Rank(fake, s) for s in sees_disk]
    return RemoteLearner(None, ranks, "r"), ranks


def test_the_ranks_write_only_where_every_rank_sees_the_run_folder(monkeypatch, tmp_path):
    learner, ranks = _learner(monkeypatch, True, True)
    assert learner.sees(tmp_path) is True
    assert all(r.probes for r in ranks) and not list(tmp_path.iterdir())  # every rank asked; the probe removed
    learner, ranks = _learner(monkeypatch, True, False)  # rank 1's node has no such folder
    assert learner.sees(tmp_path) is False and ranks[1].probes
    learner, _ = _learner(monkeypatch, False, True)
    assert learner.sees(tmp_path) is False and not list(tmp_path.iterdir())


def test_a_rank_sees_the_probe_only_with_the_drivers_token(tmp_path):
    probe = tmp_path / ".probe-x"
    probe.write_text("abc")
    assert LearnerRank.sees(None, str(probe), "abc") is True
    assert LearnerRank.sees(None, str(probe), "abd") is False  # another run's probe, or a stale one
    assert LearnerRank.sees(None, str(tmp_path / "missing"), "abc") is False


def test_a_state_naming_fsdp_shards_this_process_does_not_see_is_one_line(tmp_path):
    """A `state.pt` naming FSDP shards (each rank wrote its own, where every rank saw the run folder) read where the
    shards are not (a rank given `state.pt` in pieces, `LearnerRank.load_received`; or a run folder copied without
    them): one line, before the learner is touched."""
    write_state(tmp_path / "state.pt", 3, {"fsdp": True, "shards": "shards-3"}, {})
    with pytest.raises(UsageError, match=r"names FSDP shards in .*shards-3, which this process does not see"):
        read_state(tmp_path / "state.pt", learner=None)
    assert torch.load(tmp_path / "state.pt", weights_only=True)["next_step"] == 3  # left as it was


def test_a_folder_sent_in_pieces_arrives_whole_and_no_piece_is_larger_than_the_limit(monkeypatch, tmp_path):
    """Where a rank does not see the run folder, rank 0 streams `state.pt` and the checkpoint to the driver
    (`checkpoint.pieces` → `receive`): every file arrives byte for byte (an empty one too, nested ones in their
    folders), the driver holds one piece at a time, and the sender's folder is gone after."""
    from envace.training import checkpoint

    monkeypatch.setattr(checkpoint, "PIECE", 1000)
    sent = tmp_path / "rank0"
    (sent / "nested").mkdir(parents=True)
    files = {"state.pt": bytes(range(256)) * 9, "nested/model.safetensors": b"w" * 3000, "empty.json": b""}
    for name, data in files.items():
        (sent / name).write_bytes(data)
    sizes = []

    def through(stream):
        for name, piece in stream:
            sizes.append(len(piece))
            yield name, piece

    here = checkpoint.receive(through(checkpoint.pieces(sent)), tmp_path / "driver")
    assert {str(p.relative_to(here)): p.read_bytes() for p in here.rglob("*") if p.is_file()} == files
    assert max(sizes) == 1000 and len(sizes) == 3 + 3 + 1  # 2,304 bytes in 3 pieces, 3,000 in 3, the empty one
    assert not sent.exists()


def test_a_state_left_on_a_node_by_a_process_that_died_goes_when_the_next_one_is_made(tmp_path, monkeypatch):
    """Rank 0's copy of `state.pt` on its way to a driver that was killed stays in the node's temporary folder (the
    stream never ended, so `pieces` never removed it): the next such folder made on the node removes it, and leaves
    a live process's."""
    import subprocess
    import tempfile

    from envace.training.cluster import workers

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f"{workers.STATE_FOLDER}-pid{gone.stdout.strip()}-abc"
    (left / "state.pt").parent.mkdir()
    (left / "state.pt").write_bytes(b"x")
    live = workers.node_folder(workers.STATE_FOLDER)
    mine = workers.node_folder(workers.STATE_FOLDER)
    assert not left.exists() and live.exists() and mine.exists() and live.parent == tmp_path


def test_state_pieces_travel_to_the_ranks_a_few_at_a_time():
    """`driver.windowed`, how `RemoteLearner.send_state` streams `state.pt` to ranks that do not see the run folder:
    every piece sent once, in order, and never more than `ahead` sent and not yet written (the driver put every
    piece into the object store at once before: the whole state on its node)."""
    from envace.training.cluster.driver import windowed

    sent, done, most = [], [], 0

    def send(piece):
        nonlocal most
        sent.append(piece)
        most = max(most, len(sent) - len(done))
        return piece

    windowed(range(10), send, done.append, ahead=3)
    assert sent == done == list(range(10)) and most == 3
    windowed([], send, done.append)  # nothing to send: nothing waited for
