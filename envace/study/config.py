"""`[study]`: the controlled study's design (its `[rollout]` table is the evaluation, its `[train]` the recipe)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from envace.config import Config, RolloutConfig, TrainConfig, at_least, doc, load_toml, within
from envace.errors import UsageError

ArmName = Literal["envace", "caller_only", "real_env", "fidelity", "control", "random", "memory"]

# What each arm changes in the recipe's [train] table (`random` is not trained: `random_update.py`).
ARMS: dict[str, dict] = {
    "envace": {},
    "caller_only": {"grpo": {"variant": "caller_only"}},
    "real_env": {"grpo": {"variant": "real_env"}},
    "fidelity": {"grpo": {"rehearser_reward": "task+fidelity"}, "rollout": {"shadow_fraction": 1.0}},
    # the same steps and random draws with a learning rate too small to move a weight: what the draws alone
    # give (caller-only: cheaper, and the same samples)
    "control": {"grpo": {"variant": "caller_only", "lr": 1e-12}},
    # GRPO as envace, from an SFT of its own: the seed's SFT with memory-aware rows (`Study.sft`, SFT_ARMS)
    "memory": {},
}
# Arms that start from an SFT of their own instead of the seed's: the same recipe, seed and tasks, with the [train]
# fields these give for the study's design.
SFT_ARMS: dict[str, Callable[[StudyConfig], dict]] = {"memory": lambda design: {"sft": {"memory": design.memory_sft}}}


@dataclass
class StudyConfig(Config):
    """The design: seeds, arms, the GRPO pool's screen, and what is measured after training."""

    seeds: list[int] = doc("one SFT run, one screen and every arm per seed", factory=lambda: [0, 1, 2])
    arms: list[ArmName] = doc(
        "envace | caller_only | real_env | fidelity (task+fidelity reward, every episode shadowed) | control "
        "(lr = 1e-12: sampling noise alone) | random (the SFT weights plus a random update with envace's norm, "
        "tensor by tensor: weight drift alone; needs envace) | memory (memory-aware SFT, [train.sft] memory = "
        "memory_sft, on the seed's SFT tasks, measured as its own stage, then GRPO as envace on the seed's pool; "
        "with private_seeds its SFT and GRPO checkpoints get their own private-rehearsal sweep, stage "
        "private-memory). Not in the default list",
        factory=lambda: ["envace", "caller_only", "real_env", "fidelity", "control", "random"])
    floor_sizes: list[int] = doc("SFT sizes (train tasks) tried first, with the first seed, each evaluated on every "
                                 "test turn: the seeds' SFT takes the smallest whose success reaches floor_target "
                                 "(none does: the largest, and the report shows the curve); empty = [train.sft] "
                                 "tasks", factory=list)
    floor_target: float = doc("the share of test turns the SFT checkpoint must succeed on, so that a gain or a "
                              "loss can show", 0.15)
    pool_tasks: int = doc("train tasks SFT never saw whose turns form GRPO's pool, screened before training", 8)
    screen_group_size: int = doc("rollouts per unit in the pool's screen (GRPO's G: a unit whose G rewards all "
                                 "agree gives a group no signal)", 8)
    pool_max: int = doc("units kept from the screen: those whose rewards differ, spread over as many scenarios as "
                        "they can (none differ: the first units of the screen, and the report says so)", 8)
    world_model_limit: int | None = doc("test tasks whose gold calls the world-model benchmark rehearses (unset "
                                        "= every one)", None)
    private_budgets: list[int] = doc("private rehearsal: imagined attempts N before the real one",
                                     factory=lambda: [0, 1, 2])
    private_modes: list[Literal["parallel", "sequential"]] = doc("private rehearsal modes",
                                                                 factory=lambda: ["parallel", "sequential"])
    private_seeds: list[int] | None = doc("the seeds whose SFT and envace checkpoints are swept for private "
                                          "rehearsal (unset = every seed; [] = none)", None)
    memory_sft: Literal["rehearsed", "reference"] = doc(
        "arm memory: the memories its SFT's memory-aware rows carry ([train.sft] memory): rehearsed (of one attempt "
        "the model imagines before SFT) | reference (of the turn's gold continuation)", "rehearsed")

    def validate(self) -> None:
        at_least(self, 1, "pool_tasks", "screen_group_size", "pool_max", "world_model_limit")
        within(self, 0, 1, "floor_target")
        if any(not isinstance(n, int) or n < 1 for n in self.floor_sizes) or len(set(self.floor_sizes)) != len(
                self.floor_sizes):
            raise UsageError(f"floor_sizes: expected distinct sizes >= 1, got {self.floor_sizes!r}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise UsageError(f"seeds: expected distinct seeds, got {self.seeds!r}")
        if not self.arms or len(set(self.arms)) != len(self.arms):
            raise UsageError(f"arms: expected distinct arms, got {self.arms!r}")
        if "random" in self.arms and "envace" not in self.arms:
            raise UsageError("arms: random takes the norm of envace's update; add envace")
        if not self.private_budgets or any(not isinstance(b, int) or b < 0 for b in self.private_budgets):
            raise UsageError(f"private_budgets: expected integers >= 0, got {self.private_budgets!r}")
        if self.swept and "envace" not in self.arms:
            raise UsageError("private_seeds: private rehearsal sweeps each seed's SFT and envace checkpoints; add "
                             "envace to arms, or set private_seeds = []")
        unknown = sorted(set(self.private_seeds or []) - set(self.seeds))
        if unknown:
            raise UsageError(f"private_seeds: {unknown[0]} is not one of the seeds {self.seeds}")

    @property
    def swept(self) -> list[int]:
        return self.seeds if self.private_seeds is None else self.private_seeds


@dataclass(frozen=True)
class Study:
    """A study file, read and checked: the design, the evaluation's rollout config and the training recipe."""

    design: StudyConfig
    evaluation: RolloutConfig
    recipe: TrainConfig

    @classmethod
    def load(cls, path: str | Path) -> Study:
        raw = load_toml(path)
        for table in ("study", "rollout", "train"):
            if not isinstance(raw.get(table), dict):
                raise UsageError(f"{path} has no [{table}] table")
        unknown = sorted(set(raw) - {"study", "rollout", "train"})
        if unknown:
            raise UsageError(f"{path}: unknown table(s) {', '.join(unknown)} (a study has [study], [rollout] and "
                             "[train])")
        design = StudyConfig.from_dict(raw["study"], where=f"{path} [study]")
        evaluation = RolloutConfig.from_dict(raw["rollout"], where=f"{path} [rollout]")
        recipe = TrainConfig.from_dict(raw["train"], where=f"{path} [train]").resolve()
        if not recipe.sft.tasks or not recipe.sft.epochs:
            raise UsageError(f"{path} [train]: a study starts every seed with its own SFT; set sft.tasks and "
                             "sft.epochs")
        if recipe.grpo.pool_overlap or recipe.grpo.units is not None:
            raise UsageError(f"{path} [train]: the study draws GRPO's pool itself, from tasks SFT never saw; drop "
                             "grpo.pool_overlap and grpo.units")
        study = cls(design, replace(evaluation, split="test"), recipe)
        for arm in design.arms:  # each arm's own checks (caller_only needs lora, …) before anything runs
            study.arm(arm, seed=design.seeds[0])
            study.sft(design.seeds[0], arm=arm)
        return study

    def arm(self, arm: str, seed: int, model: str | None = None, units: list[str] | None = None) -> TrainConfig:
        """The recipe as `arm` trains it from `model` (an SFT checkpoint) on the screened `units`, no SFT of its
        own; `random`, which is not trained, is checked as envace."""
        changes = ARMS.get(arm, {})
        grpo = {**changes.get("grpo", {}), "tasks_per_step": len(units) if units else self.recipe.grpo.tasks_per_step}
        if units is not None:
            grpo["units"] = units
        table = {**changes, "sft": {"tasks": 0}, "seed": seed, "grpo": grpo}
        return TrainConfig.from_dict(table | ({"model": model} if model else {}), where=f"arm {arm}",
                                     base=self.recipe)

    def sft(self, seed: int, tasks: int | None = None, arm: str | None = None) -> TrainConfig:
        """The recipe's SFT alone, with `seed`, on `tasks` train tasks (unset: the recipe's sft.tasks); with an arm
        of SFT_ARMS, that arm's own SFT."""
        recipe = self.recipe
        sft = replace(recipe, seed=seed, grpo=replace(recipe.grpo, steps=0), eval=replace(recipe.eval, every=0),
                      sft=replace(recipe.sft, tasks=tasks or recipe.sft.tasks))
        own = SFT_ARMS.get(arm)
        return TrainConfig.from_dict(own(self.design), where=f"arm {arm}", base=sft) if own else sft
