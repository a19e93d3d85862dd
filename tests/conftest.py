"""Shared fixtures: the tiny in-process model, BFCL tasks, and the scripted reference policy."""

from __future__ import annotations

import pytest

from envace.envs import registry
from envace.policy.hf import HFBackend
from envace.policy.scripted import ReferencePolicy
from envace.policy.tiny import build_tiny


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
    """The reference policy with an imperfect world model: every other rehearsal invents a key, so the
    store holds both exact and wrong rehearsals to inspect."""

    def _rehearser(self, text: str) -> str:
        real = super()._rehearser(text)
        if len(text) % 2 or not real.endswith("}\n</execution_result>"):
            return real
        return real[: -len("}\n</execution_result>")] + ', "invented_by_rehearser": 1}\n</execution_result>'


@pytest.fixture(scope="session")
def store(tmp_path_factory, bfcl, tiny):
    """A real store: a scripted shadow rollout with drifting rehearsals (`scripted`), a scripted caller whose
    every call has a wrongly typed argument (`broken`), a tiny-model shadow rollout (`shadow`), a tiny
    training run (`trained`) and a tiny private-rehearsal sweep (`sw`)."""
    from dataclasses import replace

    from rich.console import Console

    from envace.cli import main, play
    from envace.config import RolloutConfig

    root = tmp_path_factory.mktemp("store")
    cfg = RolloutConfig(model="scripted", mode="real+shadow", limit=2, max_steps_per_turn=20, embedding=False)
    tasks = bfcl.load_tasks(cfg.category, cfg.split, cfg.limit)
    play(cfg, root, "scripted", "rollout", Console(quiet=True), DriftingRehearser(tiny[1], tasks))
    bad_call = '<tool_call>\n{"name": "cd", "arguments": {"folder": 3}}\n</tool_call>'
    play(replace(cfg, limit=1, max_steps_per_turn=2), root, "broken", "rollout", Console(quiet=True),
         ReferencePolicy(tiny[1], tasks[:1], bad_call))
    assert main(["rollout", "--model", "tiny", "--mode", "real+shadow", "--limit", "2", "--max-new-tokens", "8",
                 "--max-steps-per-turn", "1", "--root", str(root), "--run-name", "shadow"]) == 0
    assert main(["train", "experiments/smoke.toml", "--root", str(root), "--run-name", "trained"]) == 0
    assert main(["sweep", "--name", "sw", "--models", "tiny=tiny", "--budgets", "0,1", "--modes", "parallel",
                 "--config", "experiments/smoke.toml", "--root", str(root)]) == 0
    return root
