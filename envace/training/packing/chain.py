"""`chain` packing: the caller rows of one episode joined into one sequence.

A caller's prompt at step k is its step k−1 prompt + completion + the tool results, token for token,
so all caller rows of an episode become one sequence and one forward pass instead of one per message;
causal attention makes every log-prob identical to the row's own forward pass. Across episodes
nothing is shared: G rollouts of a turn forward their common prompt G times (the `tree` strategy
computes it once).
"""

from __future__ import annotations

from collections.abc import Sequence

from envace.training.packing.pack import Pack, sequence_pack


def chains(rows: Sequence) -> list[list[int]]:
    """Row indices grouped so that every row's prompt extends the previous row's sequence in its group."""
    groups: list[list[int]] = []
    for i in sorted(range(len(rows)), key=lambda i: len(rows[i].prompt_ids)):
        prompt = rows[i].prompt_ids
        for group in reversed(groups):
            last = rows[group[-1]]
            n = len(last.prompt_ids) + len(last.completion_ids)
            if len(prompt) >= n and prompt[: len(last.prompt_ids)] == last.prompt_ids and \
                    prompt[len(last.prompt_ids): n] == last.completion_ids:
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def chain_packs(rows: Sequence) -> list[Pack]:
    packs = []
    for group in chains(rows):
        last = rows[group[-1]]
        packs.append(sequence_pack(last.prompt_ids + last.completion_ids,
                                   [(i, len(rows[i].prompt_ids), len(rows[i].completion_ids)) for i in group]))
    return packs
