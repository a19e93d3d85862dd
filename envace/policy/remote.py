"""A backend served over HTTP by an OpenAI-compatible completions server (vLLM's `vllm serve`, …).

Spec: `http://HOST:PORT/v1?model=NAME&tokenizer=SPEC` (`model` as the server names it; `tokenizer`
a local model spec whose tokenizer is the served model's, `default` when omitted). Prompts go as
token ids (`"prompt": [[ids], …]`, which vLLM accepts), so the server sees exactly the engine's
rendering; the completion comes back as text, and its ids are the local tokenizer's encoding of it,
closed by the end-of-message token when the server stopped. Adapters cannot be switched off on a
server, so a frozen role cannot be served this way.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlsplit, urlunsplit

from envace.errors import UsageError
from envace.policy.backend import Generation, SamplingParams
from envace.policy.models import load_tokenizer
from envace.policy.tokenizer import END_OF_MESSAGE


class RemoteBackend:
    max_context: int | None = None  # the server enforces its own

    def __init__(self, base_url: str, model: str, tokenizer, timeout_s: float = 600.0) -> None:
        self.url = base_url.rstrip("/") + "/completions"
        self.model = model
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.calls = 0
        self.end = tokenizer.convert_tokens_to_ids(END_OF_MESSAGE)

    @classmethod
    def from_spec(cls, spec: str) -> RemoteBackend:
        parts = urlsplit(spec)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if "model" not in query:
            raise UsageError(f"a server spec needs ?model=NAME (the served model's name): {spec}")
        base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return cls(base, query["model"], load_tokenizer(query.get("tokenizer", "default")))

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        if params.frozen:
            raise UsageError("a frozen role generates with adapters off, which a completions server cannot do")
        self.calls += 1
        body = {"model": self.model, "prompt": prompts, "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "stop": [END_OF_MESSAGE]}
        if params.seed is not None:
            body["seed"] = params.seed
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                choices = sorted(json.load(response)["choices"], key=lambda c: c["index"])
        except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
            raise UsageError(f"completions server {self.url} failed: {exc}") from None
        out = []
        for choice in choices:
            text, stopped = choice["text"], choice.get("finish_reason") == "stop"
            ids = self.tokenizer.encode(text, add_special_tokens=False) + ([self.end] if stopped else [])
            out.append(Generation(ids, text, "stop" if stopped else "length"))
        return out
