"""Configs are checked when they are built, wherever that happens, with one line naming the field."""

import pytest

from envace.config import RehearserOptions, RolloutConfig, TrainConfig
from envace.errors import UsageError


@pytest.mark.parametrize("kwargs, message", [
    ({"mode": "bogus"}, "mode: unknown choice 'bogus' (choose from real, rehearse, rehearse+shadow, real+shadow)"),
    ({"limit": "two"}, "limit: expected an integer, got 'two'"),
    ({"temperature": float("nan")}, "temperature: expected a finite number, got nan"),
    ({"temperature": float("inf")}, "temperature: expected a finite number"),
    ({"temperature": True}, "temperature: expected a number, got True"),
    ({"top_p": 0.0}, "top_p: must be in (0, 1]"),
    ({"group_size": 0}, "group_size: must be at least 1, got 0"),
    ({"category": "simple"}, "category: unknown bfcl category 'simple'"),
    ({"env": "nope"}, "env: unknown env 'nope'"),
    ({"rehearser": {"fewshot": "all"}}, "fewshot: unknown choice 'all'"),
    ({"past_thinking": "strip"}, "past_thinking: unknown choice 'strip' (choose from keep, drop)"),
    ({"private": {"budget": -1}}, "budget: must be at least 0"),
])
def test_a_notebook_built_config_is_checked_too(kwargs, message):
    with pytest.raises(UsageError) as err:
        RolloutConfig(model="tiny", **kwargs)
    assert message in str(err.value)


def test_the_leakage_rule_refuses_a_rehearser_shown_test_tasks_own_results():
    reference = RehearserOptions(fewshot="reference")
    for mode in ("rehearse", "rehearse+shadow", "real+shadow"):
        with pytest.raises(UsageError, match="leakage"):
            RolloutConfig(model="tiny", mode=mode, split="test", rehearser=reference)
    RolloutConfig(model="tiny", mode="rehearse", split="train", rehearser=reference)  # train tasks may
    RolloutConfig(model="tiny", mode="real", split="test", rehearser=reference)  # no rehearser runs
    train = TrainConfig(model="tiny", rollout={"rehearser": {"fewshot": "reference"}})
    assert train.rollout.rehearser.fewshot == "reference"
    assert train.evaluation().rehearser.fewshot == "other_tasks"  # its evaluation on test tasks never does


def test_nested_tables_layer_over_their_defaults_and_name_the_path():
    cfg = TrainConfig.from_dict({"model": "tiny", "rollout": {"temperature": 0.5, "rehearser": {"max_examples": 2}}})
    assert cfg.rollout.temperature == 0.5 and cfg.rollout.group_size == 4  # the training default stays
    assert cfg.rollout.rehearser.max_examples == 2 and cfg.rollout.model == "tiny"
    with pytest.raises(UsageError, match=r"^f.toml \[train\]: rollout.rehearser.max_new_tokens: must be at least 1"):
        TrainConfig.from_dict({"model": "tiny", "rollout": {"rehearser": {"max_new_tokens": 0}}}, "f.toml [train]")
    with pytest.raises(UsageError, match="rollout.mode: set by the trainer"):
        TrainConfig.from_dict({"model": "tiny", "rollout": {"mode": "real"}})
    with pytest.raises(UsageError, match=r"rollout: unknown key\(s\) nope"):
        TrainConfig.from_dict({"model": "tiny", "rollout": {"nope": 1}})
    with pytest.raises(UsageError, match="grpo.lr: expected a number, got 'abc'"):
        TrainConfig(model="tiny", grpo={"lr": "abc"})
    with pytest.raises(UsageError, match="grpo.lr: must be > 0"):
        TrainConfig(model="tiny", grpo={"lr": 0.0})


def test_help_shows_each_options_default_and_choices(capsys):
    from envace.cli import main

    with pytest.raises(SystemExit):
        main(["rollout", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{real, rehearse, rehearse+shadow, real+shadow} (default: real)" in text
    assert "(default: 256)" in text and "--private" in text
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = capsys.readouterr().out
    assert "--model " not in text and "--budget " not in text  # the sweep sets them per cell
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "--model " not in capsys.readouterr().out


def test_a_resumed_run_goes_on_across_versions_but_not_across_designs(tmp_path):
    """`train --resume` (and a study's re-run) compare configs with `extends`: a field the stored config lacks
    (added by a later version) is not compared; any stored value that differs is another design, refused."""
    from dataclasses import asdict

    from envace.config import extends
    from envace.jobs import _resume_run
    from envace.store import Run

    assert extends({"a": 1, "t": {"b": 2}}, {"a": 1, "t": {"b": 2, "new": 0}, "new": {}})
    assert not extends({"a": 1, "t": {"b": 2}}, {"a": 1, "t": {"b": 3}})
    assert not extends({"a": 1, "gone": 2}, {"a": 1})  # a field the asked config lacks is a change too
    cfg = TrainConfig(model="tiny", grpo={"steps": 2}).resolve()
    stored = asdict(cfg)
    stored.pop("ray")  # as a run saved before [train.ray] existed
    stored["rollout"].pop("group_size")
    Run.create(tmp_path, "train", stored, "tiny", "old").update(status="interrupted")
    _resume_run(tmp_path, "old", TrainConfig(model="tiny", grpo={"steps": 5}).resolve())  # grpo.steps may grow
    with pytest.raises(UsageError, match="'old' was not trained with this config"):
        _resume_run(tmp_path, "old", TrainConfig(model="tiny", grpo={"steps": 5, "lr": 1e-3}).resolve())


@pytest.mark.parametrize("setting", ["rollout.temperature=0.7", "rollout.top_p=0.9", "rollout.rehearser.temperature=0"])
def test_importance_sampling_away_from_temperature_1_is_one_line_before_a_run_folder(tmp_path, capsys, setting):
    """grpo.importance_cap weighs tokens against the model's raw distribution (`grpo.aligned`): sampling the trained
    roles at another temperature or top-p is refused when the config is read."""
    from envace.cli import main

    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--run-name", "r",
                 "--set", "grpo.importance_cap=2.0", "--set", setting]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and setting.split("=")[0] in err[0] and "grpo.importance_cap" in err[0], err
    assert not (tmp_path / "r").exists()
    # a rehearser sampled at its own temperature is fine where it is not trained (real_env: the caller alone)
    assert "rehearser" not in TrainConfig.from_dict({"grpo": {"importance_cap": 2.0, "variant": "real_env"},
                                                     "rollout": {"rehearser": {"temperature": 0.0}}}).trained_roles
