"""Environments from outside the workbench: entry points of the `envace.envs` group and `module:factory` specs.

An installed package declares

    [project.entry-points."envace.envs"]
    shop = "my_package.shop:benchmark"

and `--env shop` finds it; `--env my_package.shop:benchmark` finds the same object without installing
anything, as long as the module is importable (the working directory, `PYTHONPATH`). Either target is a
`Benchmark` or a zero-argument callable returning one (a factory keeps heavy imports out of `envace envs`).
Whatever goes wrong (the module does not import, the name is missing, the factory raises or returns
something else) is one `UsageError` line naming the plugin; nothing here ever breaks another environment.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from importlib.metadata import EntryPoint, entry_points

from envace.envs.benchmark import Benchmark
from envace.errors import UsageError

GROUP = "envace.envs"


def is_spec(name: str) -> bool:
    """`package.module:factory` rather than a registered name."""
    return ":" in name


def entry_point_names() -> dict[str, EntryPoint]:
    """The installed `envace.envs` entry points by name (the first one wins where two packages use one name)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, ep)
    return found


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _benchmark(target: object, name: str, where: str) -> Benchmark:
    """`target` (a Benchmark, or a factory of one) as the Benchmark named `name`."""
    if not isinstance(target, Benchmark):
        if not callable(target):
            raise UsageError(f"env plugin {where}: {type(target).__name__} is neither a Benchmark nor a factory of one")
        try:
            target = target()
        except UsageError as exc:
            raise UsageError(f"env plugin {where}: {exc}") from None
        except Exception as exc:  # a plugin's own bug is reported, never raised through the workbench
            raise UsageError(f"env plugin {where}: the factory raised {one_line(exc)}") from None
        if not isinstance(target, Benchmark):
            raise UsageError(f"env plugin {where}: the factory returned {type(target).__name__}, "
                             "expected envace.envs.registry.Benchmark")
    return target if target.name == name else replace(target, name=name, load_tasks=_labelled(target.load_tasks, name))


def _labelled(load_tasks, name: str):
    """`load_tasks` whose tasks name the benchmark as the run does (`Task.env`, what `episodes.env` stores): the
    entry point or the `module:factory` spec, whatever the plugin calls itself, so a stored run finds its
    benchmark again from its own rows."""
    def load(*args, **kwargs):
        return [t if t.env == name else replace(t, env=name) for t in load_tasks(*args, **kwargs)]

    load.__wrapped__ = load_tasks
    return load


def from_entry_point(ep: EntryPoint) -> Benchmark:
    where = f"'{ep.name}' (entry point {ep.value})"
    try:
        target = ep.load()
    except Exception as exc:  # ImportError, AttributeError, or the module's own error at import
        raise UsageError(f"env plugin {where}: cannot load it ({one_line(exc)})") from None
    return _benchmark(target, ep.name, where)


def from_spec(spec: str) -> Benchmark:
    """The Benchmark a `package.module:factory` spec names; its name is the spec, so child processes find it again."""
    module_name, _, attribute = spec.partition(":")
    where = f"'{spec}'"
    if not module_name or not attribute:
        raise UsageError(f"env plugin {where}: expected package.module:factory")
    try:
        target = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"env plugin {where}: cannot import {module_name} ({one_line(exc)})") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise UsageError(f"env plugin {where}: module {module_name} has no '{attribute}'")
        target = getattr(target, part)
    return _benchmark(target, spec, where)
