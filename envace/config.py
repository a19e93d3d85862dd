"""Typed job configs. Each field documents itself; configs live in TOML files under `experiments/`.

`load_config(path, cls)` reads a TOML table into a dataclass and rejects unknown keys, wrong types
and impossible values with one clear message, before any model is loaded.
"""

from __future__ import annotations

import tomllib
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from envace.errors import UsageError
from envace.types import Mode, Split


def doc(help_text: str, default: Any = MISSING) -> Any:
    """A dataclass field whose `help` is shown by `envace … --help` and in docs."""
    return field(default=default, metadata={"help": help_text})


@dataclass
class RehearserOptions:
    """What the rehearser sees and how its output is handled (sections of `rehearser_prompt`)."""

    system: bool = doc("the validate-first system instruction", True)
    tools: str = doc("tools shown: called (all names + the called tool's schema) | all (every schema) | none",
                     "called")
    response_schema: bool = doc("the called tool's response schema, where the benchmark has one", True)
    fewshot: str = doc("grounding examples: reference (this task's real results) | other_tasks (train tasks "
                       "only, leakage-free) | none", "reference")
    max_examples: int = doc("grounding examples shown, same tool first", 8)
    demo_turn: bool = doc("show the first grounding example as an answered turn in the output format", False)
    history: bool = doc("the flattened conversation so far", True)
    latest_message: bool = doc("the caller's latest raw message", True)
    max_new_tokens: int = doc("token budget of one rehearsal", 128)
    on_error: str = doc("a malformed rehearsal that is fed back: end_episode (reference) | feed_error", "end_episode")

    def validate(self) -> None:
        _choice("rehearser.tools", self.tools, ["called", "all", "none"])
        _choice("rehearser.fewshot", self.fewshot, ["reference", "other_tasks", "none"])
        _choice("rehearser.on_error", self.on_error, ["end_episode", "feed_error"])
        if self.max_examples < 0 or self.max_new_tokens < 1:
            raise UsageError("rehearser.max_examples must be >= 0 and rehearser.max_new_tokens >= 1")


@dataclass
class PrivateOptions:
    """Test-time private rehearsal: imagined attempts in the rehearsed world, condensed into a memory,
    before one committed real execution (`envace.rehearsal.private`)."""

    mode: str = doc("none | parallel (N independent attempts, one summary) | sequential (attempt k sees the "
                    "memory of attempts 1..k-1 and revises it)", "none")
    budget: int = doc("imagined attempts N per rehearsed turn; 0 is exactly the plain policy", 0)
    scope: str = doc("turn (rehearse each user turn before it) | episode (rehearse the whole scripted episode "
                     "once, before the first turn)", "turn")
    max_steps: int = doc("caller messages per user turn in an imagined attempt", 2)
    memory_tokens: int = doc("token budget of the rehearsal memory the summariser writes", 96)
    temperature: float = doc("sampling temperature of imagined attempts (parallel attempts need > 0 to differ)",
                             1.0)
    measure_change: bool = doc("also generate the committed turn's first action without the memory (greedy) and "
                               "record whether the memory changed it", False)

    def validate(self) -> None:
        _choice("private.mode", self.mode, ["none", "parallel", "sequential"])
        _choice("private.scope", self.scope, ["turn", "episode"])
        if self.budget < 0:
            raise UsageError(f"private.budget must be >= 0, got {self.budget}")
        if self.max_steps < 1 or self.memory_tokens < 1 or self.temperature < 0:
            raise UsageError("private.max_steps and private.memory_tokens must be >= 1, private.temperature >= 0")

    @property
    def active(self) -> bool:
        return self.mode != "none" and self.budget > 0


@dataclass
class RolloutConfig:
    """One rollout job: a model plays episodes of one benchmark category."""

    env: str = doc("benchmark name (see `envace.envs.registry`)", "bfcl")
    category: str = doc("benchmark category, e.g. multi_turn_base", "multi_turn_base")
    split: str = doc("train | test | all (BFCL: scenario i % 4 == 3 is test)", Split.TEST.value)
    limit: int | None = doc("number of tasks (None = all of the split)", None)
    offset: int = doc("skip this many tasks of the split first", 0)
    mode: str = doc("who answers tool calls: real | rehearse | rehearse+shadow | real+shadow", Mode.REAL.value)
    model: str = doc("`default` (embedded SmolLM2-135M-Instruct), `tiny`, or a local model path", "default")
    group_size: int = doc("rollouts per task (GRPO's G)", 1)
    batch_size: int = doc("episodes advanced together; one store shard per batch", 8)
    max_steps_per_turn: int = doc("caller messages per user turn before the episode is cut (BFCL: 20)", 20)
    max_new_tokens: int = doc("token budget of one caller message", 256)
    temperature: float = doc("sampling temperature; 0 = greedy", 0.0)
    top_p: float = doc("nucleus sampling mass", 1.0)
    seed: int = doc("seed for sampling", 0)
    on_parse_error: str = doc("a malformed caller message: end_turn (BFCL-like) | end_episode (reference)", "end_turn")
    max_batch_tokens: int = doc("padded tokens per backend micro-batch (memory bound)", 32768)
    rehearser: RehearserOptions = field(default_factory=RehearserOptions,
                                        metadata={"help": "the rehearser role (modes other than real)"})
    caller_demo: bool = doc("show the caller one worked call of a train task with the same tools", False)
    tool_docs: str = doc("tools in the caller prompt: full (JSON schemas) | compact (name, one line, argument types)",
                         "full")
    real_fraction: float = doc("rehearse mode: share of calls the real environment answers instead (Dyna-style mix)",
                               0.0)
    private: PrivateOptions = field(default_factory=PrivateOptions,
                                    metadata={"help": "test-time private rehearsal before committed turns"})
    frozen_rehearser: bool = doc("rehearse with the base weights, adapters off (caller-only training)", False)
    embedding: bool = doc("embedding cosine for pairs (all-MiniLM-L6-v2, offline)", True)
    decision_sample: float = doc("share of pairs forked to test whether the next action changes", 0.0)
    user_model: str = doc("simulated users (τ²): the model playing the user, local or `http://…/v1?model=NAME` "
                          "(an OpenAI-compatible server); empty = the policy itself", "")
    user_max_new_tokens: int = doc("simulated users: token budget of one user message", 128)
    max_user_turns: int = doc("simulated users: user messages before the episode is cut (user_turn_limit)", 10)

    def validate(self) -> None:
        from envace.envs import registry

        bench = registry.get(self.env)
        if self.category not in bench.categories:
            raise UsageError(f"unknown {self.env} category '{self.category}' "
                             f"(choose from {', '.join(bench.categories)})")
        _choice("split", self.split, [s.value for s in Split])
        _choice("mode", self.mode, [m.value for m in Mode])
        _choice("on_parse_error", self.on_parse_error, ["end_turn", "end_episode"])
        _choice("tool_docs", self.tool_docs, ["full", "compact"])
        for name in ("group_size", "batch_size", "max_steps_per_turn", "max_new_tokens", "max_batch_tokens",
                     "user_max_new_tokens", "max_user_turns"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"limit must be at least 1, got {self.limit}")
        if self.offset < 0 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise UsageError("offset and temperature must be >= 0 and top_p in (0, 1]")
        for name in ("decision_sample", "real_fraction"):
            if not 0 <= getattr(self, name) <= 1:
                raise UsageError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        self.rehearser.validate()
        self.private.validate()
        if self.private.active and self.rehearser.fewshot == "reference" and self.split != Split.TRAIN:
            raise UsageError("private rehearsal on test tasks must not see their reference results: "
                             "set rehearser.fewshot = \"other_tasks\" (or \"none\")")
        from envace.policy.models import check_model_spec

        check_model_spec(self.model)
        if self.user_model:
            check_model_spec(self.user_model)


def _choice(name: str, value: str, allowed: list[str]) -> None:
    if value not in allowed:
        raise UsageError(f"unknown {name} '{value}' (choose from {', '.join(allowed)})")


def _type_ok(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or hint)


def from_dict(cls: type, data: dict[str, Any], where: str = "config"):
    """Build dataclass `cls` from `data`, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise UsageError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    data = dict(data)
    for key, value in data.items():
        if is_dataclass(hints[key]) and isinstance(value, dict):
            data[key] = from_dict(hints[key], value, where=f"{where}.{key}")
        elif not _type_ok(value, hints[key]):
            raise UsageError(f"{where}: '{key}' should be {hints[key]}, got {value!r}")
    cfg = cls(**data)
    if hasattr(cfg, "validate"):
        cfg.validate()
    return cfg


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"config file {p} does not exist")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{p}: malformed TOML ({exc})") from None


@dataclass
class TrainConfig:
    """SFT warm-up on train-split reference trajectories, then role-wise GRPO in the rehearsed world."""

    model: str = doc("`default`, `tiny`, or a local model path", "default")
    dtype: str = doc("weights' dtype: float32 (CPU) | bfloat16 (GPU)", "float32")
    env: str = doc("benchmark name", "bfcl")
    category: str = doc("benchmark category (train split only)", "multi_turn_base")
    seed: int = doc("seed for sampling and task order", 0)
    lora: bool = doc("train LoRA adapters (peft) instead of every weight", False)
    lora_rank: int = doc("LoRA rank", 16)
    gradient_checkpointing: bool = doc("recompute activations in the backward pass: less memory, ~30% more time",
                                       False)
    sft_tasks: int = doc("train tasks whose reference rows form the SFT set (0 = no warm-up)", 8)
    sft_epochs: int = doc("passes over the SFT rows", 2)
    sft_lr: float = doc("SFT learning rate (AdamW)", 3e-5)
    rows_per_step: int = doc("rows per optimiser step in SFT (one GRPO step takes the whole batch)", 4)
    grpo_steps: int = doc("role-wise GRPO updates", 4)
    tasks_per_step: int = doc("train tasks per GRPO step", 2)
    group_size: int = doc("rollouts per task (G)", 4)
    lr: float = doc("GRPO learning rate (AdamW; the reference uses 1e-6 at 8B)", 1e-5)
    scale_by_std: bool = doc("divide advantages by the group std (off in the reference)", False)
    shard_optimizer: bool = doc("with several processes, shard AdamW's moments across them (ZeRO stage 1: "
                                "a full fine-tune's optimizer state is 2x the weights in fp32)", False)
    fsdp: bool = doc("with several processes, shard weights, gradients and AdamW's moments across them (FSDP2, "
                     "one unit per decoder layer); rollouts run on a whole copy synced after each update. "
                     "`accelerate launch` with an FSDP config (experiments/accelerate_fsdp.yaml) sets it", False)
    save_every: int = doc("GRPO steps between resumable states (`state.pt`, overwritten atomically)", 1)
    max_new_tokens: int = doc("token budget of one caller message in rollouts", 64)
    max_steps_per_turn: int = doc("caller messages per user turn in rollouts", 2)
    temperature: float = doc("rollout sampling temperature (reference: 1.0)", 1.0)
    caller_demo: bool = doc("show the caller one worked call of another train task", False)
    tool_docs: str = doc("tools in the caller prompt: full | compact (about a third of the tokens on BFCL)", "full")
    real_fraction: float = doc("Dyna-style mix: share of calls answered by the real environment at the first "
                               "GRPO step (variant envace / caller_only)", 0.0)
    real_fraction_end: float | None = doc("anneal real_fraction linearly to this by the last step (None = constant)",
                                         None)
    eval_every: int = doc("GRPO steps between evaluations on test-split tasks (0 = none)", 0)
    eval_limit: int = doc("test-split tasks per evaluation (real environment, rehearser as shadow, greedy)", 4)
    variant: str = doc("envace (both roles, rehearsed world) | caller_only (rehearser frozen: base weights, "
                       "needs lora) | real_env (environment answers; only the caller is trained)", "envace")
    rehearser: RehearserOptions = field(default_factory=RehearserOptions, metadata={"help": "the rehearser role"})

    def validate(self) -> None:
        from envace.envs import registry
        from envace.policy.models import check_model_spec

        bench = registry.get(self.env)
        if self.category not in bench.categories:
            raise UsageError(f"unknown {self.env} category '{self.category}'")
        for name in ("sft_epochs", "rows_per_step", "tasks_per_step", "group_size", "max_new_tokens",
                     "max_steps_per_turn", "lora_rank", "save_every", "eval_limit"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.sft_tasks < 0 or self.grpo_steps < 0 or self.eval_every < 0:
            raise UsageError("sft_tasks, grpo_steps and eval_every must be >= 0")
        _choice("tool_docs", self.tool_docs, ["full", "compact"])
        for value in (self.real_fraction, self.real_fraction_end):
            if value is not None and not 0 <= value <= 1:
                raise UsageError(f"real_fraction and real_fraction_end must be in [0, 1], got {value}")
        _choice("variant", self.variant, ["envace", "caller_only", "real_env"])
        _choice("dtype", self.dtype, ["float32", "bfloat16", "float16"])
        if self.variant == "caller_only" and not self.lora:
            raise UsageError("variant caller_only needs lora = true: the frozen rehearser is the base model "
                             "with the caller's adapters switched off")
        if self.fsdp and self.shard_optimizer:
            raise UsageError("fsdp already shards the optimizer state: drop shard_optimizer")
        if self.lr <= 0 or self.sft_lr <= 0 or self.temperature < 0:
            raise UsageError("learning rates must be > 0 and temperature >= 0")
        self.rehearser.validate()
        check_model_spec(self.model)

    @property
    def trained_roles(self) -> tuple[str, ...]:
        return ("caller", "rehearser") if self.variant == "envace" else ("caller",)

    def real_fraction_at(self, step: int) -> float:
        if self.real_fraction_end is None or self.grpo_steps < 2:
            return self.real_fraction
        return self.real_fraction + (self.real_fraction_end - self.real_fraction) * step / (self.grpo_steps - 1)

    def rollout(self, step: int = 0) -> RolloutConfig:
        """The rollout settings of GRPO step `step`: the rehearsed world, or the real one for `real_env`."""
        mode = "real" if self.variant == "real_env" else "rehearse"
        return RolloutConfig(env=self.env, category=self.category, split="train", mode=mode,
                             frozen_rehearser=self.variant == "caller_only",
                             model=self.model, group_size=self.group_size, batch_size=self.tasks_per_step *
                             self.group_size, max_steps_per_turn=self.max_steps_per_turn,
                             max_new_tokens=self.max_new_tokens, temperature=self.temperature, seed=self.seed,
                             on_parse_error="end_episode", rehearser=self.rehearser, caller_demo=self.caller_demo,
                             tool_docs=self.tool_docs, real_fraction=self.real_fraction_at(step), embedding=False)

    def evaluation(self) -> RolloutConfig:
        """Evaluation settings: test split, real environment with the rehearser as shadow, greedy."""
        return RolloutConfig(env=self.env, category=self.category, split="test", limit=self.eval_limit,
                             mode="real+shadow", model=self.model, batch_size=self.eval_limit,
                             max_steps_per_turn=self.max_steps_per_turn, max_new_tokens=self.max_new_tokens,
                             temperature=0.0, seed=self.seed, rehearser=self.rehearser,
                             caller_demo=self.caller_demo, tool_docs=self.tool_docs, embedding=False)
