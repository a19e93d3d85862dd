"""Where the project keeps things outside the repository."""

from __future__ import annotations

import os
from pathlib import Path


def envace_home() -> Path:
    """Cache root for converted models (`ENVACE_HOME`, default `~/.cache/envace`)."""
    return Path(os.environ.get("ENVACE_HOME", Path.home() / ".cache" / "envace"))


def runs_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The run store root: `--root`, else `ENVACE_RUNS`, else `runs/`."""
    return Path(explicit or os.environ.get("ENVACE_RUNS", "runs"))
