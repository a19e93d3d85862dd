"""A BFCL multi-turn episode on its own instances of `bfcl_eval`'s executable classes.

BFCL's own executor keeps instances in a module-global cache keyed by model and entry, and `eval`s
model text. Here each episode owns its instances, calls are dispatched to bound methods with parsed
keyword arguments, and results are formatted exactly as BFCL formats them, so the official checker
(which re-executes the same calls) sees the same responses the caller saw.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import uuid
from typing import Any

import envace.envs.bfcl.memory as memory  # the submodules, not the package (which imports this one)
import envace.envs.bfcl.single as single
from envace.envs.base import Environment, Steps
from envace.envs.bfcl.calls import checker_calls
from envace.formats import is_error_value
from envace.types import Score, Task, ToolCall, ToolResult


def format_result(value: Any) -> str:
    """BFCL's rendering of a return value: str as is, dict as JSON (else str), anything else str()."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


class BFCLEnv(Environment):
    """BFCL v4 multi-turn: state lives in the involved classes' instances for the whole episode.

    BFCL's harness runs every call as Python, no schema check first (`execute_multi_turn_func_call`), so neither
    does this one (`validate_arguments`): `close_ticket(ticket_id='ticket_001')` reaches the tool, which answers
    that no such ticket exists, and a call the method cannot take fails as BFCL's does (`Error during
    execution: …`)."""

    validate_arguments = False

    def _setup(self, task: Task) -> None:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

        entry = task.payload["entry"]
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, Any] = {}
        self.single = task.category in single.CATEGORIES  # scored on its calls, nothing runs (`single.py`)
        if self.single:
            return
        if task.category in memory.CATEGORIES:  # its backend on the scenario's snapshot, once one is given
            (class_name,) = entry["involved_classes"]
            instance = memory.backend_class(class_name)()
            if (config := memory.initial_config(task)) is not None:
                instance._load_scenario(config)
            self._add_instance(class_name, instance)
            return
        for class_name in entry["involved_classes"]:
            cls = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)
            instance = cls()
            if class_name not in STATELESS_CLASSES:
                config = copy.deepcopy(entry["initial_config"].get(class_name, {}))
                instance._load_scenario(config, long_context="long_context" in task.category)
            self._add_instance(class_name, instance)

    def _add_instance(self, class_name: str, instance: Any) -> None:
        self.instances[class_name] = instance
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                self._methods[name] = method

    def copy_state(self) -> BFCLEnv | None:
        """The episode's instances deep-copied (they hold all of its state), bound methods rebuilt on the copies: a
        multi-turn episode's. A memory category's backend keeps its state in files, and a single-turn item runs
        nothing: None."""
        if self.task is None or self.single or self.task.category in memory.CATEGORIES:
            return None
        twin = type(self)()
        twin.task, twin._tools, twin._user_tools, twin.single = self.task, self._tools, self._user_tools, False
        twin.instances, twin._methods = {}, {}
        for class_name, instance in copy.deepcopy(self.instances).items():  # one memo: shared objects stay shared
            twin._add_instance(class_name, instance)
        return twin

    def positional_names(self, function: str) -> list[str]:
        return list(inspect.signature(self._methods[function]).parameters)

    def dispatchable(self, call: ToolCall, tools: dict[str, dict[str, Any]] | None = None) -> tuple[str, str] | None:
        """A single-turn item's checker sees every call of the message, one to a function it lacks included."""
        return None if self.single else super().dispatchable(call, tools)

    def _dispatch(self, call: ToolCall) -> ToolResult:
        if self.single:
            return ToolResult(single.NOT_EXECUTED)
        method = self._methods.get(call.name)
        if method is None:
            return ToolResult(f"Error during execution: name '{call.name}' is not defined", is_error=True,
                              error_kind="EXECUTION_ERROR")
        # Tools keep references to their arguments (a tweet stores its `mentions` list), so the call
        # must hand over a copy or later mutations leak back into the recorded call.
        value = method(**copy.deepcopy(call.arguments))
        failed = is_error_value(value)
        return ToolResult(format_result(value), is_error=failed, error_kind="TOOL_ERROR" if failed else "")

    def score(self, task: Task, steps: Steps, texts: list[str] | None = None,
              termination: str = "completed") -> Score:
        """BFCL's `multi_turn_checker` (state and response checks), plus eval_runner's turn-count rule; a
        single-turn item's own checker (`single.score`)."""
        if task.category in single.CATEGORIES:
            return single.score(task, steps)
        if task.category in memory.CATEGORIES:
            return memory.score(task, texts)
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

        ground_truth = task.payload["ground_truth"]
        if len(steps) != len(ground_truth):
            return Score(False, f"multi_turn:force_terminated ({len(steps)}/{len(ground_truth)} turns)")
        decoded = [[calls for calls in map(checker_calls, turn) if calls] for turn in steps]
        # A unique model name keeps this check's instances apart in the checker's global cache.
        model_name = f"envace_{uuid.uuid4().hex}"
        try:
            verdict = multi_turn_checker(decoded, ground_truth, task.payload["entry"], task.category, model_name)
        except Exception as exc:  # the checker asserts on malformed input; that is a failed episode
            return Score(False, f"multi_turn:checker_error ({exc})")
        finally:
            cache = vars(multi_turn_utils)
            for key in [k for k in cache if k.startswith(model_name)]:
                del cache[key]
        return Score(bool(verdict["valid"]), verdict.get("error_type", ""))
