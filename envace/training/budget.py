"""Every training row fits the packing budget, so a long run never meets a row it cannot pack.

A tree pack holds at most `packing.max_tokens` tokens alive at once (`packing.tree`), and a row longer than
that fits no pack. Rollouts would otherwise stop only at the model's context (32,768 tokens for Qwen3),
far past a 16,384-token budget, and a `--resume` would replay the same seeds into the same failure. So:

* the engine's context is `min(model context, budget)`: a caller row is its prompt plus at most
  `max_new_tokens`, and an episode whose next caller row would not fit ends `context_exceeded`;
* the rehearser's budget clamps to what is left of that context (`Rehearser._budgets`);
* a row still over the budget (a rehearser prompt longer than the budget itself) is kept out of the update,
  counted (`rows_over_budget`) and warned about: its group's baseline still counts its reward;
* before any rollout, a unit whose first caller row cannot fit (its opening prompt + `max_new_tokens`) is
  dropped from the pool with a warning, and a pool where none fits is one line with both numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from envace.config import TrainConfig
from envace.errors import UsageError


def row_budget(cfg: TrainConfig) -> int | None:
    """The most tokens one training row may hold: tree packing's budget, when one is set."""
    return cfg.packing.max_tokens if cfg.packing.strategy == "tree" else None


def engine_context(model_context: int | None, budget: int | None) -> int | None:
    """The rollout engine's context: the model's, never past the budget."""
    limits = [c for c in (model_context, budget) if c]
    return min(limits) if limits else None


def fitting(rows: Sequence, budget: int | None) -> list[int]:
    """Indices of the rows whose prompt + completion fit `budget` (all of them without one)."""
    return [i for i, r in enumerate(rows)
            if budget is None or len(r.prompt_ids) + len(r.completion_ids) <= budget]


def first_row_tokens(engine, task) -> int:
    """Tokens of `task`'s first caller row at most: its opening context (after a turn unit's gold prefix) plus
    `max_new_tokens`. A conversation opens on the simulated user's words, counted here as empty."""
    if task.simulated_user is not None:
        opening = engine.renderer.opening(replace(task, user_turns=[""]))
    else:
        opening = engine.start(task, 0).ids
    return len(opening) + engine.config.max_new_tokens


def fitting_pool(engine, pool: list, budget: int, say) -> list:
    """The units of `pool` whose first caller row fits `budget`; none fitting is a usage error naming both."""
    tokens = [first_row_tokens(engine, t) for t in pool]
    kept = [t for t, n in zip(pool, tokens, strict=True) if n <= budget]
    if not kept:
        raise UsageError(f"packing.max_tokens: the shortest first caller row of the {len(pool)} GRPO unit(s) is "
                         f"{min(tokens)} tokens (opening prompt + max_new_tokens = {engine.config.max_new_tokens}), "
                         f"over the budget of {budget} tokens: raise packing.max_tokens or lower "
                         "rollout.max_new_tokens")
    if len(kept) < len(pool):
        say(f"warning: {len(pool) - len(kept)} of {len(pool)} GRPO unit(s) open on a first caller row of more than "
            f"packing.max_tokens = {budget} tokens (longest {max(tokens)}) and are left out of the pool")
    return kept
