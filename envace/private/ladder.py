"""The private-rehearsal ladder (`envace private-ladder`): why a rehearsal memory helps or hurts, one cause at a time.

For the same turns and seeds, each rung is an eval run (a cell, as in `sweep.py`) whose committed turns see one kind
of memory; every rung is paired turn by turn with N = 0 (no memory) and with today's rehearsed memory:

| rung        | what the committed turn's user message carries                                                      |
|-------------|-----------------------------------------------------------------------------------------------------|
| `none`      | nothing: the plain policy (N = 0), the baseline every rung is paired with                           |
| `empty`     | the `<rehearsal_memory>` block with no content: the cost of the format alone                        |
| `reference` | a memory of this turn's gold continuation only (its gold calls and their real answers), written by  |
|             | the same writer as rehearsed memories (`[rollout.private] memory`): the most a memory could give     |
| `real`      | the imagined attempts played against the real environment on a copy of its state, then written the  |
|             | same way: the world model's error removed (an environment that cannot copy its state is refused)    |
| `rehearsed` | today's memory: the attempts played against the rehearser (`PrivateRehearsal`, unchanged)           |
| `select`    | `memory = "select"`: no memory, the best-scored attempt's first message committed                   |

The real and rehearsed rungs imagine "the same attempt": the same caller, prompts and sampling seed (derived from
the batch, not from the calls made before it), so their first imagined call is the same, and from the first answer on
the real environment's answers or the rehearser's steer it. The real environment's own state is never touched: each
attempt runs on its own copy (`Environment.copy_state`), taken before its first call.

Per committed turn a rung's hook records in the cell's `memories` row the memory, whether it changed the committed
first action (`decision_changed`: greedy, without and with it), the calls it was written from (`imagined_calls`) and
its fidelity: how well the tool answers it was written from match the real answers to the same calls. The rehearsed
(and select) rung's attempts run beside the rehearser on a copied state (`Shadow`), and each pair is scored with
`envace.fidelity` (value accuracy, exact match); the real and reference rungs' answers are real (fidelity 1). The
ladder then joins each row with the committed turn's first call (`copied`: is it one of the imagined calls?) into its
own `ladder_turns` table, and compares the cells (`comparisons`: `envace.compare.row`, Holm over the whole table).
"""

from __future__ import annotations

import csv
import json
import time
import typing
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from envace import compare
from envace.config import PrivateOptions, RolloutConfig, choices
from envace.engine.episode import Episode, Pending
from envace.engine.prompts import reference_transcript, summariser_prompt
from envace.engine.rehearser import Rehearser
from envace.engine.rollout import RolloutEngine
from envace.engine.worlds import Answer, Shadow, World
from envace.errors import UsageError
from envace.fidelity import canonical
from envace.private.memory import attempt_lines, parse_memory, transcript_memory
from envace.private.rehearsal import PrivateRehearsal
from envace.private.sweep import counts

NONE = "none"  # N = 0: the baseline cell of every model
RUNGS = ("empty", "reference", "real", "rehearsed", "select")
SAMPLED = ("real", "rehearsed", "select")  # rungs that sample imagined attempts: one cell per seed
EMPTY = " "  # `with_memory` writes the block around it: the tags and a blank line, no content
VS_NONE, VS_REHEARSED = "N = 0", "rehearsed"


def select_available() -> bool:
    """Whether `[rollout.private] memory` takes "select" (its rung is wired in only then)."""
    return "select" in choices(typing.get_type_hints(PrivateOptions)["memory"])


def default_rungs(budget: int = 1) -> list[str]:
    """Every rung this version has; select only where the attempts' N (`budget`, 0 = the ladder's 1) leaves
    something to choose from."""
    return [r for r in RUNGS if r != "select" or (select_available() and (budget or 1) >= 2)]


# -- input ---------------------------------------------------------------------------------------------------------

def parse_models(items: Iterable[str]) -> dict[str, str]:
    """`label=spec` models, each resolved to what loads: a training run's folder becomes its `checkpoint/`; a run
    without one, or a folder without weights, is refused."""
    named: dict[str, str] = {}
    for item in items:
        label, sep, spec = item.strip().partition("=")
        if not sep or not label.isidentifier() or not spec:
            raise UsageError(f"--models expects label=path (e.g. sft=runs/RUN), got '{item}'")
        if label in named:
            raise UsageError(f"--models: label '{label}' given twice")
        named[label] = checkpoint(label, spec)
    if not named:
        raise UsageError("--models: give at least one label=path")
    return named


def checkpoint(label: str, spec: str) -> str:
    """The model `spec` names, checked before anything runs: a run folder (`run.json`) stands for its checkpoint."""
    from envace.policy.specs import check_model_spec

    path = Path(spec).expanduser()
    if (path / "run.json").is_file():
        weights = path / "checkpoint"
        if not (weights / "config.json").is_file():
            raise UsageError(f"--models {label}={spec}: run '{path.name}' holds no checkpoint (no weights at "
                             f"{weights}); give a training run that saved one, or a checkpoint folder")
        return str(weights)
    try:
        check_model_spec(spec)
    except UsageError as exc:
        raise UsageError(f"--models {label}={spec}: {exc}") from None
    return spec


def parse_rungs(text: str) -> list[str]:
    """Comma-separated rungs, in the ladder's order; `select` only once `memory = "select"` exists."""
    asked = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in asked if r not in RUNGS]
    if not asked or unknown:
        raise UsageError(f"--rungs takes {', '.join(RUNGS)} (N = 0 always runs), got '{text}'")
    if "select" in asked and not select_available():
        raise UsageError("rung select: [rollout.private] memory = \"select\" is not available in this version "
                         "(memory takes " + ", ".join(choices(typing.get_type_hints(PrivateOptions)["memory"])) +
                         "); leave select out of --rungs")
    return [r for r in RUNGS if r in asked]


def parse_seeds(text: str | None, default: int) -> list[int]:
    return [default] if text is None else counts(text, "--seeds")


def base_config(cfg: RolloutConfig, rungs: list[str]) -> RolloutConfig:
    """The cells' common config: private rehearsal per turn (N from `[rollout.private] budget`, 1 when unset;
    parallel unless set), the change of the committed action measured; what the ladder cannot pair refused."""
    if cfg.mode not in ("real", "real+shadow"):
        raise UsageError(f"mode {cfg.mode}: the ladder commits every turn in the real environment (mode real or "
                         "real+shadow), whose state the real rung copies")
    o = cfg.private
    if o.scope != "turn":
        raise UsageError("private scope: the ladder rehearses each turn before it (scope turn); a reference memory "
                         "is that turn's gold alone")
    if o.memory not in ("summary", "transcript"):
        raise UsageError(f"private memory {o.memory}: the memory rungs take summary or transcript (select is a rung "
                         "of its own: --rungs …,select)")
    mode = "parallel" if o.mode == "none" else o.mode
    if "select" in rungs and mode != "parallel":
        raise UsageError("rung select scores independent attempts: use --private parallel")
    if "select" in rungs and (o.budget or 1) < 2:  # one attempt leaves nothing to choose: it measured temperature
        raise UsageError(f"rung select chooses among N >= 2 imagined attempts, and N = {o.budget or 1} has nothing "
                         "to choose from: set --budget 2 or more")
    return replace(cfg, report_to="none",
                   private=replace(o, mode=mode, budget=o.budget or 1, scope="turn", measure_change=True))


def check_copy(cfg: RolloutConfig) -> None:
    """The real rung needs an environment whose state can be copied: one line naming it, else."""
    from envace.envs import registry

    benchmark = registry.get(cfg.env)
    tasks = benchmark.load_tasks(cfg.category, cfg.split, 1, cfg.offset)
    if not tasks:
        return  # no task: the cell's own job says so
    env = benchmark.make_env()
    env.reset(tasks[0])
    if env.copy_state() is None:
        raise UsageError(f"rung real: environment {benchmark.name} ({type(env).__name__}, {cfg.category}) cannot "
                         "copy its state (Environment.copy_state), so an imagined attempt cannot be played against "
                         "it; leave real out of --rungs")


# -- cells ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One eval run of the ladder: a model's rung, at one seed (None: the rung samples nothing, one run serves
    every seed)."""

    label: str
    model: str
    rung: str
    seed: int | None

    def run_name(self, ladder: str) -> str:
        return f"{ladder}-{self.label}-{self.rung}" + ("" if self.seed is None else f"-s{self.seed}")


def cells(models: dict[str, str], rungs: list[str], seeds: list[int], greedy: bool) -> list[Cell]:
    """Per model, N = 0 then each rung; a rung that samples (or any, when the caller samples) once per seed."""
    out = []
    for label, model in models.items():
        for rung in (NONE, *rungs):
            if rung in SAMPLED or not greedy:
                out += [Cell(label, model, rung, s) for s in seeds]
            else:
                out.append(Cell(label, model, rung, None))
    return out


def cell_config(cell: Cell, base: RolloutConfig, seeds: list[int]) -> RolloutConfig:
    private = PrivateOptions() if cell.rung == NONE else \
        replace(base.private, memory="select") if cell.rung == "select" else base.private
    return replace(base, model=cell.model, seed=seeds[0] if cell.seed is None else cell.seed, private=private)


def hook(rung: str) -> Callable[[PrivateOptions, Rehearser], Any] | None:
    """The before-turn hook a rung's cell plays with (`build.build_engine`'s `private_hook`); None: N = 0."""
    if rung == NONE:
        return None
    if rung == "empty":
        return lambda options, rehearser: Empty(options)
    if rung == "reference":
        return lambda options, rehearser: Reference(options)
    return lambda options, rehearser: Attempts(options, rehearser, rung)


# -- the hooks -----------------------------------------------------------------------------------------------------

def calls_json(calls: Iterable[tuple[str, Any, bool]]) -> str:
    """(name, arguments, failed) calls as the `imagined_calls` column holds them, arguments canonical."""
    return json.dumps([{"name": n, "arguments": canonical(a), "failed": bool(f)} for n, a, f in calls],
                      ensure_ascii=False)


def _row(ep: Episode, options: PrivateOptions, rung: str, memory: str, changed: bool | None, wall: float,
         calls: str | None, fidelity: tuple[float | None, float | None, int], kind: str | None,
         error: str | None = None, summariser_tokens: int = 0) -> dict[str, Any]:
    """A `memories` row of a rung written without imagined attempts (empty, reference)."""
    return {"episode_id": ep.episode_id, "turn": ep.turn, "mode": options.mode, "budget": 0, "scope": options.scope,
            "memory_kind": kind, "memory": memory, "memory_error": error, "caller_tokens": 0, "rehearser_tokens": 0,
            "summariser_tokens": summariser_tokens, "imagined_steps": 0, "wall_s": wall, "decision_changed": changed,
            "rung": rung, "imagined_calls": calls, "fidelity": fidelity[0], "fidelity_exact": fidelity[1],
            "fidelity_pairs": fidelity[2]}


def _changed(engine: RolloutEngine, options: PrivateOptions, episodes: list[Episode], memory: list[str]) -> list:
    """`PrivateRehearsal`'s own measure: the greedy first action without and with the memory."""
    return PrivateRehearsal(replace(options, memory="summary"))._decision_changed(engine, episodes, memory)


class Empty:
    """Rung `empty`: the block and nothing in it."""

    def __init__(self, options: PrivateOptions) -> None:
        self.options = options

    def wants(self, ep: Episode) -> bool:
        return True  # scope turn: every turn

    def memories(self, engine: RolloutEngine, episodes: list[Episode]) -> list[str]:
        started = time.perf_counter()
        memory = [EMPTY] * len(episodes)
        changed = _changed(engine, self.options, episodes, memory)
        wall = (time.perf_counter() - started) / len(episodes)
        for ep, c in zip(episodes, changed, strict=True):
            ep.memories.append(_row(ep, self.options, "empty", EMPTY, c, wall, None, (None, None, 0), None))
        return memory


def gold_steps(ep: Episode) -> list:
    """The gold continuation of the episode's current turn, and of no other turn or task: its reference steps."""
    reference = ep.task.reference
    return list(reference[ep.turn]) if ep.turn < len(reference) else []


class Reference:
    """Rung `reference`: the memory of this turn's gold continuation (`gold_steps`), through the same writer as a
    rehearsed memory: the summariser reads it as one imagined attempt (`reference_transcript`), or it is condensed
    as a transcript memory (`attempt_lines`, closed by the scripted caller's "Done.")."""

    def __init__(self, options: PrivateOptions) -> None:
        self.options = options

    def wants(self, ep: Episode) -> bool:
        return True

    def write(self, engine: RolloutEngine, episodes: list[Episode]) -> list[tuple[str, str | None, int]]:
        """(memory, error, summariser tokens) per episode, from its turn's gold alone."""
        o = self.options
        steps = [gold_steps(ep) for ep in episodes]
        if o.memory == "transcript":
            rows = [[{"name": s.call.name, "arguments": json.dumps(s.call.arguments, ensure_ascii=False),
                      "response": s.result.content, "is_error": s.result.is_error, "error_kind": s.result.error_kind}
                     for s in turn] for turn in steps]
            return [(transcript_memory([attempt_lines(r, ["Done."], "completed")], engine.renderer.encode,
                                       o.memory_tokens), None, 0) for r in rows]
        prompts = [engine.renderer.messages(summariser_prompt(ep.task.user_turns[ep.turn], [reference_transcript(s)],
                                                              "")) for ep, s in zip(episodes, steps, strict=True)]
        gens = engine.sampler(prompts, o.memory_tokens, greedy=True, tasks=[ep.task.uid for ep in episodes])
        return [(*parse_memory(g.text), len(g.ids)) for g in gens]

    def memories(self, engine: RolloutEngine, episodes: list[Episode]) -> list[str]:
        started = time.perf_counter()
        written = self.write(engine, episodes)
        memory = [m for m, _, _ in written]
        changed = _changed(engine, self.options, episodes, memory)
        wall = (time.perf_counter() - started) / len(episodes)
        for ep, (m, error, tokens), c in zip(episodes, written, changed, strict=True):
            gold = [(s.call.name, s.call.arguments, s.result.is_error) for s in gold_steps(ep)]
            ep.memories.append(_row(ep, self.options, "reference", m, c, wall, calls_json(gold),
                                    (1.0, 1.0, len(gold)) if gold else (None, None, 0), self.options.memory, error,
                                    tokens))
        return memory


class Copies(World):
    """Each imagined attempt's calls run in the real environment, on the attempt's own copy of its real episode's
    state (taken before its first call): the real episode's environment never sees them."""

    kind = "real"
    touches_env = False  # never an episode's own environment

    def __init__(self, real: dict[str, Episode]) -> None:
        self.real = real  # imagined attempt id -> the real episode it rehearses
        self.envs: dict[str, Any] = {}

    def answer(self, pending: list[Pending]) -> list[Answer]:
        out = []
        for p in pending:
            attempt = p.episode.episode_id
            if attempt not in self.envs:
                source = self.real[attempt].env
                copied = source.copy_state() if source is not None else None
                if copied is None:
                    raise UsageError(f"rung real: {type(source).__name__} cannot copy its state "
                                     "(Environment.copy_state); leave real out of --rungs")
                self.envs[attempt] = copied
            result = self.envs[attempt].execute(p.call)
            out.append(Answer(result, "real", result.dispatched, real=result))
        return out


def batch_seed(seed: int, episodes: list[Episode]) -> int:
    """The imagined attempts' sampling seed for one batch: the run's seed and the batch's episodes, not the calls
    made before it, so every rung's cell imagines a batch alike."""
    key = "|".join(f"{ep.episode_id}@{ep.turn}" for ep in episodes)
    return seed * 7_919 + zlib.crc32(key.encode()) % 1_000_003


class Attempts(PrivateRehearsal):
    """Rungs `real`, `rehearsed` and `select`: today's private rehearsal (`PrivateRehearsal.memories`, as it is),
    its attempts played against copies of the real state (`real`) or against the rehearser with the same calls run
    on copies beside it (`rehearsed`, `select`: the fidelity pairs; none where the state cannot be copied)."""

    concurrent = False  # a call's attempts, seed and copies are kept on the hook: one episode at a time

    def __init__(self, options: PrivateOptions, rehearser: Rehearser | None, rung: str) -> None:
        super().__init__(options, rehearser)
        self.rung = rung
        self._of: dict[str, Episode] = {}
        self._attempts: dict[str, list[Episode]] = {}
        self._seed = 0
        self._copies = False

    def _imagine(self, engine: RolloutEngine, ep: Episode, memory: str, attempt: int) -> Episode:
        imagined = super()._imagine(engine, ep, memory, attempt)
        self._of[imagined.episode_id] = ep
        self._attempts.setdefault(ep.episode_id, []).append(imagined)
        return imagined

    def _sub_engine(self, engine: RolloutEngine) -> RolloutEngine:
        sub = super()._sub_engine(engine)
        sub.sampler.seed = self._seed
        if self.rung == "real":
            sub.world = Copies(self._of)
        elif self._copies:
            sub.world = Shadow(sub.world, Copies(self._of), is_error=engine.benchmark.is_error)
        return sub

    def memories(self, engine: RolloutEngine, episodes: list[Episode]) -> list[str]:
        self._of, self._attempts = {}, {}
        self._seed = batch_seed(engine.config.seed, episodes)
        first = episodes[0].env
        self._copies = first is not None and first.copy_state() is not None
        memory = super().memories(engine, episodes)
        for ep in episodes:
            attempts = self._attempts.get(ep.episode_id, [])
            calls = [(c["name"], json.loads(c["arguments"]), c["is_error"]) for a in attempts for c in a.calls]
            pairs = [p for a in attempts for p in a.pairs]
            if self.rung == "real":
                fidelity = (1.0, 1.0, len(calls)) if calls else (None, None, 0)
            elif pairs:
                fidelity = (sum(p["value_acc"] for p in pairs) / len(pairs),
                            sum(p["exact"] for p in pairs) / len(pairs), len(pairs))
            else:
                fidelity = (None, None, 0)
            row = next(r for r in reversed(ep.memories) if r["turn"] == ep.turn)
            row.update(rung=self.rung, imagined_calls=calls_json(calls), fidelity=fidelity[0],
                       fidelity_exact=fidelity[1], fidelity_pairs=fidelity[2])
        return memory


# -- what the cells show -------------------------------------------------------------------------------------------

def turn_rows(con, ladder: str, cell: Cell, run_id: str) -> list[dict[str, Any]]:
    """The `ladder_turns` rows of one rung cell: its `memories` rows, each with its episode's checklist and the
    committed turn's first call, and whether that call copies an imagined one."""
    memories = con.execute(
        "SELECT m.episode_id, e.task_uid, m.turn, e.checklist, m.memory, m.memory_error, m.decision_changed, "
        "m.imagined_calls, m.fidelity, m.fidelity_exact, m.fidelity_pairs FROM memories m JOIN episodes e "
        "ON e.run_id = m.run_id AND e.step = m.step AND e.episode_id = m.episode_id WHERE m.run_id = ? "
        "ORDER BY m.episode_id, m.turn", [run_id]).fetchall()
    first: dict[tuple[str, int], tuple[str, str]] = {}
    for episode_id, turn, name, arguments in con.execute(
            "SELECT episode_id, turn, name, arguments FROM calls WHERE run_id = ? AND source <> 'gold' "
            "ORDER BY episode_id, turn, turn_step, call_index", [run_id]).fetchall():
        first.setdefault((episode_id, turn), (name, arguments))
    rows = []
    for (episode_id, task_uid, turn, checklist, memory, error, changed, imagined, fid, exact, n) in memories:
        committed = first.get((episode_id, turn))
        key = (committed[0], canonical(_loads(committed[1]))) if committed else None
        seen = json.loads(imagined) if imagined else []
        same = [c for c in seen if key == (c["name"], c["arguments"])]
        comparable = key is not None and bool(seen)
        rows.append({"run_id": ladder, "label": cell.label, "rung": cell.rung, "seed": cell.seed, "cell_run": run_id,
                     "episode_id": episode_id, "task_uid": task_uid, "turn": turn, "checklist": checklist,
                     "memory": memory, "memory_error": error, "decision_changed": changed, "imagined_calls": imagined,
                     "committed_call": json.dumps({"name": key[0], "arguments": key[1]}, ensure_ascii=False)
                     if key else None,
                     "copied": bool(same) if comparable else None,
                     "copied_failed": any(c["failed"] for c in same) if comparable else None,
                     "fidelity": fid, "fidelity_exact": exact, "fidelity_pairs": n})
    return rows


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _pairs(grid: list[Cell], ladder: str, label: str, a: str, b: str, seeds: list[int]) -> list[tuple[str, str]]:
    """(A's run, B's run) per seed for two rungs of one model, each pair once (a rung without seeds serves all)."""
    def run(rung: str, seed: int) -> str | None:
        found = [c for c in grid if c.label == label and c.rung == rung and c.seed in (seed, None)]
        return found[0].run_name(ladder) if found else None

    out: list[tuple[str, str]] = []
    for seed in seeds:
        pair = (run(a, seed), run(b, seed))
        if None not in pair and pair not in out:
            out.append(pair)  # type: ignore[arg-type]
    return out


def comparisons(con, ladder: str, grid: list[Cell], seeds: list[int],
                completed: Callable[[str], bool] = lambda run: True) -> list[dict[str, Any]]:
    """Per model, each rung against N = 0, then each other rung against `rehearsed` (when it ran): paired by turn and
    pooled over the seeds (`compare.row`); only pairs of `completed` cells count."""
    labels = list(dict.fromkeys(c.label for c in grid))
    rungs = [r for r in RUNGS if any(c.rung == r for c in grid)]
    rows = []
    for label in labels:
        plan = [(rung, NONE, VS_NONE) for rung in rungs]
        if "rehearsed" in rungs:
            plan += [(rung, "rehearsed", VS_REHEARSED) for rung in rungs if rung != "rehearsed"]
        for rung, against, vs in plan:
            frames = [compare.episode_pairs(con, a, b) for a, b in _pairs(grid, ladder, label, against, rung, seeds)
                      if completed(a) and completed(b)]
            if frames:
                rows.append(compare.row({"model": label, "rung": rung, "vs": vs}, frames))
    return rows


def stored(frame, ladder: str) -> list[dict[str, Any]]:
    """The comparison table (`compare.with_holm`'s) as rows of the `ladder` table."""
    out = []
    for r in frame.to_dict("records"):
        up, down = (int(v) for v in str(r["up/down"]).split("/"))
        out.append({"run_id": ladder, "label": r["model"], "rung": r["rung"], "vs": r["vs"],
                    "delta_per_seed": r["Δ per seed"], "pairs": int(r["pairs"]), "a": r["A"], "b": r["B"],
                    "delta": r["Δ = B − A"], "lo": r["_lo"], "hi": r["_hi"], "mde": r["MDE 80%"], "up": up,
                    "down": down, "mcnemar_p": r["McNemar p"], "holm_mcnemar_p": r["Holm McNemar p"],
                    "permutation_p": r["permutation p"], "holm_permutation_p": r["Holm permutation p"]})
    return out


DIAGNOSIS = ("model", "rung", "turns", "with memory", "changed", "copied", "copied a failed call", "fidelity",
             "fidelity exact")


def diagnosis(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model and rung, over every seed's turns: the share of turns with a memory (non-blank, not refused), the
    share whose committed first action it changed, the share whose committed call copies an imagined one (of the
    turns with both), and the mean fidelity of the answers it was written from (of the turns with any)."""
    def mean(values: list) -> float | None:
        values = [float(v) for v in values if v is not None]
        return sum(values) / len(values) if values else None

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in turns:
        groups.setdefault((r["label"], r["rung"]), []).append(r)
    order = {r: k for k, r in enumerate(RUNGS)}
    return [{"model": label, "rung": rung, "turns": len(rows),
             "with memory": mean([bool((r["memory"] or "").strip()) for r in rows]),
             "changed": mean([r["decision_changed"] for r in rows]), "copied": mean([r["copied"] for r in rows]),
             "copied a failed call": mean([r["copied_failed"] for r in rows]),
             "fidelity": mean([r["fidelity"] for r in rows]),
             "fidelity exact": mean([r["fidelity_exact"] for r in rows])}
            for (label, rung), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99)))]


def write_tables(run, frame, turns: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The ladder's tables in its run: `ladder` (and ladder.csv, as printed), `ladder_turns` (one shard per cell)
    and the diagnosis per rung (diagnosis.csv); returns the diagnosis."""
    run.write("ladder", "comparisons", stored(frame, run.run_id) if not frame.empty else [])
    _csv(run.path / "ladder.csv", frame[[c for c in frame.columns if not str(c).startswith("_")]].to_dict("records")
         if not frame.empty else [])
    for cell_run, rows in turns.items():
        run.write("ladder_turns", cell_run, rows)
    for shard in (run.path / "ladder_turns").glob("*.parquet"):  # a cell being redone, or no longer in the grid
        if shard.stem not in turns:
            shard.unlink()
    summary = diagnosis([r for rows in turns.values() for r in rows])
    _csv(run.path / "diagnosis.csv", summary)
    return summary


def _csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        if rows:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
