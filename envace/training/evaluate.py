"""Evaluation during training: greedy episodes on test tasks in the real environment, the rehearser as a shadow.

    episodes = the first `eval.limit` test tasks, greedy, leakage-free grounding   # `TrainConfig.evaluation`
    scores = official success, checklist, well-formed calls                         # summed over processes
           + the rehearser's fidelity against the real environment                  # the ledger over stored pairs

Every process plays its share and stores its own shard, so the numbers are those of one process playing them
all. An actor plays (`RolloutActor.evaluate`, or Ray's actors); `scores` reads back what they stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envace import ledger, record, rewards, units
from envace.build import build_engine
from envace.config import TrainConfig
from envace.engine.episode import Episode
from envace.engine.examples import ExampleBank
from envace.envs.registry import Benchmark
from envace.store import Run
from envace.training.distributed import Processes

FIDELITY = ("valid_json", "exact", "structure_f1", "value_acc", "error_agree")


def evaluate(actor, recorder, updates: int, weights: dict | None = None) -> None:
    """The evaluation after `updates` updates, played by `actor` (a `RolloutActor`, or Ray's actors; given
    `weights` first, when they are not its own), scored and recorded (`recorder.Recorder.evaluation`)."""
    if weights is not None:
        actor.load(weights, updates)
    recorded(updates, recorder, *actor.evaluate(updates))


def recorded(updates: int, recorder, episodes: list[Episode], rows: list[dict[str, Any]]) -> None:
    """The evaluation after `updates` updates, played (`episodes`, `rows`), stored, scored and recorded."""
    recorder.evaluation(updates, scores(recorder.run, recorder.procs, updates, episodes, rows))


def play(cfg: TrainConfig, benchmark: Benchmark, bank: ExampleBank, generator, backend, updates: int,
         share: Callable[[list], list]) -> tuple[list[Episode], list[dict[str, Any]]]:
    """`share` of the evaluation's test tasks played greedily by `generator` through `backend`, scored, rewards
    shared."""
    generator.eval()
    backend.clear_caches()  # nothing cached under the weights before this update
    rollout, tasks = units.select(cfg.evaluation(), benchmark, backend.tokenizer)
    tasks = share(tasks)
    engine = build_engine(backend, benchmark, rollout, bank, id_prefix=f"eval{updates}:")
    episodes = engine.run_batch([(t, 0) for t in tasks]) if tasks else []
    rows = [record.score(ep, rollout.mode, "eval") for ep in episodes]
    for ep, row in zip(episodes, rows, strict=True):
        rewards.share(ep.generations, row["checklist"])
    return episodes, rows


def scores(run: Run, procs: Processes, updates: int, episodes: list[Episode],
           rows: list[dict[str, Any]]) -> dict[str, float]:
    """Store this process's evaluation episodes and return the scores of every process's (module docstring).
    Every process must call."""
    import duckdb  # here, not at the top: the training job imports this module where only Parquet is written

    shard = f"eval-{updates:05d}"
    if episodes:
        record.write_step(run, updates, episodes, rows, shard + (f"-p{procs.rank}" if procs.world > 1 else ""))
    counts = record.summarise(episodes, rows)
    for name in ("episodes", "successes", "checklist", "caller_messages", "parse_errors", "well_formed"):
        setattr(counts, name, procs.total(getattr(counts, name)))
    summary = counts.as_dict()
    out = {k: summary[k] for k in ("success_rate", "checklist", "well_formed_rate", "parse_error_rate")}
    procs.wait()  # every process's pairs are stored
    pairs = sorted((run.path / "pairs").glob(f"{shard}*.parquet"))
    source = "read_parquet([" + ", ".join(f"'{p}'" for p in pairs) + "], union_by_name = true)"
    overall = ledger.means(ledger.tool_sums(duckdb.connect(), source, run.run_id)) if pairs else None
    overall = overall[overall["tool"] == "all"] if overall is not None else []
    out["pairs"] = int(overall["pairs"].iloc[0]) if len(overall) else 0
    out["rehearsal_error_rate"] = float(overall["malformed"].iloc[0]) if len(overall) else 0.0
    out.update({k: float(overall[k].iloc[0]) for k in FIDELITY if len(overall)})
    return out
