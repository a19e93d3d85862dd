"""`Workbench`: the one API over the run store that notebooks and the app share.

Every query returns a pandas DataFrame, read through DuckDB views over all runs' Parquet shards
(`envace.store`); views are re-created on `refresh()`, so a run that is still writing shows up as its
shards land. Readers never lock writers: shards are renamed into place whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from envace.errors import UsageError
from envace.store import check_run_id, connect, refresh
from workbench.diff import diff_rows

_FIDELITY = ["valid_json", "exact", "structure_f1", "value_acc", "error_agree", "string_sim", "embed_cos", "copied"]


def _run(run_id: str | None) -> str | None:
    return None if run_id is None else check_run_id(run_id)


def _filters(*conditions: tuple[str, Any]) -> tuple[str, list[Any]]:
    """A `WHERE` clause over the (clause, value) pairs whose value is given, and its parameters."""
    used = [(clause, value) for clause, value in conditions if value is not None]
    return ("WHERE " + " AND ".join(c for c, _ in used) if used else ""), [v for _, v in used]


class Workbench:
    """Queries over every run under `root`."""

    def __init__(self, root: str | Path = "runs") -> None:
        self.root = Path(root)
        self.con = connect(self.root)

    def refresh(self) -> None:
        refresh(self.con, self.root)

    def _df(self, query: str, params: list[Any] | None = None) -> pd.DataFrame:
        return self.con.execute(query, params or []).df()

    def sql(self, query: str) -> pd.DataFrame:
        """A read-only query (SELECT / WITH / DESCRIBE / SHOW only)."""
        first = query.lstrip().split(None, 1)[0].upper() if query.strip() else ""
        if first not in {"SELECT", "WITH", "DESCRIBE", "SHOW", "FROM"} or ";" in query.strip().rstrip(";"):
            raise UsageError("only one read-only query (SELECT, WITH, DESCRIBE, SHOW) is allowed")
        return self._df(query)

    # -- runs and episodes -------------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        return self._df("SELECT run_id, kind, model, status, created_at, updated_at, summary FROM runs "
                        "ORDER BY created_at DESC")

    def episodes(self, run_id: str | None = None, success: bool | None = None, min_checklist: float | None = None,
                 tool: str | None = None, limit: int = 500) -> pd.DataFrame:
        """Episodes, best first (official success, then checklist), with optional filters."""
        where, params = _filters(("e.run_id = ?", _run(run_id)), ("e.success = ?", success),
                                 ("e.checklist >= ?", min_checklist),
                                 ("EXISTS (SELECT 1 FROM calls c WHERE c.run_id = e.run_id AND c.episode_id = "
                                  "e.episode_id AND c.name = ?)", tool))
        return self._df(
            "SELECT e.run_id, e.episode_id, e.task_uid, e.mode, e.success, e.checklist, e.termination, e.n_turns, "
            "e.n_ref_turns, e.n_calls, e.n_parse_errors, e.n_rehearsal_errors, e.generated_tokens "
            f"FROM episodes e {where} "
            f"ORDER BY e.success DESC, e.checklist DESC, e.episode_id LIMIT {int(limit)}", params)

    def steps(self, run_id: str, episode_id: str) -> pd.DataFrame:
        """An episode's generations in order (caller messages and rehearsals), turn by turn."""
        return self._df("SELECT turn, step, role, call_index, user_message, completion_text, parse_error, "
                        "len(completion_ids) AS tokens FROM turns WHERE run_id = ? AND episode_id = ? "
                        "ORDER BY turn, step, role = 'rehearser', call_index", [check_run_id(run_id), episode_id])

    def calls(self, run_id: str, episode_id: str) -> pd.DataFrame:
        """Each call with the response the caller saw and, where recorded, the real and rehearsed pair."""
        return self._df(
            "SELECT c.turn, c.step, c.call_index, c.name, c.arguments, c.source, c.response, c.is_error, "
            "p.real_response, p.rehearsed_response, p.rehearsal_error, p.exact, p.structure_f1, p.value_acc, "
            "p.error_agreement, p.decision_changed "
            "FROM calls c LEFT JOIN pairs p ON p.run_id = c.run_id AND p.episode_id = c.episode_id "
            "AND p.turn = c.turn AND p.step = c.step AND p.call_index = c.call_index "
            "WHERE c.run_id = ? AND c.episode_id = ? ORDER BY c.turn, c.step, c.call_index",
            [check_run_id(run_id), episode_id])

    @staticmethod
    def diff(real: str | None, rehearsed: str | None) -> pd.DataFrame:
        """The structural diff of two tool responses (`workbench.diff`)."""
        return pd.DataFrame(diff_rows(real, rehearsed), columns=["path", "kind", "real", "rehearsed", "drift"])

    # -- fidelity ----------------------------------------------------------------------------------

    def pairs(self, run_id: str | None = None, tool: str | None = None) -> pd.DataFrame:
        where, params = _filters(("run_id = ?", _run(run_id)), ("name = ?", tool))
        return self._df(f"SELECT * FROM pairs {where} ORDER BY run_id, episode_id, turn, step", params)

    def fidelity_by_tool(self, run_id: str | None = None) -> pd.DataFrame:
        """Mean of every fidelity metric per tool, worst exact-match first."""
        means = ", ".join(f"avg({m}::DOUBLE) AS {m}" for m in _FIDELITY)
        where, params = _filters(("run_id = ?", _run(run_id)))
        return self._df(f"SELECT name AS tool, count(*) AS pairs, avg((rehearsal_error IS NOT NULL)::INT) "
                        f"AS malformed, {means} FROM pairs {where} GROUP BY name ORDER BY exact, pairs DESC", params)

    # -- training and private rehearsal ------------------------------------------------------------

    def training(self, run_id: str, phase: str = "grpo") -> pd.DataFrame:
        """Per-step, per-role metrics of a training run, long format (step, role, name, value)."""
        return self._df("SELECT step, role, name, value FROM metrics WHERE run_id = ? AND phase = ? "
                        "ORDER BY step, role, name", [check_run_id(run_id), phase])

    def sweep(self, run_id: str | None = None) -> pd.DataFrame:
        where, params = _filters(("run_id = ?", _run(run_id)))
        return self._df(f"SELECT * FROM sweep {where} ORDER BY label, mode, budget", params)

    def rehearsed_turn(self, run_id: str, episode_id: str, turn: int) -> dict[str, pd.DataFrame]:
        """What it imagined, what it wrote down: the imagined attempts and the memory of one turn."""
        key = [check_run_id(run_id), episode_id, turn]
        return {"imagined": self._df("SELECT attempt, round, memory_seen, transcript, termination, n_steps, "
                                     "n_calls FROM imagined WHERE run_id = ? AND episode_id = ? AND turn = ? "
                                     "ORDER BY attempt", key),
                "memory": self._df("SELECT * FROM memories WHERE run_id = ? AND episode_id = ? AND turn = ?", key)}

    # -- export ------------------------------------------------------------------------------------

    @staticmethod
    def export(frame: pd.DataFrame, path: str | Path) -> Path:
        """Write a selection to .parquet, .csv or .jsonl (by suffix)."""
        path = Path(path)
        writers = {".parquet": lambda: frame.to_parquet(path, index=False),
                   ".csv": lambda: frame.to_csv(path, index=False),
                   ".jsonl": lambda: frame.to_json(path, orient="records", lines=True)}
        if path.suffix not in writers:
            raise UsageError(f"export to .parquet, .csv or .jsonl, not '{path.suffix}'")
        writers[path.suffix]()
        return path
