"""The agent's side of a VitaBench episode: its system prompt and the message that opens the episode.

Upstream's agent prompt gives the current time with its weekday plus generic tool-use rules (TOOLS.md §6);
this one is ours, short, with the same facts. The user id is not in it: in a conversation the simulated user
knows it from their profile; in solo mode the profile comes with the request in the opening message. Upstream
ends a dialogue when the agent writes `###STOP###`; here a turn ends when the agent answers without a call.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

DOMAIN_TEXT = {
    "delivery": "food delivery: stores, dishes and delivery orders",
    "instore": "in-store services: shops, packages, table bookings and service reservations",
}

AGENT_PROMPT = """You are the assistant of a local-services app ({domain}).
You help the user by calling the tools provided.
- The current time is {time} ({weekday}). It does not change during the conversation.
- Use only what the user says and what the tools return; never invent ids, products, shops, times or addresses.
- Before you place, pay, cancel or change an order, booking or reservation, make sure it is what the user wants.
- When a call needs the result of another, make them one after the other.
- When the request is done, or cannot be done, answer in plain text without a tool call."""

SOLO_RULE = ("There is no live user in this episode: the request and the user's profile open the conversation, "
             "and nobody answers questions. Decide from them and from the tools, carry the request out, then reply "
             "with a short message that contains no tool call.")
ZH_RULE = "The user writes in Chinese; reply in Chinese."

STAND_IN_HEADER = ("[No live user in this episode. The user's request and profile, as VitaBench writes them for its "
                   "user simulator:]")


def weekday(time: str) -> str:
    try:
        return datetime.strptime(time, "%Y-%m-%d %H:%M:%S").strftime("%A")
    except ValueError:
        return "unknown weekday"


def agent_system_prompt(environment: dict[str, Any], domain: str, lang: str, solo: bool) -> str:
    prompt = AGENT_PROMPT.format(domain=DOMAIN_TEXT[domain], time=environment["time"],
                                 weekday=weekday(environment["time"]))
    rules = [prompt] + ([SOLO_RULE] if solo else []) + ([ZH_RULE] if lang == "zh" else [])
    return "\n".join(rules)


def profile_lines(profile: dict[str, Any]) -> str:
    """The flat persona as `- key: value` lines (key spelling varies in the data; shown as written)."""
    return "\n".join(f"- {key}: {value}" for key, value in profile.items())


def opening_message(raw: dict[str, Any]) -> str:
    """The first user message: in solo mode the whole instruction and profile; in a conversation a stand-in
    for engines that run without a user simulator (the simulator's own opening replaces it)."""
    profile = (raw.get("user_scenario") or {}).get("user_profile") or {}
    return f"{STAND_IN_HEADER}\n{raw['instructions'].strip()}\n\nUser profile:\n{profile_lines(profile)}"
