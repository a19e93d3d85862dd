"""Policy backends: one interface for batched generation from token ids (see `backend.py`)."""

from __future__ import annotations


def load_backend(spec: str, max_batch_tokens: int = 32768):
    """A local model (`default`, `tiny`, a path) or an OpenAI-compatible server (`http://…`, `remote.py`)."""
    from envace.policy.remote import RemoteBackend
    from envace.policy.specs import is_remote

    if is_remote(spec):
        return RemoteBackend.from_spec(spec)
    from envace.policy.hf import HFBackend

    return HFBackend.load(spec, max_batch_tokens)
