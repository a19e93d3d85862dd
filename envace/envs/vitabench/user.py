"""What a user simulator needs to play a VitaBench user: its system prompt, the greeting, the stop signals.

Upstream's simulator is an LLM given the task's `instructions` (the hidden goal, in the second person) and
its `user_profile` persona (TOOLS.md §6); the conversation opens with the agent's fixed greeting. The
guidelines below are ours, in the spirit of τ²'s (VitaBench is derived from τ²-bench), whose stop signals
are reused: a user message containing one ends the episode.
"""

from __future__ import annotations

from envace.envs.tau2.user import STOP, STOP_SIGNALS
from envace.envs.vitabench.prompts import profile_lines, weekday
from envace.types import Task

GREETING = "Hello, how can I help you?"

GUIDELINES = f"""You play a user of a local-services app, talking with the app's assistant.
- Your goal is in <instructions>. Pursue it step by step: say what you need a little at a time, as a real user \
would, not all at once.
- <profile> is who you are. Answer the assistant's questions from it (your user id, your addresses, your habits).
- Never invent details that are in neither; if asked something you do not know, say so or let the assistant choose.
- Check what the assistant proposes against your instructions; accept, refuse or correct it as they say.
- You only write messages; you never call tools.
- When your goal is reached, or cannot be reached, write {STOP} as your whole message.
- Write in the language of your instructions."""

SYSTEM_PROMPT = """{guidelines}

Current time: {time} ({weekday}).

<profile>
{profile}
</profile>

<instructions>
{instructions}
</instructions>"""

__all__ = ["GREETING", "STOP", "STOP_SIGNALS", "user_system_prompt"]


def user_system_prompt(task: Task) -> str:
    """The system prompt of the model that plays the user of `task` (conversation categories only)."""
    if task.payload["solo"]:
        raise ValueError(f"{task.uid} is a solo task: it has no user to simulate")
    raw = task.payload["task"]
    time = raw["environment"]["time"]
    profile = (raw.get("user_scenario") or {}).get("user_profile") or {}
    return SYSTEM_PROMPT.format(guidelines=GUIDELINES, time=time, weekday=weekday(time),
                                profile=profile_lines(profile), instructions=raw["instructions"].strip())
