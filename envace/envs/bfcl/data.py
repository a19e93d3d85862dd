"""BFCL v4 multi-turn tasks: items, tool schemas, the scenario split and replayed reference trajectories.

Split (fixed, documented in docs/benchmarks.md): the four categories are augmentations of the same 200
scenarios, so the split is by scenario index `i` of `multi_turn_<category>_<i>`: `i % 4 == 3` is test,
everything else train, for every category. Nothing in training or tuning reads test scenarios.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import cache, lru_cache
from typing import Any

from envace.envs.bfcl.schemas import class_docs, data_dir, jsonl, openai_types, to_openai_tool
from envace.envs.bfcl.splits import split_of
from envace.errors import UsageError
from envace.types import ReferenceStep, Split, Task

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")

# BFCL's own user message at the turn where held-out functions are revealed (miss_func).
ADDED_FUNCTIONS_PROMPT = "I have updated some more functions you can choose from. What about now?"

SYSTEM_PROMPT = (
    "You are an assistant that completes the user's requests by calling the provided functions. "
    "Call one or more functions at a time; you will see their results. When the request is done, or "
    "cannot be done with the functions you have, reply to the user in plain text without a call."
)


@lru_cache(maxsize=8)
def _raw(category: str) -> tuple[list[dict[str, Any]], dict[str, list[list[str]]]]:
    entries = jsonl(data_dir() / f"BFCL_v4_{category}.json")
    answers = {a["id"]: a["ground_truth"] for a in jsonl(data_dir() / "possible_answer" / f"BFCL_v4_{category}.json")}
    return entries, answers


def _build(entry: dict[str, Any], ground_truth: list[list[str]], category: str) -> Task:
    """One BFCL item as a Task; tools and held-out functions follow BFCL's own populate step."""
    docs = [d for cls in entry["involved_classes"] for d in class_docs(cls)]
    missed = {int(turn): names for turn, names in entry.get("missed_function", {}).items()}
    held_out = {n for names in missed.values() for n in names}
    scenario = int(entry["id"].rsplit("_", 1)[1])
    user_turns = [" ".join(m["content"] for m in q if m["role"] == "user") or ADDED_FUNCTIONS_PROMPT
                  for q in entry["question"]]
    task = Task(
        uid=f"bfcl/{entry['id']}", env="bfcl", category=category, split=split_of(scenario), scenario=scenario,
        system_prompt=SYSTEM_PROMPT,
        tools=[to_openai_tool(d) for d in docs if d["name"] not in held_out],
        user_turns=user_turns, reference=[],
        tools_added={turn: [to_openai_tool(d) for d in docs if d["name"] in names] for turn, names in missed.items()},
        payload={"entry": entry, "ground_truth": ground_truth,
                 "response_schemas": {d["name"]: openai_types(d.get("response", {})) for d in docs}},
    )
    task.reference = replay_reference(task)
    return task


def replay_reference(task: Task) -> list[list[ReferenceStep]]:
    """Ground-truth calls of every turn, executed on a fresh environment, with their real results."""
    from envace.envs.bfcl.calls import parse_call_string
    from envace.envs.bfcl.env import BFCLEnv

    env = BFCLEnv()
    env.reset(task)
    turns = []
    for calls in task.payload["ground_truth"]:
        steps = []
        for text in calls:
            call = parse_call_string(text, env.positional_names)
            steps.append(ReferenceStep(call=call, result=env.execute(call)))
        turns.append(steps)
    return turns


def truncate(task: Task, k: int) -> Task:
    """The task cut after turn k: its user turns, reference, held-out tools and the checker's ground truth
    and questions all end there, so BFCL's own checker scores turns 0..k."""
    entry = {**task.payload["entry"], "question": task.payload["entry"]["question"][: k + 1]}
    payload = {**task.payload, "entry": entry, "ground_truth": task.payload["ground_truth"][: k + 1]}
    return replace(task, uid=f"{task.uid}@t{k}", user_turns=task.user_turns[: k + 1],
                   reference=task.reference[: k + 1], payload=payload,
                   tools_added={t: tools for t, tools in task.tools_added.items() if t <= k})


def load_tasks(category: str, split: str = Split.TEST, limit: int | None = None,
               offset: int = 0) -> list[Task]:
    """Tasks of one category and split, in BFCL's id order; `limit`/`offset` slice after the split. The
    single-turn categories come from `single.py`, the memory ones from `memory.py`."""
    import envace.envs.bfcl.memory as memory
    import envace.envs.bfcl.single as single

    if category in single.CATEGORIES:
        return single.load_tasks(category, split, limit, offset)
    if category in memory.CATEGORIES:
        return memory.load_tasks(category, split, limit, offset)
    if category not in CATEGORIES:
        raise UsageError(f"unknown BFCL category '{category}' (choose from "
                         f"{', '.join(CATEGORIES + single.CATEGORIES + memory.CATEGORIES)})")
    if split not in tuple(Split):
        raise UsageError(f"unknown split '{split}' (choose from train, test, all)")
    entries, _ = _raw(category)
    chosen = [i for i, e in enumerate(entries)
              if split == Split.ALL or split_of(int(e["id"].rsplit("_", 1)[1])) == split]
    return [_fresh(_built(category, i)) for i in chosen[offset: None if limit is None else offset + limit]]


@cache
def _built(category: str, index: int) -> Task:
    """Item `index` of a category, built once per process: converting its tool schemas and replaying its gold
    calls is most of a load's time, and a run loads the same tasks many times (its pool, its example bank, its
    evaluation, each stage of a study). Never handed out itself: see `_fresh`."""
    entries, answers = _raw(category)
    entry = entries[index]
    return _build(copy.deepcopy(entry), answers[entry["id"]], category)


def _fresh(task: Task) -> Task:
    """A task a caller may change as if it had been built for it: its own lists and dicts, its own copy of the BFCL
    item and gold answer (the checker and the environment read them). Tool schemas and replayed reference steps,
    which nothing changes, are shared with the cached task."""
    payload = {**task.payload, "entry": copy.deepcopy(task.payload["entry"]),
               "ground_truth": copy.deepcopy(task.payload["ground_truth"])}
    return replace(task, tools=list(task.tools), user_turns=list(task.user_turns),
                   reference=[list(steps) for steps in task.reference], payload=payload,
                   tools_added={turn: list(tools) for turn, tools in task.tools_added.items()})
