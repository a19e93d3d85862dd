"""The benchmark entry: what the workbench needs to know about an environment besides the environment itself.

A `Benchmark` is the unit of the public plugin API (`docs/environments.md`): built-ins are listed in
`registry.py`, plugins return one from an entry point of the `envace.envs` group or from a
`--env package.module:factory` spec (`plugins.py`). Its fields are the contract; new ones only ever come
with a default, so an entry written against an older workbench keeps working.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envace.envs.base import Environment, json_error
from envace.types import Task

__all__ = ["Benchmark", "json_error"]


@dataclass(frozen=True)
class Benchmark:
    """`name` is what `--env` takes (a plugin is named by its entry point or its spec, whatever it calls itself).

    `load_tasks(category, split="test", limit=None, offset=0)` returns `Task`s of one category and split
    (`all` is both); `make_env()` a fresh `Environment` for one episode.
    """

    name: str
    categories: tuple[str, ...]
    default_category: str
    load_tasks: Callable[..., list[Task]]
    make_env: Callable[[], Environment]
    # (task, k) -> the task cut after turn k, its checker's data included: what turn-level episodes need
    truncate: Callable[[Task, int], Task] | None = None
    # Whether a tool result's text reports a failure, for results written by the rehearser (and fidelity's error
    # agreement); None: the environment's own rule (`Environment.result_is_error`), which its real results go
    # through too. Set it only to override that rule.
    result_is_error: Callable[[str], bool] | None = None
    # Task uid -> why its gold cannot pass through the tools: a defect of the benchmark's own data (a gold call its
    # schema refuses, a gold product missing from the database). `check-env` reports these by name and fails on
    # every other failure, and on a listed task that passes (the list must stay true).
    known_defects: Mapping[str, str] = field(default_factory=dict)
    # Categories scored on the calls of one caller message, where no tool runs (BFCL's single-turn AST and
    # relevance categories): rehearsal, shadow pairs and private rehearsal do not apply to them.
    call_only: tuple[str, ...] = ()
    # Category -> a fresh hook that runs before the opening turn of that category's tasks, or None (BFCL's memory
    # categories: the prerequisite conversations that write the memory a question reads, `bfcl/memory.py`). It
    # has the engine's before-turn shape (`wants(episode)`, `memories(engine, episodes)`, as private rehearsal);
    # such categories run in the real environment and without private rehearsal (`RolloutConfig.validate`).
    before_turn: Callable[[str], Any] | None = None
    # Task -> the natural-language checks an LLM judge scores on an episode's transcript (`envace judge`,
    # `envace/judge.py`), each string once; None: the benchmark has none. Its verdicts are stored apart from the
    # official score (table `judgements`), as the `rubric_judge` sub-score.
    rubrics: Callable[[Task], list[str]] | None = None
    # Task -> what the judge reads besides the transcript and the rubrics (the task's time, the user's full
    # instruction); None: nothing.
    judge_context: Callable[[Task], str] | None = None

    def is_error(self, content: str) -> bool:
        """Whether `content`, a tool result as the caller sees it, reports a failure in this benchmark's convention:
        `result_is_error`, else the environment's own rule (the one its real results go through)."""
        return bool((self.result_is_error or environment_rule(self.make_env))(content))


def environment_rule(make_env: Callable[[], Environment]) -> Callable[[str], bool]:
    """The error rule of the environments `make_env` builds: read off the class, or off one instance (a factory)."""
    if isinstance(make_env, type) and issubclass(make_env, Environment):
        return make_env.result_is_error
    if isinstance(make_env, Hashable):
        return _instance_rule(make_env)
    return make_env().result_is_error


@functools.lru_cache(maxsize=64)
def _instance_rule(make_env: Callable[[], Environment]) -> Callable[[str], bool]:
    return make_env().result_is_error
