import json
from dataclasses import replace

from envace.envs.base import Environment
from envace.envs.bfcl import data
from envace.envs.bfcl.calls import parse_call_string, to_call_string
from envace.envs.bfcl.data import ADDED_FUNCTIONS_PROMPT, split_of
from envace.envs.bfcl.data import CATEGORIES as MULTI_TURN
from envace.envs.check import check_category
from envace.types import Score, Task, ToolCall, ToolResult


def test_every_ground_truth_trajectory_passes_through_execute_as_bfcls_harness_runs_it(bfcl):
    """BFCL's harness checks no argument against the schema: its gold `close_ticket(ticket_id='ticket_001')`
    (the schema says integer) runs, the tool answers that no such ticket exists, and the gold passes. So it
    does here (`BFCLEnv.validate_arguments`): 200/200 in every category, nothing rejected."""
    for category in MULTI_TURN:
        checked = check_category(bfcl, category)
        assert len(checked.tasks) == 200 and checked.failures == [] and checked.rejected == []
        # dropping the last call that did not fail always fails the checker: the negative control falls everywhere
        assert len(checked.control("fell")) == 200


def test_a_call_the_schema_refuses_runs_as_bfcl_runs_it(bfcl):
    task = next(t for t in bfcl.load_tasks("multi_turn_base", "all") if t.uid.endswith("_173"))
    env = bfcl.make_env()
    env.reset(task)
    gold = next(r for turn in task.reference for r in turn if r.call.name == "close_ticket")
    assert gold.call.arguments == {"ticket_id": "ticket_001"}  # a string where the schema says integer
    result = env.execute(gold.call)
    assert result.dispatched and result.content == gold.result.content
    missing = env.execute(ToolCall("close_ticket", {}))  # as BFCL's `eval` of the call answers it
    assert missing.is_error and missing.content.startswith("Error during execution: ") and "ticket_id" in \
        missing.content
    assert env.execute(ToolCall("no_such_tool", {})).error_kind == "TOOL_NOT_AVAILABLE"  # still refused


def _base_0(bfcl):
    return next(t for t in bfcl.load_tasks("multi_turn_base", "all", limit=1))


def test_a_wrong_call_fails_the_official_checker(bfcl):
    task = _base_0(bfcl)
    env = bfcl.make_env()
    env.reset(task)
    steps = [[[ref.call] for ref in turn] for turn in task.reference]
    steps[0][-1] = [ToolCall("ls", {})]  # replaces the move of final_report.pdf
    verdict = env.score(task, steps)
    assert not verdict.success and "mismatch" in verdict.detail
    dropped = [[[ref.call] for ref in turn] for turn in task.reference][:-1]
    assert env.score(task, dropped).detail.startswith("multi_turn:force_terminated")


def test_a_call_no_call_string_can_write_is_scored_as_the_checker_would_run_it(bfcl):
    """A sampled `touch({"file name": …})` reached the checker in training and ended the run; the checker's
    `eval` of such a call could only fail and change nothing, so the verdict is the one without it."""
    task = _base_0(bfcl)
    env = bfcl.make_env()
    gold = [[[ref.call] for ref in turn] for turn in task.reference]
    malformed = ToolCall("touch", {"file name": "x.txt"})
    with_it = [[step + [malformed] for step in turn] for turn in gold]
    assert env.score(task, gold).success and env.score(task, with_it).success
    # alone in its step, the step is as if the model had not called at all
    only = [[[malformed]] + turn for turn in gold]
    assert env.score(task, only) == env.score(task, gold)
    wrong = [[[malformed]] for _ in gold]
    assert env.score(task, wrong) == env.score(task, [[] for _ in gold])
    assert not env.score(task, wrong).success


def test_real_responses_and_state_persist_within_an_episode(bfcl):
    task = _base_0(bfcl)
    env = bfcl.make_env()
    env.reset(task)
    assert json.loads(env.execute(ToolCall("cd", {"folder": "document"})).content) == {
        "current_working_directory": "document"}
    assert "final_report.pdf" in env.execute(ToolCall("ls", {})).content
    other = bfcl.make_env()
    other.reset(task)  # a second episode of the same task starts from the initial state
    assert "document" in other.execute(ToolCall("ls", {})).content


def test_wrong_calls_are_answered_as_bfcls_harness_answers_them(bfcl):
    env = bfcl.make_env()
    env.reset(_base_0(bfcl))
    missing = env.execute(ToolCall("rm_rf_everything", {}))
    assert missing.is_error and missing.error_kind == "TOOL_NOT_AVAILABLE" and not missing.dispatched
    wrong_type = env.execute(ToolCall("cd", {"folder": 3}))  # no schema check: the method runs, and raises
    assert wrong_type.dispatched and wrong_type.error_kind == "EXECUTION_ERROR"
    assert wrong_type.content == "Error during execution: 'int' object has no attribute 'rstrip'"
    unknown_arg = env.execute(ToolCall("cd", {"folder": "document", "force": True}))
    assert unknown_arg.content.endswith("cd() got an unexpected keyword argument 'force'") and unknown_arg.is_error
    tool_error = env.execute(ToolCall("cd", {"folder": "no_such_dir"}))
    assert tool_error.is_error and tool_error.error_kind == "TOOL_ERROR" and tool_error.dispatched


def test_environment_exceptions_become_tool_errors():
    class Exploding(Environment):
        def _setup(self, task):
            pass

        def _dispatch(self, call):
            raise RuntimeError("disk on fire")

        def score(self, task, steps):
            return Score(False)

    task = Task("t/0", "toy", "c", "test", 0, "", [{"type": "function", "function": {
        "name": "boom", "parameters": {"type": "object", "properties": {}}}}], ["go"], [])
    env = Exploding()
    env.reset(task)
    assert env.execute(ToolCall("boom", {})) == ToolResult("Error during execution: disk on fire", True,
                                                          "EXECUTION_ERROR")


def test_split_is_by_scenario_and_shared_across_categories(bfcl):
    assert [split_of(i) for i in range(8)] == ["train"] * 3 + ["test"] + ["train"] * 3 + ["test"]
    for category in MULTI_TURN:
        test = bfcl.load_tasks(category, "test")
        assert len(test) == 50 and all(t.scenario % 4 == 3 for t in test)
        assert all(t.split == "train" for t in bfcl.load_tasks(category, "train", limit=20))


def test_miss_func_reveals_held_out_functions_at_their_turn(bfcl):
    task = bfcl.load_tasks("multi_turn_miss_func", "all", limit=1)[0]
    (turn, added), = task.tools_added.items()
    names = {t["function"]["name"] for t in added}
    assert names and not names & {t["function"]["name"] for t in task.tools}
    assert task.user_turns[turn] == ADDED_FUNCTIONS_PROMPT


def test_schemas_are_openai_json_schema(bfcl):
    task = _base_0(bfcl)
    types = json.dumps([t["function"]["parameters"] for t in task.tools])
    assert '"dict"' not in types and '"float"' not in types and '"object"' in types


def test_call_strings_round_trip_without_eval():
    call = parse_call_string("sort('final_report.pdf')", lambda fn: ["file_name"])
    assert call == ToolCall("sort", {"file_name": "final_report.pdf"})
    assert to_call_string(ToolCall("mv", {"source": "a'b", "n": [1, None, True]})) == \
        "mv(source=\"a'b\", n=[1, None, True])"


def test_a_task_loaded_twice_is_built_once_and_each_load_may_change_its_own(bfcl):
    """`load_tasks` builds an item once per process (`data._built`): a second load gives equal tasks, and what a
    caller changes in one (its lists, its item, its gold answer) is not seen by the next load."""
    first = bfcl.load_tasks("multi_turn_base", "test", limit=2)
    first[0].user_turns.append("one more")
    first[0].reference[0].clear()
    first[0].payload["entry"]["initial_config"].clear()
    first[0].payload["ground_truth"][0].append("ls()")
    first[0].tools.pop()
    again = bfcl.load_tasks("multi_turn_base", "test", limit=2)
    fresh = [replace(t, reference=data.replay_reference(t)) for t in again]  # gold calls replayed anew
    assert again == fresh and again[1] == first[1] and again[0] != first[0]
    assert again[0].payload["entry"]["initial_config"] and again[0].user_turns[-1] != "one more"
