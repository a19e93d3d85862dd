from dataclasses import replace

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
