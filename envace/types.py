"""The shared vocabulary: roles, modes, tool calls and results, tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    """Who produced a generation. Caller and rehearser share one set of weights."""

    CALLER = "caller"
    REHEARSER = "rehearser"
    SUMMARISER = "summariser"
    USER = "user"  # the simulated user of a conversational benchmark (τ²); never trained by default


class Mode(StrEnum):
    """Who answers the caller's tool calls during a rollout.

    `real`: the environment. `rehearse`: the policy as rehearser; no environment is touched.
    `rehearse+shadow`: the rehearsal is fed back while the environment executes the same call for the
    ledger only. `real+shadow`: the environment's response is fed back and the policy also rehearses it.
    """

    REAL = "real"
    REHEARSE = "rehearse"
    REHEARSE_SHADOW = "rehearse+shadow"
    REAL_SHADOW = "real+shadow"


class Split(StrEnum):
    TRAIN = "train"
    TEST = "test"
    ALL = "all"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: a function name and its JSON keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a tool (real or rehearsed) returned. `content` is the text the caller sees.

    `error_kind` names why a call failed: a validation kind (`TOOL_NOT_AVAILABLE`,
    `INVALID_PARAMETERS`: the call was refused and never dispatched), `EXECUTION_ERROR` (the tool raised)
    or `TOOL_ERROR` (the tool returned an error value). Empty on success.
    """

    content: str
    is_error: bool = False
    error_kind: str = ""

    @property
    def dispatched(self) -> bool:
        """False when validation refused the call, so the environment's state never saw it."""
        return self.error_kind not in ("TOOL_NOT_AVAILABLE", "INVALID_PARAMETERS")


@dataclass(frozen=True)
class ReferenceStep:
    """One ground-truth call of a task with the response the real environment gave it."""

    call: ToolCall
    result: ToolResult


@dataclass(frozen=True)
class SimulatedUser:
    """A task whose user is played by a model (τ²): its instructions, the agent's greeting it answers
    first, and the signals in a user message that end the conversation.

    `script` is what a scripted user says instead, message by message, the last one ending the conversation:
    the user's side of the reference (SFT rows of a conversation are played against it). Empty: the
    benchmark has no script for this task, and nothing that needs one can run on it.
    """

    system_prompt: str
    greeting: str
    stop_signals: tuple[str, ...]
    tools: list[dict[str, Any]] = field(default_factory=list)  # the user's own tools (τ² telecom)
    script: tuple[str, ...] = ()

    def stopped(self, text: str | None) -> bool:
        """Whether a user message ends the conversation (τ²'s UserSimulator.is_stop)."""
        return text is not None and any(signal in text for signal in self.stop_signals)


@dataclass
class Task:
    """One benchmark item, benchmark-independent.

    `user_turns[k]` is the user message that opens turn k; `tools_added[k]` are tool schemas that
    become available at turn k (BFCL miss_func). With `simulated_user` set, a model writes the user
    turns instead, as the conversation goes (`user_turns[0]` is then only a stand-in opening).
    `reference[k]` is the ground-truth trajectory of turn k replayed on a fresh environment.
    `payload` keeps the benchmark's own item for its checker. A turn task (`start_turn` = k > 0) is a task
    truncated to turns 0..k, played from turn k after its gold prefix.
    """

    uid: str
    env: str
    category: str
    split: str
    scenario: int
    system_prompt: str
    tools: list[dict[str, Any]]
    user_turns: list[str]
    reference: list[list[ReferenceStep]]
    tools_added: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    simulated_user: SimulatedUser | None = None
    start_turn: int = 0  # turns before it are replayed from the gold reference (`envace.units`)
    # The most caller messages a turn of this task may take, whatever the rollout allows (BFCL's single-turn items
    # are scored on one message); None: the rollout's `max_steps_per_turn`.
    max_steps_per_turn: int | None = None
    # Tasks that must stay on one side of the train/test split (near-duplicates, one instruction with
    # several start states). The split and the leakage guard compare groups, never texts; empty means
    # the task is its own group (`envace.types.task_group`).
    group: str = ""


def task_group(task: Task) -> str:
    """The group a task belongs to for splits and leakage: its `group`, else its benchmark and scenario."""
    return task.group or f"{task.env}/{task.scenario}"


@dataclass(frozen=True)
class Score:
    """The benchmark's own verdict on an episode.

    `success` is the binary official verdict. `value` is a graded official metric in [0, 1] where the
    benchmark has one (partial credit, process accuracy); None means `float(success)`. `subscores` are
    named graded parts (per-rubric results, say), stored as JSON beside the verdict.
    """

    success: bool
    detail: str = ""
    value: float | None = None
    subscores: dict[str, float] = field(default_factory=dict)

    @property
    def graded(self) -> float:
        return float(self.success) if self.value is None else float(self.value)
