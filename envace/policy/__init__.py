"""Policy backends: one interface for batched generation from token ids (see `backend.py`)."""

from __future__ import annotations

import atexit


def load_backend(spec: str, max_batch_tokens: int = 32768, backend: str = "hf", lora_rank: int | None = None,
                 dtype: str = "float32", say=print):
    """A backend for a model spec: in this process (`hf`), or through vLLM: servers named by URL
    (`http://…`, `remote.py`) or, with `backend = "vllm"`, a server started here for the model (stopped when
    this process exits). A remote backend is checked before any work: it answers, serves the model, and
    tokenizes like the local tokenizer."""
    from envace.policy.remote import RemoteBackend
    from envace.policy.specs import is_remote

    if is_remote(spec):
        remote = RemoteBackend.from_spec(spec)
        remote.check()
        return remote
    if backend == "vllm":
        from envace.policy import vllm
        from envace.policy.models import load_tokenizer
        from envace.policy.specs import model_dir

        server = vllm.start(model_dir(spec), name="base", lora_rank=lora_rank, dtype=dtype, say=say,
                             gpu_memory=0.9)  # the only model on its GPU
        atexit.register(server.stop)
        remote = RemoteBackend([server.url], "base", load_tokenizer(spec), servers=[server])
        remote.check()
        return remote
    from envace.policy.hf import HFBackend

    return HFBackend.load(spec, max_batch_tokens)
