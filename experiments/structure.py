"""The shape of `envace/` in four numbers: rooms, floors, cycles, the longest function.

A room is `envace` itself, a module directly in `envace/` (`envace.config`) or a package below it, subpackages
apart (`envace.training.cluster`); an arrow is any import, lazy or not, from a module of one room to another.
Floors are the levels of that graph once rooms that reach each other are merged: a room with no arrow out is on
floor 1, any other one floor above the highest room it imports. `tests/test_architecture.py` keeps the cycles at
zero; this prints the numbers a review compares before and after a change:

    python experiments/structure.py            # the working tree
    python experiments/structure.py 93a4738    # a commit, read from git without checking it out
"""

import ast
import subprocess
import sys
from pathlib import Path


def sources(rev: str | None) -> dict[str, str]:
    """Every `envace/**.py` path and its text, at `rev` or in the working tree."""
    if rev is None:
        return {str(p): p.read_text() for p in Path("envace").rglob("*.py")}
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "envace"], capture_output=True, text=True)
    if listed.returncode or not listed.stdout:
        print(f"structure: no envace/ at {rev!r} in this repository", file=sys.stderr)
        sys.exit(2)
    listed = listed.stdout.split()
    return {p: subprocess.run(["git", "show", f"{rev}:{p}"], capture_output=True, text=True, check=True).stdout
            for p in listed if p.endswith(".py")}


def measure(files: dict[str, str]) -> dict:
    modules = {p.removesuffix(".py").removesuffix("/__init__").replace("/", "."): p for p in files}
    rooms = {m for m, p in modules.items() if p.endswith("__init__.py")} | {m for m in modules if m.count(".") == 1}

    def room(name: str) -> str:
        while name not in rooms and "." in name:
            name = name.rpartition(".")[0]
        return name

    arrows: dict[str, set[str]] = {r: set() for r in rooms}
    longest = (0, "")
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(files[path])):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                longest = max(longest, (node.end_lineno - node.lineno + 1, f"{path}:{node.name}"))
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: package.count(".") + 2 - node.level]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            arrows[room(module)] |= {room(t) for t in targets if t.split(".")[0] == "envace"} - {room(module)}

    reach = {r: set(a) for r, a in arrows.items()}  # the transitive closure: a few dozen rooms
    for k in rooms:
        for r in rooms:
            if k in reach[r]:
                reach[r] |= reach[k]
    merged = {r: frozenset({r} | {s for s in reach[r] if r in reach[s]}) for r in rooms}
    floor: dict[frozenset, int] = {}

    def level(group: frozenset) -> int:
        if group not in floor:
            out = {merged[t] for r in group for t in arrows[r]} - {group}
            floor[group] = 1 + max((level(g) for g in out), default=0)
        return floor[group]

    return {"rooms": len(rooms), "floors": max(level(g) for g in set(merged.values())),
            "cycles": sorted(sorted(g) for g in set(merged.values()) if len(g) > 1),
            "longest function": f"{longest[1]} ({longest[0]} lines)",
            "lines": sum(text.count("\n") for text in files.values())}


if __name__ == "__main__":
    for key, value in measure(sources(sys.argv[1] if len(sys.argv) > 1 else None)).items():
        print(f"{key}: {value}")
