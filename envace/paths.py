"""Where the project keeps things outside the repository."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from envace.errors import UsageError


def envace_home() -> Path:
    """Cache root for converted models (`ENVACE_HOME`, default `~/.cache/envace`)."""
    return Path(os.environ.get("ENVACE_HOME", Path.home() / ".cache" / "envace"))


def runs_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The run store root: `--root`, else `ENVACE_RUNS`, else `runs/`."""
    return Path(explicit or os.environ.get("ENVACE_RUNS", "runs"))


def package_dir(module: str, distribution: str, purpose: str) -> Path:
    """The folder of an installed package, found without importing it (some import heavy extras)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"{purpose} needs the package {distribution} (run `make install`)")
    return Path(spec.submodule_search_locations[0])
