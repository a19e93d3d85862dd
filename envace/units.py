"""What one episode covers, and token budgets measured on the gold data instead of guessed.

Units: `episode` plays a whole task; `turn` plays one user turn k of a task after its gold prefix (turns
0..k-1: the gold calls and their recorded real responses, replayed into the context by the engine),
and is rewarded on turn k alone. A turn task is the task truncated to turns 0..k with `start_turn = k`:
its reference, its checker's data and its tools end at turn k (`Benchmark.truncate`; a single-turn task
is its own turn 0). Turns are selected by how many gold calls they hold and how many tokens the longest
gold call message takes with the model's tokenizer, so a turn the budget cannot express is never played.

Budgets: `max_new_tokens = "auto"` is the 95th percentile of gold call messages (train split) plus a
margin; `max_steps_per_turn = "auto"` is each turn's own gold calls plus one (the engine applies it).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from envace.envs.registry import Benchmark
from envace.errors import UsageError
from envace.formats import render_tool_call
from envace.types import Task, ToolCall

AUTO = "auto"
TOKEN_MARGIN = 16  # tokens above the gold p95: room for a model's own spelling of the same call


def message_tokens(tokenizer, calls: list[ToolCall]) -> int:
    """Tokens of the caller message that makes `calls` one per message: its longest, with the end token."""
    return max((len(tokenizer.encode(render_tool_call(c), add_special_tokens=False)) + 1 for c in calls), default=0)


def turn_task(benchmark: Benchmark, task: Task, k: int) -> Task:
    """`task` truncated to turns 0..k, to be played from turn k after the gold prefix."""
    if k == 0 and len(task.user_turns) == 1:
        return task
    if task.simulated_user is not None or benchmark.truncate is None:
        raise UsageError(f"unit turn: {benchmark.name} {task.category} has no per-turn gold to replay a prefix from "
                         "(use unit episode)")
    return replace(benchmark.truncate(task, k), start_turn=k)


def source_uid(task: Task) -> str:
    """The uid of the whole task a turn unit was cut from (a truncated task is named `<uid>@t<k>`)."""
    return whole_uid(task.uid)


def whole_uid(uid: str) -> str:
    """`<uid>@t<k>` → `<uid>`: a turn unit's uid as its whole task's."""
    return re.sub(r"@t\d+$", "", uid)


def turn_tasks(benchmark: Benchmark, tasks: list[Task], tokenizer, min_calls: int = 1, max_calls: int = 3,
               max_tokens: int | None = None) -> list[Task]:
    """Every (task, k) whose turn k has `min_calls`..`max_calls` gold calls, none longer than `max_tokens`."""
    out = []
    for task in tasks:
        if task.simulated_user is not None:
            raise UsageError(f"unit turn: {task.uid} is a conversation with a simulated user; its turns are not "
                             "scripted (use unit episode)")
        for k, turn in enumerate(task.reference):
            calls = [step.call for step in turn]
            if min_calls <= len(calls) <= max_calls and (max_tokens is None or
                                                         message_tokens(tokenizer, calls) <= max_tokens):
                out.append(turn_task(benchmark, task, k))
    if not out:
        raise UsageError(f"unit turn: no turn of the {len(tasks)} task(s) has {min_calls}-{max_calls} gold calls "
                         f"fitting {max_tokens} tokens (min_turn_calls, max_turn_calls, max_new_tokens)")
    return out


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def gold_stats(tasks: list[Task], tokenizer) -> dict[str, list[int]]:
    """Gold call-message lengths (tokens, one call per message) and gold calls per turn, over `tasks`."""
    lengths = [message_tokens(tokenizer, [step.call]) for t in tasks for turn in t.reference for step in turn]
    calls = [len(turn) for t in tasks for turn in t.reference]
    return {"message_tokens": lengths, "calls_per_turn": calls}


def auto_max_new_tokens(tasks: list[Task], tokenizer) -> int:
    lengths = gold_stats(tasks, tokenizer)["message_tokens"]
    if not lengths:
        raise UsageError("max_new_tokens = auto: these tasks have no gold calls to size the budget from")
    return percentile(lengths, 0.95) + TOKEN_MARGIN


def select(cfg, benchmark: Benchmark, tokenizer, split: str | None = None) -> tuple[object, list[Task]]:
    """(cfg with `auto` token budget resolved, the tasks it plays): `limit` and `offset` count whole tasks for
    unit episode, and turns for unit turn (a fixed, ordered set: task by task, turn by turn)."""
    split = split or cfg.split
    if cfg.max_new_tokens == AUTO:
        cfg = replace(cfg, max_new_tokens=auto_max_new_tokens(benchmark.load_tasks(cfg.category, "train"), tokenizer))
    if cfg.unit == "episode":
        return cfg, benchmark.load_tasks(cfg.category, split, cfg.limit, cfg.offset)
    turns = turn_tasks(benchmark, benchmark.load_tasks(cfg.category, split), tokenizer, cfg.min_turn_calls,
                       cfg.max_turn_calls, cfg.max_new_tokens)
    return cfg, turns[cfg.offset: None if cfg.limit is None else cfg.offset + cfg.limit]
