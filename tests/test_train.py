import json
import subprocess
import sys
from pathlib import Path

import pytest

from envace.cli import main
from envace.config import RehearserOptions
from envace.store import connect
from envace.training.rows import reference_rows

# Two processes on a free port (`--standalone`), as `accelerate launch --multi_gpu` starts them.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def test_reference_rows_cover_both_roles_from_train_tasks_only(bfcl, tiny):
    import pytest

    train = bfcl.load_tasks("multi_turn_base", "train", limit=2)
    rows = reference_rows(train, bfcl, tiny[1], RehearserOptions())
    calls = sum(len(turn) for t in train for turn in t.reference)
    assert sum(r.role == "rehearser" for r in rows) == calls
    # every reference call plus one closing "Done." per user turn
    assert sum(r.role == "caller" for r in rows) == calls + sum(len(t.user_turns) for t in train)
    assert all(r.reward == 1.0 and r.completion_ids for r in rows)
    with pytest.raises(ValueError):
        reference_rows(bfcl.load_tasks("multi_turn_base", "test", limit=1), bfcl, tiny[1], RehearserOptions())


@pytest.mark.heavy
def test_a_killed_warm_up_goes_on_from_its_last_saved_step(tmp_path):
    """SFT killed after step 3 with its place saved every 2 steps: `--resume` loads step 2's weights, moments
    and random state, takes steps 3.. again, and ends with the weights, per-step NLL and per-epoch NLL of a
    warm-up never stopped (exact: the same steps in the same order on the same numbers)."""
    import torch

    from envace.config import TrainConfig
    from envace.jobs import train_job
    from envace.store import Run
    from envace.training.loop import train

    cfg = TrainConfig(model="tiny", sft={"tasks": 2, "epochs": 2, "lr": 3e-3, "rows_per_step": 6, "save_every": 2},
                      grpo={"steps": 0})
    whole, _ = train_job(cfg, tmp_path, "whole")

    def killed_after_step_3(line: str) -> None:
        if line.strip().startswith("SFT step 3/"):
            raise KeyboardInterrupt

    cut = Run.create(tmp_path, "train", {}, "tiny", "cut")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, cut, say=killed_after_step_3)
    assert torch.load(cut.path / "sft_state.pt", weights_only=True)["step"] == 2
    assert not (cut.path / "state.pt").exists()
    said: list[str] = []
    summary = train(cfg, cut, say=said.append, resume=True)
    assert any(line.startswith("  SFT goes on after step 2/") for line in said)
    assert not any("SFT step 2/" in line for line in said) and any("SFT step 3/" in line for line in said)
    assert not (cut.path / "sft_state.pt").exists()  # done: its result is state.pt now
    assert {k: v for k, v in summary.items() if k.startswith("sft_nll")} == \
        {k: v for k, v in whole.meta()["summary"].items() if k.startswith("sft_nll")}
    a, b = (torch.load(r.path / "state.pt", weights_only=True) for r in (whole, cut))
    weights = [k for k in a if isinstance(a[k], dict) and all(torch.is_tensor(v) for v in a[k].values())]
    assert weights and all(torch.equal(a[k][n], b[k][n]) for k in weights for n in a[k])
    con = connect(tmp_path)
    nll = "SELECT step, value FROM metrics WHERE run_id = ? AND phase = 'sft' AND name = 'nll' ORDER BY step"
    assert con.execute(nll, ["whole"]).fetchall() == con.execute(nll, ["cut"]).fetchall()


@pytest.mark.heavy
def test_train_smoke_config_end_to_end(store, tmp_path, capsys):
    """`envace train experiments/smoke.toml`: the `store` fixture's run `trained` (that very command, run once for
    the suite), then a rollout from its checkpoint."""
    con = connect(store)
    nll = [v for (v,) in con.execute("SELECT value FROM metrics WHERE run_id = 'trained' AND phase = 'sft' "
                                     "AND name = 'nll' ORDER BY step").fetchall()]
    assert len(nll) >= 2 and sum(nll[-2:]) < sum(nll[:2])  # the warm-up learns
    roles = {r for (r,) in con.execute("SELECT DISTINCT role FROM metrics WHERE run_id = 'trained' "
                                       "AND phase = 'grpo'").fetchall()}
    assert {"all", "caller"} <= roles
    assert con.execute("SELECT count(DISTINCT step) FROM episodes WHERE run_id = 'trained'").fetchall()[0][0] == 2
    executions = con.execute("SELECT max(env_executions) FROM episodes WHERE run_id = 'trained'").fetchall()
    assert executions == [(0,)]  # no environment in RL
    capsys.readouterr()
    checkpoint = store / "trained" / "checkpoint"
    assert main(["rollout", "--model", str(checkpoint), "--limit", "1", "--max-new-tokens", "4",
                 "--max-steps-per-turn", "1", "--root", str(tmp_path), "--run-name", "after"]) == 0
    _grpo_pool_is_disjoint_from_what_sft_taught(tmp_path, con, checkpoint, capsys)


def _grpo_pool_is_disjoint_from_what_sft_taught(tmp_path, con, checkpoint, capsys):
    """The smoke run's GRPO played no scenario its SFT saw; its checkpoint records them, so a run from it with no
    SFT of its own still leaves them out, and naming one in grpo.units is one error line (exit 2) unless the
    overlap is asked for."""
    from envace.envs import registry
    from envace.training.pool import SEEN_FILE
    from envace.types import task_group
    from envace.units import whole_uid

    train = registry.get("bfcl").load_tasks("multi_turn_base", "train")
    sft = train[:2]  # smoke.toml: [train.sft] tasks = 2
    seen = json.loads((checkpoint / SEEN_FILE).read_text())["groups"]
    assert seen == sorted({task_group(t) for t in sft}) and len(seen) == 2
    played = {whole_uid(u) for (u,) in con.execute("SELECT DISTINCT task_uid FROM episodes WHERE run_id = 'trained' "
                                                   "AND phase = 'grpo'").fetchall()}
    assert played and not {task_group(t) for t in train if t.uid in played} & set(seen)
    taught = ["--set", f'model="{checkpoint}"', "--set", "sft.tasks=0", "--set", f'grpo.units=["{sft[0].uid}"]',
              "--set", "grpo.steps=0"]
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--run-name", "o", *taught]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"grpo.units: {sft[0].uid} is in a scenario SFT trained on" in err[0]
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--run-name", "o2", *taught,
                 "--set", "grpo.pool_overlap=true"]) == 0


def test_bad_train_configs(tmp_path):
    bad = tmp_path / "bad.toml"
    for text in ("[rollout]\n", "[train]\ngroup_size = 0\n", "[train]\nlr = 'fast'\n", "[train]\nsteps = 3\n"):
        bad.write_text(text)
        assert main(["train", str(bad), "--root", str(tmp_path)]) == 2
    assert not list(tmp_path.glob("train-*"))  # rejected before any run folder or model


@pytest.mark.parametrize("setting, field", [("rollout.user_model=tiny", "rollout.user_model"),
                                            ("rollout.report_to=tensorboard", "rollout.report_to")])
def test_rollout_fields_training_does_not_honour_are_refused(tmp_path, capsys, setting, field):
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", setting]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]


def test_lora_training_trains_adapters_and_saves_merged_weights(tmp_path):
    from envace.config import TrainConfig
    from envace.store import Run
    from envace.training.loop import train

    cfg = TrainConfig(model="tiny", policy={"lora": True, "lora_rank": 4},
                      sft={"tasks": 1, "epochs": 1, "lr": 1e-2, "rows_per_step": 8},
                      grpo={"steps": 1, "tasks_per_step": 1},
                      rollout={"group_size": 2, "max_new_tokens": 8, "max_steps_per_turn": 1})
    run = Run.create(tmp_path, "train", {}, "tiny", name="lora")
    summary = train(cfg, run, say=lambda _: None)
    saved = tmp_path / "lora" / "checkpoint"
    assert summary["checkpoint"] == str(saved) and (saved / "config.json").exists()
    assert not list(saved.glob("adapter_*"))  # merged into plain weights, loadable by --model


@pytest.mark.heavy
def test_resume_reproduces_the_uninterrupted_next_step(tmp_path):
    import re

    smoke = open("experiments/smoke.toml").read()
    full, short = tmp_path / "full.toml", tmp_path / "short.toml"
    steps = re.compile(r"^steps = \d+", re.M)  # [train.grpo] steps, the file's only key named so
    assert len(steps.findall(smoke)) == 1
    full.write_text(steps.sub("steps = 3", smoke))
    short.write_text(steps.sub("steps = 2", smoke))
    root = str(tmp_path / "runs")
    assert main(["train", str(full), "--root", root, "--run-name", "whole"]) == 0
    assert main(["train", str(short), "--root", root, "--run-name", "cut"]) == 0  # stops after step 2
    assert main(["train", str(full), "--root", root, "--resume", "cut"]) == 0
    con = connect(root)

    def step_three(run):
        metrics = con.execute("SELECT role, name, value FROM metrics WHERE run_id = ? AND phase = 'grpo' "
                              "AND step = 2 AND NOT regexp_matches(name, '_(s|t)$')"  # wall times and clocks
                              " ORDER BY role, name", [run]).fetchall()
        turns = con.execute("SELECT episode_id, role, turn, turn_step, completion_ids FROM generations "
                            "WHERE run_id = ? AND step = 2 ORDER BY episode_id, role, turn, turn_step, call_index",
                            [run]).fetchall()
        return metrics, turns

    (m_whole, t_whole), (m_cut, t_cut) = step_three("whole"), step_three("cut")
    assert t_whole and t_whole == t_cut
    assert [(r, n) for r, n, _ in m_whole] == [(r, n) for r, n, _ in m_cut]
    for (_, name, a), (_, _, b) in zip(m_whole, m_cut, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), name
    assert con.execute("SELECT count(*) FROM metrics WHERE run_id = 'cut' AND phase = 'grpo' AND step = 0 "
                       "AND name = 'loss'").fetchall()[0][0] == 1  # steps are not duplicated
    assert main(["train", str(full), "--root", root, "--resume", "whole", "--run-name", "x"]) == 0
    bad = tmp_path / "other.toml"
    bad.write_text(smoke.replace("group_size = 2", "group_size = 3"))
    assert main(["train", str(bad), "--root", root, "--resume", "cut"]) == 2


def _variant(tmp_path, name, **overrides):
    from envace.config import TrainConfig, overlay
    from envace.store import Run
    from envace.training.loop import train

    base = dict(model="tiny", sft={"tasks": 1, "epochs": 1, "lr": 1e-2, "rows_per_step": 8},
                grpo={"steps": 1, "tasks_per_step": 1},
                rollout={"group_size": 2, "max_new_tokens": 8, "max_steps_per_turn": 1})
    cfg = TrainConfig.from_dict(overlay(base, overrides))
    run = Run.create(tmp_path, "train", {}, "tiny", name=name)
    return cfg, train(cfg, run, say=lambda _: None)


def test_a_frozen_role_generates_with_the_base_weights_while_the_caller_learns():
    import torch

    from envace.config import TrainConfig
    from envace.policy.backend import SamplingParams
    from envace.policy.hf import HFBackend
    from envace.policy.models import add_lora
    from envace.policy.tiny import build_tiny
    from envace.training.grpo import Row, backward

    cfg = TrainConfig(model="tiny", grpo={"variant": "caller_only"}, policy={"lora": True})
    assert cfg.rollout_at(0).frozen_rehearser and cfg.trained_roles == ("caller",)
    model, tok = build_tiny(seed=5)
    peft = add_lora(model, 4)
    backend = HFBackend(peft, tok)
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    (untrained,) = backend.generate([prompt], greedy)
    target = tok.encode("<tool_call>", add_special_tokens=False)
    optimizer = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=5e-2)
    for _ in range(20):  # teach the caller's adapters a reply the base model does not give
        optimizer.zero_grad()
        backward(peft, [Row("t", "caller", prompt, target, 1.0)], [1.0], tok.pad_token_id)
        optimizer.step()
    backend.clear_caches()
    (frozen,) = backend.generate([prompt], SamplingParams(max_new_tokens=8, temperature=0.0, frozen=True))
    (caller,) = backend.generate([prompt], greedy)
    assert frozen.ids == untrained.ids  # the rehearser's weights did not move
    assert caller.ids != untrained.ids  # the caller's did


def test_real_env_variant_touches_the_environment_and_trains_only_the_caller(tmp_path):
    from envace.store import connect

    _variant(tmp_path, "real", grpo={"variant": "real_env"})
    con = connect(tmp_path)
    assert con.execute("SELECT DISTINCT mode FROM episodes").fetchall() == [("real",)]
    roles = {r for (r,) in con.execute("SELECT DISTINCT role FROM metrics WHERE phase = 'grpo'").fetchall()}
    assert "rehearser" not in roles


def test_caller_only_needs_lora():
    from envace.config import TrainConfig
    from envace.errors import UsageError

    with pytest.raises(UsageError, match="needs policy.lora"):
        TrainConfig(model="tiny", grpo={"variant": "caller_only"})


@pytest.mark.heavy
def test_eval_every_k_steps_and_an_annealed_dyna_mix(tmp_path):
    from envace.store import connect

    root = str(tmp_path)
    assert main(["train", "experiments/smoke.toml", "--root", root, "--run-name", "dyna", "--set", "eval.every=1",
                 "--set", "eval.limit=1", "--set", "rollout.real_fraction=0.0", "--set", "grpo.real_fraction_end=1.0",
                 "--set", "rollout.rehearser.max_new_tokens=8"]) == 0
    con = connect(root)
    evals = con.execute("SELECT step, name, value FROM metrics WHERE phase = 'eval' ORDER BY step").fetchall()
    assert sorted({s for s, _, _ in evals}) == [0, 1, 2]  # before GRPO, then after every update
    assert {"success_rate", "checklist", "well_formed_rate", "pairs"} <= {n for _, n, _ in evals}
    fractions = con.execute("SELECT value FROM metrics WHERE phase = 'grpo' AND name = 'real_fraction' "
                            "ORDER BY step").fetchall()
    assert [f for (f,) in fractions] == [0.0, 1.0]
    first, last = con.execute("SELECT sum(env_executions), sum(n_calls) FROM episodes WHERE phase = 'grpo' "
                              "GROUP BY step ORDER BY step").fetchall()
    assert first[0] == 0 and last[0] == last[1]  # rehearsed world first, the real one at the end


def test_grpo_units_fix_the_pool_and_an_unknown_uid_is_one_error_line(tmp_path, capsys):
    from envace.store import connect

    root = str(tmp_path)
    fixed = ["--set", "sft.tasks=0", "--set", "grpo.steps=2"]
    assert main(["train", "experiments/smoke.toml", "--root", root, "--run-name", "bad", *fixed,
                 "--set", 'grpo.units=["bfcl/multi_turn_base_3"]']) == 2  # a test task: not in the pool
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "grpo.units: bfcl/multi_turn_base_3 is not one of the" in err[0]
    assert main(["train", "experiments/smoke.toml", "--root", root, "--run-name", "fixed", *fixed,
                 "--set", 'grpo.units=["bfcl/multi_turn_base_5"]']) == 0
    played = connect(root).execute("SELECT DISTINCT step, task_uid FROM episodes WHERE run_id = 'fixed' "
                                   "AND phase = 'grpo' ORDER BY step").fetchall()
    assert played == [(0, "bfcl/multi_turn_base_5"), (1, "bfcl/multi_turn_base_5")]


def test_set_overrides_are_validated_like_the_file(tmp_path):
    for bad in (["--set", "bogus=1"], ["--set", "lr"], ["--set", "rollout.group_size=0"],
                ["--set", "rollout.rehearser.x=1"], ["--set", "grpo.lr=abc"], ["--set", "grpo.lr=nan"]):
        assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), *bad]) == 2
    assert not list(tmp_path.iterdir())


# Two processes, the same tasks as the sharded runs below: unsharded data parallelism on full weights.
# one SFT epoch: what these runs compare is how two processes share the work, not the warm-up
DATA_PARALLEL = ["--set", "grpo.tasks_per_step=2", "--set", "sft.tasks=2", "--set", "sft.epochs=1",
                 "--set", "policy.lora=false"]


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory):
    """One torchrun of smoke.toml in two processes (`dp`): read by the test of what two processes store and
    as the unsharded reference of the sharded runs, instead of each launching it. (store root, completed process)"""
    root = tmp_path_factory.mktemp("data-parallel")
    done = subprocess.run([*TORCHRUN, "-m", "envace.cli", "train", "experiments/smoke.toml", "--root", str(root),
                           "--run-name", "dp", *DATA_PARALLEL], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return root, done


@pytest.mark.heavy
def test_two_processes_train_one_model_under_torchrun(data_parallel):
    """`accelerate launch` / torchrun: each process plays its share of the tasks, one run, one checkpoint."""
    root, done = data_parallel
    assert "process 1 of 2" in done.stdout and (root / "dp" / "checkpoint" / "config.json").exists()
    con = connect(root)
    shards = con.execute("SELECT step, count(DISTINCT task_uid), count(*) FROM episodes GROUP BY step").fetchall()
    assert [(b, tasks) for b, tasks, _ in sorted(shards)] == [(0, 2), (1, 2)]  # both processes' tasks stored
    assert con.execute("SELECT status FROM runs WHERE run_id = 'dp'").fetchall() == [("completed",)]


@pytest.mark.parametrize("path", sorted(Path("experiments").glob("*.toml")), ids=lambda p: p.name)
def test_every_experiment_config_validates(path):
    from envace.config import RolloutConfig, TrainConfig, load_toml
    from envace.errors import UsageError

    raw = load_toml(path)
    def checked(cls, data, where=""):  # a train config reads its model's files when it is resolved
        cfg = cls.from_dict(data, where=where)
        return cfg.resolve() if cls is TrainConfig else cfg

    for table, cls in (("rollout", RolloutConfig), ("train", TrainConfig)):
        if table in raw:
            data = dict(raw[table])
            if data.get("model", "default") not in ("default", "tiny"):  # a GPU model absent from this machine
                with pytest.raises(UsageError, match="no network here"):
                    checked(cls, data)
                data["model"] = "tiny"
            checked(cls, data, where=f"{path} [{table}]")
    if "study" in raw:  # a study file: its design, and each arm's recipe, checked as `envace study` checks them
        from envace.study.config import Study, StudyConfig

        StudyConfig.from_dict(raw["study"], where=f"{path} [study]")
        if raw["train"].get("model", "default") in ("default", "tiny"):
            Study.load(path)


@pytest.mark.heavy
def test_sharded_optimizer_and_fsdp_take_the_same_steps_and_resume(data_parallel, tmp_path, capsys):
    """ZeRO stage 1 under torchrun and FSDP under `accelerate launch` with experiments/accelerate_fsdp.yaml:
    the same weights as unsharded data parallelism, every weight's state saved (ZeRO's gathered whole, FSDP's
    as each process's own shards), and resumes that load it back into the shards."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    torchrun = [*TORCHRUN, "-m", "envace.cli"]
    fsdp = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "experiments/accelerate_fsdp.yaml",
            "--num_processes", "2", "--main_process_port", "0", "-m", "envace.cli"]
    common = ["--root", str(tmp_path), *DATA_PARALLEL]

    def train(launcher, *args):
        return subprocess.run(launcher + ["train", "experiments/smoke.toml", *common, *args], capture_output=True,
                              text=True, timeout=600)

    for launcher, name, shard in ((torchrun, "zero", "true"), (fsdp, "fsdp", "false")):
        done = train(launcher, "--run-name", name, "--set", f"distributed.shard_optimizer={shard}")
        assert done.returncode == 0, done.stderr[-2000:]
    plain, zero, sharded = (load_file(root / n / "checkpoint" / "model.safetensors")
                            for root, n in ((data_parallel[0], "dp"), (tmp_path, "zero"), (tmp_path, "fsdp")))
    assert plain.keys() == zero.keys() == sharded.keys()
    assert all(torch.allclose(plain[k], zero[k], atol=1e-6) for k in plain)
    assert all(torch.allclose(plain[k], sharded[k], atol=1e-5) for k in plain)
    con = connect(str(tmp_path))
    for name in ("zero", "fsdp"):
        state = torch.load(tmp_path / name / "state.pt", weights_only=True)
        assert state["fsdp"] == (name == "fsdp")
        if name == "fsdp":  # a file a process beside state.pt, read whole here by torch's own converter
            shards = tmp_path / name / state["shards"]
            assert len(list(shards.glob("*.distcp"))) == 2 and "model" not in state
            dcp_to_torch_save(shards, tmp_path / "whole.pt")
            state = torch.load(tmp_path / "whole.pt", weights_only=True)
        updated = con.execute("SELECT max(value) FROM metrics WHERE run_id = ? AND name = 'updated'", [name]).fetchall()
        # every weight's moments, not one shard's (tests/fsdp_worker.py checks their values after real updates);
        # when every GRPO step was flat (the tiny model scores nothing) no step made any, but torch's FSDP state
        # dict initialises them all (at zero, with the learning rate set to 0)
        whole = updated[0][0] or name == "fsdp"
        assert len(state["optimizer"]["state"]) == (len(state["model"]) if whole else 0)
    done = train(torchrun, "--resume", "zero", "--set", "distributed.shard_optimizer=true", "--set", "grpo.steps=3")
    assert done.returncode == 0, done.stderr[-2000:]
    done = train(fsdp, "--resume", "fsdp", "--set", "grpo.steps=3")
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("zero", "fsdp"):
        assert torch.load(tmp_path / name / "state.pt", weights_only=True)["next_step"] == 3
    assert [p.name for p in (tmp_path / "fsdp").glob("*shards-*")] == ["shards-3"]  # the earlier saves' went
    # FSDP's state needs FSDP to resume: refused in one line (here in one process, which is not FSDP either)
    assert main(["train", "experiments/smoke.toml", *common, "--resume", "fsdp", "--set", "grpo.steps=4"]) == 2
    assert "saved with FSDP" in capsys.readouterr().err


def test_an_accelerate_fsdp_launch_is_read_or_refused_clearly(monkeypatch, tmp_path):
    from envace.training.fsdp import launcher_fsdp

    assert launcher_fsdp() is None
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    assert launcher_fsdp() == {"reshard_after_forward": False, "activation_checkpointing": False}
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--run-name", "zero",
                 "--set", "distributed.shard_optimizer=true"]) == 2  # FSDP already shards the optimizer state
    for key, value in (("FSDP_VERSION", "1"), ("FSDP_OFFLOAD_PARAMS", "true")):
        with monkeypatch.context() as m:
            m.setenv(key, value)
            assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--run-name", key]) == 2
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "distributed.fsdp=true",
                 "--set", "distributed.shard_optimizer=true"]) == 2
    assert not list(tmp_path.iterdir())  # refused before any run was created


FSDP_MODES = ["full", "full_every_pass", "lora", "zero"]


@pytest.fixture(scope="module")
def fsdp_results(tmp_path_factory) -> dict[str, dict]:
    """`tests/fsdp_worker.py`'s result for every mode, from one two-process launch."""
    out = tmp_path_factory.mktemp("fsdp") / "result"
    done = subprocess.run([*TORCHRUN, "tests/fsdp_worker.py", str(out), *FSDP_MODES],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return {mode: json.loads(Path(f"{out}.{mode}").read_text()) for mode in FSDP_MODES}


@pytest.mark.heavy
@pytest.mark.parametrize("mode", FSDP_MODES)
def test_fsdp_updates_equal_one_process_with_the_whole_batch(fsdp_results, mode):
    """Two FSDP processes with unequal shares (one pads with idle passes) take, over two updates with a
    save and load between them, the steps one process takes with the whole batch; so does ZeRO stage 1
    (`zero`: whole weights on each process, AdamW's moments sharded and gathered whole into the state).
    FSDP2 holds whole, unsharded gradients between the passes of a step unless they are reduce-scattered
    after every pass (`distributed.reduce_every_pass`)."""
    result = fsdp_results[mode]
    assert not result["skipped"] and result["moved"] > 1e-3  # the updates did something
    # The moments (0.9·0.1·g1 + 0.1·g2) carry the gradients: equal to 1e-6. The weights pass through Adam's
    # g / (|g| + 1e-8), which turns fp32 rounding in gradients of ~1e-8 into lr-sized steps: tree packing sums a
    # shared token's gradient in another order than the whole batch does (3.6% on elements below 1e-6, where
    # chain's order gave 1.5%), so its weights agree to 5e-5 where chain's agreed to 3e-6.
    assert result["weights"] < 1e-4 and result["moments"] < 1e-6
    assert result["saved"] == [result["tensors"]] * 2  # whole weights and moments, not one shard
    if mode != "zero":  # each process also wrote its own shards, and they read back as the whole state did
        assert result["from_shards"] is True
        mine, other = result["shard_files"]  # one file a process, each about half the state
        assert len(result["shard_files"]) == 2 and mine > 0.6 * other
    if mode in ("full", "full_every_pass"):
        assert (result["held"] == 0) == (mode == "full_every_pass")


def test_the_store_keeps_what_the_update_used_and_the_inspector_shows_it(tmp_path, scripted_updates):
    """A training run records through the same path as a rollout (calls, pairs with `shadow_fraction`), and
    each generation row holds the very advantage `grpo_step` was given for it, and whether it was trained."""
    from apps.render import episode_html
    from workbench import Workbench

    used = scripted_updates
    root = tmp_path / "runs"
    assert main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "t", "--set", "sft.tasks=0",
                 "--set", "rollout.shadow_fraction=1.0", "--set", "rollout.max_steps_per_turn=3",
                 "--set", "rollout.group_size=4"]) == 0
    con = connect(root)
    assert con.execute("SELECT count(*) FROM calls").fetchall()[0][0] > 0
    assert con.execute("SELECT count(*) FROM pairs").fetchall()[0][0] > 0  # shadowed by the real environment
    for step, rows in enumerate(used):
        stored = con.execute("SELECT role, completion_ids, advantage, trained FROM generations WHERE step = ? "
                             "AND advantage IS NOT NULL", [step]).fetchall()
        key = sorted((role, tuple(ids), round(adv, 9)) for role, ids, adv, _ in stored)
        assert key == sorted((r.role, tuple(r.completion_ids), round(a, 9)) for r, a in rows)
        # trained: the update back-propagated the row (advantage 0 adds nothing and is skipped)
        assert all(trained == (adv != 0.0) for _, _, adv, trained in stored if any(a for _, a in rows))
    assert any(a != 0 for rows in used for _, a in rows)  # a real signal was stored, not only zeros
    wb = Workbench(root)
    episode = wb.episodes("t")["episode_id"][0]
    steps = wb.steps("t", episode)
    caller = steps[steps["role"] == "caller"].iloc[0]
    html = episode_html(steps, wb.calls("t", episode))
    assert f"advantage {caller['advantage']:+.3f}" in html
    from html import escape

    rehearsed = next(e for e in wb.episodes("t")["episode_id"] if (wb.steps("t", e)["role"] == "rehearser").any())
    steps = wb.steps("t", rehearsed)
    rehearsals = steps[steps["role"] == "rehearser"]
    html = episode_html(steps, wb.calls("t", rehearsed))
    assert all(escape(t) in html for t in rehearsals["completion_text"])  # what the rehearser wrote, word for word
    assert 'class="caller"' in html and "white-space:pre-wrap" in html.split('class="caller"')[1].split("</pre>")[0]
    # an episode's GRPO group side by side: its G episodes, each caller advantage its reward minus one baseline
    # (the mean over the group's caller rows)
    group = wb.group("t", episode)
    assert len(group) == 4 and episode in set(group["episode_id"]) and group["reward"].nunique() > 1
    baseline = group["reward"] - group["caller_advantage"]
    assert baseline.to_numpy() == pytest.approx([baseline.iloc[0]] * 4, abs=1e-6)
    assert wb.group("t", "no-such-episode").empty


def test_sft_summariser_rows_render_the_prompt_private_rehearsal_sends(bfcl, tiny):
    """The summariser's SFT row for a turn is exactly what private rehearsal asks after one imagined attempt that
    played the reference (scripted caller and rehearser), and its target is a plain-text memory."""
    from envace.build import build_engine
    from envace.config import PrivateOptions, RolloutConfig
    from envace.formats import parse_tool_calls
    from envace.policy.scripted import ReferencePolicy

    task = next(t for t in bfcl.load_tasks("multi_turn_base", "train", limit=10)
                if all(s.result.content.isascii() for turn in t.reference for s in turn))
    rows = [r for r in reference_rows([task], bfcl, tiny[1], RehearserOptions()) if r.role == "summariser"]
    assert len(rows) == len(task.reference)
    policy = ReferencePolicy(tiny[1], [task])
    cfg = RolloutConfig(model="tiny", split="train", embedding=False,
                        private=PrivateOptions(mode="parallel", budget=1, max_steps=20))
    build_engine(policy, bfcl, cfg).run_batch([(task, 0)])
    asked = [p for p in policy.prompts if "## Imagined attempt" in tiny[1].decode(p)]
    assert [r.prompt_ids for r in rows] == asked  # token for token, turn by turn
    memory = tiny[1].decode(rows[0].completion_ids, skip_special_tokens=True)
    assert not parse_tool_calls(memory).calls and task.reference[0][0].call.name in memory
