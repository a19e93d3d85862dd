"""Paired comparisons of stored runs, as every report prints them: items paired by id, the mean difference with
an interval resampled by task, the minimum detectable effect at 80% power (so a null says what it rules out),
McNemar's test on "scored" and the sign-flip permutation test by task, and each table's p-values Holm-adjusted over
the family its caption names. Runs that share no item are a UsageError:
an unpaired test is never printed in a paired one's place.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from envace.errors import UsageError
from envace.stats import holm, paired_outcomes
from envace.units import whole_uid

P_COLUMNS = ("McNemar p", "permutation p")


def episode_pairs(con, before: str, after: str, step: int | None = None) -> pd.DataFrame:
    """Episodes of two runs with one id (the same unit and sampling seed), side by side: task_uid, a (before's
    checklist), b (after's); `step` keeps one GRPO step of training runs. None shared: UsageError."""
    keep = "" if step is None else "AND x.phase = 'grpo' AND x.step = ? AND y.phase = 'grpo' AND y.step = ?"
    frame = con.execute(
        "SELECT x.task_uid, x.checklist::DOUBLE AS a, y.checklist::DOUBLE AS b FROM episodes x JOIN episodes y "
        f"ON x.episode_id = y.episode_id WHERE x.run_id = ? AND y.run_id = ? {keep} ORDER BY x.episode_id",
        [before, after, *([] if step is None else [step, step])]).df()
    if frame.empty:
        raise UsageError(f"{before} and {after} share no episode (another seed, pool or limit): not a paired "
                         "comparison")
    return frame


def pooled(frames: list[pd.DataFrame]) -> dict:
    """`paired_outcomes` over the pairs of every seed, clustered by task."""
    both = pd.concat(frames, ignore_index=True)
    return paired_outcomes(both["a"], both["b"], [whole_uid(u) for u in both["task_uid"]])


def row(label: dict, frames: list[pd.DataFrame]) -> dict:
    """One printed comparison: the label, each seed's Δ, then the pooled outcome."""
    out = pooled(frames)
    return {**label, "Δ per seed": " / ".join(f"{(f['b'] - f['a']).mean():+.3f}" for f in frames),
            "pairs": out["pairs"], "A": out["before"], "B": out["after"], "Δ = B − A": out["delta"],
            "95% CI": f"{out['lo']:+.3f} … {out['hi']:+.3f}", "MDE 80%": out["mde"],
            "up/down": f"{out['up']}/{out['down']}",
            "McNemar p": out["mcnemar_p"], "permutation p": out["permutation_p"], "_lo": out["lo"],
            "_hi": out["hi"]}


def holm_columns(frame: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, int]:
    """`frame` with a `Holm <column>` beside each of `columns`, every p-value of those columns adjusted together as
    one family (NaN: no test, outside the family); and the family's size."""
    frame = frame.copy()
    ps = frame[columns].to_numpy(float)
    adjusted = np.array(holm(ps.ravel()), dtype=float).reshape(ps.shape)
    for k, column in enumerate(columns):
        frame.insert(frame.columns.get_loc(column) + 1, f"Holm {column}", adjusted[:, k])
    return frame, int((~np.isnan(ps)).sum())


def with_holm(rows: list[dict]) -> tuple[pd.DataFrame, str]:
    """The rows as a table, a `Holm …` column beside each p-value column (all of them one family), and the
    caption naming the family."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame, ""
    frame, n = holm_columns(frame, list(P_COLUMNS))
    return frame, (f"Holm: adjusted over the family of this table's {n} tests ({len(frame)} comparison"
                   f"{'s' * (len(frame) != 1)} × McNemar on scored and the sign-flip permutation test by task); a "
                   "finding is Holm p ≤ 0.05.")


def markdown(frame: pd.DataFrame) -> str:
    """A Markdown table of the visible columns (those not starting with `_`), numbers to 3 decimals."""
    frame = frame[[c for c in frame.columns if not str(c).startswith("_")]]

    def cell(v) -> str:
        if isinstance(v, float):
            return "–" if np.isnan(v) else f"{v:.3f}"
        return "–" if v is None else str(v)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in frame.itertuples(index=False)])
