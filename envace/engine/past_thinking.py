"""`[rollout] past_thinking = "drop"`: when a user turn starts, the caller's past messages as the template renders them.

The engine is token-in-token-out, so a caller context keeps every message as it was sampled: Qwen3's empty
think block (thinking off) or the whole thought (thinking on). Qwen3's own template drops the `<think>`
block of every assistant message before the last user message, and "drop" gives the model that context:
each past message is re-rendered by the template (`ChatRenderer.past_message`) and the generation prompt's
prefill before it removed; everything else in the context (the template's own rendering) stays as it is.
Within a turn the context still only grows.

The prompts the caller has already been sampled from are no longer prefixes of the context, so each is
frozen into its generation's `prompt_ids` first: training rows use exactly the ids each message was
sampled from.
"""

from __future__ import annotations

from envace.engine.episode import Episode
from envace.engine.prompts import ChatRenderer


def drop_past_thinking(ep: Episode, renderer: ChatRenderer) -> None:
    """Re-render the caller messages of `ep.caller_spans` as past messages; a no-op when the template keeps them."""
    if not ep.caller_spans:
        return
    prefill = renderer.prefill
    ids: list[int] = []
    cursor = 0
    for start, stop in ep.caller_spans:
        before = ep.ids[cursor:start]
        if prefill and before[-len(prefill):] == prefill:
            before = before[:-len(prefill)]
        ids += before + renderer.past_message(ep.ids[start:stop])
        cursor = stop
    ids += ep.ids[cursor:]
    ep.caller_spans = []  # a past message stays past: the next turn has only its own to re-render
    if ids == ep.ids:
        return
    for g in ep.generations:
        if g.prompt_ids is None:
            g.prompt_ids = ep.ids[: g.prompt_len]
    ep.ids = ids
