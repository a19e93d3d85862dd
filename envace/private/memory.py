"""How imagined attempts become a rehearsal memory (`[rollout.private] memory`).

- `summary`: the policy, as summariser, writes the memory from the attempts' transcripts
  (`prompts.summariser_prompt`); `parse_memory` keeps plain text and rejects an empty or call-shaped one.
- `transcript`: no generation. Each attempt is condensed deterministically: its calls in order with the result
  the rehearser gave each (errors named by kind), then how it ended, within `memory_tokens` (every attempt an
  equal share; long results cut first, then the lines that do not fit). A 135M model cannot summarise (in the
  sweeps most of its summaries were rejected as call-shaped text); this form still carries what the imagined
  attempts found. Tool-call tags inside a rehearsed result are neutralised, so a transcript never holds a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from envace.formats import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, parse_tool_calls, strip_thinking

RESULT_CHARS = 60  # a rehearsed result as shown in a transcript memory: its head only


def parse_memory(text: str) -> tuple[str, str | None]:
    """(memory, error) of a summariser's output: plain text, tags stripped; empty or call-like output is no memory."""
    body = re.sub(r"</?(rehearsal_memory|memory)>", "", strip_thinking(text)).strip()
    if parse_tool_calls(body).calls or TOOL_CALL_OPEN in body:
        return "", "tool_call_in_memory"
    if not body:
        return "", "empty_memory"
    return body, None


def _plain(text: str) -> str:
    """One line of memory text: no line breaks, no tool-call tags (a rehearsal may have written them)."""
    text = text.replace(TOOL_CALL_OPEN, "[tool_call]").replace(TOOL_CALL_CLOSE, "[/tool_call]")
    return " ".join(text.split())


def _short(text: str, chars: int) -> str:
    text = _plain(text)
    return text if len(text) <= chars else text[: chars - 1] + "…"


def attempt_lines(calls: Sequence[dict[str, Any]], replies: Sequence[str], termination: str | None) -> list[str]:
    """An imagined attempt as memory lines: `name {arguments} -> result` per call (`failed KIND:` before a failed
    result), the caller's reply, and how the attempt ended when it did not end with a reply."""
    lines = []
    for n, call in enumerate(calls, 1):
        arguments = call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"])
        failed = f"failed {call.get('error_kind') or 'TOOL_ERROR'}: " if call.get("is_error") else ""
        lines.append(f"{n}. {call['name']} {_short(arguments, RESULT_CHARS)} -> {failed}"
                     f"{_short(str(call['response']), RESULT_CHARS)}")
    if replies:
        lines.append(f"reply: {_short(replies[-1], RESULT_CHARS)}")
    if termination not in (None, "completed") or not lines:
        lines.append(f"ended: {termination or 'no call and no reply'}")
    return lines


def transcript_memory(attempts: Sequence[list[str]], encode: Callable[[str], list[int]], budget: int) -> str:
    """The attempts' lines (`attempt_lines`, in order) as one memory of at most `budget` tokens by `encode`:
    each attempt gets an equal share, a header and as many of its lines as fit (a line too long for what is
    left is cut to it)."""
    share = max(1, (budget - len(attempts) + 1) // max(1, len(attempts)))  # a line break between attempts
    blocks = []
    for k, lines in enumerate(attempts, 1):
        block = f"Attempt {k}:"
        for line in lines:
            candidate = f"{block}\n{line}"
            if len(encode(candidate)) <= share:
                block = candidate
                continue
            room = share - len(encode(block + "\n"))
            if room > 4:  # a cut line is worth keeping only if some of it shows
                block = _cut(f"{block}\n{line}", encode, share)
            break
        if len(encode(block)) <= share:
            blocks.append(block)
    memory = "\n".join(blocks)
    return memory if len(encode(memory)) <= budget else _cut(memory, encode, budget)  # merges across joins


def _cut(text: str, encode: Callable[[str], list[int]], budget: int) -> str:
    """`text` shortened by characters until it encodes to at most `budget` tokens (ending in `…`)."""
    lo, hi = 0, len(text)
    while lo < hi:  # the longest prefix that fits, by bisection on characters
        mid = (lo + hi + 1) // 2
        if len(encode(text[:mid] + "…")) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo] + "…"
