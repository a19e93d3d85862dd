"""The environment protocol: `reset(task)`, `execute(call) -> ToolResult`, `score(task, steps)`.

A new benchmark implements `_setup` (fresh per-episode state), `_dispatch` (run one call) and `score` (the
benchmark's own success check), plus a `Benchmark` entry (`benchmark.py`; a built-in in `registry.py`, a
plugin anywhere: `docs/environments.md`). Done here, once, for all: a call to a tool the task does not have is
refused; its arguments are checked against the tool's schema when the environment says its upstream harness
does so (`validate_arguments`; BFCL's, τ²'s and VitaBench's run the call as it is); an exception becomes an
error result; and every result goes through the environment's one error rule (`result_is_error`), which
`Benchmark.is_error` applies to rehearsed results too, so a real and a rehearsed failure read alike. A
simulated user with tools of its own (τ² telecom) acts through `execute_user`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from envace.envs.validate import check_call
from envace.formats import as_json_value, is_error_value
from envace.types import Score, Task, ToolCall, ToolResult

# Per turn, per step, the calls the caller issued: what a benchmark checker scores.
Steps = list[list[list[ToolCall]]]


EXECUTION_ERROR = "Error during execution: "  # what `execute` answers for a tool that raised (BFCL's own text)


def json_error(content: str) -> bool:
    """The default failure convention: the result is a JSON object with an `error` key (BFCL's tools, the rehearser),
    or the text `execute` answers for a tool that raised."""
    return content.startswith(EXECUTION_ERROR) or is_error_value(as_json_value(content))


class Environment(ABC):
    """One episode's tool world. Instances are never shared between episodes.

    `validate_arguments`: check each call's arguments against its tool's schema before `_dispatch` (refused as
    `INVALID_PARAMETERS`), as the benchmark's own harness does, or not (the tool itself answers a wrong call,
    as in BFCL's, τ²'s and VitaBench's harnesses). `result_is_error`: the environment's one error rule.
    """

    validate_arguments: bool = True

    def __init__(self) -> None:
        self.task: Task | None = None
        self._tools: dict[str, dict[str, Any]] = {}
        self._user_tools: dict[str, dict[str, Any]] = {}
        self.executions = 0  # counted so tests can prove a mode never touches the environment

    def reset(self, task: Task) -> None:
        """Start a fresh episode of `task`: new state, every tool of the task callable."""
        self.task = task
        schemas = task.tools + [t for added in task.tools_added.values() for t in added]
        self._tools = {t["function"]["name"]: t["function"] for t in schemas}
        user = task.simulated_user.tools if task.simulated_user is not None else []
        self._user_tools = {t["function"]["name"]: t["function"] for t in user}
        self._setup(task)

    @property
    def tools(self) -> dict[str, dict[str, Any]]:
        """Every tool of the current task, name → OpenAI function schema (validation needs no execution)."""
        return self._tools

    @property
    def user_tools(self) -> dict[str, dict[str, Any]]:
        """The simulated user's own tools (τ² telecom), name → schema; empty for most benchmarks."""
        return self._user_tools

    def execute(self, call: ToolCall) -> ToolResult:
        """Validate the call against the schema, then dispatch it. Never raises."""
        return self._checked(call, self._tools, self._dispatch)

    def execute_user(self, call: ToolCall) -> ToolResult:
        """The simulated user's tool call, validated against the user's tools, then `_dispatch_user`. Never raises."""
        return self._checked(call, self._user_tools, self._dispatch_user)

    @classmethod
    def result_is_error(cls, content: str) -> bool:
        """Whether a result's text reports a failure: the one error rule of this environment, applied to what it
        returns (`execute` flags a result it matches) and to what the rehearser writes in its place
        (`Benchmark.is_error`). Override it when your tools report failure otherwise than `{"error": …}`, e.g.
        `{"status": false}`; a result `_dispatch` flags by hand that this rule misses is a problem `check-env`
        names (a rehearsal of the same text would count as a success)."""
        return json_error(content)

    def copy_state(self) -> Environment | None:
        """A new environment in this one's current state, for a what-if: calls on the copy never reach this one (the
        private-rehearsal ladder plays an imagined attempt on one, `envace.private.ladder`). None, the default: the
        state cannot be copied, and whatever needs a copy refuses, naming the environment. Override it where the
        state can be copied whole."""
        return None

    def dispatchable(self, call: ToolCall, tools: dict[str, dict[str, Any]] | None = None) -> tuple[str, str] | None:
        """Why this environment would refuse `call` before running it (error kind, message), or None."""
        return check_call(call, self._tools if tools is None else tools, self.validate_arguments)

    def _checked(self, call: ToolCall, tools: dict[str, dict[str, Any]], dispatch) -> ToolResult:
        self.executions += 1
        problem = self.dispatchable(call, tools)
        if problem:
            return ToolResult(f"{problem[0]}: {problem[1]}", is_error=True, error_kind=problem[0])
        try:
            result = dispatch(call)
        except Exception as exc:  # the tool's own failure is the caller's observation, not our crash
            return ToolResult(f"{EXECUTION_ERROR}{exc}", is_error=True, error_kind="EXECUTION_ERROR")
        if not result.is_error and self.result_is_error(result.content):
            result = ToolResult(result.content, True, result.error_kind or "TOOL_ERROR")
        return result

    @abstractmethod
    def _setup(self, task: Task) -> None:
        """Build fresh state for `task`."""

    @abstractmethod
    def _dispatch(self, call: ToolCall) -> ToolResult:
        """Run one schema-valid call against the episode's state."""

    def _dispatch_user(self, call: ToolCall) -> ToolResult:
        """Run one schema-valid call of the simulated user (only benchmarks whose user has tools need it)."""
        raise NotImplementedError(f"{type(self).__name__} has no user tools")

    @abstractmethod
    def score(self, task: Task, steps: Steps, texts: list[str] | None = None,
              termination: str = "completed") -> Score:
        """The benchmark's official verdict on the calls an episode executed, turn by turn.

        Judge `steps`, not this instance's state: in rehearse mode the episode's environment never executed
        anything, so a checker that needs state replays the calls on a fresh one (as BFCL's and τ²'s do).

        `texts` are the caller's plain-text answers in order (τ²'s COMMUNICATE check reads them);
        `termination` is how the engine ended the episode (`completed` is a normal end). A benchmark
        that judges calls only ignores both.
        """
