"""Shared fixtures: the tiny in-process model, BFCL tasks, and the scripted reference policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from envace.envs import registry
from envace.policy.hf import HFBackend
from envace.policy.scripted import ReferencePolicy
from envace.policy.tiny import build_tiny


def in_ci() -> bool:
    """CI sets CI=true: there a missing part of the test environment is a failure, never a skip."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


SESSION_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def session_threads():
    """Every test leaves torch on the session's threads. A test may set one thread (a peak of one thread's buffers,
    the float order of a 1-CPU Ray worker); left so, every later test in this process ran on one of the two cores
    (`test_precision`'s did: the files after it, two fifths of the suite's time)."""
    yield
    torch.set_num_threads(SESSION_THREADS)


@pytest.fixture(autouse=True)
def log_streams_left_open():
    """No logging handler is left writing to a test's captured stream, closed when the test ends. Ray's handler
    keeps the `sys.stderr` of the moment `ray` is first imported: imported inside a test with `capsys`
    (`test_gpu_rehearsal`'s Ray job), every later Ray message in this process was a "--- Logging error ---"
    traceback on stderr, and the tests after it that read stderr (`test_ray`'s one-line refusals) failed."""
    yield
    import logging
    import sys

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", False):
                handler.stream = sys.stderr  # not setStream: it flushes the closed stream first


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter of `.venv-vllm` (`make vllm`; or `ENVACE_VLLM_PYTHON`), for every test that starts a real
    vLLM server. Without it such a test skips and says why; in CI it fails, so a CI that lost vLLM cannot pass."""
    from envace.errors import UsageError
    from envace.policy import vllm

    try:
        return vllm.python()
    except UsageError as err:
        missing = str(err)
    if in_ci():
        pytest.fail(f"CI=true, and this test needs vLLM: {missing}", pytrace=False)
    pytest.skip(f"NO vLLM: {missing}")


@pytest.fixture(scope="session")
def bfcl():
    return registry.get("bfcl")


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer): 2-layer random-init Llama with an in-process BPE tokenizer."""
    return build_tiny()


@pytest.fixture()
def tiny_backend(tiny):
    model, tok = tiny
    return HFBackend(model, tok)


@pytest.fixture()
def reference_policy(tiny):
    """A scripted policy replaying the reference; `corrupt` / `rehearsal` fix the caller / rehearser reply."""
    return lambda tasks, corrupt=None, rehearsal=None: ReferencePolicy(tiny[1], tasks, corrupt, rehearsal)


class DriftingRehearser(ReferencePolicy):
    """The reference policy with an imperfect world model on its last task: there every rehearsal of an object
    invents a key, so the store holds an exactly rehearsed episode and a drifting one to inspect."""

    def _rehearser(self, text: str, task) -> str:
        real = super()._rehearser(text, task)
        drifting = f"User: {list(self.by_first_turn)[-1]}" in text
        if not drifting or not real.endswith("}\n</execution_result>"):
            return real
        return real[: -len("}\n</execution_result>")] + ', "invented_by_rehearser": 1}\n</execution_result>'


class CoinFlipCaller(ReferencePolicy):
    """The reference policy standing in for a trained model's backend (`max_context`, `clear_caches`), whose caller
    drops a call half the time (seeded by the request): rewards differ within a GRPO group."""

    max_context = None

    def clear_caches(self) -> None:
        pass

    def generate(self, prompts, params):
        import random

        from envace.policy.backend import Generation

        rng = random.Random(params.seed)
        out = []
        for gen in super().generate(prompts, params):
            if "<tool_call>" in gen.text and rng.random() < 0.5:
                text = "I cannot do that."
                gen = Generation(self.tokenizer.encode(text, add_special_tokens=False) + [self.end], text, "stop")
            out.append(gen)
        return out


@pytest.fixture()
def scripted_updates(monkeypatch):
    """A training run in this process played by `CoinFlipCaller` on BFCL's multi_turn_base train tasks instead of
    the model's own generation, each update recorded: the list of (row, advantage) lists `grpo_step` was given."""
    import envace.training.actor as rollout_actor
    import envace.training.learner as learner
    from envace.training.grpo import grpo_step

    tasks = registry.get("bfcl").load_tasks("multi_turn_base", "train")
    used = []

    def recording_step(model, optimizer, rows, advantages, *args, **kwargs):
        used.append(list(zip(rows, advantages, strict=True)))
        return grpo_step(model, optimizer, rows, advantages, *args, **kwargs)

    monkeypatch.setattr(rollout_actor, "HFBackend", lambda model, tokenizer, *_: CoinFlipCaller(tokenizer, tasks))
    monkeypatch.setattr(learner, "grpo_step", recording_step)
    return used


@pytest.fixture()
def browser(tmp_path):
    """Headless Debian chromium driven by selenium (never a downloaded browser), for the app's browser tests."""
    from apps.screenshots import CHROMIUM, DRIVER, chromium

    if not (CHROMIUM.exists() and DRIVER.exists()):
        pytest.skip(f"NO BROWSER TEST: {CHROMIUM} or {DRIVER} is missing (`make test` installs Debian's chromium "
                    "and chromium-driver where it can)")
    driver = chromium(tmp_path / "profile")
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def store(tmp_path_factory, bfcl, tiny):
    """A real store: a scripted shadow rollout with drifting rehearsals (`scripted`), a scripted caller whose
    every call names a tool the task does not have (`broken`), a world-model run rehearsed with the gold (`measured`), a
    tiny-model shadow rollout (`shadow`), a suite of three cells played by the gold (`paper`), a tiny training run
    (`trained`) and a tiny private-rehearsal sweep (`sw`)."""
    from dataclasses import replace

    from envace.cli import main
    from envace.config import RolloutConfig
    from envace.jobs import Reporter, rollout_job

    root = tmp_path_factory.mktemp("store")
    quiet = type("Quiet", (Reporter,), {"say": lambda self, text: None})()
    cfg = RolloutConfig(model="tiny", mode="real+shadow", limit=2, max_steps_per_turn=20, embedding=False)
    tasks = bfcl.load_tasks(cfg.category, cfg.split, cfg.limit)
    rollout_job(cfg, root, "scripted", reporter=quiet, backend=DriftingRehearser(tiny[1], tasks))
    bad_call = '<tool_call>\n{"name": "rm_rf", "arguments": {"folder": 3}}\n</tool_call>'
    rollout_job(replace(cfg, limit=1, max_steps_per_turn=2), root, "broken", reporter=quiet,
                backend=ReferencePolicy(tiny[1], tasks[:1], bad_call))
    from envace.jobs import world_model_job

    world_model_job("reference", cfg, root, "measured", quiet, turns="1..",
                    backend=ReferencePolicy(tiny[1], tasks))  # the gold calls of turns 1.. rehearsed with their gold
    assert main(["rollout", "--model", "tiny", "--mode", "real+shadow", "--limit", "2", "--max-new-tokens", "8",
                 "--max-steps-per-turn", "1", "--root", str(root), "--run-name", "shadow"]) == 0
    from unittest import mock

    from envace import suite
    from envace.jobs import suite_job

    three = [suite.Cell("bfcl", "simple_python", "all"), suite.Cell("bfcl", "multi_turn_base", "all"),
             suite.Cell("tau2", "airline", "test")]  # a suite of three real cells: what the views read is the same
    with mock.patch.object(suite, "cells", lambda *_: three):
        suite_job("paper", "reference", RolloutConfig(embedding=False), 1, root, quiet)
    assert main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "trained"]) == 0
    assert main(["sweep", "--name", "sw", "--models", "tiny=tiny", "--budgets", "0,1", "--modes", "parallel",
                 "--config", "experiments/smoke.toml", "--root", str(root)]) == 0
    return root


REAL_CONFIG = """
# A store written by the real default model: what a user opens after `make demo`, kept small.
[rollout]
caller_demo = true
tool_docs = "compact"   # a third of full schemas' prompt tokens: the same views, minutes less of the suite
max_new_tokens = 48
max_steps_per_turn = 2
batch_size = 2
decision_sample = 0.5

[rollout.rehearser]
max_examples = 2
max_new_tokens = 48

[rollout.private]
max_steps = 1
memory_tokens = 24

[train]
model = "default"

[train.policy]
lora = true

[train.sft]
tasks = 0               # the SFT views are the scripted store's (`trained`): on one multi-turn task's 28 rows the
                        # default model's warm-up was half of this store's time

[train.grpo]
steps = 1
tasks_per_step = 1
lr = 2e-4

[train.eval]
every = 1
limit = 1

[train.rollout]
tool_docs = "compact"
caller_demo = true
group_size = 2
temperature = 0.7
max_new_tokens = 32
max_steps_per_turn = 2
shadow_fraction = 1.0

[train.rollout.rehearser]
max_examples = 2
max_new_tokens = 32
on_error = "feed_error"
"""


@pytest.fixture(scope="session")
def real_store(tmp_path_factory):
    """Every kind of run, written by the real default model (malformed rehearsals, long prompts, no calls at
    all in places): a BFCL real+shadow rollout (`demo`), a training run with shadow pairs and evaluations
    (`train`), a private-rehearsal sweep (`sw`), the world-model benchmark on one gold call (`world-model`) and a
    τ² conversation with the simulated user (`tau2`)."""
    from envace.cli import main

    reuse = os.environ.get("ENVACE_REAL_STORE")  # a store this fixture wrote before: saves ~8 min when iterating
    if reuse:
        return Path(reuse)
    root = tmp_path_factory.mktemp("real")
    config = root.parent / "real.toml"
    config.write_text(REAL_CONFIG)
    common = ["--root", str(root)]
    assert main(["rollout", "--mode", "real+shadow", "--limit", "1", "--model", "default", "--config", str(config),
                 "--run-name", "demo", *common]) == 0
    assert main(["train", str(config), "--run-name", "train", *common]) == 0
    assert main(["sweep", "--name", "sw", "--models", "base=default", "--budgets", "0,1", "--modes", "parallel",
                 "--limit", "1", "--max-new-tokens", "24", "--config", str(config), *common]) == 0
    assert main(["world-model", "default", "--limit", "1", "--turns", "0", "--config", str(config),
                 "--run-name", "world-model", *common]) == 0
    assert main(["rollout", "--env", "tau2", "--domain", "airline", "--limit", "1", "--model", "default",
                 "--tool-docs", "compact",
                 "--max-new-tokens", "24", "--user-max-new-tokens", "24", "--max-user-turns", "2",
                 "--max-steps-per-turn", "2", "--run-name", "tau2", *common]) == 0
    return root
