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
