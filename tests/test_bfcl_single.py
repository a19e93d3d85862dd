"""BFCL-v4's single-turn categories: one caller message scored by bfcl_eval's own AST checker (Python, Java and
JavaScript items), the relevance rule, the gold replay of check-env, and the modes that do not apply."""

from __future__ import annotations

import pytest

from envace.cli import main
from envace.envs import registry
from envace.envs.bfcl import single
from envace.types import ToolCall


def _item(category: str, index: int = 0):
    return registry.get("bfcl").load_tasks(category, "all", 1, index)[0]


def _score(task, calls: list[ToolCall]):
    return single.score(task, [[calls]] if calls else [[]])


def test_a_python_item_passes_its_answer_and_fails_a_wrong_value_or_function():
    task = _item("simple_python")  # calculate_triangle_area(base=10, height=5, unit in {"units", omitted})
    assert [(s.call.name, s.call.arguments) for s in task.reference[0]] == [
        ("calculate_triangle_area", {"base": 10, "height": 5})]
    assert _score(task, [ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "units"})]).success
    wrong = _score(task, [ToolCall("calculate_triangle_area", {"base": 11, "height": 5})])
    assert not wrong.success and wrong.detail == "value_error:others"
    named = _score(task, [ToolCall("triangle_area", {"base": 10, "height": 5})])
    assert not named.success and named.detail == "simple_function_checker:wrong_func_name"
    assert _score(task, []).detail.startswith("ast_decoder:decoder_wrong_output_format")


def test_java_and_javascript_items_take_source_text_as_bfcl_does():
    java = _item("simple_java", 1)  # SQLCompletionAnalyzer.makeProposalsFromObject(useShortName: boolean, …)
    gold = java.reference[0][0].call
    assert gold.arguments["useShortName"] == "true" and _score(java, [gold]).success
    raw = ToolCall(gold.name, {**gold.arguments, "useShortName": True})  # a JSON boolean, not Java source
    assert _score(java, [raw]).detail == "type_error:java"
    js = _item("simple_javascript")
    call = js.reference[0][0].call
    assert all(isinstance(v, str) for v in call.arguments.values()) and _score(js, [call]).success
    first = next(iter(call.arguments))
    assert not _score(js, [ToolCall(call.name, {**call.arguments, first: call.arguments[first] + "_x"})]).success


def test_relevance_is_whether_a_call_was_made():
    call = [ToolCall("anything", {})]
    irrelevant, relevant = _item("irrelevance"), _item("live_relevance")
    assert _score(irrelevant, []).success and not _score(irrelevant, call).success
    assert _score(relevant, call).success and not _score(relevant, []).success


def test_the_caller_sees_bfcls_function_calling_schema_and_hints():
    tool = _item("simple_python", 10).tools  # BFCL's `_cast_to_openai_type` and its Python hint
    function = tool[0]["function"]
    assert function["description"].endswith(" Note that the provided function is in Python 3 syntax.")
    assert function["parameters"]["type"] == "object"
    types = {p["type"] for t in _item("simple_python", 3).tools for p in t["function"]["parameters"]["properties"]
             .values()}
    assert types <= {"string", "integer", "number", "boolean", "array", "object"}
    java = _item("simple_java").tools[0]["function"]["parameters"]["properties"]
    assert all(p["type"] == "string" and "in string representation" in p["description"] for p in java.values())


def test_check_env_replays_a_single_turn_category(capsys):
    assert main(["check-env", "bfcl", "--category", "simple_javascript", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "simple_javascript            50/50  negative control fell 50/50" in out
    assert main(["check-env", "bfcl", "--category", "simple_java", "--workers", "1"]) == 0  # 3 named defects
    out = capsys.readouterr().out
    assert "97/100 ground-truth trajectories pass" in out and out.count("known defect: bfcl/simple_java_") == 3


@pytest.mark.parametrize("args, message", [
    (["check-env", "bfcl", "--category", "live_relevance"], "bfcl live_relevance has no gold answers to replay"),
    (["check-env", "bfcl", "--category", "nope"], "category: unknown bfcl category 'nope'"),
    (["rollout", "--category", "simple_python", "--mode", "rehearse", "--model", "tiny"],
     "mode: bfcl simple_python is scored on the calls of one message and no tool runs"),
    (["eval", "tiny", "--category", "irrelevance", "--private", "parallel", "--budget", "1"],
     "nothing to rehearse"),
])
def test_what_does_not_apply_to_a_single_turn_category_is_one_line(tmp_path, capsys, args, message):
    assert main([*args, "--root", str(tmp_path)] if args[0] != "check-env" else args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_rollout_plays_one_message_and_the_gold_passes(tmp_path, capsys):
    assert main(["rollout", "--category", "parallel_multiple", "--split", "all", "--limit", "2", "--model",
                 "reference", "--root", str(tmp_path), "--run-name", "gold"]) == 0
    out = capsys.readouterr().out
    assert "100.0%" in out and "step_limit 2" in out  # one caller message each, every call in it
