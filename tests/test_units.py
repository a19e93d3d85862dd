"""Turn-level episodes from the gold prefix, budgets from the gold data, and the signal they are built for."""

import pytest

from envace import units
from envace.build import build_engine
from envace.config import RehearserOptions, RolloutConfig
from envace.errors import UsageError
from envace.record import score


def _long_task(bfcl):
    """A test task with at least three turns, each with at least one gold call."""
    return next(t for t in bfcl.load_tasks("multi_turn_base", "test") if len(t.reference) >= 3
                and all(t.reference[:3]))


@pytest.mark.parametrize("mode", ["real", "rehearse"])
def test_a_turn_episode_replays_the_gold_prefix_token_for_token_and_is_scored_on_its_turn(bfcl, reference_policy,
                                                                                           mode):
    task = _long_task(bfcl)
    whole = build_engine(reference_policy([task]), bfcl, RolloutConfig(model="tiny", mode="real", embedding=False))
    (full,) = whole.run_batch([(task, 0)])
    k = 2
    turn = units.turn_task(bfcl, task, k)
    assert turn.start_turn == k and turn.user_turns == task.user_turns[: k + 1]
    engine = build_engine(reference_policy([task]), bfcl, RolloutConfig(model="tiny", mode=mode, embedding=False))
    (ep,) = engine.run_batch([(turn, 0)])
    first = ep.generations[0]
    assert first.turn == k and first.turn_step == 0  # the policy wrote nothing before turn k
    played = next(g for g in full.generations if g.turn == k and g.turn_step == 0)
    assert ep.ids[: first.prompt_len] == full.ids[: played.prompt_len]  # the prefix the reference itself built
    gold = [c for c in ep.calls if c["source"] == "gold"]
    assert [c["response"] for c in gold] == [s.result.content for t in task.reference[:k] for s in t]
    assert ep.env.executions == (len(ep.calls) if mode == "real" else 0)  # rehearse: no environment at all
    row = score(ep, mode)
    assert row["checklist"] == 1.0 and row["start_turn"] == k and row["n_ref_turns"] == 1
    assert row["success"]  # BFCL's own checker, which re-executes the calls, on turns 0..k
    assert row["n_calls"] == len(task.reference[k])


def test_dropping_a_call_of_the_played_turn_scores_less(bfcl, reference_policy):
    task = _long_task(bfcl)
    k = 2
    short = type(task)(**{**task.__dict__, "reference": task.reference[:k] + [task.reference[k][:-1]]
                          + task.reference[k + 1:]})
    turn = units.turn_task(bfcl, task, k)
    engine = build_engine(reference_policy([short]), bfcl, RolloutConfig(model="tiny", mode="real", embedding=False))
    (ep,) = engine.run_batch([(turn, 0)])
    row = score(ep, "real")
    assert row["checklist"] == pytest.approx(1 - 1 / len(task.reference[k])) and not row["success"]


def test_turns_are_selected_by_gold_calls_and_tokens_and_bad_filters_are_clear(bfcl, tiny, tau2=None):
    from envace.envs import registry

    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=6)
    turns = units.turn_tasks(bfcl, tasks, tiny[1], 2, 2)
    assert turns and all(len(t.reference[t.start_turn]) == 2 for t in turns)
    budget = units.message_tokens(tiny[1], [s.call for t in turns for s in t.reference[t.start_turn]])
    fewer = units.turn_tasks(bfcl, tasks, tiny[1], 2, 2, max_tokens=budget - 1)
    assert len(fewer) < len(turns)
    with pytest.raises(UsageError, match="min_turn_calls, max_turn_calls"):
        units.turn_tasks(bfcl, tasks, tiny[1], 40, 50)
    every = units.turn_tasks(bfcl, tasks, tiny[1], 1, 10)  # `grpo_tasks` keeps the turns of the tasks it names
    assert {units.source_uid(t) for t in every} == {t.uid for t in tasks}
    assert {t.start_turn for t in every} >= {0, 1} and len({t.uid for t in every}) == len(every)
    airline = registry.get("tau2").load_tasks("airline", "test", limit=1)
    with pytest.raises(UsageError, match="simulated user"):
        units.turn_tasks(registry.get("tau2"), airline, tiny[1])


def test_auto_budgets_come_from_the_gold_data(bfcl, tiny, reference_policy):
    train = bfcl.load_tasks("multi_turn_base", "train")
    lengths = units.gold_stats(train, tiny[1])["message_tokens"]
    auto = units.auto_max_new_tokens(train, tiny[1])
    assert auto == units.percentile(lengths, 0.95) + units.TOKEN_MARGIN
    assert sum(n <= auto for n in lengths) >= 0.95 * len(lengths)
    cfg = RolloutConfig(model="tiny", max_new_tokens="auto", max_steps_per_turn="auto", unit="turn", limit=3)
    resolved, turns = units.select(cfg, bfcl, tiny[1])
    assert resolved.max_new_tokens == auto and len(turns) == 3
    engine = build_engine(reference_policy(bfcl.load_tasks("multi_turn_base", "test")), bfcl, resolved)
    loop = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    engine_loop = build_engine(reference_policy([], corrupt=loop), bfcl, resolved)
    (ep,) = engine_loop.run_batch([(turns[0], 0)])
    assert ep.termination == "step_limit"  # auto: the turn's gold calls + 1 messages, then cut
    assert len(ep.of_role("caller")) == len(turns[0].reference[turns[0].start_turn]) + 1
    del engine


def test_no_prompt_of_a_test_episode_holds_its_own_gold_results(bfcl, reference_policy, tmp_path, tiny):
    """The leakage rule, on what was stored: the grounding every rehearser prompt of a real+shadow and a rehearse
    run on test tasks showed holds none of that task's own gold results that no train task shares (the
    conversation so far may hold them: the episode itself produced them)."""
    from envace.jobs import Reporter, rollout_job
    from envace.store import connect

    quiet = type("Quiet", (Reporter,), {"say": lambda self, text: None})()
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=3)
    train_results = {s.result.content for t in bfcl.load_tasks("multi_turn_base", "train") for turn in t.reference
                     for s in turn}
    for mode in ("real+shadow", "rehearse"):
        cfg = RolloutConfig(model="tiny", mode=mode, limit=3, embedding=False)
        rollout_job(cfg, tmp_path, mode.replace("+", "-"), reporter=quiet, backend=reference_policy(tasks))
    with pytest.raises(UsageError, match="leakage"):
        RolloutConfig(model="tiny", mode="rehearse", rehearser=RehearserOptions(fewshot="reference"))
    rows = connect(tmp_path).execute("SELECT e.task_uid, g.prompt_ids FROM generations g JOIN episodes e USING "
                                     "(run_id, step, episode_id) WHERE g.role = 'rehearser'").fetchall()
    assert len(rows) > 5
    own = {t.uid: {s.result.content for turn in t.reference for s in turn if len(s.result.content) > 20}
           - train_results for t in tasks}
    assert any(own.values())
    for uid, prompt in rows:
        grounding = tiny[1].decode(prompt).split("## Previous tool calls and results\n", 1)[1].split("\n\n## ")[0]
        assert not [r for r in own[uid] if r in grounding], uid
