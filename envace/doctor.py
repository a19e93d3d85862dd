"""`envace doctor [--root]`: every problem in a store, and what to do about it.

Each finding names a file or run and the remedy. Readers already skip what is listed here (a bad run.json
hides its run, a bad shard its rows), so the store stays usable; the doctor says what was skipped and why.
"""

from __future__ import annotations

from pathlib import Path

from envace.store import SCHEMAS, list_runs, old_layout_runs, shard_problem


def findings(root: str | Path) -> list[tuple[str, str, str]]:
    """(what, where, what to do) for every problem under `root`."""
    root = Path(root)
    out: list[tuple[str, str, str]] = []
    for name in old_layout_runs(root):
        out.append(("stored under the old table and column names", name, f"envace migrate --root {root}"))
    warnings: list[str] = []
    runs = {meta["run_id"]: meta for meta in list_runs(root, warnings)}
    for warning in warnings:
        out.append(("unusable run.json: the run is hidden", warning.split(":", 1)[0].removeprefix("skipped "),
                    "restore its run.json, or move the folder out of the store"))
    old = set(old_layout_runs(root))
    for table in SCHEMAS:
        for path in sorted(root.glob(f"*/{table}/*.parquet")):
            problem = path.parent.parent.name not in old and shard_problem(path)
            if problem:
                out.append((f"shard skipped: {problem}", str(path), "delete it (its step's other shards stay), "
                            "or rerun that step"))
    for leftover in sorted([*root.glob("*/*/.*.partial"), *root.glob("*/.*.tmp"), *root.glob("*/.*.partial")]):
        out.append(("a write interrupted before its rename", str(leftover), "delete it: nothing reads it"))
    for run_id, meta in runs.items():
        if meta.get("status") == "interrupted":
            fix = (f"envace train CONFIG --resume {run_id} --root {root}" if meta.get("kind") == "train"
                   else "rerun it, or keep what it stored")
            out.append(("interrupted (killed, or its process is gone)", run_id, fix))
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if not folder.name.startswith(".") and not (folder / "run.json").exists():
            out.append(("a folder without run.json", str(folder), "not a run: move it out of the store"))
    return out
