"""`Workbench`: the one API over the run store that notebooks and the app share.

Every query returns a pandas DataFrame, read through DuckDB views over all runs' Parquet shards
(`envace.store`); views are re-created on `refresh()`, so a run that is still writing shows up as its
shards land. Readers never lock writers: shards are renamed into place whole. A query about one run
reads only that run's shards, so loading an episode does not scan the whole store. One lock
serialises queries: the app calls in from several threads and a DuckDB connection is not thread-safe.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from envace import ledger, world_model
from envace.config import nest
from envace.errors import UsageError
from envace.store import StoreIndex, check_run_id, connect, episode_counts, flat_config, get_run, refresh
from workbench.diff import diff_rows

_FIDELITY = list(ledger.METRICS)


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
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[tuple[Path, ...], pd.DataFrame]] = {}
        self._tokenizers: dict[str, Any] = {}
        self.con = connect(self.root)
        self.index = StoreIndex({}, [])
        self.refresh()

    def refresh(self) -> list[str]:
        """Pick up shards and runs written since; returns the warnings (skipped corrupt shards)."""
        with self._lock:
            self.index = refresh(self.con, self.root, self.index if self.index.shards else None)
        return self.index.warnings

    @property
    def warnings(self) -> list[str]:
        return self.index.warnings

    def runs_with(self, table: str) -> set[str]:
        """The runs that have stored at least one shard of `table` (no query: read off the index)."""
        return {path.parent.parent.name for path in self.index.shards.get(table, [])}

    def _source(self, table: str, run_id: str | None) -> str:
        """The table restricted to one run's shards; the whole view for no run, or a run with none (a
        `run_id = ?` filter then finds nothing)."""
        if run_id is None:
            return table
        shards = self.index.run_shards(table, check_run_id(run_id))
        return self.index.source(shards) if shards else table

    def _df(self, query: str, params: list[Any] | None = None) -> pd.DataFrame:
        with self._lock:
            return self.con.execute(query, params or []).df()

    def sql(self, query: str) -> pd.DataFrame:
        """A read-only query (SELECT / WITH / DESCRIBE / SHOW only)."""
        first = query.lstrip().split(None, 1)[0].upper() if query.strip() else ""
        if first not in {"SELECT", "WITH", "DESCRIBE", "SHOW", "FROM"} or ";" in query.strip().rstrip(";"):
            raise UsageError("only one read-only query (SELECT, WITH, DESCRIBE, SHOW) is allowed")
        import duckdb

        try:
            return self._df(query)
        except duckdb.PermissionException as exc:  # the connection reads the store's folder and nothing else
            raise UsageError(f"only the store can be read: {str(exc).splitlines()[0]}") from None

    # -- runs and episodes -------------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        """Every run with its live status and headline metrics (from its `run.json` summary)."""
        return self._df(
            "SELECT run_id, kind, model, status, to_timestamp(created_at) AS created, "
            "to_timestamp(updated_at) AS updated, "
            "TRY_CAST(json_extract(summary, '$.episodes') AS INT) AS episodes, "
            "TRY_CAST(json_extract(summary, '$.success_rate') AS DOUBLE) AS success_rate, "
            "TRY_CAST(json_extract(summary, '$.checklist') AS DOUBLE) AS checklist, "
            "TRY_CAST(json_extract(summary, '$.well_formed_rate') AS DOUBLE) AS well_formed_rate, "
            "summary FROM runs ORDER BY created_at DESC")

    def episode_counts(self) -> dict[str, int]:
        """Every run's stored episodes, counted (all phases: a training run's GRPO and evaluation episodes)."""
        with self._lock:
            return episode_counts(self.con)

    def config_diff(self, run_ids: list[str]) -> pd.DataFrame:
        """The config fields (nested tables flattened to dotted keys) on which the runs differ: one row per field,
        one column per run ("" where a run has no such field)."""
        configs = {r: {k: json.dumps(v) for k, v in flat_config(_stored_config(get_run(self.root, check_run_id(r))))
                       .items()} for r in run_ids}
        fields = sorted({k for c in configs.values() for k in c})
        rows = [{"field": f, **{r: c.get(f, "") for r, c in configs.items()}} for f in fields
                if len({c.get(f, "") for c in configs.values()}) > 1]
        return pd.DataFrame(rows, columns=["field", *run_ids])

    def headlines(self) -> pd.DataFrame:
        """Per training run, what its last steps say: the caller's mean reward and the share of groups with a
        learning signal at the last GRPO step, and the checklist and rehearsal exact-match of its last evaluation."""
        return self._df(
            "WITH g AS (SELECT run_id, max(step) AS step FROM metrics WHERE phase = 'grpo' GROUP BY run_id), "
            "e AS (SELECT run_id, max(step) AS step FROM metrics WHERE phase = 'eval' GROUP BY run_id), "
            "last_g AS (SELECT m.run_id, max(CASE WHEN role = 'caller' AND name = 'reward_mean' THEN value END) AS "
            "reward, max(CASE WHEN role = 'caller' AND name = 'signal_groups' THEN value END) AS signal, "
            "max(m.step) + 1 AS steps FROM metrics m JOIN g USING (run_id, step) WHERE phase = 'grpo' GROUP BY ALL), "
            "last_e AS (SELECT m.run_id, max(CASE WHEN name = 'checklist' THEN value END) AS eval_checklist, "
            "max(CASE WHEN name = 'exact' THEN value END) AS eval_exact FROM metrics m JOIN e USING (run_id, step) "
            "WHERE phase = 'eval' GROUP BY ALL) "
            "SELECT * FROM last_g FULL JOIN last_e USING (run_id)")

    def episodes(self, run_id: str | None = None, success: bool | None = None, min_checklist: float | None = None,
                 max_checklist: float | None = None, tool: str | None = None, termination: str | None = None,
                 fidelity: str | None = None, error_kind: str | None = None, worst_first: bool = False,
                 limit: int = 500, phase: str | None = None, step: int | None = None) -> pd.DataFrame:
        """Episodes with their mean rehearsal exact-match, best first (success, checklist, fidelity) or worst first.

        `fidelity` keeps one bucket of that mean: `low` (< 1/3), `mid`, `high` (≥ 2/3) or `none` (no pairs).
        `error_kind` keeps episodes with a caller parse error or a tool error of that kind (`error_kinds`).
        `phase` (grpo, eval, …) and `step` keep one part of a training run: a GRPO step's groups, or the
        evaluation after `step` updates.
        """
        buckets = {"low": "f.fidelity < 1/3", "mid": "f.fidelity >= 1/3 AND f.fidelity < 2/3",
                   "high": "f.fidelity >= 2/3", "none": "f.fidelity IS NULL"}
        if fidelity is not None and fidelity not in buckets:
            raise UsageError(f"fidelity bucket must be one of {', '.join(buckets)}, not '{fidelity}'")
        episodes, pairs, calls, generations = (self._source(t, run_id)
                                               for t in ("episodes", "pairs", "calls", "generations"))
        where, params = _filters(("e.success = ?", success), ("e.checklist >= ?", min_checklist),
                                 ("e.checklist <= ?", max_checklist), ("e.termination = ?", termination),
                                 ("e.run_id = ?", _run(run_id)), ("e.phase = ?", phase),
                                 ("e.step = ?", None if step is None else int(step)),
                                 ("EXISTS (SELECT 1 FROM cl c WHERE c.run_id = e.run_id AND c.episode_id = "
                                  "e.episode_id AND c.name = ?)", tool),
                                 ("EXISTS (SELECT 1 FROM errs x WHERE x.run_id = e.run_id AND x.episode_id = "
                                  "e.episode_id AND x.kind = ?)", error_kind))
        if fidelity is not None:
            where = (where + " AND " if where else "WHERE ") + buckets[fidelity]
        order = "ASC" if worst_first else "DESC"
        return self._df(
            f"WITH cl AS (SELECT * FROM {calls}), f AS (SELECT run_id, episode_id, avg(exact) AS fidelity "
            f"FROM {pairs} GROUP BY ALL), errs AS ({self._errors_sql(calls, generations)}) "
            "SELECT e.run_id, e.episode_id, e.step, e.phase, e.task_uid, e.mode, e.success, e.checklist, f.fidelity, "
            "e.termination, e.n_turns, e.n_ref_turns, e.n_calls, e.n_parse_errors, e.n_rehearsal_errors, "
            f"e.generated_tokens FROM {episodes} e LEFT JOIN f USING (run_id, episode_id) {where} "
            f"ORDER BY e.success {order}, e.checklist {order}, f.fidelity {order} NULLS LAST, e.episode_id "
            f"LIMIT {int(limit)}", params)

    def episodes_by_step(self, run_id: str, phase: str = "grpo") -> pd.DataFrame:
        """A training run's episodes counted per step of one phase (GRPO's steps, or the evaluations after each
        step's updates), with their success rate and mean checklist: the rows a link opens in the Inspector."""
        return self._df(f"SELECT step, count(*) AS episodes, avg(success::DOUBLE) AS success, "
                        f"avg(checklist) AS checklist FROM {self._source('episodes', run_id)} "
                        "WHERE run_id = ? AND phase = ? GROUP BY step ORDER BY step", [check_run_id(run_id), phase])

    def episode_spans(self, run_id: str, phase: str = "grpo") -> pd.DataFrame:
        """When each episode of one phase ran, one row per episode in start order: `start_s` and `end_s` in seconds
        since the phase's first episode began, `wait_s`, the part of it spent with its next request ready while
        other episodes' work ran, and `actor`, the rollout actor that played it (NULL in runs stored before
        episodes kept it). Empty for runs stored before episodes kept their own start and end."""
        return self._df("SELECT step, episode_id, started_at - min(started_at) OVER () AS start_s, "
                        "ended_at - min(started_at) OVER () AS end_s, coalesce(wait_s, 0.0) AS wait_s, actor "
                        f"FROM {self._source('episodes', run_id)} WHERE run_id = ? AND phase = ? "
                        "AND started_at IS NOT NULL ORDER BY started_at, episode_id", [check_run_id(run_id), phase])

    def group(self, run_id: str, episode_id: str) -> pd.DataFrame:
        """The GRPO group of a training episode side by side: the G episodes of its unit at its step, each with its
        reward (the checklist both roles share), success, the advantage the update gave its caller's and its
        rehearser's rows (their mean), and how it ended. Empty for an episode outside GRPO."""
        episodes, generations = self._source("episodes", run_id), self._source("generations", run_id)
        run = check_run_id(run_id)
        return self._df(
            f"WITH me AS (SELECT step, task_uid FROM {episodes} WHERE run_id = ? AND episode_id = ? "
            "AND phase = 'grpo') SELECT e.episode_id, e.checklist AS reward, e.success, "
            "avg(g.advantage) FILTER (g.role = 'caller') AS caller_advantage, "
            "avg(g.advantage) FILTER (g.role = 'rehearser') AS rehearser_advantage, e.termination "
            f"FROM {episodes} e JOIN me USING (step, task_uid) LEFT JOIN {generations} g "
            "ON g.run_id = e.run_id AND g.episode_id = e.episode_id "
            "WHERE e.run_id = ? AND e.phase = 'grpo' GROUP BY ALL ORDER BY e.episode_id", [run, episode_id, run])

    @staticmethod
    def _errors_sql(calls: str, generations: str) -> str:
        return (f"SELECT run_id, episode_id, error_kind AS kind FROM {calls} WHERE error_kind <> '' "
                f"UNION ALL SELECT run_id, episode_id, parse_error FROM {generations} WHERE parse_error IS NOT NULL")

    def error_kinds(self, run_id: str) -> list[str]:
        """The caller parse-error and tool-error kinds that occur in a run, most frequent first."""
        calls, generations = self._source("calls", run_id), self._source("generations", run_id)
        return list(self._df(f"SELECT kind FROM ({self._errors_sql(calls, generations)}) WHERE run_id = ? "
                             "GROUP BY kind ORDER BY count(*) DESC, kind", [check_run_id(run_id)])["kind"])

    def unit_rewards(self, run_id: str, phase: str | None = None) -> pd.DataFrame:
        """Per unit (`task_uid`: a task, or a task at a turn): its episodes, how many scored above 0, the mean,
        min and max checklist, and `spread` (not all equal): a GRPO group on that unit gets a signal only when
        its rewards differ, so a sampled rollout of the pool (a pass-rate screen) names the units worth
        training on (`[train.grpo] units`). `phase` keeps one phase of a training run."""
        where, params = _filters(("run_id = ?", check_run_id(run_id)), ("phase = ?", phase))
        return self._df(
            "SELECT task_uid, count(*) AS episodes, count(*) FILTER (checklist > 0) AS hits, "
            "avg(checklist) AS mean, min(checklist) AS min, max(checklist) AS max, "
            "min(checklist) < max(checklist) AS spread "
            f"FROM {self._source('episodes', run_id)} {where} GROUP BY task_uid ORDER BY task_uid", params)

    def steps(self, run_id: str, episode_id: str) -> pd.DataFrame:
        """An episode's generations in order (caller messages, rehearsals, user messages), turn by turn, each
        with what was stored for it: the reward its role got, and in training runs the advantage the
        update used and whether it trained on the row."""
        generations = self._source("generations", run_id)
        return self._df(
            "SELECT turn, turn_step, role, call_index, user_message, completion_text, parse_error, "
            "len(completion_ids) AS tokens, completion_ids, reward, advantage, trained, logprobs "
            f"FROM {generations} WHERE run_id = ? AND episode_id = ? "
            "ORDER BY turn, turn_step, role = 'rehearser', call_index", [check_run_id(run_id), episode_id])

    def calls(self, run_id: str, episode_id: str) -> pd.DataFrame:
        """Each call with the response the caller saw and, where recorded, the real and rehearsed pair."""
        calls, pairs = self._source("calls", run_id), self._source("pairs", run_id)
        return self._df(
            "SELECT c.turn, c.turn_step, c.call_index, c.name, c.arguments, c.source, c.response, c.is_error, "
            "p.real_response, p.rehearsed_response, p.rehearsal_error, p.exact, p.structure_f1, p.value_acc, "
            "p.error_agreement, p.embed_cos, p.decision_changed "
            f"FROM {calls} c LEFT JOIN {pairs} p ON p.run_id = c.run_id AND p.step = c.step "
            "AND p.episode_id = c.episode_id AND p.turn = c.turn AND p.turn_step = c.turn_step "
            "AND p.call_index = c.call_index "
            "WHERE c.run_id = ? AND c.episode_id = ? ORDER BY c.turn, c.turn_step, c.call_index",
            [check_run_id(run_id), episode_id])

    def tokenizer(self, run_id: str):
        """The tokenizer of the model a run generated with (cached per model), or None when it cannot load here:
        what turns stored token ids back into the tokens the token view colours."""
        runs = self.runs()
        model = runs.set_index("run_id")["model"].get(check_run_id(run_id))
        if not model:
            return None
        if model not in self._tokenizers:
            from envace.policy.models import tokenizer_for

            try:
                self._tokenizers[model] = tokenizer_for(str(model))
            except (UsageError, OSError, ValueError):
                self._tokenizers[model] = None
        return self._tokenizers[model]

    @staticmethod
    def diff(real: str | None, rehearsed: str | None) -> pd.DataFrame:
        """The structural diff of two tool responses (`workbench.diff`)."""
        return pd.DataFrame(diff_rows(real, rehearsed), columns=["path", "kind", "real", "rehearsed", "drift"])

    # -- fidelity ----------------------------------------------------------------------------------

    def pairs(self, run_id: str | None = None, tool: str | None = None) -> pd.DataFrame:
        where, params = _filters(("run_id = ?", _run(run_id)), ("name = ?", tool))
        return self._df(f"SELECT * FROM {self._source('pairs', run_id)} {where} "
                        "ORDER BY run_id, step, episode_id, turn, turn_step", params)

    def fidelity_by_tool(self, run_id: str | None = None) -> pd.DataFrame:
        """Mean of every fidelity metric per tool, worst exact-match first, and a last `all` row
        (`envace.ledger`, the aggregate `envace fidelity` prints).

        Over the whole store the means are combined from per-run sums (`_across_runs`), so a refresh
        re-scans only the runs that wrote since, not every pair in the store.
        """
        sums = [self._tool_sums(run_id)] if run_id is not None else self._across_runs("pairs", self._tool_sums)
        frame = ledger.means(sums)
        tools = frame[frame["tool"] != "all"].sort_values(["exact", "pairs"], ascending=[True, False])
        return pd.concat([tools, frame[frame["tool"] == "all"]], ignore_index=True)

    def _tool_sums(self, run_id: str) -> pd.DataFrame:
        with self._lock:
            return ledger.tool_sums(self.con, self._source("pairs", run_id), check_run_id(run_id))

    def _across_runs(self, table: str, per_run: Callable[[str], pd.DataFrame]) -> list[pd.DataFrame]:
        """`per_run` of every run that has `table`, cached per run until that run's shards change."""
        parts = []
        for run_id in sorted(self.runs_with(table)):
            key = (per_run.__name__, run_id)
            shards = tuple(self.index.run_shards(table, run_id))
            if self._cache.get(key, (None,))[0] != shards:
                self._cache[key] = (shards, per_run(run_id))
            parts.append(self._cache[key][1])
        return parts

    def fidelity_over_training(self, run_id: str) -> pd.DataFrame:
        """Rehearsal fidelity against the GRPO step, long format (step, source, name, value): `eval` from the
        periodic test-split evaluations, `train` from the shadow pairs of that step's own rollouts
        (`shadow_fraction`). Empty for a run that is not a training run."""
        pairs, episodes = self._source("pairs", run_id), self._source("episodes", run_id)
        names = ", ".join(f"'{m}'" for m in _FIDELITY)
        means = ", ".join(f"avg(p.{m}::DOUBLE) AS {m}" for m in _FIDELITY)
        return self._df(
            f"SELECT step, 'eval' AS source, name, value FROM metrics WHERE run_id = ? AND phase = 'eval' "
            f"AND name IN ({names}) UNION ALL SELECT step, 'train' AS source, name, value FROM "
            f"(UNPIVOT (SELECT p.step AS step, {means} FROM {pairs} p JOIN {episodes} e "
            f"USING (run_id, step, episode_id) WHERE p.run_id = ? AND e.phase = 'grpo' GROUP BY p.step) "
            f"ON {', '.join(_FIDELITY)} INTO NAME name VALUE value) ORDER BY step, source, name",
            [check_run_id(run_id), run_id])

    def suite(self, run_id: str) -> pd.DataFrame:
        """A suite run (`envace suite`) as the paper's table: our row (mean and 95% interval per benchmark and
        overall) above the published rows; substitutes are named in the column headers."""
        from envace import suite

        meta = self.runs().set_index("run_id").loc[check_run_id(run_id)]
        if meta["kind"] != suite.KIND:
            raise UsageError(f"run '{run_id}' is a {meta['kind']} run, not a suite")
        with self._lock:
            outcomes = suite.outcomes(self.con, {"summary": json.loads(meta["summary"] or "{}")})
        return suite.headline(outcomes, run_id)

    def world_model(self, run_id: str) -> pd.DataFrame:
        """A world-model benchmark run (`envace world-model`; any run with pairs): per tool and overall, the calls,
        the tasks, the share of valid results and each metric's mean with its 95% bootstrap interval over tasks
        (`<metric>_lo`, `<metric>_hi`)."""
        return world_model.table(self.world_model_calls(run_id))

    def world_model_compare(self, run_a: str, run_b: str) -> pd.DataFrame:
        """Two runs' rehearsals of the same calls, paired: per metric A's and B's means, Δ = B − A with its paired
        95% interval over tasks, the calls B scores higher and lower on, and the sign test. Runs over different
        calls raise UsageError (saying how many differ)."""
        return world_model.compare(world_model.matched(self.world_model_calls(run_a),
                                                       self.world_model_calls(run_b), (run_a, run_b)))

    def world_model_calls(self, run_id: str) -> pd.DataFrame:
        """One row per rehearsed call of a run: its key (episode, turn, step, index), tool, arguments, `valid` and
        every metric; `envace.world_model.matched` pairs two runs' rows call by call."""
        with self._lock:
            return world_model.pairs(self.con, self._source("pairs", run_id), check_run_id(run_id))

    def calibration(self, run_id: str | None = None) -> pd.DataFrame:
        """Per episode: mean rehearsal exact-match against its outcome (does fidelity go with success?)."""
        if run_id is None:
            parts = self._across_runs("pairs", self.calibration)
            return (pd.concat(parts).sort_values("fidelity", ignore_index=True) if parts else
                    pd.DataFrame(columns=["run_id", "episode_id", "success", "checklist", "fidelity", "copy_rate",
                                          "pairs"]))
        episodes, pairs = (self._source(t, run_id) for t in ("episodes", "pairs"))
        return self._df(
            "SELECT e.run_id, e.episode_id, e.success, e.checklist, avg(p.exact) AS fidelity, "
            f"avg(p.copied::DOUBLE) AS copy_rate, count(*) AS pairs FROM {episodes} e JOIN {pairs} p "
            "USING (run_id, step, episode_id) WHERE e.run_id = ? GROUP BY ALL ORDER BY fidelity",
            [check_run_id(run_id)])

    def judgements(self, run_id: str | None = None) -> pd.DataFrame:
        """The optional rubric judge's rows (`envace judge`), one per episode × rubric, each with its episode's
        `rubric_judge` sub-score: the share of its rubrics met (an unparsed verdict counts as not met). A local
        model's stand-in for an official LLM judge: never comparable with published numbers."""
        where, params = _filters(("run_id = ?", _run(run_id)))
        return self._df(
            "SELECT run_id, step, episode_id, task_uid, judge_model, rubric_index, rubric, verdict, "
            "avg(coalesce(verdict, false)::DOUBLE) OVER (PARTITION BY run_id, judge_model, step, episode_id) "
            f"AS rubric_judge, judge_text FROM {self._source('judgements', run_id)} {where} "
            "ORDER BY run_id, judge_model, step, episode_id, rubric_index", params)

    # -- training and private rehearsal ------------------------------------------------------------

    def training(self, run_id: str, phase: str = "grpo") -> pd.DataFrame:
        """Per-step, per-role metrics of a training run, long format (step, role, name, value)."""
        return self._df(f"SELECT step, role, name, value FROM {self._source('metrics', run_id)} "
                        "WHERE run_id = ? AND phase = ? ORDER BY step, role, name", [check_run_id(run_id), phase])

    def sweep(self, run_id: str | None = None) -> pd.DataFrame:
        where, params = _filters(("run_id = ?", _run(run_id)))
        return self._df(f"SELECT * FROM sweep {where} ORDER BY label, mode, budget", params)

    def ladder(self, run_id: str) -> pd.DataFrame:
        """A private-rehearsal ladder's comparisons (`envace private-ladder`), as its run stored them: each rung
        against N = 0 and against the rehearsed memory, paired by turn, p-values Holm-adjusted over the table."""
        return self._df(f"SELECT label AS model, rung, vs, pairs, a AS A, b AS B, delta AS \"Δ = B − A\", lo, hi, "
                        f"mde AS \"MDE 80%\", up, down, mcnemar_p AS \"McNemar p\", holm_mcnemar_p AS "
                        f"\"Holm McNemar p\", permutation_p AS \"permutation p\", holm_permutation_p AS "
                        f"\"Holm permutation p\" FROM {self._source('ladder', run_id)} WHERE run_id = ?",
                        [check_run_id(run_id)])

    def ladder_turns(self, run_id: str) -> pd.DataFrame:
        """A ladder's committed turns, one row per rung cell's turn: its memory, whether it changed the committed
        first action, whether the committed call copies an imagined one, and the memory's fidelity."""
        return self._df(f"SELECT * FROM {self._source('ladder_turns', run_id)} WHERE run_id = ? "
                        "ORDER BY label, rung, seed, episode_id, turn", [check_run_id(run_id)])

    def ladder_diagnosis(self, run_id: str) -> pd.DataFrame:
        """`ladder_turns` per model and rung: the share of turns with a memory, changed, copied, and the mean
        fidelity (`envace.private.ladder.diagnosis`)."""
        from envace.private.ladder import DIAGNOSIS, diagnosis

        rows = diagnosis(self.ladder_turns(run_id).astype(object).where(lambda f: f.notna(), None).to_dict("records"))
        return pd.DataFrame(rows, columns=list(DIAGNOSIS))

    def rehearsed_turns(self, run_id: str) -> pd.DataFrame:
        """The privately rehearsed turns of a run: which episode and turn, the memory and its kind (summary,
        transcript; empty in runs stored before there was a choice), its cost."""
        return self._df(f"SELECT episode_id, turn, mode, budget, scope, memory_kind, memory, memory_error, "
                        f"imagined_steps, "
                        f"caller_tokens + rehearser_tokens + summariser_tokens AS tokens, decision_changed "
                        f"FROM {self._source('memories', run_id)} WHERE run_id = ? ORDER BY episode_id, turn",
                        [check_run_id(run_id)])

    def rehearsed_turn(self, run_id: str, episode_id: str, turn: int) -> dict[str, pd.DataFrame]:
        """What it imagined, what it wrote down: the imagined attempts and the memory of one turn."""
        key = [check_run_id(run_id), episode_id, turn]
        imagined, memories = self._source("imagined", run_id), self._source("memories", run_id)
        return {"imagined": self._df("SELECT attempt, round, memory_seen, transcript, termination, n_steps, "
                                     f"n_calls FROM {imagined} WHERE run_id = ? AND episode_id = ? AND turn = ? "
                                     "ORDER BY attempt", key),
                "memory": self._df(f"SELECT * FROM {memories} WHERE run_id = ? AND episode_id = ? AND turn = ?",
                                   key)}

    def private_turns(self, run_id: str, episode_id: str) -> dict[int, dict[str, pd.DataFrame]]:
        """An episode's privately rehearsed turns, each as `rehearsed_turn` gives it (none for a run that
        never rehearsed privately)."""
        if run_id not in self.runs_with("memories"):
            return {}
        turns = self._df(f"SELECT DISTINCT turn FROM {self._source('memories', run_id)} WHERE run_id = ? AND "
                         "episode_id = ? ORDER BY turn", [check_run_id(run_id), episode_id])["turn"]
        return {int(t): self.rehearsed_turn(run_id, episode_id, int(t)) for t in turns}

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


def _stored_config(meta: dict) -> dict:
    """A run's stored config; a train run's with the flat keys of an earlier release nested, as a new run keeps
    them, so that runs of both compare setting by setting."""
    config = meta.get("config") or {}
    return nest(config) if meta.get("kind") == "train" else config
