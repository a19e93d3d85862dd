"""`[train]` nested by concern: old flat keys still load (one warning per key), `envace migrate FILE.toml` rewrites
them, `validate()` is pure and `resolve()` gives what a run trains with and stores."""

import copy
import json
import re
from dataclasses import asdict, replace

import pytest

from envace import config
from envace.cli import main
from envace.config import MOVED, TrainConfig, flat, load_toml, moved_key
from envace.errors import UsageError

# A value away from its default for every old flat key, all of them valid together.
OLD = {"dtype": "bfloat16", "lora": True, "lora_rank": 8, "gradient_checkpointing": True, "packing": "chain",
       "max_pack_tokens": 4096, "tree_attention": "dense", "flat_row_metrics": True, "sft_tasks": 3, "sft_epochs": 1,
       "sft_lr": 1e-3, "sft_memory": "reference", "rows_per_step": 6, "sft_save_every": 5, "grpo_steps": 7,
       "tasks_per_step": 3, "grpo_tasks": 5, "grpo_units": ["bfcl/multi_turn_base_4@t1"], "grpo_pool_overlap": True,
       "lr": 2e-4,
       "scale_by_std": True, "algorithm": "token_mean", "variant": "caller_only", "rehearser_reward": "task",
       "fidelity_weight": 0.25, "real_fraction_end": 0.5, "max_staleness": 1, "vllm_importance_cap": 2.0,
       "save_every": 3, "eval_every": 2, "eval_limit": 3, "servers": "", "vllm_gpu_memory": 0.3,
       "vllm_devices": [1], "shard_optimizer": False, "fsdp": False, "fsdp_reduce_every_pass": True,
       "dist_timeout_s": 60.0}

# An old file as an earlier release's users wrote them: comments above, beside and under keys, a value over
# several lines, a table of its own after [train].
OLD_FILE = """\
# A recipe written before the tables nested.
[train]
model = "tiny"
lora = true
lora_rank = 8
# the warm-up
sft_tasks = 3              # tasks whose reference rows SFT trains on
sft_lr = 1e-3
grpo_steps = 7
tasks_per_step = 1         # one unit a step, so that
                           # every step plays the one screened turn
grpo_units = [
  "bfcl/multi_turn_base_4@t1",   # the turn with spread
]
packing = "chain"
lr = 2e-4
eval_every = 2

# GRPO's rollouts
[train.rollout]
group_size = 2
max_new_tokens = 16
"""


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each old key warns once per process: a test that counts the warnings starts with none given."""
    monkeypatch.setattr(config, "_warned", set())


def _nested(old: dict) -> dict:
    out: dict = {}
    for key, value in old.items():
        table, leaf = MOVED[key].split(".")
        out.setdefault(table, {})[leaf] = value
    return out


def _literal(value) -> str:
    return json.dumps(value)  # strings, booleans, numbers and lists of them: TOML reads JSON's spelling


def test_every_old_key_loads_as_its_new_one_from_a_file_and_a_dict(tmp_path):
    assert set(OLD) == set(MOVED)
    path = tmp_path / "old.toml"
    path.write_text('[train]\nmodel = "tiny"\n' + "".join(f"{k} = {_literal(v)}\n" for k, v in OLD.items()))
    old = TrainConfig.from_dict(load_toml(path)["train"], where=f"{path} [train]")
    new = TrainConfig.from_dict({"model": "tiny", **_nested(OLD)})
    assert old == new
    for key, value in OLD.items():
        table, leaf = MOVED[key].split(".")
        assert getattr(getattr(new, table), leaf) == value, key
    assert flat(new) == {**flat(TrainConfig(model="tiny")), **OLD}  # `flat` reads the tables back to the old keys
    settings = {k: v for k, v in flat(new).items() if k not in ("rollout", "ray")}  # the trainer owns some of those
    assert TrainConfig.from_dict(settings) == new  # and they load to the same config


def test_an_old_key_warns_once_naming_its_new_key_and_the_file(tmp_path, capsys, fresh_warnings):
    TrainConfig.from_dict({"model": "tiny", "sft_lr": 1e-3})
    TrainConfig.from_dict({"model": "tiny", "sft_lr": 2e-3, "packing": "row"})
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["warning: [train] sft_lr is now sft.lr (envace migrate FILE rewrites the file)",
                   "warning: [train] packing is now packing.strategy (envace migrate FILE rewrites the file)"]
    old = tmp_path / "old.toml"
    old.write_text('[train]\nmodel = "tiny"\neval_every = 2\nbogus = 1\n')
    assert main(["train", str(old), "--root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # a refused config: its one error line, no warning
    assert len(err) == 1 and err[0].startswith("error:") and "bogus" in err[0]
    old.write_text('[train]\nmodel = "tiny"\neval_every = 2\n')
    assert main(["train", str(old), "--root", str(tmp_path / "runs"), "--resume", "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # built, then the run is refused: the warning came first
    assert err[0] == f"warning: {old} [train] eval_every is now eval.every (envace migrate {old} rewrites the file)"
    assert len(err) == 2 and err[1].startswith("error:")


def test_an_old_key_given_by_set_sets_its_new_one(tmp_path, capsys, fresh_warnings):
    from envace.cli.train import _overridden

    table = load_toml("experiments/smoke.toml")["train"]
    assert _overridden(table, ["lr=1e-3", "packing=\"row\""])["grpo"]["lr"] == 1e-3
    assert _overridden(table, ["packing=\"row\""])["packing"] == {"strategy": "row"}
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "lr=1e-3", "--resume",
                 "none"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "warning: --set lr is now --set grpo.lr" and len(err) == 2 and err[1].startswith("error:")
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "lr=abc"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: experiments/smoke.toml [train]: grpo.lr: expected a number, got 'abc'"]
    assert not list(tmp_path.iterdir())


def test_an_old_key_beside_its_new_one_is_one_line(tmp_path, capsys):
    with pytest.raises(UsageError, match=r"^sft_lr and sft.lr are both set: keep sft.lr alone"):
        TrainConfig.from_dict({"sft_lr": 1e-3, "sft": {"lr": 1e-4}})
    TrainConfig.from_dict({"sft_lr": 1e-3, "sft": {"epochs": 1}})  # other keys of the table: no conflict
    both = tmp_path / "both.toml"
    both.write_text('[train]\nmodel = "tiny"\nlr = 1e-3\n\n[train.grpo]\nlr = 1e-4\n')
    capsys.readouterr()
    for argv in (["train", str(both), "--root", str(tmp_path / "runs")], ["migrate", str(both)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "lr and grpo.lr are both set" in err[0], err
    assert not (tmp_path / "runs").exists() and "lr = 1e-3" in both.read_text()  # nothing run, nothing rewritten


def test_migrate_rewrites_a_file_line_by_line_to_the_same_config(tmp_path, capsys):
    path = tmp_path / "old.toml"
    path.write_text(OLD_FILE)
    before = TrainConfig.from_dict(load_toml(path)["train"])
    assert main(["migrate", str(path)]) == 0
    assert "10 key(s) moved: lora → policy.lora," in capsys.readouterr().out
    text = path.read_text()
    table = load_toml(path)["train"]
    assert TrainConfig.from_dict(table) == before
    assert not [k for k, v in table.items() if moved_key(k, v) is not None]  # no old key left
    for line in OLD_FILE.splitlines():  # every comment kept, in its column
        if "#" in line:
            assert line[line.index("#"):] in text and any(
                kept.index("#") == line.index("#") for kept in text.splitlines() if line[line.index("#"):] in kept)
    assert re.search(r"\[train\.sft\]\n# the warm-up\ntasks = 3 +# tasks whose reference rows SFT", text)
    assert "[train.grpo]\nsteps = 7\ntasks_per_step = 1         # one unit a step, so that\n" \
           "                           # every step plays the one screened turn\nunits = [\n" in text
    assert "[train.packing]\nstrategy = \"chain\"\n" in text
    assert text.index("[train.eval]") < text.index("# GRPO's rollouts") < text.index("[train.rollout]")
    assert main(["migrate", str(path)]) == 0  # once is enough
    assert "no old [train] key" in capsys.readouterr().out and path.read_text() == text


def test_migrate_puts_keys_in_a_table_the_file_has_and_refuses_bad_input(tmp_path, capsys):
    path = tmp_path / "half.toml"
    path.write_text('[train]\nmodel = "tiny"\nsft_lr = 1e-3\n\n[train.sft]\nepochs = 1\n\n[train.rollout]\n'
                    'group_size = 2\n')
    assert main(["migrate", str(path)]) == 0
    assert "[train.sft]\nepochs = 1\nlr = 1e-3\n\n[train.rollout]" in path.read_text()
    assert load_toml(path)["train"]["sft"] == {"epochs": 1, "lr": 1e-3}
    capsys.readouterr()
    for argv in (["migrate", str(tmp_path / "none.toml")], ["migrate", "README.md"],
                 ["migrate", str(path), "--root", str(tmp_path)]):
        assert main(argv) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    dotted = tmp_path / "dotted.toml"  # a table given both as dotted keys and as a header: refused, unchanged
    dotted.write_text('[train]\nmodel = "tiny"\nsft_lr = 1e-3\nsft.epochs = 1\n')
    assert main(["migrate", str(dotted)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sft_lr → sft.lr" in err[0] and "sft_lr = 1e-3" in dotted.read_text()


def test_validate_is_pure_and_resolve_gives_a_new_config(monkeypatch):
    from envace.policy import specs
    from envace.policy.tiny import saved_tiny

    folder = str(saved_tiny())
    cfg = replace(TrainConfig(model="tiny"), model=folder)  # rollout.model still the placeholder
    before = copy.deepcopy(asdict(cfg))
    monkeypatch.setattr(specs, "check_model_spec", lambda spec: pytest.fail(f"validate read {spec}"))
    cfg.validate()
    assert asdict(cfg) == before and cfg.rollout.model == "tiny"
    monkeypatch.undo()
    resolved = cfg.resolve()
    assert asdict(cfg) == before  # resolve leaves it as it was
    assert (resolved.rollout.model, resolved.rollout.split) == (folder, "train")
    assert resolved.resolve() == resolved and asdict(replace(resolved, rollout=cfg.rollout)) == before
    missing = TrainConfig(model="/no/such/model")  # built: nothing read yet
    with pytest.raises(UsageError, match="does not exist"):
        missing.resolve()


def test_a_new_run_stores_its_resolved_config_and_an_old_flat_one_resumes(tmp_path):
    from envace.jobs import _resume_run, train_job
    from envace.policy.tiny import saved_tiny
    from envace.store import Run, get_run

    folder = str(saved_tiny())
    cfg = TrainConfig(model=folder, sft={"tasks": 0}, grpo={"steps": 0})
    run, _ = train_job(cfg, tmp_path, "new")
    stored = get_run(tmp_path, "new")["config"]
    assert stored == json.loads(json.dumps(asdict(cfg.resolve())))
    assert stored["rollout"]["model"] == folder and stored["sft"]["tasks"] == 0  # resolved, nested
    with pytest.raises(UsageError, match="missing"):  # the model a run was resumed with is checked again
        train_job(replace(cfg, model=str(tmp_path / "missing")), tmp_path, resume="new")
    old = flat(cfg.resolve())  # as an earlier release stored it: flat keys
    Run.create(tmp_path, "train", old, folder, "old").update(status="interrupted")
    _resume_run(tmp_path, "old", replace(cfg, grpo=replace(cfg.grpo, steps=3)).resolve())  # grpo.steps may grow
    with pytest.raises(UsageError, match="'old' was not trained with this config"):
        _resume_run(tmp_path, "old", replace(cfg, sft=replace(cfg.sft, lr=1.0)).resolve())


def test_the_study_arms_and_sft_change_the_nested_recipe():
    from envace.study.config import ARMS, Study

    study = Study.load("experiments/study_cpu.toml")
    control = study.arm("control", seed=1, units=["bfcl/multi_turn_base_4@t1"])
    assert (control.grpo.variant, control.grpo.lr, control.sft.tasks, control.seed) == ("caller_only", 1e-12, 0, 1)
    assert control.grpo.units == ["bfcl/multi_turn_base_4@t1"] and control.grpo.tasks_per_step == 1
    assert control.policy == study.recipe.policy and control.grpo.steps == study.recipe.grpo.steps
    fidelity = study.arm("fidelity", seed=0)
    assert fidelity.grpo.rehearser_reward == "task+fidelity" and fidelity.rollout.shadow_fraction == 1.0
    sft = study.sft(seed=2, tasks=4)
    assert (sft.grpo.steps, sft.eval.every, sft.sft.tasks, sft.sft.lr) == (0, 0, 4, study.recipe.sft.lr)
    assert not [k for arm in ARMS.values() for k in arm if k in MOVED]  # the arms speak the new keys
