"""A τ² episode on its own τ² environment, each call run by the domain's own tool execution.

Calls go through `Environment.get_response`, as τ²'s orchestrator sends them, so responses and the state
they leave (the DB hashes τ² compares) are τ²'s. A tool that raises answers `Error: <message>`, τ²'s
text, as an `EXECUTION_ERROR` result. Every dispatched call and its response is kept in `trajectory`
(the message dicts `score_trajectory` reads); calls refused by validation never reach the environment
and are not kept, since τ²'s state never saw them.

Telecom's user acts on their own phone: `execute_user` runs such a call (the user simulator's) against
the user's tools with τ²'s `requestor="user"`. τ² reports a failed call as text, `Error: <message>`
(`result_is_error`, the benchmark entry's failure convention).
"""

from __future__ import annotations

import copy
from typing import Any

from envace.envs.base import Environment, Steps, json_error
from envace.envs.tau2.domains import tau2_module
from envace.envs.tau2.scoring import initial_environment, score_trajectory
from envace.types import Score, Task, ToolCall, ToolResult


def result_is_error(content: str) -> bool:
    """τ²'s failure convention: the environment answers a tool that raised with `Error: <message>` (a rehearser
    may also write the workbench's own `{"error": …}`)."""
    return content.startswith("Error:") or json_error(content)


class Tau2Env(Environment):
    """τ²-Bench (airline, retail, telecom, telecom solo): state lives in one τ² Environment per episode.

    τ²'s environment checks no argument against a schema: a call runs as it is, and a wrong one fails in the tool
    (`Error: …`), so neither does this one (`validate_arguments`)."""

    validate_arguments = False
    result_is_error = staticmethod(result_is_error)

    def _setup(self, task: Task) -> None:
        self.env = initial_environment(task)
        self.trajectory: list[dict[str, Any]] = []

    def _run(self, call: ToolCall, requestor: str) -> ToolResult:
        message = tau2_module("data_model.message").ToolCall(
            id=f"call_{len(self.trajectory)}", name=call.name, requestor=requestor,
            # Tools keep references to their arguments (a reservation stores its passengers list).
            arguments=copy.deepcopy(call.arguments))
        response = self.env.get_response(message)
        self.trajectory.append({"role": requestor, "content": None,
                                "tool_calls": [{"name": call.name, "arguments": copy.deepcopy(call.arguments)}]})
        self.trajectory.append({"role": "tool", "content": response.content})
        return ToolResult(response.content, is_error=response.error,
                          error_kind="EXECUTION_ERROR" if response.error else "")

    def _dispatch(self, call: ToolCall) -> ToolResult:
        return self._run(call, "assistant")

    def _dispatch_user(self, call: ToolCall) -> ToolResult:
        return self._run(call, "user")

    def record_text(self, role: str, content: str) -> None:
        """A text message of the conversation (the agent's answers are what COMMUNICATE reads)."""
        self.trajectory.append({"role": role, "content": content})

    def score(self, task: Task, steps: Steps, texts: list[str] | None = None,
              termination: str = "completed") -> Score:
        """τ²'s reward from the dispatched calls of each turn and step, plus the agent's text messages.

        A call to one of the user's tools (telecom, not solo) is the simulated user's: the two tool sets
        share no name, and the agent's own calls to user tools are refused before dispatch. Responses are
        replayed on a fresh environment. Without `texts`, tasks whose basis has COMMUNICATE can only pass
        when they have nothing to communicate. `termination` is the engine's: an episode that did not end
        `completed` (τ²: the agent or the user stopped) scores 0, as τ² scores max-steps and error endings.
        """
        messages: list[dict[str, Any]] = []
        user_names = {t["function"]["name"] for t in task.payload["user_tools"]}
        for step in (step for turn in steps for step in turn):
            start = len(messages)  # one message per step, split where the caller changes
            for call in step:
                role = "user" if call.name in user_names else "assistant"
                if len(messages) > start and messages[-1]["role"] == role:
                    messages[-1]["tool_calls"].append(call)
                else:
                    messages.append({"role": role, "content": None, "tool_calls": [call]})
        messages += [{"role": "assistant", "content": text} for text in texts or []]
        return score_trajectory(task, messages, "agent_stop" if termination == "completed" else termination)
