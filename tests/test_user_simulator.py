"""τ² episodes through the rollout engine: the simulated user as a role of our own stack."""

import pytest

from envace.build import build_engine
from envace.config import RolloutConfig
from envace.envs import registry
from envace.envs.tau2 import load_tasks
from envace.policy.backend import Generation
from envace.record import score
from envace.training.rows import training_rows
from envace.types import Role


class ScriptedUser:
    """A user that opens with the task's own request, then ends the conversation: a real Backend."""

    max_context = None

    def __init__(self, tokenizer, opening: str, never_stop: bool = False) -> None:
        self.tokenizer, self.opening, self.never_stop = tokenizer, opening, never_stop
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt, skip_special_tokens=False)
            written = text.count("<|im_start|>assistant") - 1  # the last one is the generation header
            reply = self.opening if written == 0 or self.never_stop else "Thanks, that's all. ###STOP###"
            out.append(Generation(self.tokenizer.encode(reply, add_special_tokens=False) + [self.end], reply, "stop"))
        return out


@pytest.fixture(scope="module")
def tau2():
    return registry.get("tau2")


def _quiet_task(tau2):
    """A retail test task with state changes and nothing to communicate (the scripted caller only says 'Done.')."""
    for task in tau2.load_tasks("retail", "test"):
        criteria = task.payload["task"]["evaluation_criteria"]
        if criteria.get("actions") and not criteria.get("communicate_info"):
            return task
    raise AssertionError("no such retail task")


@pytest.mark.heavy
def test_a_simulated_conversation_replaying_the_gold_actions_scores_one(tau2, tiny, reference_policy):
    task = _quiet_task(tau2)
    assert task.simulated_user is not None and "###STOP###" in task.simulated_user.system_prompt
    cfg = RolloutConfig(env="tau2", category="retail", model="tiny", mode="real", embedding=False)
    engine = build_engine(reference_policy([task]), tau2, cfg, None, ScriptedUser(tiny[1], task.user_turns[0]))
    (ep,) = engine.run_batch([(task, 0)])
    row = score(ep, "real")
    assert row["termination"] == "completed" and row["success"], row["score_detail"]
    assert row["checklist"] == 1.0
    users = ep.of_role(Role.USER)
    assert len(users) == 2 and "###STOP###" in users[-1].gen.text and users[0].prompt_ids
    # the user's generations are stored as their own role and never become training rows
    _, rows = training_rows([ep], ("caller", "rehearser"))
    assert rows and all(r.role in (Role.CALLER, Role.REHEARSER) for r in rows)
    assert len(rows) == len(ep.of_role(Role.CALLER))


@pytest.mark.heavy
def test_dropping_a_gold_action_fails_the_conversation(tau2, tiny, reference_policy):
    task = _quiet_task(tau2)
    writes = [i for i, ref in enumerate(task.reference[0]) if not ref.call.name.startswith(("get_", "find_"))]
    short = type(task)(**{**task.__dict__, "reference": [[r for i, r in enumerate(task.reference[0])
                                                          if i != writes[-1]]]})
    cfg = RolloutConfig(env="tau2", category="retail", model="tiny", mode="real", embedding=False)
    engine = build_engine(reference_policy([short]), tau2, cfg, None, ScriptedUser(tiny[1], task.user_turns[0]))
    (ep,) = engine.run_batch([(short, 0)])
    assert not score(ep, "real")["success"]


@pytest.mark.heavy
def test_a_user_that_never_stops_is_cut_off(tau2, tiny, tiny_backend):
    task = _quiet_task(tau2)
    cfg = RolloutConfig(env="tau2", category="retail", model="tiny", mode="rehearse", max_new_tokens=4,
                        max_user_turns=3, embedding=False)
    engine = build_engine(tiny_backend, tau2, cfg, None, ScriptedUser(tiny[1], "hello", never_stop=True))
    (ep,) = engine.run_batch([(task, 0)])
    row = score(ep, "rehearse")
    assert row["termination"] == "user_turn_limit" and not row["success"]
    assert len(ep.of_role(Role.USER)) == 3 and ep.env.executions == 0


@pytest.mark.parametrize("mode", ["real", "rehearse+shadow"])
def test_solo_telecom_runs_on_the_tiny_model(tiny_backend, tau2, mode):
    (task,) = load_tasks("telecom_solo", "test", 1)
    assert task.simulated_user is None
    cfg = RolloutConfig(env="tau2", category="telecom_solo", model="tiny", mode=mode, max_new_tokens=8,
                        max_steps_per_turn=2, embedding=False)
    (ep,) = build_engine(tiny_backend, tau2, cfg).run_batch([(task, 0)])
    assert ep.termination in ("completed", "step_limit")
    assert not ep.of_role(Role.USER)


@pytest.mark.heavy
def test_the_cli_rolls_out_tau2_with_the_user_played_by_the_policy(tmp_path):
    from envace.cli import main
    from envace.store import connect

    assert main(["rollout", "--env", "tau2", "--domain", "airline", "--limit", "1", "--model", "tiny",
                 "--max-new-tokens", "8", "--user-max-new-tokens", "8", "--max-user-turns", "2",
                 "--root", str(tmp_path), "--run-name", "t"]) == 0
    con = connect(tmp_path)
    roles = dict(con.execute("SELECT role, count(*) FROM generations GROUP BY role").fetchall())
    assert roles["user"] == 2 and roles["caller"] >= 2
    assert con.execute("SELECT termination, env, category FROM episodes").fetchall() == [
        ("user_turn_limit", "tau2", "airline")]
    assert main(["rollout", "--env", "tau2", "--domain", "lunar", "--root", str(tmp_path)]) == 2


@pytest.mark.heavy
def test_training_runs_on_solo_telecom_and_refuses_reference_rows_without_a_scripted_user(tmp_path, capsys):
    from envace.cli import main
    from envace.store import connect

    args = ["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "rollout.env=tau2",
            "--set", 'rollout.tool_docs="compact"',  # τ²'s schemas in full are most of this test's time
            "--set", "sft.epochs=1", "--set", "grpo.steps=1"]  # SFT's reference rows and a GRPO step: what is asked
    assert main([*args, "--set", "rollout.category=telecom_solo", "--run-name", "solo"]) == 0
    con = connect(tmp_path)
    assert con.execute("SELECT DISTINCT category FROM episodes").fetchall() == [("telecom_solo",)]
    # telecom's user acts on the phone between the agent's calls: no script to play it (airline and retail have one,
    # `test_protocol.py`)
    assert main([*args, "--set", "rollout.category=telecom", "--run-name", "conversation"]) == 2
    assert "simulated user has no script" in capsys.readouterr().err
