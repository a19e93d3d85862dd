from dataclasses import replace

import pytest

from envace import rewards
from envace.types import ToolCall


def _issued(task):
    return [[ref.call for ref in turn] for turn in task.reference]


def test_checklist_is_one_on_the_reference_and_less_when_a_call_is_dropped_or_changed(bfcl):
    for task in bfcl.load_tasks("multi_turn_base", "test", limit=5):
        assert rewards.checklist(task, _issued(task))[0] == 1.0
        dropped = _issued(task)
        dropped[0] = dropped[0][:-1]
        assert rewards.checklist(task, dropped)[0] < 1.0
        changed = _issued(task)
        first = changed[0][0]
        changed[0][0] = replace(first, arguments={k: f"{v}-x" for k, v in first.arguments.items()} or {"z": 1})
        assert rewards.checklist(task, changed)[0] < 1.0


def test_early_termination_costs_the_remaining_turns(bfcl):
    task = bfcl.load_tasks("multi_turn_base", "test", limit=1)[0]
    score, detail = rewards.checklist(task, _issued(task)[:1])
    assert score == 1 / len(task.reference) and len(detail) == len(task.reference)


def test_value_equivalence():
    assert rewards.equivalent(1, 1.0) and rewards.equivalent("5", 5) and rewards.equivalent([1, 2], [2, 1])
    assert rewards.equivalent({"a": [1, "x"]}, {"a": ["x", 1]}) and rewards.equivalent(" a ", "a")
    assert not rewards.equivalent(True, 1) and not rewards.equivalent("a", "b") and not rewards.equivalent([1], [1, 1])
    ref = ToolCall("mv", {"source": "a", "destination": "b"})
    assert rewards.call_matches(ref, ToolCall("mv", {"destination": "b", "source": "a", "force": False}))
    assert not rewards.call_matches(ref, ToolCall("mv", {"source": "a"}))
    assert not rewards.call_matches(ref, ToolCall("cp", ref.arguments))


def test_turns_without_reference_calls_score_when_reached(bfcl):
    task = next(t for t in bfcl.load_tasks("multi_turn_miss_param", "all", limit=20) if any(not r for r in t.reference))
    assert rewards.checklist(task, _issued(task))[0] == 1.0


def test_task_plus_fidelity_rewards_a_faithful_rehearsal_more():
    from envace import fidelity, rewards
    from envace.engine.episode import Generated
    from envace.policy.backend import Generation

    real = '{"current_directory_content": ["a.txt", "b"]}'

    def pair(rehearsed):
        return {"turn": 0, "turn_step": 1, "call_index": 0,
                **fidelity.score_pair(real, rehearsed, False, None if rehearsed is None else False, [])}

    def row(reward=0.5):
        return Generated("rehearser", 0, 1, Generation([1], "x", "stop"), 1, call_index=0, reward=reward)

    exact, wrong, malformed, unpaired = row(), row(), row(), Generated("rehearser", 0, 2, Generation([1], "x", "stop"),
                                                                     1, call_index=0, reward=0.5)
    rewards.add_fidelity([exact], [pair(real)], 0.5)
    rewards.add_fidelity([wrong], [pair('{"error": "no such folder"}')], 0.5)
    rewards.add_fidelity([malformed, unpaired], [pair(None)], 0.5)
    assert exact.reward == pytest.approx(1.0)  # 0.5 task + 0.5 × 1.0
    assert 0.5 < wrong.reward < exact.reward
    assert malformed.reward == pytest.approx(0.5) and unpaired.reward == 0.5  # no real response beside it: task only
