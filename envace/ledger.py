"""The fidelity ledger's one aggregate: per-tool means of every pair metric, and their overall row.

`tool_sums` is the one SQL over `pairs` (sums and non-null counts per tool, so that sums of several runs
or shards combine exactly); `means` turns sums into per-tool means plus an `all` row. `envace fidelity`,
the workbench's tables and charts, and training-time evaluation all read fidelity through these two.
"""

from __future__ import annotations

import pandas as pd

# Pair metrics averaged per tool (each 1.0 for a perfect rehearsal; `copied` is a rate, lower is better).
METRICS = ("valid_json", "exact", "structure_f1", "value_acc", "error_agree", "string_sim", "embed_cos", "copied")
COLUMNS = ["tool", "pairs", "malformed", "forks", "decision_change", *METRICS]


def tool_sums(con, source: str, run_id: str) -> pd.DataFrame:
    """Per tool of one run: pairs, malformed rehearsals, forks and changed decisions, each metric's sum
    and non-null count. `source` is a table expression over `pairs` rows (a view or `read_parquet`)."""
    sums = ", ".join(f"sum({m}::DOUBLE) AS sum_{m}, count({m}) AS n_{m}" for m in METRICS)
    return con.execute(
        f"SELECT name AS tool, count(*) AS pairs, count(rehearsal_error) AS malformed, "
        f"count(decision_changed) AS forks, coalesce(sum(decision_changed::INT), 0) AS changed, {sums} "
        f"FROM {source} WHERE run_id = ? GROUP BY name", [run_id]).df()


def means(sums: pd.DataFrame | list[pd.DataFrame]) -> pd.DataFrame:
    """Per-tool means (most pairs first, then by name) and a last `all` row, from one or more `tool_sums`."""
    frames = [sums] if isinstance(sums, pd.DataFrame) else [s for s in sums if not s.empty]
    if not frames or all(f.empty for f in frames):
        return pd.DataFrame(columns=COLUMNS)
    per_tool = pd.concat(frames).groupby("tool").sum(numeric_only=True)
    per_tool = per_tool.sort_values("pairs", ascending=False, kind="stable")
    total = per_tool.sum().to_frame("all").T
    both = pd.concat([per_tool, total])

    def ratio(num: pd.Series, den: pd.Series) -> pd.Series:
        return (num / den.where(den > 0)).astype(float)

    out = pd.DataFrame({"pairs": both["pairs"].astype(int), "malformed": ratio(both["malformed"], both["pairs"]),
                        "forks": both["forks"].astype(int), "decision_change": ratio(both["changed"], both["forks"]),
                        **{m: ratio(both[f"sum_{m}"], both[f"n_{m}"]) for m in METRICS}})
    return out.rename_axis("tool").reset_index()
