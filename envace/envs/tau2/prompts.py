"""The agent's side of τ²'s prompts: the system prompt wrapping a domain policy, and each episode's opening.

The instruction texts are τ²'s own (`tau2/agent/llm_agent.py`: AGENT_INSTRUCTION, SYSTEM_PROMPT,
AGENT_SOLO_INSTRUCTION, SYSTEM_PROMPT_SOLO), copied because importing that module imports litellm; a test
checks they still appear verbatim in the installed source. Two deliberate differences in solo mode: the
ticket opens the episode as its user message instead of sitting in a `<ticket>` block, and the agent
stops by answering without a tool call instead of calling a `done` tool, which is how every episode of
this workbench ends a turn.
"""

from __future__ import annotations

from typing import Any

AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.
""".strip()

SYSTEM_PROMPT = """
<instructions>
{agent_instruction}
</instructions>
<policy>
{domain_policy}
</policy>
""".strip()

# τ²'s solo instruction up to its stop rule, which names the `done` tool; ours follows it.
AGENT_SOLO_INSTRUCTION_HEAD = """
You are a customer service agent that helps the user according to the <policy> provided below.
You will be provided with a ticket that contains the user's request.
You will need to plan and call the appropriate tools to solve the ticket.

You cannot communicate with the user, only make tool calls.
Stop when you consider that you have solved the ticket.
""".strip()
SOLO_STOP_RULE = "To do so, reply with a short message that contains no tool call."
SOLO_TAIL = "Always follow the policy. Always make sure you generate valid JSON only."

# τ²'s orchestrator opens every conversation with this agent message before the simulated user speaks.
FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"

STAND_IN_HEADER = ("[No live customer in this episode. The customer's situation, as τ²-Bench writes it for "
                   "its user simulator:]")


def agent_system_prompt(policy: str, solo: bool = False) -> str:
    if not solo:
        return SYSTEM_PROMPT.format(agent_instruction=AGENT_INSTRUCTION, domain_policy=policy)
    instruction = f"{AGENT_SOLO_INSTRUCTION_HEAD}\n{SOLO_STOP_RULE}\n\n{SOLO_TAIL}"
    return SYSTEM_PROMPT.format(agent_instruction=instruction, domain_policy=policy)


def opening_message(task: dict[str, Any], solo: bool) -> str:
    """The user message that opens the episode.

    Solo: τ²'s ticket. Otherwise the opening belongs to the user simulator (it answers
    FIRST_AGENT_MESSAGE), so this is a stand-in for engines that run without one: the scenario's reason
    for calling and known information, verbatim and labelled as such. Scores earned from the stand-in
    are not comparable with τ²'s.
    """
    if solo:
        return task["ticket"]
    return f"{STAND_IN_HEADER}\n{customer_request(task)}"


def customer_request(task: dict[str, Any]) -> str:
    """The scenario's reason for calling and known information, verbatim: what the customer opens with."""
    instructions = task["user_scenario"]["instructions"]
    if isinstance(instructions, str):
        return instructions
    parts = [instructions["reason_for_call"], instructions.get("known_info")]
    return "\n".join(p.strip() for p in parts if p)
