"""Processes as /proc shows them, for tests that assert what is left running after a kill."""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited and not yet reaped, does not)."""
    try:
        return _stat(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def parent(pid: int) -> int:
    return int(_stat(pid)[1])


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children, theirs, …)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = parent(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue  # gone while read
    found, frontier = [], [pid]
    while frontier:
        frontier = [p for p, pp in parents.items() if pp in frontier]
        found += frontier
    return found
