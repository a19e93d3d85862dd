"""`envace study`: the controlled study on the tiny model: every stage, a kill and the re-run that goes on, the
report's paired and Holm-corrected tables, the random-update control, and bad input as one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from envace.cli import main
from envace.errors import UsageError

STUDY = """
[study]
floor_sizes = [1, 2]
seeds = [0, 1]
arms = ["envace", "control", "random"]
pool_tasks = 2
screen_group_size = 2
pool_max = 2
world_model_limit = 1
private_budgets = [0, 1]
private_modes = ["parallel"]
private_seeds = [0]

[rollout]
unit = "turn"
max_turn_calls = 1
limit = 3
model = "tiny"
max_new_tokens = 32  # the tiny model writes every token it may: "auto" (107 here) made generation 2/3 of the test
max_steps_per_turn = "auto"

[rollout.rehearser]
fewshot = "other_tasks"
max_new_tokens = 16

[rollout.private]
max_steps = 1
memory_tokens = 8

[train]
model = "tiny"

[train.policy]
lora = true
lora_rank = 4

[train.sft]
tasks = 1
epochs = 1
lr = 3e-3
rows_per_step = 8

[train.grpo]
steps = 2
lr = 1e-3

[train.rollout]
unit = "turn"
max_turn_calls = 1
group_size = 2
max_new_tokens = 32
max_steps_per_turn = "auto"

[train.rollout.rehearser]
max_new_tokens = 16
"""


def _status(root: Path, run: str) -> str | None:
    meta = root / run / "run.json"
    return json.loads(meta.read_text()).get("status") if meta.exists() else None


@pytest.mark.heavy
def test_the_study_goes_on_after_a_kill_and_reports_paired_corrected_tables(tmp_path, capsys):
    from envace.compare import episode_pairs
    from envace.store import connect

    config, root = tmp_path / "tiny.toml", tmp_path / "runs"
    config.write_text(STUDY)
    # killed (SIGKILL: no handler runs) once envace's first GRPO step of seed 0 has saved its resumable state
    proc = subprocess.Popen([sys.executable, "-m", "envace.cli", "study", str(config), "--root", str(root)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    state, deadline = root / "tiny-envace-s0" / "state.pt", time.time() + 300
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert state.exists() and _status(root, "tiny-envace-s0") != "completed"
    kept = {run: (root / run / "run.json").read_text() for run in ("tiny-sft-n1-s0", "tiny-sft-n2-s0",
                                                                     "tiny-screen-sft-n2-s0")}
    assert all('"completed"' in text for text in kept.values())
    pools = json.loads((root / "tiny" / "pools.json").read_text())
    assert main(["show", "tiny", "--root", str(root)]) == 0  # no report yet: the stages so far, and how many
    shown = capsys.readouterr().out
    done = sum(_status(root, p.name) == "completed" for p in root.iterdir() if re.fullmatch(r"tiny-.+-s\d+", p.name))
    assert f"{done} of {json.loads((root / 'tiny' / 'run.json').read_text())['summary']['stages']} stages" in shown
    assert "tiny-envace-s0" in shown and "no report yet" in shown
    runs_before = sorted(p.name for p in root.iterdir())
    study_before = (root / "tiny" / "run.json").read_text()
    assert main(["study", str(config), "--root", str(root), "--so-far"]) == 0  # the tables so far, running nothing
    so_far = (root / "tiny" / "report-so-far.md").read_text()
    assert f"**So far: {done} of " in so_far and "The base off the floor" in so_far and "| 2 | 3 |" in so_far
    assert "seed 0: GRPO on" in so_far and "(no completed pair of stages yet)" in so_far  # no arm evaluated yet
    assert sorted(p.name for p in root.iterdir()) == runs_before
    assert (root / "tiny" / "run.json").read_text() == study_before and not (root / "tiny" / "report.md").exists()
    capsys.readouterr()

    assert main(["study", str(config), "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "tiny-envace-s0 (resumed)" in out and "tiny-sft-n2-s0: done already, kept" in out
    assert {run: (root / run / "run.json").read_text() for run in kept} == kept  # not redone
    assert json.loads((root / "tiny" / "pools.json").read_text())["0"] == pools["0"]  # every arm of seed 0: the same

    stages = [p.name for p in root.iterdir() if (p / "run.json").exists()]
    assert all(_status(root, run) == "completed" for run in stages)
    summary = json.loads((root / "tiny" / "run.json").read_text())["summary"]
    staged = [run for run in stages if re.fullmatch(r"tiny-.+-s\d+", run)]  # not the sweep's cells, nor itself
    assert summary["stages"] == len(staged)  # every stage run the study said it would hold
    for seed in (0, 1):  # the first seed's SFT of the chosen size (2: no size reached 15%) is the floor's own run
        assert {f"tiny-{arm}-s{seed}" for arm in ("sft-n2", "envace", "control", "random")} <= set(stages)
    assert "tiny-sft-n1-s1" not in stages
    con = connect(root)
    grpo = con.execute("SELECT run_id, count(DISTINCT step) FROM episodes WHERE phase = 'grpo' GROUP BY run_id "
                       "ORDER BY run_id").fetchall()
    assert grpo == [(f"tiny-{arm}-s{s}", 2) for arm in ("control", "envace") for s in (0, 1)]

    report = (root / "tiny" / "report.md").read_text()
    for section in ("The base off the floor", "each arm against the SFT checkpoint", "against the controls",
                    "The pool's screen", "World model on the test gold calls", "Private rehearsal"):
        assert section in report
    assert report.count("Holm: adjusted over the family of this table's") == 5
    turns = next(line for line in report.splitlines() if line.startswith("| envace | SFT |"))
    assert turns.split(" | ")[3] == "6"  # 3 test turns × 2 seeds, paired turn by turn
    assert "(2 comparisons × McNemar" in report  # envace against control and against random
    assert (root / "tiny" / "figure.html").stat().st_size > 1000
    with pytest.raises(UsageError, match="share no episode"):  # an eval and a screen: nothing pairs
        episode_pairs(con, "tiny-eval-envace-s0", "tiny-screen-envace-s0")

    # a study stored before a field existed, with the flat [train] keys of an earlier release, and with the servers'
    # share of GPU memory at 0.4 (its default before `auto`), goes on: the field's default is no change of design,
    # the keys' new names neither, a setting that changes no result neither
    from envace.config import flat

    meta = root / "tiny" / "run.json"
    stored = json.loads(meta.read_text())
    assert stored["config"]["train"]["serving"]["gpu_memory"] == "auto"
    stored["config"]["train"]["serving"]["gpu_memory"] = 0.4
    stored["config"]["train"] = flat(stored["config"]["train"])
    del stored["config"]["train"]["algorithm"]
    meta.write_text(json.dumps(stored))
    capsys.readouterr()
    assert main(["study", str(config), "--root", str(root)]) == 0
    assert capsys.readouterr().out.count("done already, kept") == 37  # every stage, none redone

    # the same name with another design is another study: refused before anything runs, or is reported
    config.write_text(STUDY.replace("pool_max = 2", "pool_max = 1"))
    for extra in ([], ["--so-far"]):
        assert main(["study", str(config), "--root", str(root), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is not this study" in err[0]
    assert main(["study", str(config), "--root", str(tmp_path / "empty"), "--so-far"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no study 'tiny'" in err[0]


@pytest.mark.parametrize("change, message", [
    (("[train.grpo]\n", "[train.grpo]\npool_overlap = true\n"), "drop grpo.pool_overlap"),
    (('arms = ["envace", "control", "random"]', 'arms = ["control", "random"]'), "random takes the norm"),
    (("[train.sft]\ntasks = 1", "[train.sft]\ntasks = 0"), "its own SFT"),
    (("seeds = [0, 1]", "seeds = [0, 0]"), "distinct seeds"),
    (('arms = ["envace", "control", "random"]', 'arms = ["control"]'), "add envace to arms"),
    (("floor_sizes = [1, 2]", "floor_sizes = [0]"), "floor_sizes"),
    (("[rollout]\n", "[nope]\n[rollout]\n"), "unknown table"),
])
def test_a_bad_study_file_is_one_line_and_exit_2_before_any_run(tmp_path, capsys, change, message):
    config = tmp_path / "bad.toml"
    config.write_text(STUDY.replace(*change))
    assert main(["study", str(config), "--root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "runs").exists()


def test_the_random_update_moves_each_tensor_as_far_as_training_did_in_another_direction(tmp_path):
    from envace.policy.models import load_policy
    from envace.study.random_update import random_update
    from envace.training.pool import SEEN_FILE

    start, trained = tmp_path / "start", tmp_path / "trained"
    model, tok = load_policy("tiny")
    model.save_pretrained(start)
    tok.save_pretrained(start)
    (start / SEEN_FILE).write_text(json.dumps({"groups": ["bfcl/0"]}))
    names = [n for n, _ in model.named_parameters()]
    moved = set(names[1::3])
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name in moved:
                weight.add_(0.01 * torch.randn(weight.shape, generator=g))
    model.save_pretrained(trained)
    tok.save_pretrained(trained)
    summary = random_update(start, trained, tmp_path / "random", seed=3, dtype="float32")
    assert summary["tensors_moved"] == len(moved)
    w0, w1, wr = ({n: p.detach() for n, p in load_policy(str(d))[0].named_parameters()}
                  for d in (start, trained, tmp_path / "random"))
    for name in names:
        delta, rand = w1[name] - w0[name], wr[name] - w0[name]
        if name not in moved:
            assert torch.equal(wr[name], w0[name])
            continue
        assert float(rand.norm()) == pytest.approx(float(delta.norm()), rel=1e-4)
        cosine = float((rand * delta).sum() / (rand.norm() * delta.norm()))
        assert abs(cosine) < 0.5  # another direction, not the trained one
    assert json.loads((tmp_path / "random" / SEEN_FILE).read_text()) == {"groups": ["bfcl/0"]}
    random_update(start, trained, tmp_path / "again", seed=3, dtype="float32")  # seeded: the same weights
    again = dict(load_policy(str(tmp_path / "again"))[0].named_parameters())
    assert all(torch.equal(again[n].detach(), wr[n]) for n in names)
