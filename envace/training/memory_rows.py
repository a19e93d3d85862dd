"""Memory-aware SFT rows (`[train.sft] memory`): caller turns whose prompt carries a rehearsal memory.

Private rehearsal appends a `<rehearsal_memory>` block to the user message of the turn it rehearsed; the SFT rows
of `rows.reference_rows` never show one, so every committed turn with a memory is out of SFT's distribution. Here,
for every user turn k of a train task, the scripted reference policy plays the task once more through the real
engine with a before-turn hook that hands turn k (and no other) a memory: the caller rows of turn k are the very
prompts private rehearsal makes at a turn-k commit (the memory in that turn's user message), and their targets are
still the gold calls. One copy per caller row of the plain set, then.

The memory, as the summariser is trained to write one (`prompts.reference_memory`, the target of the summariser's
SFT rows: the calls in order with what they returned):

- `reference`: of the turn's gold continuation (its gold calls and their real answers), and nothing else;
- `rehearsed`: of one imagined attempt the model being trained plays, before SFT, against its own rehearser from
  the gold history so far (`PrivateRehearsal`'s attempt: parallel, N = 1, `[rollout.private]`'s defaults), its
  calls with the results the rehearser imagined. Such a memory may be wrong; the target stays the gold call, so the
  caller learns to read a memory, not to copy it. The attempts are drawn from the training seed and the weights
  before SFT, so a warm-up resumed from `sft_state.pt` rebuilds the same rows (the state is loaded after them).

Train tasks only: a test-split task is refused before anything is played, as the example bank refuses one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace

from envace.build import build_engine
from envace.config import ONE_ATTEMPT, PrivateOptions, RehearserOptions, RolloutConfig, TrainConfig
from envace.engine.episode import Episode
from envace.engine.examples import ExampleBank
from envace.engine.prompts import reference_memory
from envace.engine.rollout import RolloutEngine
from envace.envs.registry import Benchmark
from envace.policy.backend import Backend
from envace.policy.scripted import ReferencePolicy
from envace.policy.specs import REFERENCE_MODEL
from envace.private.rehearsal import PrivateRehearsal
from envace.training.grpo import Row
from envace.types import Role, Task

Writer = Callable[[RolloutEngine, list[Episode]], list[str]]


class TurnMemory:
    """The before-turn hook of memory rows: the episode with group index k gets `write`'s memory at turn k only."""

    def __init__(self, write: Writer) -> None:
        self.write = write

    def wants(self, ep: Episode) -> bool:
        return ep.turn == ep.group_index

    def memories(self, engine: RolloutEngine, episodes: list[Episode]) -> list[str]:
        return self.write(engine, episodes)


def gold_memory(engine: RolloutEngine, episodes: list[Episode]) -> list[str]:
    """`reference`: the memory of each episode's current turn's gold continuation."""
    return [reference_memory(ep.task.reference[ep.turn] if ep.turn < len(ep.task.reference) else [])
            for ep in episodes]


def attempt_memory(attempt: Episode, turn: int) -> str:
    """The memory of an imagined attempt's calls in `turn` with their imagined results, written as
    `reference_memory` writes the gold's."""
    steps = [SimpleNamespace(call=SimpleNamespace(name=c["name"], arguments=json.loads(c["arguments"])),
                             result=SimpleNamespace(content=c["response"]))
             for c in attempt.calls if c["turn"] == turn]
    return reference_memory(steps)


class Imagined:
    """`rehearsed`: each memory from one imagined attempt of `backend` (the model before SFT) against its own
    rehearser, played from the reference episode's history (`PrivateRehearsal`'s sub-engine and attempt)."""

    def __init__(self, backend: Backend, benchmark: Benchmark, config: RolloutConfig, examples: ExampleBank,
                 options: PrivateOptions = ONE_ATTEMPT) -> None:
        self.engine = build_engine(backend, benchmark, config, examples)
        self.rehearsal = PrivateRehearsal(options)

    def __call__(self, engine: RolloutEngine, episodes: list[Episode]) -> list[str]:
        sub = self.rehearsal._sub_engine(self.engine)  # the rehearsed world of the model, not the scripted one
        attempts = [self.rehearsal._imagine(self.engine, ep, "", 0) for ep in episodes]
        sub.play(attempts)
        return [attempt_memory(a, ep.turn) for ep, a in zip(episodes, attempts, strict=True)]


def memory_rows(tasks: list[Task], benchmark: Benchmark, tokenizer, rehearser: RehearserOptions,
                caller_demo: bool = False, examples: ExampleBank | None = None, tool_docs: str = "full",
                write: Writer = gold_memory, seed: int = 0) -> list[Row]:
    """A copy of every caller row of `rows.reference_rows(tasks, …)` with `write`'s memory in the user message of
    its turn (the module docstring); the same prompts otherwise, the gold call as target."""
    test = [t.uid for t in tasks if t.split != "train"]
    if test:
        raise ValueError(f"memory-aware SFT rows come from train-split tasks only, and {test[0]} is a "
                         f"{next(t.split for t in tasks if t.split != 'train')}-split task")
    policy = ReferencePolicy(tokenizer, tasks)
    rows: list[Row] = []
    for category in dict.fromkeys(t.category for t in tasks):  # one engine per category, every turn in one batch
        cfg = RolloutConfig(env=benchmark.name, category=category, split="train", mode="real", model=REFERENCE_MODEL,
                            batch_size=1, embedding=False, rehearser=rehearser, caller_demo=caller_demo,
                            tool_docs=tool_docs, seed=seed)
        engine = build_engine(policy, benchmark, cfg, examples)
        engine.before_turn = TurnMemory(write)
        batch = [(t, k) for t in tasks if t.category == category for k in _turns(t)]
        for ep in engine.run_batch(batch):
            rows += [Row(ep.task.uid, g.role, list(g.prompt(ep.ids)), list(g.gen.ids), 1.0)
                     for g in ep.generations if g.role == Role.CALLER and g.turn == ep.group_index]
    return rows


def _turns(task: Task) -> range:
    """The user turns a memory row is made for: every scripted one (a conversation's first: its user writes the
    others as it goes)."""
    return range(task.start_turn, 1 if task.simulated_user is not None else len(task.user_turns))


def sft_memory_rows(cfg: TrainConfig, policy) -> list[Row]:
    """`cfg.sft.memory`'s rows for the first `sft.tasks` train tasks of `policy` (`setup.Policy`): reference
    memories, or memories of attempts the policy's model imagines now, before SFT."""
    tasks = policy.train_tasks[: cfg.sft.tasks]
    write: Writer = gold_memory
    if cfg.sft.memory == "rehearsed":
        from envace.policy.hf import HFBackend
        from envace.units import auto_max_new_tokens

        budget = cfg.rollout.max_new_tokens if isinstance(cfg.rollout.max_new_tokens, int) else \
            auto_max_new_tokens(policy.train_tasks, policy.tok)
        played = replace(cfg.rollout, model=REFERENCE_MODEL, mode="real", max_new_tokens=budget, seed=cfg.seed,
                         private=PrivateOptions())
        write = Imagined(HFBackend(policy.model, policy.tok, cfg.rollout.max_batch_tokens), policy.benchmark, played,
                         policy.bank)
    return memory_rows(tasks, policy.benchmark, policy.tok, cfg.rollout.rehearser, cfg.rollout.caller_demo,
                       policy.bank, cfg.rollout.tool_docs, write, cfg.seed)
