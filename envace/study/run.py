"""`envace study FILE`: the controlled study as one resumable command (the design: `envace/study/__init__.py`).

Every stage is a run named `NAME-<stage>-s<seed>` beside the study's own run (`NAME`, kind `study`), which keeps
the design, the pools and, at the end, `report.md` and `figure.html`. A re-run keeps every completed stage,
resumes an interrupted training from its `state.pt` (or its SFT from `sft_state.pt`) and plays any other
interrupted stage again from scratch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from envace import compare
from envace.config import PrivateOptions, RolloutConfig, extends, nest, results_only
from envace.envs import registry
from envace.errors import UsageError
from envace.jobs import Reporter, eval_job, rollout_job, sweep_job, train_job, world_model_job
from envace.store import Run, check_run_id, connect, get_run
from envace.study.config import SFT_ARMS, Study
from envace.study.random_update import random_update
from envace.study.report import Tables, figure, floor_table
from envace.study.screen import spread_units
from envace.training.pool import inherited
from envace.types import task_group


class Stages:
    """The study's runs under `root`: which are done, and doing one once."""

    def __init__(self, root: Path, name: str, total: int, reporter: Reporter):
        self.root, self.name, self.total, self.reporter, self.at = root, name, total, reporter, 0

    def run(self, stage: str, seed: int) -> str:
        return f"{self.name}-{stage}-s{seed}"

    def completed(self, run: str) -> bool:
        meta = self.root / run / "run.json"
        return meta.exists() and get_run(self.root, run).get("status") == "completed"

    def checkpoint(self, stage: str, seed: int) -> str:
        return str(self.root / self.run(stage, seed) / "checkpoint")

    def once(self, stage: str, seed: int, job) -> None:
        """`job(run name, resume)` unless the stage completed before; an unfinished run is resumed when it can
        be (`job` says so by taking `resume`), else removed and done again."""
        run = self.run(stage, seed)
        self.at += 1
        if self.completed(run):
            self.reporter.say(f"[{self.at}/{self.total}] {run}: done already, kept")
            return
        resume = any((self.root / run / f).exists() for f in ("state.pt", "sft_state.pt"))
        if (self.root / run).exists() and not resume:
            shutil.rmtree(self.root / run)
        self.reporter.say(f"[{self.at}/{self.total}] {run}" + (" (resumed)" if resume else ""))
        job(run, resume)


def _pool_tasks(study: Study, sft: str) -> list[str]:
    """The uids of the first `pool_tasks` train tasks the SFT checkpoint `sft` never saw."""
    cfg = study.recipe.rollout
    seen = inherited(sft)
    tasks = registry.get(cfg.env).load_tasks(cfg.category, "train")
    unseen = [t.uid for t in tasks if task_group(t) not in seen][: study.design.pool_tasks]
    if not unseen:
        raise UsageError(f"pool_tasks: every {cfg.category} train task is in a scenario SFT trained on")
    return unseen


def screen_config(study: Study, model: str, seed: int) -> RolloutConfig:
    """The pool sampled as GRPO samples it (the rehearsed world, G per unit, the recipe's temperature), with one
    seed per study seed: the screens before and after training draw episode k of a unit alike, so they pair."""
    g = study.design.screen_group_size
    return replace(study.recipe.rollout, model=model, split="train", mode="rehearse", limit=None, offset=0,
                   group_size=g, batch_size=max(study.recipe.rollout.batch_size, 4 * g), seed=seed,
                   private=PrivateOptions(), real_fraction=0.0, shadow_fraction=0.0, frozen_rehearser=False)


def _sizes(design) -> tuple[int, int]:
    """(the stages the study steps through, the distinct stage runs it holds): the first seed's SFT and evaluation
    are the floor's own, when there is a floor."""
    own = sum(arm in SFT_ARMS for arm in design.arms)  # an arm with its own SFT: that SFT, its eval and wm, its sweep
    total = 2 * len(design.floor_sizes) + len(design.seeds) * (4 + 4 * len(design.arms) + 3 * own) + \
        len(design.swept) * (1 + own)
    return total, total - (2 if design.floor_sizes else 0)


def _saved_pools(saved: Path) -> dict[int, dict[str, Any]]:
    return {int(k): v for k, v in json.loads(saved.read_text()).items()} if saved.exists() else {}


def study_job(path: str | Path, root: str | Path = "runs", name: str | None = None,
              reporter: Reporter | None = None) -> tuple[Run, Path]:
    """Run (or go on with) the study in `path` under `root`; returns its run and the report's path."""
    reporter = reporter or Reporter()
    study, root = Study.load(path), Path(root)
    name = check_run_id(name or Path(path).stem)
    design = study.design
    run = _study_run(root, name, _config(study))
    total, held = _sizes(design)
    stages = Stages(root, name, total, reporter)
    run.update(summary={"stages": held})
    saved = run.path / "pools.json"  # each seed's pool, once chosen: a re-run trains on the same units
    pools = _saved_pools(saved)
    with run.running():
        floor = _floor(study, stages)
        for seed in design.seeds:
            _seed(study, stages, seed, pools, saved, floor["chosen"])
            if seed in design.swept:
                stages.once("private", seed, lambda r, _, s=seed: sweep_job(
                    r, {"sft": stages.checkpoint(sft_stage(floor["chosen"]), s), "envace":
                        stages.checkpoint("envace", s)},
                    design.private_modes, design.private_budgets, study.evaluation, root, reporter))
                for arm in (a for a in design.arms if a in SFT_ARMS):  # its own SFT, and GRPO from it
                    stages.once(f"private-{arm}", seed, lambda r, _, s=seed, a=arm: sweep_job(
                        r, {f"sft_{a}": stages.checkpoint(own_sft_stage(floor["chosen"], a), s),
                            a: stages.checkpoint(a, s)},
                        design.private_modes, design.private_budgets, study.evaluation, root, reporter))
        out = write_report(study, stages, pools, floor, run.path)
    run.update(status="completed", summary={"report": str(out), "stages": held})
    reporter.say(f"report: {out}")
    return run, out


def report_so_far(path: str | Path, root: str | Path = "runs", name: str | None = None) -> Path:
    """`envace study FILE --so-far`: the report's tables over the stages completed so far, in `report-so-far.md`
    (and `figure-so-far.html`) beside the final report's place. It runs nothing and writes nothing else, so it can
    be read while the study runs; a seed whose pool the study has not saved yet gets it from its screen, as the
    study will."""
    study, root = Study.load(path), Path(root)
    name = check_run_id(name or Path(path).stem)
    if not (root / name / "run.json").exists():
        raise UsageError(f"no study '{name}' in {root}: `envace study {path}` starts it")
    if not _same_study(root, name, _config(study)):
        raise UsageError(f"run '{name}' in {root} is not this study (another design or kind): pick another --name")
    design, stages = study.design, Stages(root, name, 0, Reporter())
    floor = _floor_so_far(study, stages)
    if floor["chosen"] is None:
        raise UsageError(f"study '{name}': no SFT size has been evaluated yet, so there is nothing to report")
    pools, stage = _saved_pools(root / name / "pools.json"), sft_stage(floor["chosen"])
    for seed in design.seeds:
        screen = stages.run(f"screen-{stage}", seed)
        if seed not in pools and stages.completed(screen):
            units, spread = spread_units(connect(root), screen, design.pool_max)
            pools[seed] = {"units": units, "spread": spread,
                           "tasks": _pool_tasks(study, stages.checkpoint(stage, seed))}
    staged = re.compile(re.escape(name) + r"-.+-s\d+")  # as `envace show` counts: not a sweep's cells
    done = sum(stages.completed(p.name) for p in root.iterdir() if staged.fullmatch(p.name))
    return write_report(study, stages, pools, floor, root / name, so_far=f"{done} of {_sizes(design)[1]}")


def _config(study: Study) -> dict[str, Any]:
    """What the study's run stores as its design."""
    return {"study": asdict(study.design), "rollout": asdict(study.evaluation), "train": asdict(study.recipe)}


def _same_study(root: Path, name: str, config: dict[str, Any]) -> bool:
    """Whether the run `name` is a study of this design (save for fields added since it was stored)."""
    stored = get_run(root, name)
    design, asked = stored.get("config"), json.loads(json.dumps(config))
    if isinstance(design, dict) and isinstance(design.get("train"), dict):  # an earlier release's flat keys nested
        design = {**design, "train": results_only(nest(design["train"]))}
        asked = {**asked, "train": results_only(asked["train"])}
    return stored.get("kind") == "study" and extends(design, asked)


def _study_run(root: Path, name: str, config: dict[str, Any]) -> Run:
    """The study's own run, created, or reopened by a re-run of the same design (another design under the same
    name would mix two studies' stages: refused)."""
    if not (root / name / "run.json").exists():
        return Run.create(root, "study", config, config["train"]["model"], name)
    if not _same_study(root, name, config):
        raise UsageError(f"run '{name}' in {root} is not this study (another design or kind): pick another --name")
    run = Run(root, name)
    run.update(status="running", pid=os.getpid())
    return run


def _floor(study: Study, stages: Stages) -> dict[str, Any]:
    """The base off the floor: each of `floor_sizes` SFT'd with the first seed and evaluated on every test turn
    (stages `sft-nN`, `eval-sft-nN`: the first seed's own SFT, of the size chosen, is one of them). `chosen` is
    the size the seeds' SFT takes (the smallest whose success reaches floor_target, else the largest; the
    recipe's sft.tasks without floor_sizes), `success` each size's share of test turns succeeded."""
    design, root = study.design, stages.root
    if not design.floor_sizes:
        return _floor_so_far(study, stages)
    seed = design.seeds[0]
    for n in sorted(design.floor_sizes):
        cfg = study.sft(seed, n)
        stages.once(f"sft-n{n}", seed, lambda r, resume, cfg=cfg: train_job(
            cfg, root, None if resume else r, r if resume else None, stages.reporter))
        checkpoint = stages.checkpoint(f"sft-n{n}", seed)
        stages.once(f"eval-sft-n{n}", seed, lambda r, _, c=checkpoint: eval_job(c, study.evaluation, root, r,
                                                                                 stages.reporter))
    floor = _floor_so_far(study, stages)
    reached = floor["success"][floor["chosen"]] >= design.floor_target
    stages.reporter.say(f"SFT size: {floor['chosen']} train tasks (" + (
        f"the smallest with success ≥ {design.floor_target:.0%}" if reached
        else f"none reached {design.floor_target:.0%}: the largest") + ")")
    return floor


def _floor_so_far(study: Study, stages: Stages) -> dict[str, Any]:
    """`_floor`'s result from the floor's evaluations completed so far (all of them, once `_floor` has run);
    `chosen` is None while none has completed."""
    design = study.design
    if not design.floor_sizes:
        return {"chosen": study.recipe.sft.tasks, "success": {}}
    runs = {n: stages.run(f"eval-sft-n{n}", design.seeds[0]) for n in sorted(design.floor_sizes)}
    success = {n: float(get_run(stages.root, run)["summary"]["success_rate"]) for n, run in runs.items()
               if stages.completed(run)}
    reached = [n for n, rate in success.items() if rate >= design.floor_target]
    return {"chosen": min(reached) if reached else max(success, default=None), "success": success}


def sft_stage(tasks: int) -> str:
    """The SFT stage of `tasks` train tasks (a floor size's and a seed's SFT of that size are one stage)."""
    return f"sft-n{tasks}"


def own_sft_stage(tasks: int, arm: str) -> str:
    """The SFT stage of an arm that starts from an SFT of its own (`SFT_ARMS`), on the same `tasks` train tasks."""
    return f"{sft_stage(tasks)}-{arm}"


def _seed(study: Study, stages: Stages, seed: int, pools: dict[int, dict[str, Any]], saved: Path,
          sft_tasks: int) -> None:
    """One seed's SFT, screen and arms (the module docstring); its pool, once chosen, goes into `pools` and the
    file `saved`, so a re-run trains on the same units."""
    root, say = stages.root, stages.reporter.say
    stage = sft_stage(sft_tasks)
    stages.once(stage, seed, lambda r, resume: train_job(study.sft(seed, sft_tasks), root, None if resume else r,
                                                         r if resume else None, stages.reporter))
    sft = stages.checkpoint(stage, seed)
    _measure(study, stages, stage, seed, sft)
    tasks = _pool_tasks(study, sft)
    stages.once(f"screen-{stage}", seed, lambda r, _: rollout_job(screen_config(study, sft, seed), root, r,
                                                             reporter=stages.reporter, only=tasks))
    pool = pools.get(seed)
    if pool is None:
        units, spread = spread_units(connect(root), stages.run(f"screen-{stage}", seed), study.design.pool_max)
        pool = {"units": units, "spread": spread, "tasks": tasks}
        if not spread:
            say(f"seed {seed}: no unit of the screen has rewards that differ; the arms train on {len(units)} of "
                "its units, where no GRPO group has a signal")
        pools[seed] = pool
        saved.write_text(json.dumps(pools, indent=1))
    for arm in study.design.arms:
        if arm == "random":
            stages.once("random", seed, lambda r, _: _random(study, stages, r, seed, sft_tasks))
        else:
            start = sft
            if arm in SFT_ARMS:  # its own SFT first (the same seed and tasks: the pool holds none of them either)
                own = own_sft_stage(sft_tasks, arm)
                stages.once(own, seed, lambda r, resume, a=arm: train_job(
                    study.sft(seed, sft_tasks, a), root, None if resume else r, r if resume else None,
                    stages.reporter))
                start = stages.checkpoint(own, seed)
                _measure(study, stages, own, seed, start)
            cfg = study.arm(arm, seed, model=start, units=pool["units"])
            stages.once(arm, seed, lambda r, resume, cfg=cfg: train_job(cfg, root, None if resume else r,
                                                                        r if resume else None, stages.reporter))
        checkpoint = stages.checkpoint(arm, seed)
        _measure(study, stages, arm, seed, checkpoint)
        stages.once(f"screen-{arm}", seed, lambda r, _, c=checkpoint: rollout_job(
            screen_config(study, c, seed), root, r, reporter=stages.reporter, only=tasks))


def _measure(study: Study, stages: Stages, stage: str, seed: int, checkpoint: str) -> None:
    """A checkpoint on every test turn of the evaluation, and the world-model benchmark on the test gold calls."""
    root, design = stages.root, study.design
    stages.once(f"eval-{stage}", seed, lambda r, _: eval_job(checkpoint, study.evaluation, root, r, stages.reporter))
    stages.once(f"wm-{stage}", seed, lambda r, _: world_model_job(
        checkpoint, replace(study.evaluation, limit=design.world_model_limit), root, r,
        stages.reporter))


def _random(study: Study, stages: Stages, name: str, seed: int, sft_tasks: int) -> None:
    """The random-update control of this seed, stored as a run holding its checkpoint."""
    sft, trained = stages.checkpoint(sft_stage(sft_tasks), seed), stages.checkpoint("envace", seed)
    run = Run.create(stages.root, "random-update", {"start": sft, "trained": trained, "seed": seed}, sft, name)
    with run.running():
        summary = random_update(sft, trained, run.path / "checkpoint", seed, study.recipe.policy.dtype)
    run.update(status="completed", summary=summary)


def write_report(study: Study, stages: Stages, pools: dict, floor: dict[str, Any], folder: Path,
                 so_far: str | None = None) -> Path:
    """report.md (and figure.html) in the study's folder from what the stages stored; with `so_far` ("k of N"
    stages completed), report-so-far.md and figure-so-far.html, saying so at the top."""
    design = study.design
    tables = Tables(connect(stages.root), lambda stage, s: stages.run(stage, s), stages.completed,
                           design.seeds, design.arms, design.swept, design.private_modes, design.private_budgets,
                           pools, sft_stage(floor["chosen"]),
                           {arm: own_sft_stage(floor["chosen"], arm) for arm in design.arms if arm in SFT_ARMS})
    sections = {
        "Test turns: each arm against the SFT checkpoint it started from": tables.test_turns(),
        "Test turns: each arm against the controls": tables.controls(),
        "The pool's screen after training against before": tables.screens(),
        "World model on the test gold calls: each arm against SFT": tables.world_model(),
        "Private rehearsal: N imagined attempts against none": tables.private(),
    }
    lines = [f"# Study {stages.name}", "", f"Seeds {design.seeds}; arms {', '.join(design.arms)}. Every row pairs "
             "A and B item by item and pools the seeds; intervals resample tasks. A and B are mean checklist "
             "scores (the share of a turn's checks passed; 1 is success), save in the world-model table, whose "
             "metric column names its score; McNemar counts the items scored (> 0) on one side only.", ""]
    if so_far:
        lines[2:2] = [f"**So far: {so_far} stages completed.** Stages not completed are left out of every table "
                      "(a seed is in a row once both of that row's stages are done); the study's own report.md "
                      "replaces this one.", ""]
    for seed, pool in sorted(pools.items(), key=lambda kv: int(kv[0])):
        units = len(pool["units"])
        lines.append(f"- seed {seed}: GRPO on {units} unit{'s' * (units != 1)} of {len(pool['tasks'])} train tasks "
                     f"SFT never saw ({pool['spread']} of the screen's units had rewards that differ)")
    if floor["success"]:
        lines += ["", "## The base off the floor: test-turn success against SFT size (first seed)", "",
                  compare.markdown(floor_table(tables, floor["success"], floor["chosen"])), "",
                  f"The seeds' SFT uses {floor['chosen']} train tasks: " + (
                      f"the smallest size whose success reaches {design.floor_target:.0%}."
                      if floor["success"][floor["chosen"]] >= design.floor_target else
                      f"no size reached {design.floor_target:.0%}, so the largest; read the rest with that floor in "
                      "mind.")]
    shown = {}
    for title, rows in sections.items():
        frame, caption = compare.with_holm(rows)
        lines += ["", f"## {title}", ""]
        lines += [compare.markdown(frame), "", caption] if rows else ["(no completed pair of stages yet)"]
        shown[title] = frame
    suffix = "-so-far" if so_far else ""
    out = folder / f"report{suffix}.md"
    out.write_text("\n".join(lines) + "\n")
    figure({"test turns vs SFT": shown[next(iter(sections))],
                   "world model vs SFT": shown["World model on the test gold calls: each arm against SFT"]},
                  folder / f"figure{suffix}.html")
    return out
