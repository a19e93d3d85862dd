"""The training code may be restructured, never changed: a seeded run gives what the release before it gave.

`tests/fixtures/golden/` was written by `python tests/golden.py` with the code before the training job was split
into its rooms (loop, learner, recorder, checkpoint): the digest of a synchronous and a staleness-1 run (every
metric but wall times, every generation's tokens, reward, advantage and trained flag, every episode's scores,
the merged checkpoint's tensors), and a run of the same config stopped after two of its three steps. Tokens,
ids and flags must match exactly; numbers to their last rounded digit (`golden.REL`), as another CPU sums in
another order.
"""

import json
import shutil

import pytest
from golden import FIXTURE, config, difference, digest, train

EXPECTED = json.loads((FIXTURE / "digest.json").read_text())


@pytest.mark.heavy
@pytest.mark.parametrize("name, staleness", [("sync", 0), ("ahead", 1)])
def test_a_seeded_run_gives_what_the_earlier_release_gave(tmp_path, name, staleness):
    train(config(tmp_path / f"{name}.toml", staleness=staleness), tmp_path / "runs", name)
    got = digest(tmp_path / "runs", name)
    for part in ("metrics", "episodes", "generations", "generations_sha256", "checkpoint"):
        assert difference(got[part], EXPECTED[name][part], part) is None


def test_a_run_written_by_the_earlier_release_resumes_into_the_same_last_step(tmp_path):
    """The stopped run's `run.json`, `state.pt` and shards, as the earlier code wrote them, resume to step 3 and
    store exactly what the uninterrupted run stored for it."""
    root = tmp_path / "runs"
    shutil.copytree(FIXTURE / "store", root)
    train(config(tmp_path / "sync.toml"), root, "cut", "--resume", "cut")
    got, whole = digest(root, "cut"), EXPECTED["sync"]
    last = [m for m in whole["metrics"] if m[1] == 3 or (m[0] == "grpo" and m[1] == 2)]
    assert last and difference([m for m in got["metrics"] if m[:4] in [n[:4] for n in last]], last) is None
    assert difference(got["checkpoint"], whole["checkpoint"]) is None
    assert difference([e for e in got["episodes"] if e[2] == 2 and e[1] == "grpo"],
                      [e for e in whole["episodes"] if e[2] == 2 and e[1] == "grpo"]) is None


def test_only_the_last_rounded_digit_of_a_number_is_forgiven():
    loss = ["grpo", 0, "all", "loss", -0.0053685]
    assert difference([loss[:4] + [-0.0053684]], [loss]) is None
    assert difference([loss[:4] + [-0.0053785]], [loss]) == "[0][4]: -0.0053785 != -0.0053685"
    assert difference({"ids": [1, 2]}, {"ids": [1, 3]}) == "['ids'][1]: 2 != 3"
    assert difference([loss], [loss, loss]) is not None and difference("a" * 64, "b" * 64) is not None


def test_the_golden_runs_have_a_signal_to_lose():
    """The fixture is worth guarding: its updates are real (groups with differing rewards, trained rows)."""
    sync = EXPECTED["sync"]
    assert any(m[3] == "signal_groups" and m[4] > 0 for m in sync["metrics"])
    assert any(m[3] == "rows_backpropagated" and m[4] > 0 for m in sync["metrics"])


def test_every_config_resolves_as_the_earlier_release_resolved_it():
    """Every `[rollout]` / `[train]` table under experiments/ and the stored config of the earlier release's run
    give the very settings they gave before (`tests/fixtures/golden/configs.json`; a TOML edited on purpose
    is re-snapshotted with `python tests/golden.py configs`)."""
    from pathlib import Path

    from golden import configs

    expected = json.loads((FIXTURE / "configs.json").read_text())
    got = configs(Path(__file__).resolve().parent.parent)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == expected[name], name
