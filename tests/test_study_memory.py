"""The study's `memory` arm: memory-aware SFT (`[train.sft] memory`) on the seed's SFT tasks, then GRPO as envace on
the seed's pool; its SFT and GRPO checkpoints measured and swept like the seed's own."""

from __future__ import annotations

import json
import re

import pytest
from test_study import STUDY as PLAIN

from envace.cli import main
from envace.study.config import Study
from envace.study.run import _sizes, own_sft_stage

# test_study's tiny study, one seed, with the memory arm beside envace and one GRPO step
STUDY = (PLAIN.replace('floor_sizes = [1, 2]\nseeds = [0, 1]\narms = ["envace", "control", "random"]',
                       'floor_sizes = []\nseeds = [0]\narms = ["envace", "memory"]')
         .replace("private_seeds = [0]\n", 'private_seeds = [0]\nmemory_sft = "rehearsed"\n')
         .replace("\nsteps = 2\n", "\nsteps = 1\n"))
assert 'arms = ["envace", "memory"]' in STUDY and "memory_sft" in STUDY and "\nsteps = 1\n" in STUDY, \
    "test_study's STUDY changed: update these edits"


def test_the_memory_arm_retrains_sft_with_memory_rows_then_runs_grpo_as_envace(tmp_path):
    config = tmp_path / "study.toml"
    config.write_text(STUDY.replace('memory_sft = "rehearsed"', 'memory_sft = "reference"'))
    study = Study.load(config)
    assert study.sft(0).sft.memory == "none" and study.sft(0, arm="envace").sft.memory == "none"
    own = study.sft(0, arm="memory")
    assert own.sft.memory == "reference" and own.sft.tasks == study.sft(0).sft.tasks and own.grpo.steps == 0
    grpo, envace = study.arm("memory", 0, model="tiny", units=["u"]), study.arm("envace", 0, model="tiny", units=["u"])
    assert grpo == envace  # GRPO as envace's (its start, the memory SFT, is the model it is given)
    assert own_sft_stage(1, "memory") == "sft-n1-memory"
    # per seed: sft, eval, wm, screen; 4 per arm; the memory SFT's own sft, eval and wm; two sweeps
    assert _sizes(study.design) == (4 + 8 + 3 + 2, 4 + 8 + 3 + 2)
    assert main(["study", str(tmp_path / "nope.toml"), "--root", str(tmp_path / "runs")]) == 2
    config.write_text(STUDY.replace('memory_sft = "rehearsed"', 'memory_sft = "gold"'))
    assert main(["study", str(config), "--root", str(tmp_path / "runs")]) == 2
    assert not (tmp_path / "runs").exists()


@pytest.mark.heavy
def test_a_study_with_the_memory_arm_measures_and_reports_it(tmp_path, capsys):
    from envace.store import connect

    config, root = tmp_path / "tiny.toml", tmp_path / "runs"
    config.write_text(STUDY)
    assert main(["study", str(config), "--root", str(root)]) == 0
    stages = {p.name for p in root.iterdir() if (p / "run.json").exists() and re.fullmatch(r"tiny-.+-s\d+", p.name)}
    summary = json.loads((root / "tiny" / "run.json").read_text())["summary"]
    assert summary["stages"] == len(stages)
    assert {"tiny-sft-n1-memory-s0", "tiny-eval-sft-n1-memory-s0", "tiny-wm-sft-n1-memory-s0", "tiny-memory-s0",
            "tiny-eval-memory-s0", "tiny-screen-memory-s0", "tiny-private-memory-s0"} <= stages
    sft = json.loads((root / "tiny-sft-n1-memory-s0" / "run.json").read_text())["config"]
    assert sft["sft"]["memory"] == "rehearsed" and sft["sft"]["tasks"] == 1
    grpo = json.loads((root / "tiny-memory-s0" / "run.json").read_text())["config"]
    assert grpo["model"].endswith("tiny-sft-n1-memory-s0/checkpoint")  # GRPO from the memory-aware SFT
    assert grpo["sft"]["tasks"] == 0 and grpo["grpo"]["variant"] == "envace"
    swept = connect(root).execute("SELECT DISTINCT label FROM sweep WHERE run_id = 'tiny-private-memory-s0' "
                                  "ORDER BY label").fetchall()
    assert swept == [("memory",), ("sft_memory",)]
    report = (root / "tiny" / "report.md").read_text()
    assert "| sft_memory | SFT |" in report and "| memory | sft_memory |" in report and "| memory | SFT |" in report
    assert "| sft_memory | parallel | 1 |" in report and "| memory | parallel | 1 |" in report
