"""Rollouts ahead of the update (`grpo.max_staleness`, `envace.training.staleness`): what samples each step, what is
trained, the importance correction's inputs, and an exact resume.

The actor samples with the tiny model's own weights (its copy, loaded with each published version), and half
of its messages are swapped for the gold ones (the reference policy's) so that rewards differ within a group
and the learner has something to update on; the swapped messages carry no log-probs, the sampled ones keep
the actor's. `grpo.max_staleness = 0` is the synchronous loop, which the rest of the suite covers.
"""

from __future__ import annotations

import random

import pytest
from replay import same, stored

from envace.cli import main
from envace.store import connect

STALE = ["--set", "grpo.max_staleness=1", "--set", "grpo.importance_cap=2.0", "--set", "sft.tasks=0",
         "--set", "rollout.group_size=4", "--set", "rollout.temperature=1.0", "--set", "grpo.lr=5e-2",
         "--set", "packing.flat_row_metrics=true"]


def _half_gold(monkeypatch, bfcl):
    import envace.training.actor as rollout_actor
    from envace.policy.hf import HFBackend
    from envace.policy.scripted import ReferencePolicy

    tasks = bfcl.load_tasks("multi_turn_base", "train")

    class HalfGold(HFBackend):
        def __init__(self, model, tok, *rest):
            super().__init__(model, tok, *rest)
            self.gold = ReferencePolicy(tok, tasks)

        def generate(self, prompts, params):
            sampled, gold = super().generate(prompts, params), self.gold.generate(prompts, params)
            rng = random.Random(params.seed)
            return [g if rng.random() < 0.5 else s for s, g in zip(sampled, gold, strict=True)]

    monkeypatch.setattr(rollout_actor, "HFBackend", HalfGold)


@pytest.fixture
def half_gold(monkeypatch, bfcl):
    _half_gold(monkeypatch, bfcl)


@pytest.fixture(scope="module")
def ahead(tmp_path_factory, bfcl):
    """Three steps one step ahead of the update (`ahead`), run once: what it stores is checked, and a run cut after
    two steps and resumed must replay its last step."""
    root = tmp_path_factory.mktemp("ahead")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _half_gold(monkeypatch, bfcl)
        assert _train(root, "ahead", 3) == 0
    return root


def _train(root, name: str, steps: int, *extra: str) -> int:
    return main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", name,
                 "--set", f"grpo.steps={steps}", *STALE, *extra])


@pytest.mark.heavy
def test_one_step_ahead_samples_with_the_previous_version_and_trains_nothing_older(ahead, capsys):
    con = connect(ahead)
    versions = con.execute("SELECT step, min(policy_version), max(policy_version) FROM generations "
                           "GROUP BY step ORDER BY step").fetchall()
    assert versions == [(0, 0, 0), (1, 0, 0), (2, 1, 1)]  # step b sampled by version max(0, b − 1)
    assert con.execute("SELECT count(*) FROM generations WHERE trained").fetchall()[0][0] > 0
    assert con.execute("SELECT max(step - policy_version) FROM generations WHERE trained").fetchall()[0][0] <= 1
    metric = dict(((step, name), value) for step, name, value in con.execute(
        "SELECT step, name, value FROM metrics WHERE phase = 'grpo' AND role = 'all'").fetchall())
    assert [metric[b, "staleness"] for b in range(3)] == [0, 1, 1]
    # the importance ratio's inputs: the sampler's stored log-probs against the learner's. Step 0 was sampled by
    # the weights it updates (the gap is numerical noise); step 2 by version 1, one update behind version 2.
    assert metric[0, "logprob_gap"] < 1e-4
    assert metric[1, "updated"] == 1 and metric[2, "logprob_gap"] > 1e-3
    capsys.readouterr()
    assert main(["show", "ahead", "--root", str(ahead)]) == 0
    shown = capsys.readouterr().out
    assert "where the GRPO time went" in shown and "learner waits for rollouts" in shown and "0: 1, 1: 2" in shown
    from workbench import Workbench
    from workbench.figures import step_timeline

    fig = step_timeline(Workbench(ahead).training("ahead"))  # the Training tab's timeline
    lanes = {t.name: t for t in fig.data if t.orientation == "h"}
    assert set(lanes) == {"actor", "learner", "publish"} and all(len(t.x) == 3 for t in lanes.values())
    # step 2 (sampled by version 0) was played while the learner updated on step 1: the spans overlap
    actor_start, learner_start = lanes["actor"].base[1], lanes["learner"].base[0]
    assert actor_start < learner_start + lanes["learner"].x[0]
    # version 1, published by the first update, is loaded by the actor right before step 3, which samples with it
    publish, actor = lanes["publish"], lanes["actor"]
    assert publish.x[2] > 0 and abs(publish.base[2] + publish.x[2] - actor.base[2]) < 1e-6
    assert publish.base[2] >= lanes["learner"].base[0] + lanes["learner"].x[0] - 1e-6  # after the update made it
    histogram = [t for t in fig.data if t.orientation != "h"][0]
    assert list(histogram.x) == [0, 1] and list(histogram.y) == [1, 2]


@pytest.mark.heavy
def test_a_resumed_run_ahead_of_its_update_replays_exactly(ahead, tmp_path, half_gold):
    assert _train(tmp_path, "cut", 2) == 0
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--resume", "cut",
                 "--set", "grpo.steps=3", *STALE]) == 0
    con = connect(tmp_path)

    # step 3 sampled by version 1, kept in state.pt across the stop: the same generations and metrics
    same(stored(connect(ahead), "ahead", step=2), stored(con, "cut", step=2))


@pytest.mark.parametrize("settings", [["grpo.max_staleness=-1"], ["grpo.max_staleness=1"],
                                      ["grpo.max_staleness=1", "grpo.importance_cap=2.0",
                                       "distributed.shard_optimizer=true"]])
def test_bad_staleness_settings_are_one_line_and_exit_2(tmp_path, capsys, settings):
    args = [a for s in settings for a in ("--set", s)]
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_staleness" in err[0]
    assert not list(tmp_path.iterdir())  # refused before any run was created


@pytest.mark.heavy
def test_partial_rollouts_let_a_group_straddle_a_publish_and_bound_every_generation(tmp_path, half_gold,
                                                                                     monkeypatch):
    """`grpo.partial_rollouts`: step 2's one group starts on version 0 and, once the learner publishes version 1
    (its update on step 1), goes on with it. The actor's first call of step 2 waits until version 1 is offered,
    so the publish lands mid-group on any machine. Every generation stores the version that sampled it, and
    step − version ≤ max_staleness holds for each."""
    from ray_workers.sitecustomize import hold_for_offer

    import envace.training.actor as actor_module

    for cls, name in ((actor_module.RolloutActor, "play"), (actor_module.PartialBackend, "generate")):
        monkeypatch.setattr(cls, name, getattr(cls, name))  # restored after the test
    hold = tmp_path / "hold"
    hold.touch()
    hold_for_offer(str(hold))(actor_module)  # as the Ray workers take it (tests/ray_workers)
    assert _train(tmp_path, "partial", 3, "--set", "grpo.partial_rollouts=true", "--set",
                  "grpo.tasks_per_step=1") == 0
    con = connect(tmp_path)
    by_episode = con.execute("SELECT episode_id, min(policy_version), max(policy_version) FROM generations "
                             "WHERE step = 1 GROUP BY episode_id").fetchall()
    assert len(by_episode) == 4 and any(low == 0 and high == 1 for _, low, high in by_episode), by_episode
    assert con.execute("SELECT min(step - policy_version), max(step - policy_version) FROM generations").fetchall() \
        == [(0, 1)]
    assert con.execute("SELECT count(*) FROM generations WHERE step = 1 AND policy_version = 1 AND trained"
                       ).fetchall()[0][0] > 0  # rows sampled by the newer version are trained on
    staleness = con.execute("SELECT step, value FROM metrics WHERE phase = 'grpo' AND role = 'all' AND "
                            "name = 'staleness' ORDER BY step").fetchall()
    assert staleness == [(0, 0), (1, 1), (2, 1)]  # counted from the version each step started on


def test_partial_rollouts_need_a_step_ahead(tmp_path, capsys):
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "grpo.partial_rollouts=true"]) \
        == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "partial_rollouts: needs max_staleness" in err[0], err
    assert not list(tmp_path.iterdir())
