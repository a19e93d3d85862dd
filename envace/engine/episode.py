"""One attempt at a task while it is played: its caller context, and everything it will record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envace.envs.base import Environment
from envace.policy.backend import Generation
from envace.types import Task, ToolCall


@dataclass
class Generated:
    """One model output of one role: a row of `generations`, and the unit of training.

    A caller's prompt is the episode's context up to `prompt_len` (token ids exactly as generated), or
    `prompt_ids` once the context was re-rendered past it (`past_thinking = "drop"`); a rehearser's or a
    simulated user's prompt is its own (`prompt_ids`). `reward`, `advantage` and
    `trained` are filled in by whoever scores or trains on the row, and stored as they were used.
    """

    role: str
    turn: int
    turn_step: int
    gen: Generation
    prompt_len: int
    prompt_ids: list[int] | None = None
    call_index: int | None = None
    user_message: str | None = None
    n_calls: int | None = None
    parse_error: str | None = None
    parse_detail: str | None = None
    reward: float | None = None
    advantage: float | None = None
    trained: bool = False
    policy_version: int | None = None  # training: the updates the sampling weights had had (`training.actor`)

    def prompt(self, context: list[int]) -> list[int]:
        return self.prompt_ids if self.prompt_ids is not None else context[: self.prompt_len]


@dataclass
class Episode:
    """One attempt at a task, with its growing caller context and what it will store.

    `env` is the episode's own environment; an imagined attempt (private rehearsal) has none, only the
    real episode's `tools`, so nothing in it can execute a real call.
    """

    episode_id: str
    task: Task
    group_index: int
    env: Environment | None
    tools: dict[str, dict[str, Any]]
    ids: list[int] = field(default_factory=list)
    # (start, stop) in `ids` of each caller message since past messages were last re-rendered: the ids after the
    # message's header through its <|im_end|> (`past_thinking.drop_past_thinking`)
    caller_spans: list[tuple[int, int]] = field(default_factory=list)
    prompt_tokens: int = 0
    turn: int = 0
    turn_step: int = 0
    steps: list[list[list[ToolCall]]] = field(default_factory=lambda: [[]])  # dispatched calls, for the checker
    issued: list[list[ToolCall]] = field(default_factory=lambda: [[]])  # every call per turn, for the checklist
    history: list[tuple[str, str]] = field(default_factory=list)  # the conversation as the rehearser reads it
    latest: str = ""
    texts: list[str] = field(default_factory=list)  # the caller's plain answers, for checkers that read them
    awaiting_user: bool = False  # a simulated user writes the next user turn before the caller goes on
    user_view: list[dict[str, Any]] = field(default_factory=list)  # the conversation as the simulated user sees it
    generations: list[Generated] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    termination: str | None = None
    started: float = field(default_factory=time.perf_counter)
    started_at: float = field(default_factory=time.time)  # the run's clock, for timelines
    actor: int | None = None  # training: the rollout actor that played it (Ray's actor index, or the process rank)
    ended: float | None = None  # perf_counter when it terminated (`RolloutEngine.play`): its own wall time, not
    # its batch's, so an episode done after one turn is not charged the slowest one's
    # seconds of it in flight with its next request ready, held back by other episodes' work: its generations'
    # `held_s` (finished before the rest of their backend call) and the loop's phases it had no part in (`idle_share`)
    wait_s: float = 0.0
    demo: list[dict[str, Any]] | None = None  # the caller's worked example, re-rendered with a memory
    open_turn: bool = False  # the current user turn awaits its private-rehearsal memory before rendering
    # the current turn's first caller message, already written by the imagined attempt private rehearsal chose
    # (`memory = "select"`): the engine commits it instead of sampling one
    chosen: Generation | None = None
    memories: list[dict[str, Any]] = field(default_factory=list)  # one per privately rehearsed turn
    imagined: list[dict[str, Any]] = field(default_factory=list)  # one per imagined attempt
    shadowed: bool | None = None  # drawn once by a partial shadow: does the real world answer beside?

    def record(self, role: str, gen: Generation, prompt_len: int, **fields: Any) -> Generated:
        """Keep one generation of `role` at the episode's current turn and step."""
        row = Generated(role, self.turn, self.turn_step, gen, prompt_len, **fields)
        self.generations.append(row)
        self.wait_s += gen.held_s or 0.0
        return row

    @property
    def wall_s(self) -> float:
        """Seconds from the start to the end of this episode (to now while it runs)."""
        return (self.ended if self.ended is not None else time.perf_counter()) - self.started

    def of_role(self, role: str) -> list[Generated]:
        return [g for g in self.generations if g.role == role]


def idle_share(episodes: list[Episode]) -> float | None:
    """The idle share of episode slots: of the seconds episodes were in flight, the share they sat with their next
    request ready while the loop waited on other episodes (`Episode.wait_s`). Near 0 in the per-episode loop; in
    lock-step, what the slowest episode of each step costs the others. None for no time at all."""
    wall = sum(ep.wall_s for ep in episodes)
    return sum(ep.wait_s for ep in episodes) / wall if wall > 0 else None


@dataclass(frozen=True)
class Pending:
    """A call waiting for its answer: the episode, its position among the message's calls, the call."""

    episode: Episode
    index: int
    call: ToolCall
