"""Training rows always fit the packing budget (`envace.training.budget`): a long run never crashes on one.

The caller is the reference policy (it replays gold calls, so episodes run for several steps, as a trained
policy's would), the trained model the tiny one; `packing.max_tokens` is set just above the shortest opening
prompt, so most units cannot open within it and the ones that can run out of room after their first call.
"""

from __future__ import annotations

import random

import pytest

from envace.cli import main
from envace.config import RehearserOptions
from envace.engine.episode import Episode, Pending
from envace.engine.examples import ExampleBank
from envace.engine.prompts import ChatRenderer
from envace.engine.rehearser import Rehearser
from envace.engine.sampler import Sampler
from envace.policy.backend import Generation
from envace.store import connect
from envace.types import ToolCall


@pytest.fixture
def reference_caller(monkeypatch, bfcl):
    import envace.training.actor as rollout_actor
    from envace.policy.scripted import ReferencePolicy

    class Reference(ReferencePolicy):
        max_context = None  # as a vLLM server at 32,768 tokens: nothing but the budget stops an episode

        def clear_caches(self):
            pass

        def generate(self, prompts, params):
            rng, out = random.Random(params.seed), []
            for g in super().generate(prompts, params):
                if "<tool_call>" in g.text and rng.random() < 0.3:  # a call dropped: rewards differ in a group
                    text = "I cannot do that."
                    g = Generation(self.tokenizer.encode(text, add_special_tokens=False) + [self.end], text, "stop")
                if len(g.ids) > params.max_new_tokens:  # as a model does, never past the budget it is given
                    g = Generation(g.ids[:params.max_new_tokens], g.text, "length", g.logprobs)
                out.append(g)
            return out

    tasks = bfcl.load_tasks("multi_turn_base", "train")
    monkeypatch.setattr(rollout_actor, "HFBackend", lambda model, tok, *_: Reference(tok, tasks))


def _train(root, *overrides: str) -> int:
    sets = [a for o in ("sft.tasks=0", "grpo.steps=2", "rollout.max_steps_per_turn=4", "rollout.max_new_tokens=64",
                        "rollout.group_size=4",
                        *overrides)
            for a in ("--set", o)]
    return main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "t", *sets])


BUDGET = 2600  # the shortest opening of the pool is ~2,490 tiny-tokenizer tokens, +64 new tokens


def _longest_row(con, where: str) -> int | None:
    """The longest stored row that matches `where` (a caller's prompt is the first prompt_len of its context)."""
    return con.execute("SELECT max(coalesce(len(prompt_ids), prompt_len) + len(completion_ids)) "
                       f"FROM generations WHERE {where}").fetchall()[0][0]


def test_long_episodes_under_a_small_budget_train_and_every_row_fits(tmp_path, reference_caller, capsys):
    assert _train(tmp_path, f"packing.max_tokens={BUDGET}") == 0  # raised BudgetError mid-step before
    out = " ".join(capsys.readouterr().out.split())  # the CLI folds long lines
    assert "left out of the pool" in out  # units whose first row cannot fit were dropped before any rollout
    con = connect(tmp_path)
    assert con.execute("SELECT count(DISTINCT step) FROM episodes").fetchall()[0][0] == 2
    ended = {t for (t,) in con.execute("SELECT DISTINCT termination FROM episodes").fetchall()}
    assert "context_exceeded" in ended  # the budget, not the model's context, ended them
    assert _longest_row(con, "true") <= BUDGET
    assert 0 < _longest_row(con, "trained") <= BUDGET  # and the update trained on them


def test_a_rehearser_prompt_over_the_budget_is_kept_out_of_the_update_not_a_crash(tmp_path, reference_caller,
                                                                                   capsys):
    # every tool schema in the rehearser's prompt: its prompts alone pass the budget
    assert _train(tmp_path, f"packing.max_tokens={BUDGET}", "rollout.rehearser.tools=all") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"row(s) over packing.max_tokens = {BUDGET} left out of the update" in out
    con = connect(tmp_path)
    assert _longest_row(con, "role = 'rehearser'") > BUDGET
    assert (_longest_row(con, "trained") or 0) <= BUDGET
    over = con.execute("SELECT sum(value) FROM metrics WHERE name = 'rows_over_budget'").fetchall()[0][0]
    assert over > 0


def test_a_pool_no_row_of_which_fits_is_one_line_with_both_numbers(tmp_path, reference_caller, capsys):
    assert _train(tmp_path, "packing.max_tokens=1000") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "packing.max_tokens" in err[0] and "1000" in err[0]
    assert "shortest first caller row" in err[0] and "Traceback" not in err[0]
    assert not list(tmp_path.glob("t/episodes/*.parquet"))  # before any rollout


def test_the_rehearsers_budget_clamps_to_what_is_left_of_the_context(bfcl, tiny):
    model, tok = tiny
    from envace.policy.hf import HFBackend

    backend = HFBackend(model, tok)
    renderer = ChatRenderer(tok)
    task = bfcl.load_tasks("multi_turn_base", "train", limit=1)[0]
    ep = Episode("e", task, 0, None, task.tools)
    ep.history.append(("User", task.user_turns[0]))
    call = task.reference[0][0].call if task.reference[0] else ToolCall("ls", {})
    pending = [Pending(ep, 0, call)]
    options = RehearserOptions(max_new_tokens=32, temperature=1.0)

    def rehearse(context):
        ep.generations.clear()
        Rehearser(Sampler(backend, 1.0, seed=3), renderer, ExampleBank(), options, max_context=context
                  ).rehearse(pending)
        return ep.generations[-1]

    free = rehearse(None)
    prompt_len = free.prompt_len
    assert len(free.gen.ids) > 5  # unclamped, the tiny model writes past the clamp below (seeded)
    clamped = rehearse(prompt_len + 5)
    assert 0 < len(clamped.gen.ids) <= 5 and clamped.prompt_len + len(clamped.gen.ids) <= prompt_len + 5
    none_left = rehearse(prompt_len - 1)  # a prompt past the context: no request, an empty (malformed) rehearsal
    assert none_left.gen.ids == [] and none_left.parse_error


def test_the_hf_fallback_takes_the_configured_micro_batch_size(tmp_path, monkeypatch):
    import envace.training.actor as rollout_actor
    from envace.policy.hf import HFBackend

    sizes = []

    def recording(model, tok, max_batch_tokens=32768, *rest):
        sizes.append(max_batch_tokens)
        return HFBackend(model, tok, max_batch_tokens, *rest)

    monkeypatch.setattr(rollout_actor, "HFBackend", recording)
    assert main(["train", "experiments/smoke.toml", "--root", str(tmp_path), "--set", "sft.tasks=0",
                 "--set", "grpo.steps=1", "--set", "rollout.max_batch_tokens=4096"]) == 0
    assert sizes and set(sizes) == {4096}  # was the backend's default, 32,768, whatever the config said
