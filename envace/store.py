"""The run store: one folder per run with `run.json` and Parquet shards per table; DuckDB views on top.

Layout: `<root>/<run_id>/run.json` and `<root>/<run_id>/<table>/<shard>.parquet`. A shard is written
to a temp name and renamed, so a reader never sees half a file, and rewriting a shard of the same
name (same batch or step) replaces it: re-running a step is idempotent. Readers query
through `connect(root)`: views over the shards present at the last `refresh`; many small files are fine
for DuckDB, and no writer ever holds a lock.
`SCHEMAS` below is the one place the tables' columns are defined.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from envace.errors import UsageError
from envace.pids import alive

# Every per-episode table is keyed by (run, step, episode): `step` is the job's step, one batch of a
# rollout or one GRPO update of a training run (its evaluations are stored at the update they follow).
_KEY = [("run_id", pa.string()), ("step", pa.int32()), ("episode_id", pa.string())]
# Where in an episode: the user turn, and the caller message within it.
_AT = [("turn", pa.int32()), ("turn_step", pa.int32())]

SCHEMAS: dict[str, pa.Schema] = {
    # One row per episode: the benchmark's verdict and the episode's counters.
    "episodes": pa.schema(_KEY + [
        ("task_uid", pa.string()), ("env", pa.string()), ("category", pa.string()), ("split", pa.string()),
        ("group_index", pa.int32()),      # which of the G rollouts of this task
        ("mode", pa.string()),            # real | rehearse | rehearse+shadow | real+shadow
        ("phase", pa.string()),           # rollout | grpo (a training rollout) | eval (a training-time evaluation)
        ("start_turn", pa.int32()),       # the first user turn the policy played (later than 0: a gold prefix)
        ("success", pa.bool_()),          # official benchmark success
        ("score_detail", pa.string()),    # the checker's error type when it failed
        ("score_value", pa.float64()),    # graded official score in [0, 1] (`Score.graded`; NULL in older shards)
        ("score_parts", pa.string()),     # JSON: the benchmark's named subscores (`Score.subscores`), "{}" when none
        ("checklist", pa.float64()),      # environment-free checklist reward in [0, 1] (envace.rewards)
        ("checklist_detail", pa.string()),  # JSON: per reference turn, which items passed
        ("termination", pa.string()),     # completed | step_limit | context_exceeded | parse_error | rehearsal_error
        ("n_turns", pa.int32()), ("n_ref_turns", pa.int32()),  # user turns completed / in the task
        ("n_steps", pa.int32()),          # caller messages
        ("n_calls", pa.int32()), ("n_parse_errors", pa.int32()), ("n_tool_errors", pa.int32()),
        ("n_well_formed", pa.int32()),    # caller messages with at least one call and no parse error
        ("n_rehearsals", pa.int32()), ("n_rehearsal_errors", pa.int32()),
        ("env_executions", pa.int32()),   # calls the real environment executed (0 in rehearse mode)
        ("prompt_tokens", pa.int32()),    # the first caller prompt
        ("generated_tokens", pa.int32()),
        ("private_tokens", pa.int32()),   # private rehearsal: tokens of every role over all rehearsed turns
        ("imagined_steps", pa.int32()),   # private rehearsal: imagined caller messages over all rehearsed turns
        ("context_ids", pa.list_(pa.int32())),  # final caller context; generations.prompt_len indexes into it
        ("wall_s", pa.float64()),         # this episode's own seconds, start to end (its batch's in older shards)
        ("started_at", pa.float64()), ("ended_at", pa.float64()),  # epoch seconds (NULL in older shards)
        # of wall_s, the seconds it sat with its next request ready while other episodes' work ran (lock-step's
        # waits for the slowest; ~0 under episode_loop = per_episode): SUM(wait_s) / SUM(wall_s) is the idle
        # share of episode slots (`engine.episode.idle_share`); NULL in older shards
        ("wait_s", pa.float64()),
        ("actor", pa.int32()),            # training: the rollout actor that played it (NULL elsewhere, older shards)
    ]),
    # One row per model generation of any role: a caller message, the rehearsal of one call, a simulated
    # user's message. The unit of training: what the trainer used is stored with it, never re-derived.
    "generations": pa.schema(_KEY + _AT + [
        ("role", pa.string()),            # caller | rehearser | user
        ("call_index", pa.int32()),       # rehearser: which call of the caller message it answers
        ("user_message", pa.string()),    # caller: the user text that opened this turn (first message only)
        ("prompt_len", pa.int32()),       # caller: prompt = episodes.context_ids[:prompt_len], unless prompt_ids
        ("prompt_ids", pa.list_(pa.int32())),  # rehearser and user: their own prompt (not in the caller context);
        # caller: its prompt once past_thinking = "drop" re-rendered the context it was sampled from
        ("completion_ids", pa.list_(pa.int32())),
        ("completion_text", pa.string()),
        ("finish", pa.string()),          # stop | length
        ("n_calls", pa.int32()),
        ("parse_error", pa.string()),     # None, or an error kind from envace.formats
        ("parse_detail", pa.string()),
        ("logprobs", pa.list_(pa.float32())),  # the sampled tokens' log-probabilities, when the backend gave them
        ("temperature", pa.float64()),    # what it was sampled at (0: greedy); NULL in older shards
        ("top_p", pa.float64()),          # its nucleus mass; NULL in older shards
        ("reward", pa.float64()),         # the reward this row's role got for the episode (envace.rewards)
        ("advantage", pa.float64()),      # the role-wise GRPO advantage the update used; None outside training
        ("trained", pa.bool_()),          # whether the update trained on this row
        ("policy_version", pa.int32()),   # training: updates the weights that sampled it had had (NULL elsewhere)
    ]),
    # One row per tool call the caller issued, with the response fed back to it.
    "calls": pa.schema(_KEY + _AT + [
        ("call_index", pa.int32()),       # position among the message's parallel calls
        ("name", pa.string()), ("arguments", pa.string()),  # arguments as JSON
        ("source", pa.string()),          # real | rehearsed | gold: who wrote the response the caller saw
        ("response", pa.string()), ("is_error", pa.bool_()), ("error_kind", pa.string()),
    ]),
    # One row per privately rehearsed turn: the memory the committed turn saw, and what it cost.
    "memories": pa.schema(_KEY + [
        ("turn", pa.int32()),
        ("mode", pa.string()), ("budget", pa.int32()), ("scope", pa.string()),  # parallel|sequential, N, turn|episode
        ("memory_kind", pa.string()),     # summary (the summariser wrote it) | transcript (condensed, not generated)
        # | select (no memory: the best-scored attempt's first message was committed)
        ("memory", pa.string()),          # appended to the user's message of the committed turn ("" = none)
        ("memory_error", pa.string()),    # None, or why a summary was not usable (empty_memory, tool_call_in_memory)
        ("caller_tokens", pa.int32()), ("rehearser_tokens", pa.int32()), ("summariser_tokens", pa.int32()),
        ("imagined_steps", pa.int32()),   # caller messages over all imagined attempts
        ("wall_s", pa.float64()),         # the batched rehearsal phase's wall time, divided by its episodes
        ("decision_changed", pa.bool_()),  # greedy first action differs without the memory (when measured)
        # the private-rehearsal ladder (`envace private-ladder`; NULL elsewhere): the rung that wrote the memory,
        # the calls it was written from (JSON [{name, arguments, failed}]: imagined, or the turn's gold), and its
        # fidelity: the tool answers it was written from against the real answers to the same calls (value accuracy
        # and exact match, over `fidelity_pairs` calls; 1 where they are real answers)
        ("rung", pa.string()), ("imagined_calls", pa.string()),
        ("fidelity", pa.float64()), ("fidelity_exact", pa.float64()), ("fidelity_pairs", pa.int32()),
        # memory = select (NULL otherwise): how the attempts were scored (judge | checklist), the `imagined.attempt`
        # whose first message was committed, and its imagined score (NULL: no attempt wrote a message)
        ("select_by", pa.string()), ("selected_attempt", pa.int32()), ("selected_score", pa.float64()),
    ]),
    # One row per imagined attempt, linked to the committed turn it informed by (episode_id, turn).
    "imagined": pa.schema(_KEY + [
        ("turn", pa.int32()), ("attempt", pa.int32()), ("round", pa.int32()),
        ("memory_seen", pa.string()),     # sequential: the memory of the attempts before it
        ("transcript", pa.string()),      # the imagined turn: Assistant / Tool[name] / User lines
        ("termination", pa.string()), ("n_steps", pa.int32()), ("n_calls", pa.int32()),
        ("caller_tokens", pa.int32()), ("rehearser_tokens", pa.int32()),  # rehearser: its judgement's too
        ("score", pa.float64()),          # memory = select: the attempt's imagined outcome in [0, 1]; NULL otherwise
        ("judgement", pa.string()),       # memory = select by judge: the rehearser's answer; NULL otherwise
    ]),
    # One row per group of a training step that failed for good (a 4xx answer, an environment's exception): not
    # played again, not trained on (`scheduler.Scheduler.faulted`).
    "failures": pa.schema([
        ("run_id", pa.string()), ("step", pa.int32()),
        ("task_uid", pa.string()), ("chunk", pa.int32()),  # the group's task, and the chunk it was played in
        ("error", pa.string()),           # what it raised, in one line
    ]),
    # One row per cell of a private-rehearsal budget sweep (`envace sweep`); each cell is its own eval run.
    "sweep": pa.schema([
        ("run_id", pa.string()),          # the sweep
        ("label", pa.string()), ("model", pa.string()),  # e.g. base / trained, and the model spec
        ("mode", pa.string()), ("budget", pa.int32()),  # none (N = 0) | parallel | sequential; N
        ("cell_run", pa.string()), ("episodes", pa.int32()),
        ("success_rate", pa.float64()), ("checklist", pa.float64()), ("well_formed_rate", pa.float64()),
        ("private_tokens_per_episode", pa.float64()), ("wall_s_per_episode", pa.float64()),
    ]),
    # One row per comparison of a private-rehearsal ladder (`envace private-ladder`): a rung's cells against N = 0
    # or against the rehearsed rung, paired by turn and pooled over seeds (`envace.compare.row`); p-values
    # Holm-adjusted over the whole table.
    "ladder": pa.schema([
        ("run_id", pa.string()),          # the ladder
        ("label", pa.string()), ("rung", pa.string()),  # the model, and the rung (B)
        ("vs", pa.string()),              # what it is compared with (A): none (N = 0) | rehearsed
        ("delta_per_seed", pa.string()),  # each seed's mean difference, " / "-joined
        ("pairs", pa.int32()), ("a", pa.float64()), ("b", pa.float64()), ("delta", pa.float64()),
        ("lo", pa.float64()), ("hi", pa.float64()),  # 95% interval of delta, resampled by task
        ("mde", pa.float64()),            # minimum detectable effect at 80% power for these pairs
        ("up", pa.int32()), ("down", pa.int32()),  # items scored on B's side only / on A's only
        ("mcnemar_p", pa.float64()), ("holm_mcnemar_p", pa.float64()),
        ("permutation_p", pa.float64()), ("holm_permutation_p", pa.float64()),
    ]),
    # One row per committed turn of a ladder's rung cell: what its memory did (the cell's `memories` row joined
    # with its committed first call).
    "ladder_turns": pa.schema([
        ("run_id", pa.string()),          # the ladder
        ("label", pa.string()), ("rung", pa.string()), ("seed", pa.int32()), ("cell_run", pa.string()),
        ("episode_id", pa.string()), ("task_uid", pa.string()), ("turn", pa.int32()),
        ("checklist", pa.float64()),      # the committed episode's
        ("memory", pa.string()), ("memory_error", pa.string()),
        ("decision_changed", pa.bool_()),  # the memory changed the committed first action (greedy, with and without)
        ("imagined_calls", pa.string()),  # as in `memories`
        ("committed_call", pa.string()),  # JSON {name, arguments} of the committed turn's first call; NULL: none
        ("copied", pa.bool_()),           # it is one of the imagined calls, name and arguments (NULL: no call or none)
        ("copied_failed", pa.bool_()),    # it copies an imagined call that failed
        ("fidelity", pa.float64()), ("fidelity_exact", pa.float64()), ("fidelity_pairs", pa.int32()),
    ]),
    # One row per (step, phase, role, metric) of a training run: long format, easy to plot and filter.
    "metrics": pa.schema([
        ("run_id", pa.string()), ("step", pa.int32()),
        ("phase", pa.string()),           # sft | grpo | eval
        ("role", pa.string()),            # caller | rehearser | all
        ("name", pa.string()), ("value", pa.float64()),
    ]),
    # One row per call answered both ways (shadow worlds): the unit of world-model fidelity.
    "pairs": pa.schema(_KEY + _AT + [
        ("call_index", pa.int32()), ("name", pa.string()), ("arguments", pa.string()),
        ("fed_back", pa.string()),        # real | rehearsed: which one the caller saw
        ("real_response", pa.string()), ("rehearsed_response", pa.string()),  # rehearsed: None if malformed
        ("real_is_error", pa.bool_()), ("rehearsed_is_error", pa.bool_()),
        ("rehearsal_error", pa.string()),  # None, or a rehearsal error kind from envace.formats
        ("valid_json", pa.float64()), ("exact", pa.float64()), ("structure_f1", pa.float64()),
        ("value_acc", pa.float64()),
        ("error_agreement", pa.string()),  # both_ok | both_error | false_error | missed_error | no_rehearsal
        ("error_agree", pa.float64()), ("string_sim", pa.float64()),
        ("embed_cos", pa.float64()),      # all-MiniLM-L6-v2 cosine; None when not computed
        ("copied", pa.bool_()),           # the rehearsal is verbatim one of its few-shot examples
        ("decision_changed", pa.bool_()),  # the next caller action differs after real vs rehearsed (sampled)
    ]),
    # One row per episode × rubric judged by `envace judge` (`envace/judge.py`): the optional `rubric_judge`
    # sub-score (share of an episode's rubrics met), a local model's stand-in for an official LLM judge, never
    # part of the official score. One shard per judge model, rewritten by a re-run.
    "judgements": pa.schema(_KEY + [
        ("task_uid", pa.string()),
        ("rubric_index", pa.int32()),     # position in `Benchmark.rubrics(task)`, from 0
        ("rubric", pa.string()),
        ("verdict", pa.bool_()),          # met or not; NULL when the judge's answer gave none for it
        ("judge_model", pa.string()),     # the judge's model spec
        ("judge_text", pa.string()),      # the judge's raw answer for the episode (every window's)
    ]),
}

# Stores written before these names changed: the old name of each table folder and column. `refresh` skips
# such a run with a warning naming `envace migrate`; `migrate` rewrites it under the new names.
RENAMED_TABLES = {"turns": "generations"}
RENAMED_COLUMNS = {"batch": "step", "step": "turn_step"}

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_run_id(run_id: str) -> str:
    """Run ids and names become folder names: letters, digits, '.', '_' and '-' only."""
    if not _RUN_ID.match(run_id) or ".." in run_id:
        raise UsageError(f"invalid run name '{run_id}' (use letters, digits, '.', '_' and '-')")
    return run_id


def _git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


@dataclass
class Run:
    """A writer's handle on one run folder."""

    root: Path
    run_id: str

    @property
    def path(self) -> Path:
        return self.root / self.run_id

    @classmethod
    def create(cls, root: str | Path, kind: str, config: dict[str, Any], model: str,
               name: str | None = None) -> Run:
        root = Path(root)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_id = check_run_id(name) if name is not None else f"{kind}-{stamp}-{secrets.token_hex(2)}"
        run = cls(root, run_id)
        if run.path.exists():
            raise UsageError(f"run '{run_id}' already exists in {root}")
        run.path.mkdir(parents=True)
        now = time.time()
        _write_json(run.path / "run.json", {
            "run_id": run_id, "kind": kind, "model": model, "status": "running", "pid": os.getpid(),
            "git_sha": _git_sha(), "created_at": now, "updated_at": now, "config": config, "summary": {},
        })
        return run

    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / "run.json").read_text())

    def update(self, **fields: Any) -> None:
        meta = self.meta()
        meta.update(fields, updated_at=time.time())
        _write_json(self.path / "run.json", meta)

    @contextmanager
    def running(self) -> Iterator[Run]:
        """Marks the run `interrupted` if the block raises (a kill -9 is caught by `list_runs` instead)."""
        try:
            yield self
        except BaseException:
            self.update(status="interrupted")
            raise

    def write(self, table: str, shard: str, rows: list[dict[str, Any]]) -> Path:
        """Write one shard atomically; the same (table, shard) again replaces it."""
        folder = self.path / table
        folder.mkdir(exist_ok=True)
        final = folder / f"{shard}.parquet"
        tmp = folder / f".{shard}.{os.getpid()}.partial"  # not matched by the readers' *.parquet glob
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMAS[table]), tmp)
        os.replace(tmp, final)
        return final


STAGING = ".staging"  # `<root>/.staging/<run_id>/`: a run being rewritten, invisible to readers until swapped in


def swap_in(staged: Path, target: Path) -> None:
    """Put the folder `staged` where `target` is, in one atomic step when the target exists: readers see the old
    run or the new one, never a missing folder. Linux's `renameat2(RENAME_EXCHANGE)` swaps the two; the old run
    then sits at `staged` and is deleted. Where the call is missing (another OS, a filesystem without it) two
    renames leave a moment with no folder."""
    import ctypes
    import shutil

    if target.exists():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            at_fdcwd, rename_exchange = -100, 2
            if libc.renameat2(at_fdcwd, os.fsencode(staged), at_fdcwd, os.fsencode(target), rename_exchange):
                raise OSError(ctypes.get_errno(), "renameat2")
        except (AttributeError, OSError):
            old = target.with_name(f"{target.name}.old-{secrets.token_hex(3)}")
            os.rename(target, old)
            os.rename(staged, target)
            staged = old
        shutil.rmtree(staged, ignore_errors=True)
    else:
        os.rename(staged, target)


def list_runs(root: str | Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """Every run's metadata, newest first. A `running` run whose process is gone reads `interrupted`.

    An unreadable `run.json` is skipped, and said so in `warnings` when given.
    """
    runs = []
    for meta_path in sorted(Path(root).glob("*/run.json")):
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            problem = meta_problem(meta, meta_path.parent.name)
        except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
            problem = "unreadable run.json (not UTF-8 JSON)"
        if problem:
            if warnings is not None:
                warnings.append(f"skipped run {meta_path.parent.name}: {problem} ({meta_path})")
            continue
        if meta.get("status") == "running" and not alive(meta.get("pid")):
            meta["status"] = "interrupted"
        runs.append(meta)
    return sorted(runs, key=lambda m: m.get("created_at", 0), reverse=True)


_META_TYPES = {"kind": (str,), "status": (str,), "model": (str,), "created_at": (int, float),
               "updated_at": (int, float), "summary": (dict,), "config": (dict,)}


def meta_problem(meta: Any, folder: str) -> str | None:
    """Why a run.json cannot be trusted (it is not an object, names another run, has a field of the wrong type),
    or None: a bad one hides its run with a warning, and every other run keeps working."""
    if not isinstance(meta, dict):
        return "run.json is not an object"
    if meta.get("run_id") != folder:
        return f"run.json names run {meta.get('run_id')!r}, not its folder's name"
    for key, types in _META_TYPES.items():
        value = meta.get(key)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            return f"run.json's {key} is {type(value).__name__}, expected {'/'.join(t.__name__ for t in types)}"
    return None


def get_run(root: str | Path, run_id: str) -> dict[str, Any]:
    check_run_id(run_id)
    for meta in list_runs(root):
        if meta["run_id"] == run_id:
            return meta
    raise UsageError(f"no run '{run_id}' in {root}")


@dataclass
class StoreIndex:
    """What the views of one `refresh` read: the readable shards per table, and what was skipped and why."""

    shards: dict[str, list[Path]]
    warnings: list[str]

    def run_shards(self, table: str, run_id: str) -> list[Path]:
        return [path for path in self.shards.get(table, []) if path.parent.parent.name == run_id]

    def source(self, paths: list[Path]) -> str:
        """A table expression over exactly these shards (of one table), with every column of its schema.

        Shards written before a column was added lack it: `union_by_name` fills it with NULL, at the price
        of reading every footer per query (about 40% of a whole-store scan), so it is used only when the
        shards' columns differ; a column none of them has is added as NULL of its type, so a query naming a
        new column reads an old store too.
        """
        columns = {_columns(p) for p in paths}
        union = len(columns) > 1
        files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
        scan = f"read_parquet([{files}], union_by_name = {str(union).lower()})"
        schema = SCHEMAS.get(paths[0].parent.name) if paths else None
        present = {name for names in columns for name in names or ()}
        missing = [f for f in schema if f.name not in present] if schema is not None else []
        if not missing:
            return scan
        added = ", ".join(f"CAST(NULL AS {_sql_type(f.type)}) AS {f.name}" for f in missing)
        return f"(SELECT *, {added} FROM {scan})"


_SQL_TYPES = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.float32(): "FLOAT", pa.int32(): "INTEGER",
              pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}


def _sql_type(kind: pa.DataType) -> str:
    """DuckDB's name for a column type of `SCHEMAS`."""
    if pa.types.is_list(kind):
        return _sql_type(kind.value_type) + "[]"
    return _SQL_TYPES[kind]


# (path, size, mtime) -> (the shard's column names, or None; why not). A shard is immutable once renamed into
# place, so each footer is read once per process.
_FOOTERS: dict[tuple[str, int, int], tuple[tuple[str, ...] | None, str | None]] = {}


def _columns(path: Path) -> tuple[str, ...] | None:
    """A readable shard's columns, else None (`shard_problem` says why)."""
    return _footer(path)[0]


def shard_problem(path: Path) -> str | None:
    return _footer(path)[1]


def _footer(path: Path) -> tuple[tuple[str, ...] | None, str | None]:
    try:
        stat = path.stat()
    except OSError:
        return None, "a link to a file that is gone"
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _FOOTERS:
        try:
            _FOOTERS[key] = _checked(pq.read_schema(path), path.parent.name)
        except (OSError, pa.ArrowException):
            _FOOTERS[key] = None, "not a readable Parquet shard"
    return _FOOTERS[key]


def _checked(schema: pa.Schema, table: str) -> tuple[tuple[str, ...] | None, str | None]:
    """The shard's columns if they are its table's (a subset, with its keys, each of the table's type)."""
    expected = SCHEMAS.get(RENAMED_TABLES.get(table, table))
    if expected is None or table in RENAMED_TABLES:
        return tuple(schema.names), None  # an old-layout folder: `old_layout_runs` reports it
    foreign = [n for n in schema.names if n not in expected.names and n not in RENAMED_COLUMNS]
    if foreign or "run_id" not in schema.names:
        return None, f"not a shard of {table} (columns {', '.join(foreign[:3] or ['without run_id'])})"
    for name in schema.names:
        if name in expected.names and not pa.types.is_null(schema.field(name).type) \
                and schema.field(name).type != expected.field(name).type:
            return None, f"column {name} is {schema.field(name).type}, {table} stores {expected.field(name).type}"
    return tuple(schema.names), None


def open_store(root: str | Path = "runs"):
    """(connection, index): an in-memory DuckDB connection with one view per table over every run's readable
    shards, plus `runs`; the index says which shards it read and what it skipped.

    Parquet footers are cached on the connection: a shard never changes once renamed into place, and
    re-reading a thousand footers per query is most of a whole-store query's time.
    """
    import duckdb

    root = Path(root).resolve()
    con = duckdb.connect()
    con.execute("SET parquet_metadata_cache = true")
    # The connection reads the store and nothing else: a query (notebooks' `Workbench.sql`) cannot reach
    # any other file, and the setting cannot be lifted once the database runs.
    con.execute("SET allowed_directories = ?", [[str(root) + os.sep]])
    con.execute("SET enable_external_access = false")
    return con, refresh(con, root)


def connect(root: str | Path = "runs"):
    """`open_store`'s connection alone."""
    return open_store(root)[0]


def refresh(con, root: str | Path, previous: StoreIndex | None = None) -> StoreIndex:
    """(Re)create the views over the shards present now; call again to see shards written since.

    A corrupt or half-written shard is left out of the views and named in the returned warnings, so one
    bad file never breaks a query over the others. With the `previous` index of this connection, a
    table whose shards did not change keeps its view (re-binding a view over thousands of files costs).
    """
    root = Path(root).resolve()  # absolute shard paths: the connection may read below the store's own folder only
    index = StoreIndex({}, [])
    old = old_layout_runs(root)
    index.warnings += [f"skipped run {name}: written before `turns` became `generations` and `batch` became "
                       f"`step`; convert it with `envace migrate --root {root}`" for name in old]
    for table, schema in SCHEMAS.items():
        good = []
        for path in sorted(root.glob(f"*/{table}/*.parquet")):
            if path.parent.parent.name in old:
                continue
            problem = shard_problem(path)
            if problem is None:
                good.append(path)
            else:
                index.warnings.append(f"skipped {path}: {problem}")
        index.shards[table] = good
        if previous is not None and good and previous.shards.get(table) == good:
            continue
        con.unregister(table)  # an empty stand-in registered earlier would shadow the view
        if good:
            con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * FROM {index.source(good)}")
        else:
            con.execute(f"DROP VIEW IF EXISTS {table}")
            con.register(table, schema.empty_table())
    runs = [{**{k: m.get(k) for k in ("run_id", "kind", "model", "status", "git_sha")},
             "created_at": m.get("created_at"), "updated_at": m.get("updated_at"),
             "config": json.dumps(m.get("config", {})), "summary": json.dumps(m.get("summary", {}))}
            for m in list_runs(root, index.warnings)]
    con.unregister("runs")
    con.register("runs", pa.Table.from_pylist(runs, schema=pa.schema([
        ("run_id", pa.string()), ("kind", pa.string()), ("model", pa.string()), ("status", pa.string()),
        ("git_sha", pa.string()), ("created_at", pa.float64()), ("updated_at", pa.float64()),
        ("config", pa.string()), ("summary", pa.string())])))
    return index


def episode_counts(con) -> dict[str, int]:
    """Every run's stored episodes, counted over all phases (a training run's GRPO and evaluation episodes; a
    run stopped before its summary still has the episodes it stored)."""
    return {run: int(n) for run, n in con.execute("SELECT run_id, count(*) FROM episodes GROUP BY run_id").fetchall()}


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A run's config with nested tables as dotted keys (`rollout.rehearser.max_examples`), as `--set` reads them."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def old_layout_runs(root: str | Path) -> list[str]:
    """Runs stored under the old names (a `turns/` folder, or a `batch` key column)."""
    old = set()
    for run_dir in Path(root).glob("*/"):
        if (run_dir / "turns").is_dir() or any(
                "batch" in (_columns(p) or ()) for p in run_dir.glob("episodes/*.parquet")):
            old.add(run_dir.name)
    return sorted(old)


def migrate(root: str | Path) -> list[str]:
    """Rewrite every old-layout run under the new names (`RENAMED_TABLES`, `RENAMED_COLUMNS`); returns
    what it converted. Each shard is written whole under its new name before the old one is removed, so
    a migration killed midway is simply run again."""
    done = []
    for name in old_layout_runs(root):
        run = Run(Path(root), name)
        phase = "grpo" if run.meta().get("kind") == "train" else "rollout"
        for folder in sorted(p for p in run.path.iterdir() if p.is_dir()):
            table = RENAMED_TABLES.get(folder.name, folder.name)
            if table not in SCHEMAS:
                continue
            for shard in sorted(folder.glob("*.parquet")):
                rows = pq.read_table(shard).to_pylist()
                renamed = [{RENAMED_COLUMNS.get(k, k) if "batch" in row else k: v for k, v in row.items()}
                           for row in rows]
                if table == "episodes":
                    renamed = [{"phase": phase, "start_turn": 0, **row} for row in renamed]
                run.write(table, shard.stem, renamed)
                if folder.name != table:
                    shard.unlink()
            if folder.name != table and not any(folder.iterdir()):
                folder.rmdir()
        done.append(name)
    return done
