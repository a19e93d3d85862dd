"""Memory episodes in GRPO's groups (`grpo.memory_episodes = k`): the last k episodes of every group privately
rehearse before each committed turn, as test time does, so GRPO also trains caller turns that read a memory.

    episodes of a task: g = 0 … G − 1            # one group, the same task and weights
    g ≥ G − k: before each user turn, one imagined attempt in the rehearsed world, summarised (`ONE_ATTEMPT`);
               the turn's user message carries the memory (`<rehearsal_memory>`), then the turn is played
    g < G − k: the turn as always
    A_g = r_g − mean(r)                          # one reward per episode, one baseline for the group

Private rehearsal appends a block no other training row shows (`docs/results.md`: the block alone costs
checklist points). Memory-aware SFT (`sft.memory`) teaches reading one by imitation; here the block is in the
prompt of committed turns GRPO trains on, and with 0 < k < G the group's advantages compare episodes that read a
memory with episodes that did not, on the same task. Only the committed turns train: the imagined attempts and
the summary are the hook's own generations, never the episode's (`PrivateRehearsal`); they are stored
(`memories`, `imagined`) as a rollout's are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envace.config import PrivateOptions
from envace.engine.episode import Episode
from envace.engine.rehearser import Rehearser
from envace.private.rehearsal import PrivateRehearsal


class SomeEpisodes:
    """A before-turn hook for the episodes `chosen` picks; every other episode opens its turns at once. A wrapper:
    the hook it wraps is unchanged (and as safe to call from several threads as it was: `concurrent`)."""

    def __init__(self, hook: Any, chosen: Callable[[Episode], bool]) -> None:
        self.hook, self.chosen = hook, chosen
        self.concurrent = getattr(hook, "concurrent", False)

    def wants(self, ep: Episode) -> bool:
        return self.chosen(ep) and self.hook.wants(ep)

    def memories(self, engine: Any, episodes: list[Episode]) -> list[str]:
        return self.hook.memories(engine, episodes)


def private_hook(k: int, group_size: int) -> Callable[[PrivateOptions, Rehearser], SomeEpisodes] | None:
    """`build_engine`'s `private_hook` for k memory episodes in groups of `group_size`: private rehearsal for
    group indices G − k … G − 1. None for k = 0, where the step's rollouts have no private rehearsal."""
    if not k:
        return None

    def build(options: PrivateOptions, rehearser: Rehearser) -> SomeEpisodes:
        return SomeEpisodes(PrivateRehearsal(options, rehearser), lambda ep: ep.group_index >= group_size - k)
    return build
