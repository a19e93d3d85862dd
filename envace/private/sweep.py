"""Budget sweeps of private rehearsal: one eval run per cell, one comparable table.

A cell is (model label, mode, N). N = 0 is the plain policy, run once per model (it is the same for
both modes). Each cell is a run named `<sweep>-<label>-<mode>-<N>` in the same store, so a sweep that
was interrupted resumes by skipping the cells whose run completed (an unfinished cell is redone).
The table lives in the sweep's own run folder as the `sweep` table and as `sweep.csv`. Each N > 0 cell is also
compared with its model's N = 0 cell, turn by turn (`against_none`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace import compare
from envace.errors import UsageError


@dataclass(frozen=True)
class Cell:
    label: str
    model: str
    mode: str
    budget: int

    def run_name(self, sweep: str) -> str:
        return f"{sweep}-{self.label}-{self.mode}-{self.budget}"


def parse_grid(models: list[str], modes: str, budgets: str) -> tuple[dict[str, str], list[str], list[int]]:
    """`label=spec` models, comma-separated modes and budgets, checked."""
    named: dict[str, str] = {}
    for item in models:
        label, sep, spec = item.partition("=")
        if not sep or not label.isidentifier() or not spec:
            raise UsageError(f"--model expects label=spec (e.g. base=default), got '{item}'")
        named[label] = spec
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    if not mode_list or any(m not in ("parallel", "sequential") for m in mode_list):
        raise UsageError(f"--modes takes parallel and/or sequential, got '{modes}'")
    return named or {"base": "default"}, mode_list, counts(budgets, "--budgets")


def counts(text: str, flag: str) -> list[int]:
    """Comma-separated integers >= 0 (budgets, seeds), sorted and distinct; anything else one UsageError."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated integers, got '{text}'") from None
    if not values or values[0] < 0:
        raise UsageError(f"{flag}: integers >= 0, got '{text}'")
    return values


def cells(models: dict[str, str], modes: list[str], budgets: list[int]) -> list[Cell]:
    out = []
    for label, model in models.items():
        if 0 in budgets:
            out.append(Cell(label, model, "none", 0))
        out += [Cell(label, model, mode, n) for mode in modes for n in budgets if n > 0]
    return out


def cell_row(sweep: str, cell: Cell, run_id: str, summary: dict[str, Any]) -> dict[str, Any]:
    episodes = max(summary.get("episodes", 0), 1)
    return {"run_id": sweep, "label": cell.label, "model": cell.model, "mode": cell.mode, "budget": cell.budget,
            "cell_run": run_id, "episodes": summary.get("episodes", 0), "success_rate": summary.get("success_rate"),
            "checklist": summary.get("checklist"), "well_formed_rate": summary.get("well_formed_rate"),
            "private_tokens_per_episode": summary.get("private_tokens", 0) / episodes,
            "wall_s_per_episode": summary.get("wall_s", 0.0) / episodes}


def write_table(run, rows: list[dict[str, Any]]) -> None:
    run.write("sweep", "cells", rows)
    with (run.path / "sweep.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def against_none(con, sweeps: list[str], labels: list[str], modes: list[str], budgets: list[int],
                 completed: Callable[[str], bool] = lambda run: True) -> list[dict[str, Any]]:
    """Per model label, mode and N > 0: its cell against the same model's N = 0 cell, paired by turn and pooled
    over `sweeps` (one per seed; `compare.row`). Only pairs of `completed` cells count."""
    rows = []
    for label in labels:
        for mode in modes:
            for n in (b for b in budgets if b > 0):
                runs = [(Cell(label, "", "none", 0).run_name(s), Cell(label, "", mode, n).run_name(s)) for s in sweeps]
                frames = [compare.episode_pairs(con, a, b) for a, b in runs if completed(a) and completed(b)]
                if frames:
                    rows.append(compare.row({"model": label, "mode": mode, "N": n, "vs": "N = 0"}, frames))
    return rows
