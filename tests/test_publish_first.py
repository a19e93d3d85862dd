"""With rollouts ahead of the update, the new weights reach the actor before the learner writes the step's rows:
the actor plays the step they unlock while the store is written (`loop.overlapped`, `Dispatcher.advance`)."""

from __future__ import annotations

import threading

from envace.config import TrainConfig
from envace.training.actor import Played
from envace.training.learner import BaseLearner, StepResult
from envace.training.loop import Trainer, overlapped
from envace.training.staleness import local_dispatcher


class Actor:
    """Plays instantly; says when each step began."""

    def __init__(self) -> None:
        self.version, self.began = 0, {}

    def holds(self, version: int) -> bool:
        return self.version == version

    def load(self, weights, version: int) -> float:
        self.version = version
        return 0.0

    def offer(self, weights, version: int) -> None:
        pass

    def play(self, step: int, tasks) -> Played:
        self.began.setdefault(step, threading.Event()).set()
        return Played(step, self.version, [], [], 0.0, 0.0)


class Learner(BaseLearner):
    def step(self, played: Played) -> StepResult:
        return StepResult(played, [], [], {})

    def weights(self) -> dict:
        return {}


class Recorder:
    """Writes a step's rows only once the actor has begun the step its update unlocked (or gives up)."""

    def __init__(self, actor: Actor, staleness: int, steps: int) -> None:
        self.actor, self.staleness, self.steps, self.waited = actor, staleness, steps, {}

    def record(self, result: StepResult) -> None:
        unlocked = result.played.step + self.staleness + 1
        if unlocked < self.steps:
            began = self.actor.began.setdefault(unlocked, threading.Event())
            self.waited[result.played.step] = began.wait(timeout=5)

    def say(self, text: str) -> None:
        pass

    def waited_for(self, played, wait_s: float) -> None:
        pass


class Procs:
    def share(self, items):
        return list(items)


def test_the_actor_plays_the_unlocked_step_before_the_rows_are_written(monkeypatch):
    import envace.training.loop as loop

    monkeypatch.setattr(loop, "save_state", lambda *args: None)
    cfg = TrainConfig(model="tiny", grpo={"steps": 4, "tasks_per_step": 1, "max_staleness": 1, "importance_cap": 2.0},
                      rollout={"temperature": 1.0})
    actor = Actor()
    recorder = Recorder(actor, cfg.grpo.max_staleness, cfg.grpo.steps)
    trainer = Trainer(cfg, None, Procs(), Learner(), recorder, pool=["unit"])
    overlapped(trainer, local_dispatcher(trainer, actor, 0, {0: {}}), 0)
    # steps 0 and 1 unlock steps 2 and 3: each began while its unlocking step's rows were still unwritten
    assert recorder.waited == {0: True, 1: True}
