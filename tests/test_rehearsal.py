import json

import pytest

from envace.build import build_engine
from envace.config import RehearserOptions, RolloutConfig
from envace.engine.examples import ExampleBank
from envace.formats import parse_execution_result
from envace.jobs import play
from envace.record import score
from envace.store import Run, connect


def _config(**kw):
    kw.setdefault("embedding", False)
    return RolloutConfig(batch_size=4, **kw)


def _engine(backend, bfcl, **kw):
    return build_engine(backend, bfcl, _config(**kw))


def test_rehearse_mode_never_touches_the_environment(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=3)
    engine = _engine(reference_policy(tasks), bfcl, mode="rehearse")
    episodes = engine.run_batch([(t, 0) for t in tasks])
    assert all(ep.env.executions == 0 for ep in episodes)
    assert all(c["source"] == "rehearsed" for ep in episodes for c in ep.calls)
    rows = [score(ep, "rehearse") for ep in episodes]
    # a rehearser that reproduces the real results lets the caller finish every turn: full checklist
    assert all(r["checklist"] == 1.0 and r["env_executions"] == 0 for r in rows)


def test_rehearsals_are_batched_across_episodes(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=4)
    policy = reference_policy(tasks)
    kinds = []
    generate = policy.generate

    def recording(prompts, params):
        texts = [policy.tokenizer.decode(p) for p in prompts]
        kinds.append({"rehearser" if "## Call to simulate" in t else "caller" for t in texts})
        return generate(prompts, params)

    policy.generate = recording
    episodes = _engine(policy, bfcl, mode="rehearse").run_batch([(t, 0) for t in tasks])
    assert all(len(k) == 1 for k in kinds)  # a backend call serves one role
    roles = [k.pop() for k in kinds]
    # each step: one caller call, then at most one rehearser call for every pending call of every episode
    assert roles[0] == "caller" and all(not (a == b == "rehearser") for a, b in zip(roles, roles[1:], strict=False))
    assert roles.count("caller") == max(len(ep.of_role("caller")) for ep in episodes)
    assert sum(len(ep.of_role("rehearser")) for ep in episodes) == sum(len(ep.calls) for ep in episodes)
    assert roles.count("rehearser") < sum(len(ep.calls) for ep in episodes)  # calls of several episodes share one


def test_shadow_pairs_line_up_with_the_real_replay(bfcl, reference_policy):
    # on train tasks the rehearser may be grounded on the task's own results: a perfect copy of them
    tasks = bfcl.load_tasks("multi_turn_base", "train", limit=2)
    episodes = _engine(reference_policy(tasks), bfcl, mode="rehearse+shadow", split="train",
                       rehearser=RehearserOptions(fewshot="reference")).run_batch([(t, 0) for t in tasks])
    for ep in episodes:
        real = [ref.result.content for turn in ep.task.reference for ref in turn]
        assert [p["real_response"] for p in ep.pairs] == real
        assert all(p["fed_back"] == "rehearsed" and p["exact"] == 1.0 and p["copied"] for p in ep.pairs)
        assert ep.env.executions == len(real)


def test_real_shadow_feeds_real_responses_and_records_bad_rehearsals(bfcl, reference_policy, tmp_path):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=2)
    policy = reference_policy(tasks, rehearsal="no tags here")
    run = Run.create(tmp_path, "rollout", {}, "tiny", name="shadow")
    summary = play(_config(mode="real+shadow", decision_sample=1.0), run, policy, tasks=tasks)
    assert summary.terminations == {"completed": 2}  # a bad rehearsal only matters when it is fed back
    con = connect(tmp_path)
    pairs = con.execute("SELECT fed_back, rehearsal_error, rehearsed_response, exact, decision_changed "
                        "FROM pairs").fetchall()
    assert len(pairs) == summary.calls > 0
    assert all(p == ("real", "missing_result", None, 0.0, None) for p in pairs)  # no fork without a rehearsal
    roles = dict(con.execute("SELECT role, count(*) FROM generations GROUP BY role").fetchall())
    assert roles["rehearser"] == summary.calls


def test_malformed_rehearsal_fed_back_ends_the_episode_by_default(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    for on_error, termination in (("end_episode", "rehearsal_error"), ("feed_error", "completed")):
        policy = reference_policy(tasks, rehearsal="<execution_result>{truncated")
        engine = _engine(policy, bfcl, mode="rehearse", rehearser=RehearserOptions(on_error=on_error))
        (ep,) = engine.run_batch([(tasks[0], 0)])
        assert ep.termination == termination
        assert ep.calls[0]["error_kind"] == "INVALID_EXECUTION_RESULT"


def test_decision_forks_compare_next_actions(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    wrong = '<execution_result>\n{"error": "No such file"}\n</execution_result>'
    engine = _engine(reference_policy(tasks, rehearsal=wrong), bfcl, mode="real+shadow", decision_sample=1.0)
    (ep,) = engine.run_batch([(tasks[0], 0)])
    flags = [p["decision_changed"] for p in ep.pairs]
    assert flags and all(f is not None for f in flags)
    assert not any(flags)  # the scripted caller ignores tool responses, so its next action never changes


def test_embedding_cosine_is_filled(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    engine = build_engine(reference_policy(tasks), bfcl, RolloutConfig(mode="rehearse+shadow"))
    (ep,) = engine.run_batch([(tasks[0], 0)])
    assert all(p["embed_cos"] == pytest.approx(1.0, abs=1e-4) for p in ep.pairs)


def test_rehearser_prompt_sections_are_switchable(bfcl, reference_policy):
    from envace.engine.prompts import Example, rehearser_prompt

    task = bfcl.load_tasks("multi_turn_base", "test", limit=1)[0]
    call = task.reference[0][0].call
    full = rehearser_prompt(task, call, [Example(call, '{"x": 1}')], [("User", "hi")], "latest!",
                            RehearserOptions())
    text = full[1]["content"]
    for section in ("Available tools", "Schema of the called tool", "Response schema", "Previous tool calls",
                    "Conversation so far", "latest message", "Call to simulate"):
        assert section in text
    demo = rehearser_prompt(task, call, [Example(call, '{"x": 1}')], [], "", RehearserOptions(demo_turn=True))
    assert [m["role"] for m in demo] == ["system", "user", "assistant", "user"]
    assert demo[2]["content"] == '<execution_result>\n{"x": 1}\n</execution_result>'
    bare = rehearser_prompt(task, call, [], [], "", RehearserOptions(
        system=False, tools="none", response_schema=False, fewshot="none", history=False, latest_message=False))
    assert len(bare) == 1 and bare[0]["content"].startswith("## Call to simulate")


def test_leakage_free_examples_come_from_train_tasks_only(bfcl):
    train = bfcl.load_tasks("multi_turn_base", "train", limit=30)
    bank = ExampleBank(train)
    test_task = bfcl.load_tasks("multi_turn_base", "test", limit=1)[0]
    call = test_task.reference[0][0].call
    shown = bank.for_call(test_task, call, RehearserOptions(fewshot="other_tasks"))
    test_results = {ref.result.content for turn in test_task.reference for ref in turn}
    assert shown and all(e.call.name == call.name for e in shown[:1])
    assert all(e.content not in test_results or e.content in {r.result.content for t in train
                                                              for turn in t.reference for r in turn} for e in shown)
    with pytest.raises(ValueError):
        ExampleBank([test_task])


@pytest.mark.parametrize("text, kind", [
    ("plain words", "missing_result"),
    ("<execution_result>{\"a\": 1", "unclosed_result"),
    ("<execution_result>1</execution_result><execution_result>2</execution_result>", "several_results"),
    ("<execution_result>{'a': 1}</execution_result>", "invalid_json"),
    ("<execution_result>  </execution_result>", "empty_result"),
    ("<execution_result>" + "x" * 30000 + "</execution_result>", "too_long"),
])
def test_rehearsal_errors_are_classified(text, kind):
    assert parse_execution_result(text).error == kind


def test_rehearsal_parses_any_json_value():
    assert parse_execution_result('<execution_result>\n{"b": [1, "ü"]}\n</execution_result>').value == {"b": [1, "ü"]}
    assert parse_execution_result("<execution_result>null</execution_result>").error is None
    assert json.loads("null") is parse_execution_result("<execution_result>null</execution_result>").value


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_dyna_mix_sends_that_share_of_calls_to_the_real_environment(bfcl, reference_policy, fraction):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=3)
    episodes = _engine(reference_policy(tasks), bfcl, mode="rehearse", real_fraction=fraction,
                       seed=1).run_batch([(t, 0) for t in tasks])
    calls = [c for ep in episodes for c in ep.calls]
    real = [c for c in calls if c["source"] == "real"]
    rehearsals = sum(len(ep.of_role("rehearser")) for ep in episodes)
    assert sum(ep.env.executions for ep in episodes) == len(real)  # the environment sees only its share
    assert rehearsals == len(calls) - len(real)  # every other call is rehearsed, none twice
    if fraction in (0.0, 1.0):
        assert len(real) == fraction * len(calls)
    else:
        assert 0 < len(real) < len(calls)
    assert not any(ep.pairs for ep in episodes)  # a mix is not a shadow: nothing answered twice


def test_a_shadow_share_pairs_whole_episodes_and_a_mix_inside_a_shadow_executes_each_call_once(bfcl, reference_policy):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=4)
    episodes = _engine(reference_policy(tasks), bfcl, mode="rehearse", shadow_fraction=0.5,
                       seed=3).run_batch([(t, g) for t in tasks for g in range(2)])
    shadowed = [ep for ep in episodes if ep.shadowed]
    assert 0 < len(shadowed) < len(episodes)
    for ep in episodes:  # a shadowed episode's environment sees every call of it, in order; the others none
        assert ep.env.executions == (len(ep.calls) if ep.shadowed else 0)
        assert len(ep.pairs) == (len(ep.calls) if ep.shadowed else 0)
        assert all(c["source"] == "rehearsed" for c in ep.calls)
    mixed = _engine(reference_policy(tasks), bfcl, mode="rehearse", shadow_fraction=1.0, real_fraction=0.5,
                    seed=3).run_batch([(t, 0) for t in tasks])
    for ep in mixed:
        real = sum(c["source"] == "real" for c in ep.calls)
        assert ep.env.executions == len(ep.calls)  # mixed-in real calls are not executed a second time
        assert len(ep.pairs) == len(ep.calls) - real  # a real call fed back has no rehearsal beside it
        assert len(ep.of_role("rehearser")) == len(ep.calls) - real


@pytest.mark.parametrize("rehearser_temperature", [None, 0.0])
def test_the_rehearser_samples_at_its_own_temperature_when_given_one(bfcl, reference_policy, rehearser_temperature):
    tasks = bfcl.load_tasks("multi_turn_base", "test", limit=1)
    policy = reference_policy(tasks)
    seen = []
    generate = policy.generate
    policy.generate = lambda prompts, params: seen.append(params.temperature) or generate(prompts, params)
    engine = _engine(policy, bfcl, mode="rehearse", temperature=0.7,
                     rehearser=RehearserOptions(temperature=rehearser_temperature))
    engine.run_batch([(t, 0) for t in tasks])
    decoded = [policy.tokenizer.decode(p) for p in policy.prompts]
    roles = ["rehearser" if "## Call to simulate" in d else "caller" for d in decoded]
    assert len(seen) >= 2 and set(roles) == {"caller", "rehearser"}
    # one backend call per role and step: the calls that hold rehearser prompts got the rehearser's temperature
    assert 0.7 in seen and (0.0 in seen) == (rehearser_temperature == 0.0)
