"""VitaBench delivery and in-store tasks as `Task`s: files, categories, groups, splits and gold references.

Files (in `data/`, copied unchanged from upstream commit 96f3b85 with its MIT `LICENSE`): the task lists
`delivery_tasks_en.json.gz`, `instore_tasks_en.json.gz`, `delivery_tasks_zh.json.gz` (the same 100
delivery tasks in Chinese) and the official tool schemas of each domain (`tool_schemas_*.json`).

Categories: `delivery`, `instore`, `delivery_zh` are conversations with a simulated user (the task's
`instructions` and `user_profile`); their `_solo` variants have no user: the instruction and profile open
the episode as the first user message.

Groups and split: ids have no near-duplicate families (no two instructions of a file have `fuzz.ratio` above
60), but personas recur: 14 delivery and 10 in-store user ids play several tasks, with the same profile and
addresses. A group is therefore a persona, `vitabench/<domain>/<user id>` (Chinese delivery shares the
English groups, so a task and its translation are always on the same side). A group is in `test` when
sha256(group) as an integer is < 25 modulo 100: delivery 26 test / 74 train tasks, in-store 29 / 71.
`scenario` is the first 8 hex digits of the same hash as an integer, so tasks of a group share it.

`reference` is one turn: the gold calls built from `required_orders` (see `gold.py`) run on a fresh
environment, with their real results.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from envace.envs.vitabench.env import VitaBenchEnv
from envace.envs.vitabench.gold import replay_gold
from envace.envs.vitabench.prompts import agent_system_prompt, opening_message, weekday
from envace.envs.vitabench.user import GREETING, STOP_SIGNALS, user_system_prompt
from envace.errors import UsageError
from envace.types import SimulatedUser, Split, Task

SOLO_SUFFIX = "_solo"
SOURCES = {"delivery": ("delivery", "en"), "instore": ("instore", "en"), "delivery_zh": ("delivery", "zh")}
CATEGORIES = tuple(name + suffix for name in SOURCES for suffix in ("", SOLO_SUFFIX))
TASK_FILES = {("delivery", "en"): "delivery_tasks_en.json.gz", ("instore", "en"): "instore_tasks_en.json.gz",
              ("delivery", "zh"): "delivery_tasks_zh.json.gz"}
SCHEMA_FILES = {("delivery", "en"): "tool_schemas_delivery.json", ("instore", "en"): "tool_schemas_instore.json",
                ("delivery", "zh"): "tool_schemas_delivery_zh.json"}
VENUES = {"delivery": "stores", "instore": "shops"}
TEST_PERCENT = 25

# Tasks whose gold end state no tool sequence reaches: defects of the upstream data (README.md beside this file).
_DEFECTS = {
    "delivery": {"80715001": "gold product S75401753354131701_P99357 is not in the task's database",
                 "I0716002": "gold product S20095944891750071_P71251 is not in the task's database"},
    "instore": {"10826019": "the gold product belongs to another shop than the gold order's",
                "10826031": "a gold booking at a shop that takes no bookings",
                "10826084": "one product id twice in a gold order, with two quantities"},
}
KNOWN_DEFECTS = {f"vitabench/{category}/{task_id}": reason for category in CATEGORIES
                 for task_id, reason in _DEFECTS[SOURCES[category.removesuffix(SOLO_SUFFIX)][0]].items()}


def data_dir() -> Path:
    return Path(__file__).parent / "data"


def source_of(category: str) -> tuple[str, str, bool]:
    """(domain, language, solo) of a category; unknown names are a UsageError."""
    if category not in CATEGORIES:
        raise UsageError(f"unknown VitaBench category '{category}' (choose from {', '.join(CATEGORIES)})")
    domain, lang = SOURCES[category.removesuffix(SOLO_SUFFIX)]
    return domain, lang, category.endswith(SOLO_SUFFIX)


def _problem(task: Any, domain: str) -> str | None:
    """What is wrong with one task object, or None when it has everything the adapter reads."""
    if not isinstance(task, dict):
        return f"is a {type(task).__name__}, not an object"
    for key, kind in (("id", str), ("instructions", str), ("environment", dict), ("evaluation_criteria", dict),
                      ("user_scenario", dict)):
        if not isinstance(task.get(key), kind):
            return f"has no {kind.__name__} '{key}'"
    env = task["environment"]
    for key, kind in (("time", str), ("user_id", str), (VENUES[domain], dict), ("orders", dict)):
        if not isinstance(env.get(key), kind):
            return f"has no {kind.__name__} 'environment.{key}'"
    states = task["evaluation_criteria"].get("expected_states")
    if not isinstance(states, list) or not states or not isinstance(states[0], dict) \
            or not isinstance(states[0].get("required_orders"), list):
        return "has no 'evaluation_criteria.expected_states[0].required_orders' list"
    return None


def read_tasks(path: Path, domain: str) -> list[dict[str, Any]]:
    """A task file as upstream ships it (gzip JSON list); a file of another structure is a UsageError."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            tasks = json.load(fh)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a gzip-compressed JSON task file ({exc})") from exc
    if not isinstance(tasks, list):
        raise UsageError(f"{path}: expected a JSON list of tasks, found a {type(tasks).__name__}")
    seen: set[str] = set()
    for i, task in enumerate(tasks):
        problem = _problem(task, domain)
        if problem:
            raise UsageError(f"{path}: task {i} {problem}")
        if task["id"] in seen:
            raise UsageError(f"{path}: task id '{task['id']}' appears twice")
        seen.add(task["id"])
    return tasks


def read_schemas(path: Path) -> list[dict[str, Any]]:
    """OpenAI function schemas; anything else is a UsageError."""
    try:
        tools = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a JSON tool-schema file ({exc})") from exc
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)
            for t in tools):
        raise UsageError(f"{path}: expected a JSON list of {{'type': 'function', 'function': {{'name': ...}}}}")
    return tools


@lru_cache(maxsize=4)
def _raw(domain: str, lang: str) -> tuple[dict[str, Any], ...]:
    return tuple(read_tasks(data_dir() / TASK_FILES[(domain, lang)], domain))


@lru_cache(maxsize=4)
def _schemas(domain: str, lang: str) -> tuple[dict[str, Any], ...]:
    return tuple(read_schemas(data_dir() / SCHEMA_FILES[(domain, lang)]))


def group_of(domain: str, raw: dict[str, Any]) -> str:
    """The persona a task belongs to: tasks of one user id stay on one side of the split."""
    return f"vitabench/{domain}/{raw['environment']['user_id']}"


def _digest(group: str) -> int:
    return int(hashlib.sha256(group.encode("utf-8")).hexdigest(), 16)


def split_of(group: str) -> str:
    return Split.TEST if _digest(group) % 100 < TEST_PERCENT else Split.TRAIN


def scenario_of(group: str) -> int:
    return int(hashlib.sha256(group.encode("utf-8")).hexdigest()[:8], 16)


def _build(category: str, raw: dict[str, Any]) -> Task:
    domain, lang, solo = source_of(category)
    raw = copy.deepcopy(raw)
    group = group_of(domain, raw)
    task = Task(
        uid=f"vitabench/{category}/{raw['id']}", env="vitabench", category=category, split=split_of(group),
        scenario=scenario_of(group), system_prompt=agent_system_prompt(raw["environment"], domain, lang, solo),
        tools=copy.deepcopy(list(_schemas(domain, lang))), user_turns=[opening_message(raw)], reference=[],
        payload={"domain": domain, "lang": lang, "solo": solo, "task_id": raw["id"], "task": raw,
                 "required_orders": raw["evaluation_criteria"]["expected_states"][0]["required_orders"]},
        group=group,
    )
    env = VitaBenchEnv()
    env.reset(task)
    task.reference = [replay_gold(env, task.payload["required_orders"], domain)]
    if not solo:
        task.simulated_user = SimulatedUser(user_system_prompt(task), GREETING, STOP_SIGNALS)
    return task


def rubrics(task: Task) -> list[str]:
    """The rubrics the official judge scores (TOOLS.md §6): every `state_rubrics` entry of every expected state,
    then `overall_rubrics`, each string once (only identical strings are duplicates, as upstream removes them)."""
    criteria = task.payload["task"]["evaluation_criteria"]
    found = [r for state in criteria.get("expected_states") or [] for r in state.get("state_rubrics") or []]
    found += criteria.get("overall_rubrics") or []
    return list(dict.fromkeys(r for r in found if isinstance(r, str) and r.strip()))


def judge_context(task: Task) -> str:
    """What the official judge reads besides the transcript: the task's time and the user's full instruction."""
    raw = task.payload["task"]
    time = raw["environment"]["time"]
    return f"Current time: {time} ({weekday(time)})\nUser instruction: {raw['instructions'].strip()}"


def load_tasks(category: str, split: str = Split.TEST, limit: int | None = None, offset: int = 0) -> list[Task]:
    """Tasks of one category and split, in file order; `limit`/`offset` slice after the split."""
    domain, lang, _ = source_of(category)
    if split not in tuple(Split):
        raise UsageError(f"unknown split '{split}' (choose from train, test, all)")
    chosen = [t for t in _raw(domain, lang) if split == Split.ALL or split_of(group_of(domain, t)) == split]
    chosen = chosen[offset: None if limit is None else offset + limit]
    return [_build(category, t) for t in chosen]


def load_task(category: str, task_id: str) -> Task:
    """One task by its VitaBench id (e.g. `10711001` in delivery); unknown ids are a UsageError."""
    domain, lang, _ = source_of(category)
    for raw in _raw(domain, lang):
        if raw["id"] == task_id:
            return _build(category, raw)
    raise UsageError(f"unknown VitaBench {category} task id '{task_id}'")
