"""The recorder: what a training run keeps of each step, in the store and in the experiment tracker.

    metrics(step, phase, values)   one row per (role, name): phase `sft`, `grpo` or `eval`
    record(result)                 a GRPO step: its per-role metrics, its episodes (`record.write_step`), one line
    evaluation(updates, scores)    an evaluation's scores, one line

Process 0 writes the metrics and speaks for all; every process stores its own share of a step's episodes
(`step-KKKKK-pR` shards), so the store holds the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from envace import record
from envace.config import TrainConfig
from envace.engine.episode import Episode
from envace.store import Run
from envace.trackers import Tracker, keyed, open_tracker
from envace.training.distributed import Processes
from envace.training.grpo import Row, signal_groups
from envace.training.learner import StepResult
from envace.types import Role

# Advantage histogram buckets stored per step and role: (name, lower bound, upper bound).
_ADV_BINS = (("lt_-0.5", -float("inf"), -0.5), ("-0.5_-0.1", -0.5, -0.1), ("-0.1_0.1", -0.1, 0.1),
             ("0.1_0.5", 0.1, 0.5), ("ge_0.5", 0.5, float("inf")))


def _std(values: torch.Tensor) -> float:
    return values.std().item() if len(values) > 1 else 0.0


def step_metrics(rows: list[Row], advantages: list[float], episodes: list[Episode], scored: list[dict[str, Any]],
                 stats: dict[str, Any], real_fraction: float) -> dict[str, dict[str, float]]:
    """Per-role metrics of one GRPO step (this process's share of the batch): the update's numeric statistics
    under `all`, and per trained role its rewards, advantages (spread and histogram), tokens and error rate."""
    per_role: dict[str, dict[str, float]] = {"all": {k: v for k, v in stats.items() if isinstance(v, int | float)}}
    signal = signal_groups(rows)
    for role in (Role.CALLER, Role.REHEARSER):
        picked = [i for i, r in enumerate(rows) if r.role == role]
        if picked:
            rewards = torch.tensor([rows[i].reward for i in picked])
            adv = torch.tensor([advantages[i] for i in picked])
            errors = sum(g.parse_error is not None for ep in episodes for g in ep.of_role(role))
            per_role[role.value] = {
                "rows": len(picked), "reward_mean": rewards.mean().item(), "reward_std": _std(rewards),
                "adv_mean": adv.mean().item(), "adv_std": _std(adv), "adv_abs_mean": adv.abs().mean().item(),
                "tokens": sum(len(rows[i].completion_ids) for i in picked), "error_rate": errors / len(picked),
                "signal_groups": signal.get(role.value, 0.0),
                **{f"adv_bin_{name}": float(((adv >= lo) & (adv < hi)).sum()) for name, lo, hi in _ADV_BINS}}
    per_role["all"].update(checklist_mean=sum(r["checklist"] for r in scored) / len(scored),
                           real_fraction=real_fraction,
                           rehearsal_errors=sum(r["n_rehearsal_errors"] for r in scored),
                           parse_errors=sum(r["n_parse_errors"] for r in scored))
    return per_role


class Recorder:
    """Writes a run's steps into `run` and `tracker` (module docstring); `say` prints one line."""

    def __init__(self, run: Run, procs: Processes, say: Callable[[str], None], tracker: Tracker | None = None,
                 steps: int = 0, staleness: int = 0) -> None:
        self.run, self.procs, self.say, self.tracker = run, procs, say, tracker or Tracker()
        self.steps, self.staleness = steps, staleness  # for the step line: "step k/steps", "sampled s ago"

    @classmethod
    def open(cls, cfg: TrainConfig, run: Run, procs: Processes, say: Callable[[str], None]) -> Recorder:
        """The recorder of a training run, with the experiment tracker `report_to` names on process 0."""
        tracker = open_tracker(cfg.report_to, run, asdict(cfg)) if procs.main else None
        return cls(run, procs, say, tracker, cfg.grpo.steps, cfg.grpo.max_staleness)

    def metrics(self, step: int, phase: str, values: dict[str, dict[str, float]], shard: str) -> None:
        """One step's metrics (per role) into the store, and the same numbers to the experiment tracker."""
        self.run.write("metrics", shard, [{"run_id": self.run.run_id, "step": step, "phase": phase, "role": role,
                                           "name": name, "value": float(v)}
                                          for role, named in values.items() for name, v in named.items()])
        self.tracker.log(keyed(phase, values), step)

    def sft(self, step: int, values: dict[str, float]) -> None:
        """One SFT step's metrics (process 0 calls it)."""
        self.metrics(step, "sft", {"all": values}, f"sft-{step:05d}")

    def waited_for(self, played, wait_s: float) -> None:
        """How long the learner waited for a step played ahead, and how empty the actors' slots were meanwhile."""
        self.say(f"  learner waited {wait_s:.1f} s for step {played.step + 1}"
                 + ("" if played.slot_idle is None else f"; actors' slots idle {played.slot_idle:.0%}"))

    def failed(self, played) -> None:
        """Groups of a step that failed for good (`Played.failed`): one row each in `failures`, and a line."""
        self.say(f"GRPO step {played.step + 1}: {len(played.failed)} group(s) failed and are left out of the update "
                 f"(first: {played.failed[0]['task']}: {played.failed[0]['error']})")
        if self.procs.main:
            self.run.write("failures", f"step-{played.step:05d}",
                           [{"run_id": self.run.run_id, "step": played.step, "task_uid": f["task"],
                             "chunk": f["chunk"], "error": f["error"]} for f in played.failed])
            if not played.episodes:
                self.metrics(played.step, "grpo", {"all": {"failed_groups": float(len(played.failed))}},
                             f"step-{played.step:05d}")

    def dropped(self, step: int, version: int) -> None:
        """A step sampled more than `grpo.max_staleness` versions ago: counted, never trained on."""
        self.say(f"GRPO step {step + 1}: sampled by policy version {version}, {step - version} behind: dropped")
        if self.procs.main:
            self.metrics(step, "grpo", {"all": {"dropped_stale_steps": 1.0}}, f"step-{step:05d}")

    def record(self, result: StepResult) -> dict[str, dict[str, float]]:
        """A GRPO step: per-role metrics (process 0), this process's episodes, and the step's line."""
        played, stats = result.played, result.stats
        if stats["rows_over_budget"]:
            self.say(f"  warning: {stats['rows_over_budget']} row(s) over packing.max_tokens = {result.budget} left "
                     "out of the update")
        per_role = step_metrics(result.rows, result.advantages, played.episodes, played.scored, stats,
                                played.real_fraction)
        shard = f"step-{played.step:05d}" + (f"-p{self.procs.rank}" if self.procs.world > 1 else "")
        if self.procs.main:
            self.metrics(played.step, "grpo", per_role, shard)
        record.write_step(self.run, played.step, played.episodes, played.scored, shard)
        roles = [role for role in ("caller", "rehearser") if role in per_role]
        signal = ", ".join(f"{role} {per_role[role]['signal_groups']:.0%}" for role in roles)
        adv = ", ".join(f"{role} ±{per_role[role]['adv_std']:.3f}" for role in roles)
        self.say(f"GRPO step {played.step + 1}/{self.steps}: {len(result.rows)} rows, checklist "
                 f"{per_role['all']['checklist_mean']:.3f}, groups with signal: {signal or '-'}; "
                 f"advantage spread {adv or '-'}; loss {stats['loss']:.4f}; {stats['rows_skipped']} row(s) with "
                 f"advantage 0 not back-propagated" + (" (skipped: non-finite)" if stats["skipped"] else "")
                 + ("" if stats["updated"] or stats["skipped"] else " (no update: every advantage 0)")
                 + (f"; sampled {result.staleness} version(s) ago" if self.staleness else ""))
        return per_role

    def evaluation(self, updates: int, scores: dict[str, float]) -> None:
        """An evaluation's scores at `updates` (every process calls; process 0 writes)."""
        if self.procs.main:
            self.metrics(updates, "eval", {"all": scores}, f"eval-{updates:05d}")
        self.procs.wait()
        self.say(f"  eval after {updates} update(s): success {scores['success_rate']:.2f}, checklist "
                 f"{scores['checklist']:.3f}, well-formed {scores['well_formed_rate']:.2f}, rehearsal exact "
                 f"{scores.get('exact', 0.0):.2f} over {scores['pairs']} pairs")

    def close(self) -> None:
        self.tracker.close()
