"""BFCL-v4's single-turn categories: one user request, one caller message, scored by `bfcl_eval`'s own checkers.

Nothing executes. The AST categories (simple python/java/javascript, multiple, parallel, parallel_multiple and
their live counterparts) hand the calls of the caller's one message to `ast_checker` against the item's
`possible_answer`; the relevance categories ask only whether a call was made (irrelevance: none must be;
live_relevance: one must be), as BFCL's `relevance_file_runner` does. Every call of the message counts, a call
to a function the item does not have included (the checker names it wrong), so nothing is refused before the
score; and since no tool answers, rehearsal does not apply (`Benchmark.call_only`).

Items come through `bfcl_eval.utils.load_dataset_entry`, its language hints in the function docs included, and
their schemas are cast to JSON Schema as BFCL casts them for function-calling models (`cast_types`, its
`_cast_to_openai_type` restated: that module needs tree-sitter). A live item whose prompt holds several
messages (a system prompt, an earlier exchange) is rendered as one user message after the system prompt.
Split: item k of a category is test when k % 4 == 3 (training needs one; the suite plays `all`).

`ast_checker`'s module imports `bfcl_eval.constants.model_config`, which imports every API vendor's client;
its one use there is whether a model's function names had their dots replaced (`convert_func_name`). Where that
import fails, a stand-in answering "kept" (as this workbench's calls keep them) is used for that import only.
"""

from __future__ import annotations

import copy
import importlib
import sys
import types
from functools import lru_cache
from typing import Any

from envace.envs.bfcl.splits import chosen, split_of
from envace.types import ReferenceStep, Score, Split, Task, ToolCall, ToolResult

AST = ("simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
       "live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
RELEVANCE = ("irrelevance", "live_irrelevance", "live_relevance")
CATEGORIES = AST + RELEVANCE
NOT_EXECUTED = "(not executed: BFCL scores this category's calls as they are written)"
SYSTEM_PROMPT = ("You are an assistant that completes the user's request by calling the provided functions, "
                 "all the calls it needs in one message. When no function fits the request, reply to the user "
                 "in plain text without a call.")
_CHECKER_MODEL = "envace"

# Items whose possible answer no call can pass through BFCL's own checker: defects of its data, named by check-env.
KNOWN_DEFECTS = {
    "bfcl/simple_java_36": "an ArrayList of `any` whose answer holds a number and a boolean: the checker reads every "
                           "`any` element as a string",
    "bfcl/simple_java_65": "an ArrayList of `any` whose answer holds booleans: the checker reads every `any` element "
                           "as a string",
    "bfcl/simple_java_64": "the answer's HashMap holds plain values where the checker expects lists of accepted "
                           "values (it compares against the characters of 'epoch_millis')",
    "bfcl/live_simple_106-63-0": "two required parameters (auto_loan_payment_start, bank_hours_start) are missing "
                                 "from the answer",
    "bfcl/live_simple_112-68-0": "five required parameters accept no value at all (empty lists)",
    "bfcl/live_multiple_507-149-4": "required origin_airport accepts only its omission",
    "bfcl/live_multiple_862-181-3": "the answer gives journey_start_time, which Trains_1_FindTrains does not have",
    "bfcl/live_multiple_964-207-0": "the answer names `question`; transfer_to_human_agent requires `statement`",
}


def language(category: str) -> str:
    return "Java" if category == "simple_java" else "JavaScript" if category == "simple_javascript" else "Python"


def cast_types(properties: dict[str, Any]) -> dict[str, Any]:
    """BFCL's `_cast_to_openai_type` with its `GORILLA_TO_OPENAPI` mapping: each parameter's type to JSON Schema
    (unknown ones to string; a float gets `format: float` and a line in its description), recursively."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI as mapping

    for value in properties.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            if value["type"] == "float":
                value["format"] = "float"
                value["description"] = value.get("description", "") + " This is a float type value."
            value["type"] = mapping.get(value["type"], "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = cast_types(value["properties"])
            elif "items" in value:
                value["items"]["type"] = mapping[value["items"]["type"]]
                if value["items"]["type"] == "array" and "items" in value["items"]:
                    value["items"]["items"]["type"] = mapping[value["items"]["items"]["type"]]
                elif value["items"]["type"] == "object" and "properties" in value["items"]:
                    value["items"]["properties"] = cast_types(value["items"]["properties"])
    return properties


def _tool(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    parameters = {**doc["parameters"], "type": "object", "properties": cast_types(doc["parameters"]["properties"])}
    return {"type": "function", "function": {"name": doc["name"], "description": doc["description"],
                                             "parameters": parameters}}


@lru_cache(maxsize=16)
def _entries(category: str) -> tuple[tuple[dict[str, Any], ...], dict[str, Any], dict[str, Any]]:
    """(items as the caller is shown them, language hints in their docs; each item's docs as the checker reads
    them, without; each item's possible answer)."""
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    shown = tuple(load_dataset_entry(category, include_prereq=False))
    checked = {e["id"]: e["function"] for e in load_dataset_entry(category, include_prereq=False,
                                                                  include_language_specific_hint=False)}
    answers = {} if category in RELEVANCE else {a["id"]: a["ground_truth"] for a in load_ground_truth_entry(category)}
    return shown, checked, answers


def gold_calls(answer: list[dict[str, Any]], docs: list[dict[str, Any]], category: str) -> list[ToolCall]:
    """A call per function of a possible answer, each parameter at its first accepted value (`_pick`; an optional
    one whose omission is accepted left out), written as a caller writes it: Java and JavaScript values as source
    text for the parameter's declared type (`source_values`)."""
    from envace.envs.bfcl.source_values import as_source

    schemas = {d["name"]: d["parameters"].get("properties", {}) for d in docs}
    required = {d["name"]: set(d["parameters"].get("required", [])) for d in docs}
    calls = []
    for item in answer:
        ((name, params),) = item.items()
        # an optional parameter whose omission is accepted is omitted (the answer may name one the function lacks)
        arguments = {k: picked for k, v in params.items()
                     if not ("" in v and k not in required.get(name, ())) and (picked := _pick(v)) is not _OMIT}
        if language(category) != "Python":
            arguments = {k: as_source(v, schemas.get(name, {}).get(k, {}), language(category))
                         for k, v in arguments.items()}
        calls.append(ToolCall(name, arguments))
    return calls


_OMIT = object()


def _pick(alternatives: Any) -> Any:
    """One value of a possible answer's list of accepted values: the first that is not "" (which marks an optional
    parameter; a parameter accepting only "" is left out), its own nested alternatives resolved alike."""
    if not isinstance(alternatives, list):
        return alternatives
    given = [a for a in alternatives if a != ""]
    return _resolve(given[0]) if given else _OMIT


def _resolve(value: Any) -> Any:
    """A dict's keys, and those of a list of dicts, hold lists of accepted values in turn (BFCL's `dict_checker`)."""
    if isinstance(value, dict):
        return {k: picked for k, v in value.items() if (picked := _pick(v)) is not _OMIT}
    if isinstance(value, list) and value and all(isinstance(e, dict) for e in value):
        return [_resolve(e) for e in value]
    return value


def _task(index: int, entry: dict[str, Any], docs: list[dict[str, Any]], answer: list[dict[str, Any]] | None,
          category: str) -> Task:
    messages = entry["question"][0]
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    spoken = [m for m in messages if m["role"] != "system"]
    request = spoken[0]["content"] if len(spoken) == 1 else "\n\n".join(
        f"{m['role'].capitalize()}: {m['content']}" for m in spoken)
    task = Task(uid=f"bfcl/{entry['id']}", env="bfcl", category=category,
                split=split_of(index), scenario=index,
                system_prompt=f"{system}\n\n{SYSTEM_PROMPT}" if system else SYSTEM_PROMPT,
                tools=[_tool(doc) for doc in entry["function"]], user_turns=[request], reference=[[]],
                payload={"entry": entry, "checked_docs": docs, "possible_answer": answer,
                         "gold": category != "live_relevance"}, max_steps_per_turn=1)
    if answer is not None:
        task.reference = [[ReferenceStep(call, ToolResult(NOT_EXECUTED)) for call in gold_calls(answer, docs,
                                                                                                 category)]]
    return task


def load_tasks(category: str, split: str = Split.TEST, limit: int | None = None, offset: int = 0) -> list[Task]:
    shown, checked, answers = _entries(category)
    return [_task(k, copy.deepcopy(e), copy.deepcopy(checked[e["id"]]), answers.get(e["id"]), category)
            for k, e in chosen(shown, split, limit, offset)]


@lru_cache(maxsize=1)
def _ast_checker():
    """bfcl_eval's `ast_checker` (see the module docstring for the stand-in) and the model name it is run for."""
    module = "bfcl_eval.eval_checker.ast_eval.ast_checker"
    try:
        from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING
    except ImportError:
        stand_in = types.ModuleType("bfcl_eval.constants.model_config")
        stand_in.MODEL_CONFIG_MAPPING = {_CHECKER_MODEL: types.SimpleNamespace(underscore_to_dot=False)}
        sys.modules[stand_in.__name__] = stand_in
        try:
            checker = importlib.import_module(module).ast_checker
        finally:
            del sys.modules[stand_in.__name__]
        return checker, _CHECKER_MODEL
    kept = next(name for name, config in MODEL_CONFIG_MAPPING.items() if not config.underscore_to_dot)
    return importlib.import_module(module).ast_checker, kept.replace("/", "_")


def score(task: Task, steps: list[list[list[ToolCall]]]) -> Score:
    """BFCL's verdict on the calls of turn 0 (one message: every call counts)."""
    from bfcl_eval.constants.enums import Language

    calls = [c for step in (steps[0] if steps else []) for c in step]
    category = task.category
    if category in RELEVANCE:
        wanted = category == "live_relevance"
        made = bool(calls)
        detail = "" if made == wanted else ("no function call" if wanted else "called a function")
        return Score(made == wanted, detail)
    if not calls:
        return Score(False, "ast_decoder:decoder_wrong_output_format (no function call)")
    checker, model = _ast_checker()
    verdict = checker(copy.deepcopy(task.payload["checked_docs"]), [{c.name: copy.deepcopy(c.arguments)}
                                                                     for c in calls],
                      task.payload["possible_answer"], Language[language(category).upper()], category, model)
    return Score(bool(verdict["valid"]), verdict.get("error_type", "") if not verdict["valid"] else "")
