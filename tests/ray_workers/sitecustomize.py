"""Imported by every Python process started while this folder is on PYTHONPATH: the Ray workers of
tests/test_ray.py (the simulated cluster's nodes are started with it; the test process itself is not).

- `ENVACE_TEST_HALF_GOLD=1`: the tiny model's messages are half swapped for the gold ones (`half_gold`), as
  tests/test_staleness.py does in-process, so that rewards differ within a group and updates happen.
- `ENVACE_TEST_FORBIDDEN=DIR`: any file operation under DIR (the driver's runs folder) raises: no worker may
  read or write a path of the driver's.
- `ENVACE_TEST_PLAY_FAILS=MARKER`: while the file MARKER does not exist, the next actor to play step 2 (step 1)
  creates it and times out as a served backend does on a server that never answers (`play_fails_once`: the
  backend's own request, 1 s, to a socket that accepts and stays silent).
- `ENVACE_TEST_SLOW_ACTOR=FILE`: while FILE exists and holds "I S", Ray actor I sleeps S seconds a group before it
  plays (`slow_actor`): a slow actor for the work queue to route around.
- `ENVACE_TEST_HOLD_FOR_OFFER=FILE`: while FILE exists, under partial rollouts an actor that holds version 0 when
  its chunk of step 2 (step 1) has made its first backend call waits there until a newer version is offered
  (`hold_for_offer`), so a publish lands mid-chunk.
"""

import importlib.abc
import importlib.util
import os
import random
import sys
import time


def half_gold(backend_class) -> None:
    """Swap each generated message for the reference policy's with probability 1/2 (seeded by the request)."""
    original = backend_class.generate

    def generate(self, prompts, params):
        from envace.envs import registry
        from envace.policy.scripted import ReferencePolicy

        if not hasattr(self, "_gold"):
            self._gold = ReferencePolicy(self.tokenizer, registry.get("bfcl").load_tasks("multi_turn_base", "train"))
        sampled, gold = original(self, prompts, params), self._gold.generate(prompts, params)
        rng = random.Random(params.seed)
        return [g if rng.random() < 0.5 else s for s, g in zip(sampled, gold, strict=True)]

    backend_class.generate = generate


class _Patched(importlib.abc.MetaPathFinder):
    """Imports module `name` as usual, then hands it to `patch`: a hook on a module the worker imports only when
    Ray gives it an actor (importing it here would cost every worker process seconds)."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


def play_fails_once(marker: str):
    """`envace.training.actor` with `RolloutActor.play` timing out once at step 1, where `marker` does not exist
    (made atomically: of two actors playing step 1 at once, one fails)."""

    def patch(module) -> None:
        original = module.RolloutActor.play

        def play(self, step, tasks, *args, **kwargs):
            if step == 1:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass
                else:  # the served backend's own request to a server that takes it and never answers
                    import socket

                    from envace.policy.vllm import request

                    with socket.socket() as silent:
                        silent.bind(("127.0.0.1", 0))
                        silent.listen(1)
                        request(f"http://127.0.0.1:{silent.getsockname()[1]}/v1/completions", {"prompt": "x"},
                                timeout_s=1.0)
            return original(self, step, tasks, *args, **kwargs)

        module.RolloutActor.play = play

    return patch


def slow_actor(marker: str):
    """`envace.training.cluster.workers` with `ActorWorker.play` sleeping first on the actor `marker` names."""

    def patch(module) -> None:
        original = module.ActorWorker.play

        def play(self, step, tasks, version, chunk=0, weights=None):
            try:
                index, seconds = open(marker).read().split()
            except FileNotFoundError:
                index, seconds = -1, 0
            if int(index) == self.index:
                time.sleep(float(seconds) * len(tasks))
            return original(self, step, tasks, version, chunk, weights)

        module.ActorWorker.play = play

    return patch


def hold_for_offer(marker: str):
    """`envace.training.actor` with step 1's first `PartialBackend` call of a chunk played on version 0 waiting (up to
    120 s) for a newer version to be offered, while `marker` exists."""

    def patch(module) -> None:
        import threading

        playing, play, generate = threading.local(), module.RolloutActor.play, module.PartialBackend.generate

        def play_step(self, step, tasks, *args, **kwargs):
            playing.actor, playing.step, playing.calls = self, step, 0
            return play(self, step, tasks, *args, **kwargs)

        def generate_then_wait(self, prompts, params):
            out = generate(self, prompts, params)
            playing.calls += 1
            if playing.step == 1 and playing.calls == 1 and os.path.exists(marker):
                actor, deadline = playing.actor, time.monotonic() + 120
                while actor.version < 1 and not actor.offers.newer_than(0) and time.monotonic() < deadline:
                    time.sleep(0.05)
            return out

        module.RolloutActor.play, module.PartialBackend.generate = play_step, generate_then_wait

    return patch


if os.environ.get("ENVACE_TEST_HOLD_FOR_OFFER"):
    sys.meta_path.insert(0, _Patched("envace.training.actor", hold_for_offer(os.environ["ENVACE_TEST_HOLD_FOR_OFFER"])))

if os.environ.get("ENVACE_TEST_SLOW_ACTOR"):
    sys.meta_path.insert(0, _Patched("envace.training.cluster.workers",
                                     slow_actor(os.environ["ENVACE_TEST_SLOW_ACTOR"])))

if os.environ.get("ENVACE_TEST_PLAY_FAILS"):
    sys.meta_path.insert(0, _Patched("envace.training.actor", play_fails_once(os.environ["ENVACE_TEST_PLAY_FAILS"])))

if os.environ.get("ENVACE_TEST_HALF_GOLD"):
    from envace.policy.hf import HFBackend

    half_gold(HFBackend)

_forbidden = os.environ.get("ENVACE_TEST_FORBIDDEN")
if _forbidden:
    _EVENTS = {"open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "shutil.rmtree"}

    def _audit(event, args):
        if event in _EVENTS and args and isinstance(args[0], str | bytes | os.PathLike) \
                and os.path.abspath(os.fsdecode(args[0])).startswith(_forbidden):
            raise PermissionError(f"a Ray worker touched the driver's {os.fsdecode(args[0])}")

    sys.addaudithook(_audit)
