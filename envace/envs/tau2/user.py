"""What a user simulator needs to play τ²'s customer: its system prompt, tools and stop signals.

τ²'s `UserSimulator` (`tau2/user/user_simulator.py`, `tau2/user/base.py`) calls an LLM through
litellm; these are its prompt and protocol without it, so any model can play the user:
- system prompt: the global guidelines (`data/tau2/user_simulator/simulation_guidelines.md`, or
  `simulation_guidelines_tools.md` when the user has tools: telecom) followed by the task's
  `user_scenario` rendered by τ²'s own `UserScenario.__str__`, inside `<scenario>` tags;
- the conversation opens with the agent's FIRST_AGENT_MESSAGE; the simulator sees the conversation with
  roles flipped (agent messages as `user`, its own as `assistant`), and only the agent's text messages
  and responses to its own tool calls, never the agent's tool calls;
- a user message containing STOP, TRANSFER or OUT_OF_SCOPE ends the episode (τ²'s USER_STOP), which
  is then scored; a user message with tool calls goes to the environment (`Tau2Env.execute_user`).
The templates are copied; a test checks they still match the installed source.
"""

from __future__ import annotations

from typing import Any

from envace.envs.tau2.domains import tau2_module
from envace.envs.tau2.prompts import FIRST_AGENT_MESSAGE
from envace.types import Task

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
STOP_SIGNALS = (STOP, TRANSFER, OUT_OF_SCOPE)

SYSTEM_PROMPT = """
{global_user_sim_guidelines}

<scenario>
{instructions}
</scenario>
""".strip()

__all__ = ["FIRST_AGENT_MESSAGE", "OUT_OF_SCOPE", "STOP", "STOP_SIGNALS", "TRANSFER", "guidelines_path",
           "user_system_prompt", "user_tools"]


def guidelines_path(with_tools: bool) -> Any:
    folder = tau2_module("utils.utils").DATA_DIR / "tau2" / "user_simulator"
    return folder / ("simulation_guidelines_tools.md" if with_tools else "simulation_guidelines.md")


def user_tools(task: Task) -> list[dict[str, Any]]:
    """The simulated user's tools as OpenAI function schemas (telecom only; empty in solo mode)."""
    return task.payload["user_tools"]


def user_system_prompt(task: Task) -> str:
    """The system prompt τ²'s UserSimulator would give its LLM for `task`."""
    if task.payload["solo"]:
        raise ValueError(f"{task.uid} is a solo task: it has no user to simulate")
    scenario = tau2_module("data_model.tasks").UserScenario.model_validate(task.payload["task"]["user_scenario"])
    guidelines = guidelines_path(bool(user_tools(task))).read_text()
    return SYSTEM_PROMPT.format(global_user_sim_guidelines=guidelines, instructions=str(scenario))
