"""Benchmarks by name: how to load their tasks and make a fresh environment for an episode."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from envace.envs.base import Environment
from envace.errors import UsageError
from envace.types import Task


@dataclass(frozen=True)
class Benchmark:
    name: str
    categories: tuple[str, ...]
    default_category: str
    load_tasks: Callable[..., list[Task]]
    make_env: Callable[[], Environment]
    # (task, k) -> the task cut after turn k, its checker's data included: what turn-level episodes need
    truncate: Callable[[Task, int], Task] | None = None


def _bfcl() -> Benchmark:
    from envace.envs.bfcl import CATEGORIES, BFCLEnv, load_tasks, truncate

    return Benchmark("bfcl", CATEGORIES, "multi_turn_base", load_tasks, BFCLEnv, truncate)


def _tau2() -> Benchmark:
    from envace.envs.tau2 import CATEGORIES, Tau2Env, load_tasks

    return Benchmark("tau2", CATEGORIES, "airline", load_tasks, Tau2Env)


_BENCHMARKS: dict[str, Callable[[], Benchmark]] = {"bfcl": _bfcl, "tau2": _tau2}


def names() -> list[str]:
    return sorted(_BENCHMARKS)


def get(name: str) -> Benchmark:
    if name not in _BENCHMARKS:
        raise UsageError(f"unknown env '{name}' (choose from {', '.join(names())})")
    return _BENCHMARKS[name]()
