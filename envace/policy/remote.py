"""A backend served over HTTP by OpenAI-compatible completions servers (vLLM), token ids in and out.

Spec: `http://HOST:PORT/v1?model=NAME&tokenizer=SPEC`, or several servers separated by commas
(`http://a:8000/v1,http://b:8000/v1?model=NAME`): `model` is the name the servers serve, `tokenizer` a
local model spec whose tokenizer is the served model's (`default` when omitted), used to render prompts.

Prompts go as token ids and every completion comes back as the server's sampled token ids
(`return_token_ids`) with their log-probabilities (`logprobs: 0`, the model's raw distribution), so
nothing is ever re-encoded. Each prompt is its own request with its own seed (a batch shares one seed in
vLLM's API, which would give a GRPO group identical samples); the requests of a call run concurrently and
the server batches them. With several servers the prompts are spread across them in contiguous shares.
`model` may be switched to a hot-loaded adapter's name; a frozen role then generates with the base name.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit, urlunsplit

from envace.errors import UsageError
from envace.policy.backend import Generation, SamplingParams
from envace.policy.models import load_tokenizer
from envace.policy.tokenizer import END_OF_MESSAGE
from envace.policy.vllm import request

T, R = TypeVar("T"), TypeVar("R")


class RemoteBackend:
    concurrent = True  # every prompt is its own request: the per-episode loop may call it from many threads

    def __init__(self, urls: list[str], model: str, tokenizer, timeout_s: float = 600.0,
                 concurrency: int = 256, servers: list | None = None) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.servers = servers or []  # servers this program started (`vllm.Server`), stopped by `close`
        self.model = self.base_model = model  # `model` becomes an adapter's name once one is loaded
        self.tokenizer = tokenizer
        # A step plays 128-256 episodes at once on a GPU: every one of them is a request the server can batch.
        self.timeout_s, self.concurrency = timeout_s, concurrency
        self.max_context: int | None = None  # the servers' smallest `max_model_len`, read by `check`
        self.calls = 0
        self.end = tokenizer.convert_tokens_to_ids(END_OF_MESSAGE)

    @classmethod
    def from_spec(cls, spec: str) -> RemoteBackend:
        urls, query = [], {}
        for part in spec.split(","):
            parts = urlsplit(part.strip())
            query.update({k: v[-1] for k, v in parse_qs(parts.query).items()})
            urls.append(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")))
        if "model" not in query:
            raise UsageError(f"a server spec needs ?model=NAME (the served model's name): {spec}")
        return cls(urls, query["model"], load_tokenizer(query.get("tokenizer", "default")))

    def check(self) -> None:
        """Every server answers, serves the model, and tokenizes a probe exactly as the local tokenizer does
        (a server started on another model would get prompts it reads differently): one clear error if not."""
        probe = "<|im_start|>user\nenvace probe: ls(folder='Documents') 1234.5 ü<|im_end|>"
        expected = self.tokenizer.encode(probe, add_special_tokens=False)
        for url in self.urls:
            cards = request(f"{url}/models", timeout_s=30)["data"]
            served = [m["id"] for m in cards]
            if self.base_model not in served:
                raise UsageError(f"{url} does not serve '{self.base_model}' (it serves {', '.join(served)})")
            answer = request(f"{url.removesuffix('/v1')}/tokenize",
                             {"model": self.base_model, "prompt": probe, "add_special_tokens": False}, 60)
            if not isinstance(answer, dict) or answer.get("tokens") != expected:
                raise UsageError(f"{url} tokenizes differently from the local tokenizer: it serves another model "
                                 "than the one named (pass ?tokenizer=SPEC for the served model)")
            # The engine ends an episode `context_exceeded` before its prompt passes the server's limit, which
            # vLLM would answer with a 400 in the middle of a run.
            limit = next((m.get("max_model_len") for m in cards if m["id"] == self.base_model), None)
            if limit:
                self.max_context = min(self.max_context or limit, int(limit))

    def close(self) -> None:
        for server in self.servers:
            server.stop()

    def clear_caches(self) -> None:
        """Servers keep their own prefix caches, keyed by the weights' version."""

    def _complete(self, url: str, prompt: list[int], params: SamplingParams, seed: int | None) -> Generation:
        if params.frozen and self.model == self.base_model:
            raise UsageError("a frozen role generates with the base weights, but the server holds no adapter to "
                             "switch off (train with lora = true)")
        max_tokens = params.max_new_tokens
        if self.max_context is not None:  # a prompt near the limit gets what room is left (as HF's would)
            max_tokens = min(max_tokens, self.max_context - len(prompt))
            if max_tokens < 1:  # no room at all: an empty, cut-off message rather than the server's 400
                return Generation([], "", "length", [])
        # Sampling is exactly what is asked: no top-k, min-p or repetition penalty from the model's
        # generation_config.json (Qwen3 ships top_k = 20), which the HF backend and the trainer's log-probs
        # (the untruncated distribution) know nothing of. Servers started here also ignore that file.
        body = {"model": self.base_model if params.frozen else self.model, "prompt": prompt,
                "max_tokens": max_tokens, "temperature": params.temperature, "top_p": params.top_p,
                "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                "stop_token_ids": [self.end], "return_token_ids": True, "logprobs": 0,
                "return_tokens_as_token_ids": True}
        if seed is not None:
            body["seed"] = seed
        started = time.perf_counter()
        answer = request(f"{url}/completions", body, self.timeout_s)
        elapsed = time.perf_counter() - started
        try:
            choice = answer["choices"][0]
            ids = list(choice["token_ids"])
            logprobs = list(choice["logprobs"]["token_logprobs"])
        except (KeyError, IndexError, TypeError):
            raise UsageError(f"{url}/completions did not return token ids and log-probs: {str(answer)[:200]}") from None
        stopped = choice.get("finish_reason") == "stop"
        if stopped and (not ids or ids[-1] != self.end):  # the stop token closes the message, as HF's output does
            ids.append(self.end)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generation(ids, text, "stop" if stopped else "length", logprobs[: len(ids)], elapsed_s=elapsed)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        share = -(-len(prompts) // len(self.urls)) if prompts else 1
        jobs = [(self.urls[i // share], p, params.seeds[i] if params.seeds else
                 None if params.seed is None else params.seed * 65_537 + i) for i, p in enumerate(prompts)]
        return concurrently(lambda job: self._complete(job[0], job[1], params, job[2]), jobs, self.concurrency)


def concurrently(fn: Callable[[T], R], jobs: list[T], width: int) -> list[R]:
    """`fn` of every job on up to `width` daemon threads, results in order; the first exception is raised once
    all are done. Daemon threads, waited on through an interruptible semaphore: Ctrl-C or SIGTERM reaches the
    caller at once, and the process exits without waiting for requests still in flight (a thread pool's
    workers are joined at exit: Ctrl-C took up to a request's timeout)."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for item in enumerate(jobs):
        todo.put(item)
    finished = threading.Semaphore(0)

    def work() -> None:
        while True:
            try:
                i, job = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = fn(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                errors.append(exc)
            finally:
                finished.release()

    for _ in range(max(1, min(width, len(jobs)))):
        threading.Thread(target=work, daemon=True).start()
    for _ in jobs:
        finished.acquire()
    if errors:
        raise errors[0]
    return results
