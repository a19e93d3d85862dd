"""Benchmarks by name: the built-ins below, then installed plugins, then `package.module:factory` specs.

`get(name)` is the one lookup every job, child process and check goes through, so a plugin is seen the same
way everywhere (`plugins.py` says how plugins are found). `installed()` is what `envace envs` lists: a
plugin that fails to load is listed with its error, and every other environment keeps working.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from envace.envs import plugins
from envace.envs.benchmark import Benchmark
from envace.errors import UsageError

__all__ = ["Benchmark", "Installed", "get", "installed", "names"]


# The built-ins, by the package whose `benchmark()` builds each: loaded by path when asked for, as a plugin is, so
# this module imports none of them (they import `benchmark.py` and `base.py` beside it: the arrows point down).
_BUILT_INS = {"bfcl": "envace.envs.bfcl", "tau2": "envace.envs.tau2", "vitabench": "envace.envs.vitabench"}


def _built_in(name: str) -> Benchmark:
    return importlib.import_module(_BUILT_INS[name]).benchmark()


def names() -> list[str]:
    """Every name `--env` takes besides a `module:factory` spec: the built-ins and the installed entry points."""
    return sorted(set(_BUILT_INS) | set(plugins.entry_point_names()))


def get(name: str) -> Benchmark:
    if name in _BUILT_INS:
        return _built_in(name)
    entry_point = plugins.entry_point_names().get(name)
    if entry_point is not None:
        return plugins.from_entry_point(entry_point)
    if plugins.is_spec(name):
        return plugins.from_spec(name)
    raise UsageError(f"unknown env {name!r} (choose from {', '.join(names())}, or give package.module:factory)")


@dataclass(frozen=True)
class Installed:
    """One row of `envace envs`: where an environment comes from, and its categories or why it does not load."""

    name: str
    source: str
    categories: tuple[str, ...] = ()
    error: str = ""


def installed(names_: list[str] | None = None) -> list[Installed]:
    """Every built-in and entry-point environment (or the `names_` given, specs too), each loaded as a run would
    load it (`probe`): its categories, or the first thing that fails."""
    rows = []
    for name in names() if names_ is None else names_:
        if name in _BUILT_INS:
            source = "built-in"
        elif name in plugins.entry_point_names():
            source = f"entry point {plugins.entry_point_names()[name].value}"
        else:
            source = "spec" if plugins.is_spec(name) else "unknown"
        try:
            rows.append(Installed(name, source, probe(get(name))))
        except Exception as exc:  # a broken built-in (missing data) is listed like a broken plugin
            rows.append(Installed(name, source, error=str(exc).strip().splitlines()[0] if str(exc).strip()
                                  else type(exc).__name__))
    return rows


def probe(benchmark: Benchmark) -> tuple[str, ...]:
    """Its categories, once each has loaded one task and reset a fresh environment on it (a factory whose data
    path is unset fails here, not in the first command); what fails is one UsageError line naming it."""
    if not benchmark.categories:
        raise UsageError(f"env '{benchmark.name}' has no categories")
    for category in benchmark.categories:
        where = f"env '{benchmark.name}' category {category}"
        try:
            tasks = benchmark.load_tasks(category, "all", 1)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
        except Exception as exc:  # a plugin's own bug: reported, never raised through the workbench
            raise UsageError(f"{where}: load_tasks raised {plugins.one_line(exc)}") from None
        if not tasks:
            raise UsageError(f"{where}: load_tasks returned no task")
        try:
            benchmark.make_env().reset(tasks[0])
        except Exception as exc:  # noqa: BLE001 - as above
            raise UsageError(f"{where}: an environment could not be reset on {tasks[0].uid} "
                             f"({plugins.one_line(exc)})") from None
    return benchmark.categories
