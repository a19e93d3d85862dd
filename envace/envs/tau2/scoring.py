"""τ²'s verdict on a finished conversation, from its own evaluators, with no LLM.

`score_trajectory` takes the conversation as simple dicts, builds τ²'s messages and combines
EnvironmentEvaluator (DB, ENV_ASSERTION), ActionEvaluator (ACTION) and CommunicateEvaluator
(COMMUNICATE) under the task's `reward_basis` exactly as `tau2.evaluator.evaluator.evaluate_simulation`
does for `EvaluationType.ALL` (that module imports litellm through tau2.registry, so the combination is
restated here). NL_ASSERTION needs an LLM judge; no task of the three domains has it in its basis.

Message dicts, in conversation order:
- `{"role": "assistant" | "user", "content": str | None, "tool_calls": [{"name", "arguments"}, ...]}`;
  `tool_calls` entries may also be `envace.types.ToolCall`s. A user message's calls are the simulated
  user's own tool calls (telecom). Solo mode has no user: user messages are skipped.
- `{"role": "tool", "content": str}`: the responses to the preceding message's calls, in call order.
  Responses may be left out: missing ones are produced by replaying the calls on a fresh environment.
  Recorded ones are checked by τ²'s DB evaluator, which replays them and fails on any difference.
- Other roles (system) are ignored.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from envace.envs.tau2.domains import make_environment, tau2_module
from envace.types import Score, Task, ToolCall

# τ²'s TerminationReason values that let an episode be scored at all; any other scores 0.
STOPPED = ("agent_stop", "user_stop")


def tau2_task(task: Task) -> Any:
    return tau2_module("data_model.tasks").Task.model_validate(task.payload["task"])


def initial_environment(task: Task) -> Any:
    """A fresh τ² environment in the task's initial state, set up as τ²'s orchestrator does."""
    state = tau2_task(task).initial_state
    env = make_environment(task.payload["domain"], task.payload["solo"])
    env.set_state(initialization_data=state.initialization_data if state else None,
                  initialization_actions=state.initialization_actions if state else None,
                  message_history=(state.message_history or []) if state else [])
    return env


def _call_dict(call: Any) -> dict[str, Any]:
    if isinstance(call, ToolCall):
        return {"name": call.name, "arguments": call.arguments}
    return {"name": call["name"], "arguments": call.get("arguments") or {}}


def _call_kwargs(call: Any) -> dict[str, Any]:
    # Tools keep references to their arguments (a reservation stores its passengers list).
    return copy.deepcopy(_call_dict(call))


def to_tau2_messages(task: Task, messages: list[dict[str, Any]]) -> list[Any]:
    """τ² Message objects with every tool call followed by its response (replayed where none was recorded).

    The task's own message history, if its initial state has one, comes first, as the evaluator expects.
    """
    m = tau2_module("data_model.message")
    state = tau2_task(task).initial_state
    out: list[Any] = list((state.message_history or []) if state else [])
    pending: list[list[Any]] = []  # [call, recorded response] slots of the latest calls, in order
    for message in messages:
        role = message.get("role")
        if role == "tool":
            if pending:  # a response with no call left to answer is not part of τ²'s trajectory
                pending.pop(0)[1] = str(message.get("content"))
            continue
        # τ²'s solo trajectories hold no user message (the ticket is not part of them).
        if role not in ("assistant", "user") or (task.payload["solo"] and role == "user"):
            continue
        calls = [m.ToolCall(id=f"call_{len(out)}_{i}", requestor=role, **_call_kwargs(raw))
                 for i, raw in enumerate(message.get("tool_calls") or [])]
        cls = m.AssistantMessage if role == "assistant" else m.UserMessage
        out.append(cls(role=role, content=message.get("content"), tool_calls=calls or None))
        pending = [[call, None] for call in calls]
        out.extend(pending)
    slots = [i for i, item in enumerate(out) if isinstance(item, list)]
    replay = initial_environment(task) if any(out[i][1] is None for i in slots) else None
    for i in slots:
        call, content = out[i]
        # The replay runs every call, answered or not, so later calls see the state earlier ones left.
        fresh = replay.get_response(call) if replay is not None else None
        out[i] = fresh if content is None else m.ToolMessage(id=call.id, role="tool", content=content,
                                                              requestor=call.requestor)
    return out


def _combine(task: Any, env_info: Any, action_info: Any, comm_info: Any) -> tuple[float, dict[str, float]]:
    """evaluate_simulation's product over the reward basis (EvaluationType.ALL)."""
    basis = {str(b.value) for b in task.evaluation_criteria.reward_basis}
    reward, parts = 1.0, {}
    for names, info in (({"DB", "ENV_ASSERTION"}, env_info), ({"ACTION"}, action_info),
                        ({"COMMUNICATE"}, comm_info)):
        if basis & names:
            parts.update({str(getattr(k, "value", k)): v for k, v in (info.reward_breakdown or {}).items()})
            reward *= info.reward
    return reward, parts


def _failures(basis: set[str], env_info: Any, action_info: Any, comm_info: Any) -> list[str]:
    notes = []
    if "DB" in basis and env_info.db_check is not None and not env_info.db_check.db_match:
        notes.append("db mismatch")
    if "ENV_ASSERTION" in basis:
        notes += [f"assertion {a.env_assertion.func_name}({a.env_assertion.arguments}) not met"
                  for a in env_info.env_assertions or [] if not a.met]
    if "ACTION" in basis:
        notes += [f"action {a.action.name} not taken" for a in action_info.action_checks or [] if not a.action_match]
    if "COMMUNICATE" in basis:
        notes += [f"'{c.info}' not communicated" for c in comm_info.communicate_checks or [] if not c.met]
    return notes


def score_trajectory(task: Task, messages: list[dict[str, Any]], termination: str = "agent_stop") -> Score:
    """τ²'s reward for a conversation of `task`; success is reward 1.0, as τ² counts a pass.

    `termination` is τ²'s TerminationReason value: anything but agent_stop / user_stop scores 0, as in τ².
    """
    evaluator = tau2_module("evaluator.evaluator_env")
    action = tau2_module("evaluator.evaluator_action")
    communicate = tau2_module("evaluator.evaluator_communicate")
    if termination not in STOPPED:
        return Score(False, f"reward 0.0: terminated ({termination})")
    item = tau2_task(task)
    if item.evaluation_criteria is None:
        return Score(True, "reward 1.0: no evaluation criteria")
    basis = {str(b.value) for b in item.evaluation_criteria.reward_basis}
    if "NL_ASSERTION" in basis:
        return Score(False, "reward 0.0: NL_ASSERTION needs an LLM judge")
    try:
        trajectory = to_tau2_messages(task, messages)
        env_info = evaluator.EnvironmentEvaluator.calculate_reward(
            environment_constructor=functools.partial(make_environment, task.payload["domain"]), task=item,
            full_trajectory=trajectory, solo_mode=task.payload["solo"])
    except ValueError as exc:  # τ²'s replay refuses a trajectory whose recorded responses differ
        return Score(False, f"reward 0.0: trajectory does not replay ({str(exc).splitlines()[0]})")
    action_info = action.ActionEvaluator.calculate_reward(task=item, full_trajectory=trajectory)
    comm_info = communicate.CommunicateEvaluator.calculate_reward(task=item, full_trajectory=trajectory)
    reward, parts = _combine(item, env_info, action_info, comm_info)
    shown = ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
    notes = "; ".join(_failures(basis, env_info, action_info, comm_info)) if reward < 1.0 else ""
    return Score(reward == 1.0, f"reward {reward:.1f} ({shown})" + (f": {notes}" if notes else ""), value=reward,
                 subscores={k: float(v) for k, v in parts.items()})
