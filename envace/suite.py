"""The paper's headline table in one command: BFCL-v4, τ²-Bench and VitaBench, each cell an ordinary eval run.

    envace suite MODEL [--name NAME] [--limit N] [--user-model SPEC] [--private parallel|sequential --budget K]

Cells (runs named `<suite>-<env>-<category>[-<mode><K>]`, kept when a re-run finds them completed, as a sweep's):
- BFCL-v4: every category that runs offline, whole (split `all`, what the leaderboard scores): the 13 single-turn,
  the 4 multi-turn and the 3 memory ones (each question after its scenario's prerequisite conversations, played
  by the same model: `envace/envs/bfcl/memory.py`). Web search needs the internet; its rows say so. The BFCL-v4
  column is `leaderboard.offline_overall`: web search's weight removed and the rest renormalised. Labelled
  offline wherever shown.
- τ²-Bench: airline, retail, telecom (test split), the customer played by `--user-model` (else the policy itself):
  pass^1. A substitute: the published numbers' customer is a frontier model.
- VitaBench: delivery and in-store (test split), scored by the deterministic substitute for its LLM judge.
Every cell is greedy, in the real environment.

`summary`: each cell's success with a 95% bootstrap interval over its items; BFCL-v4 with a stratified bootstrap
(items resampled within each category, the formula applied to each draw); τ² and VitaBench the mean of their
cells; Overall the mean of the three, as the paper's. `--limit N` plays the first N items of each cell: a smoke,
not a score. With `--private MODE --budget K`, the τ² and BFCL multi-turn cells also run with private rehearsal,
and `rehearsal_summary` is the paper's second table. `paper()` holds the published rows (data/paper_tables.toml).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from envace.config import PrivateOptions, RolloutConfig
from envace.envs.bfcl import leaderboard
from envace.envs.bfcl.data import CATEGORIES as BFCL_MULTI_TURN
from envace.envs.bfcl.memory import CATEGORIES as BFCL_MEMORY
from envace.envs.bfcl.single import CATEGORIES as BFCL_SINGLE
from envace.stats import cluster_bootstrap

KIND = "suite"
TAU2 = ("airline", "retail", "telecom")
VITABENCH = ("delivery", "instore")
UNAVAILABLE = {"web_search_base": "needs the internet", "web_search_no_snippet": "needs the internet"}
COLUMNS = {"bfcl": "BFCL-v4 (offline overall)", "tau2": "τ²-Bench (substitute user)",
           "vitabench": "VitaBench (substitute judge)", "overall": "Overall"}
DRAWS = 2000


@dataclass(frozen=True)
class Cell:
    env: str
    category: str
    split: str
    private: str = "none"  # none | parallel | sequential
    budget: int = 0

    def run_name(self, suite: str) -> str:
        rehearsed = f"-{self.private}{self.budget}" if self.budget else ""
        return f"{suite}-{self.env}-{self.category}{rehearsed}"


def cells(private: str = "none", budget: int = 0) -> list[Cell]:
    """Every cell of the suite; with private rehearsal, τ² and BFCL multi-turn once more with it."""
    out = [Cell("bfcl", c, "all") for c in BFCL_SINGLE + BFCL_MULTI_TURN + BFCL_MEMORY]
    out += [Cell("tau2", c, "test") for c in TAU2] + [Cell("vitabench", c, "test") for c in VITABENCH]
    if private != "none" and budget > 0:
        out += [replace(c, private=private, budget=budget) for c in out
                if c.env == "tau2" or c.category in BFCL_MULTI_TURN]
    return out


def cell_config(cell: Cell, base: RolloutConfig, model: str, limit: int | None) -> RolloutConfig:
    """A cell's eval: `base`'s settings (budgets, docs, user model), the cell's env, category and split, greedy,
    real environment, private rehearsal when the cell has it."""
    return replace(base, env=cell.env, category=cell.category, split=cell.split, limit=limit, offset=0, model=model,
                   mode="real", group_size=1, temperature=0.0, unit="episode", report_to="none",
                   private=replace(base.private, mode=cell.private, budget=cell.budget)
                   if cell.budget else PrivateOptions())


def paper() -> dict[str, Any]:
    """The published rows and their source (`data/paper_tables.toml`)."""
    return tomllib.loads((Path(__file__).parent / "data" / "paper_tables.toml").read_text(encoding="utf-8"))


def _ci(values: np.ndarray) -> tuple[float, float]:
    return cluster_bootstrap(values) if len(values) else (float("nan"), float("nan"))


def cell_table(outcomes: dict[Cell, np.ndarray]) -> pd.DataFrame:
    """One row per cell run (successes as 0/1 per item): items, success and its 95% interval, in percent."""
    rows = []
    for cell, won in outcomes.items():
        lo, hi = _ci(won)
        rows.append({"env": cell.env, "category": cell.category, "private": cell.private, "budget": cell.budget,
                     "items": len(won), "success": 100 * won.mean() if len(won) else float("nan"),
                     "lo": 100 * lo, "hi": 100 * hi})
    rows += [{"env": "bfcl", "category": c, "private": "none", "budget": 0, "items": 0, "success": float("nan"),
              "lo": float("nan"), "hi": float("nan"), "note": why} for c, why in UNAVAILABLE.items()]
    return pd.DataFrame(rows)


def _bfcl(outcomes: dict[str, np.ndarray]) -> float:
    scores = {c: {"accuracy": float(v.mean()), "total_count": len(v)} for c, v in outcomes.items() if len(v)}
    return 100 * leaderboard.offline_overall(scores)


def _resampled(outcomes: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {c: v[rng.integers(0, len(v), len(v))] for c, v in outcomes.items() if len(v)}


def summary(outcomes: dict[Cell, np.ndarray], seed: int = 0) -> pd.DataFrame:
    """Our row: BFCL-v4 (offline), τ², VitaBench and Overall, each with a 95% stratified bootstrap interval."""
    plain = {c: v for c, v in outcomes.items() if not c.budget}
    bfcl = {c.category: v for c, v in plain.items() if c.env == "bfcl"}
    tau2 = [v for c, v in plain.items() if c.env == "tau2"]
    vita = [v for c, v in plain.items() if c.env == "vitabench"]

    def point(b, t, v) -> dict[str, float]:
        means = {"bfcl": _bfcl(b) if b else float("nan"),
                 "tau2": 100 * np.mean([x.mean() for x in t if len(x)]) if any(len(x) for x in t) else float("nan"),
                 "vitabench": 100 * np.mean([x.mean() for x in v if len(x)]) if any(len(x) for x in v)
                 else float("nan")}
        return {**means, "overall": float(np.mean(list(means.values())))}

    rng = np.random.default_rng(seed)
    draws = pd.DataFrame([point(_resampled(bfcl, rng), [x[rng.integers(0, len(x), len(x))] for x in tau2 if len(x)],
                                [x[rng.integers(0, len(x), len(x))] for x in vita if len(x)]) for _ in range(DRAWS)])
    seen = point(bfcl, tau2, vita)
    return pd.DataFrame([{"column": COLUMNS[k], "ours": seen[k], "lo": draws[k].quantile(0.025),
                          "hi": draws[k].quantile(0.975)} for k in COLUMNS])


def rehearsal_summary(outcomes: dict[Cell, np.ndarray]) -> pd.DataFrame:
    """The paper's second table from the suite's own cells: τ², BFCL multi-turn and their mean, without and with
    private rehearsal (the success of each, a mean over its cells)."""
    rows = []
    settings = sorted({(c.private, c.budget) for c in outcomes if c.budget})
    for private, budget in [("none", 0), *settings]:
        chosen = {c: v for c, v in outcomes.items() if (c.private, c.budget) == (private, budget)}
        tau2 = [v.mean() for c, v in chosen.items() if c.env == "tau2" and len(v)]
        turns = [v.mean() for c, v in chosen.items() if c.category in BFCL_MULTI_TURN and len(v)]
        t, b = (100 * float(np.mean(x)) if x else float("nan") for x in (tau2, turns))
        rows.append({"setting": "no rehearsal" if not budget else f"{private}, N = {budget}", "tau2": t,
                     "bfcl_multi_turn": b, "overall": (t + b) / 2})
    return pd.DataFrame(rows)


def outcomes(con, meta: dict[str, Any]) -> dict[Cell, np.ndarray]:
    """Each cell of a stored suite run with its items' successes (0/1), read from the cells' own episodes."""
    out = {}
    for row in (meta.get("summary") or {}).get("cells") or []:
        cell = Cell(row["env"], row["category"], row["split"], row["private"], row["budget"])
        won = con.execute("SELECT success::INT FROM episodes WHERE run_id = ? ORDER BY episode_id",
                          [row["cell_run"]]).fetchall()
        out[cell] = np.array([w for (w,) in won], dtype=float)
    return out


def headline(outcomes: dict[Cell, np.ndarray], run_id: str) -> pd.DataFrame:
    """The paper's table as it reads: our row (mean and 95% interval) above the published rows."""
    ours = summary(outcomes)
    rows = [{"model": f"this run: {run_id}", **{r["column"]: f"{r['ours']:.2f} ({r['lo']:.2f}–{r['hi']:.2f})"
                                                for r in ours.to_dict("records")}}]
    rows += [{"model": f"{row['model']} (published)", **{COLUMNS[k]: f"{row[k]:.2f}" for k in COLUMNS}}
             for row in paper()["headline"]]
    return pd.DataFrame(rows)
