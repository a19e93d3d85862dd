"""`envace bench rollout|rehearsal|private`: the engine's tokens/s against raw batched `model.generate`.

Both sides run in one process on the same model and the same prompts: the engine plays BFCL test
episodes (one backend call per step), recording each step's batch of prompts; then every recorded
batch is replayed through a plain left-padded `model.generate` call of the same batch size and token
budget. Tokens/s on each side is generated tokens over its own wall time, so the engine's parsing,
environment calls, rendering and store-free bookkeeping all count against it.
"""

from __future__ import annotations

import time

from envace.config import RolloutConfig
from envace.envs import registry
from envace.jobs import play
from envace.policy.backend import SamplingParams
from envace.policy.hf import HFBackend


def _raw_generate(backend: HFBackend, prompts: list[list[int]], max_new_tokens: int) -> int:
    """One plain batched `generate` call; returns the tokens generated up to each row's stop token."""
    import torch

    width = max(len(p) for p in prompts)
    pad = backend.tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = backend.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                     do_sample=False, eos_token_id=backend.stop_ids, pad_token_id=pad)
    total = 0
    for row in out[:, width:].tolist():
        stop = next((k for k, t in enumerate(row) if t in backend.stop_ids), None)
        total += len(row) if stop is None else stop + 1
    return total


def _recorded(backend) -> list[list[list[int]]]:
    """Every batch of prompts `backend.generate` is called with from now on, in the list returned: the engine's step
    batches, to replay outside it."""
    batches: list[list[list[int]]] = []
    generate = backend.generate

    def recording(prompts: list[list[int]], params: SamplingParams):
        batches.append(prompts)
        return generate(prompts, params)

    backend.generate = recording
    return batches


def bench_rollout(model: str = "default", limit: int = 4, max_new_tokens: int = 64, console=None) -> dict:
    say = console.print if console else print
    benchmark = registry.get("bfcl")
    tasks = benchmark.load_tasks("multi_turn_base", "test", limit=limit)
    backend = HFBackend.load(model)
    cfg = RolloutConfig(model=model, limit=limit, batch_size=limit, max_new_tokens=max_new_tokens,
                        max_steps_per_turn=3)
    batches = _recorded(backend)
    say(f"engine: {limit} BFCL test episodes, batch {limit}, {max_new_tokens} new tokens per message …")
    start = time.perf_counter()
    summary = play(cfg, None, backend, tasks=tasks)
    engine_s = time.perf_counter() - start
    say(f"raw model.generate: replaying the engine's {len(batches)} step batches …")
    start = time.perf_counter()
    raw_tokens = sum(_raw_generate(backend, b, max_new_tokens) for b in batches)
    raw_s = time.perf_counter() - start
    result = {
        "model": model, "episodes": limit, "steps": len(batches), "max_new_tokens": max_new_tokens,
        "engine_tokens": summary.generated_tokens, "engine_s": round(engine_s, 1),
        "engine_tok_per_s": round(summary.generated_tokens / engine_s, 2),
        "raw_tokens": raw_tokens, "raw_s": round(raw_s, 1), "raw_tok_per_s": round(raw_tokens / raw_s, 2),
    }
    result["ratio"] = round(result["engine_tok_per_s"] / result["raw_tok_per_s"], 2)
    say(result)
    return result


def bench_rollout_vllm(model: str = "default", limit: int = 8, max_new_tokens: int = 64, console=None) -> dict:
    """The engine on a vLLM server against the engine on the HF backend, on the same greedy episodes (batch =
    `limit`), and against the server's own raw batched completions of the same step prompts: the engine's
    overhead around the server (HTTP, one request per prompt, parsing, environments, rendering)."""
    from envace.policy import vllm
    from envace.policy.models import load_tokenizer
    from envace.policy.remote import RemoteBackend
    from envace.policy.specs import model_dir

    say = console.print if console else print
    benchmark = registry.get("bfcl")
    tasks = benchmark.load_tasks("multi_turn_base", "test", limit=limit)
    cfg = RolloutConfig(model=model, limit=limit, batch_size=limit, max_new_tokens=max_new_tokens,
                        max_steps_per_turn=3, caller_demo=True, tool_docs="compact")
    server = vllm.start(model_dir(model), "base", say=say, gpu_memory=0.9)  # alone on its GPU
    try:
        remote = RemoteBackend([server.url], "base", load_tokenizer(model))
        remote.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))  # the server's first request warms it up
        batches = _recorded(remote)
        result: dict = {"model": model, "episodes": limit, "max_new_tokens": max_new_tokens}
        for name, backend in (("vllm", remote), ("hf", HFBackend.load(model))):
            say(f"engine on {name}: {limit} BFCL test episodes, batch {limit} …")
            start = time.perf_counter()
            summary = play(cfg, None, backend, tasks=tasks)
            seconds = time.perf_counter() - start
            result[f"{name}_engine"] = {"tokens": summary.generated_tokens, "s": round(seconds, 1),
                                        "tok_per_s": round(summary.generated_tokens / seconds, 2)}
        say(f"raw vLLM completions: the engine's {len(batches)} step batches, one request each …")
        vllm.request(f"{server.root}/reset_prefix_cache", {})  # the engine's own run must not serve the replay
        start = time.perf_counter()
        raw_tokens = 0
        for prompts in batches:
            body = {"model": "base", "prompt": prompts, "max_tokens": max_new_tokens, "temperature": 0.0,
                    "stop_token_ids": [remote.end], "return_token_ids": True}
            raw_tokens += sum(len(c["token_ids"]) for c in vllm.request(f"{server.url}/completions", body)["choices"])
        seconds = time.perf_counter() - start
        result["raw_vllm"] = {"tokens": raw_tokens, "s": round(seconds, 1), "tok_per_s": round(raw_tokens / seconds, 2)}
        result["vllm_engine_over_hf_engine"] = round(result["vllm_engine"]["tok_per_s"] /
                                                     result["hf_engine"]["tok_per_s"], 2)
        result["vllm_engine_over_raw_vllm"] = round(result["vllm_engine"]["tok_per_s"] /
                                                    result["raw_vllm"]["tok_per_s"], 2)
    finally:
        server.stop()
    say(result)
    return result


def _bfcl_setup(model: str, limit: int):
    """(benchmark, the first `limit` base test tasks, the train-task example bank, a loaded backend)."""
    from envace.engine.examples import ExampleBank

    benchmark = registry.get("bfcl")
    tasks = benchmark.load_tasks("multi_turn_base", "test", limit=limit)
    return benchmark, tasks, ExampleBank(benchmark.load_tasks("multi_turn_base", "train")), HFBackend.load(model)


def bench_rehearsal(model: str = "default", limit: int = 2, max_new_tokens: int = 64, console=None) -> dict:
    """`rehearse+shadow` against `real` on the same episodes and batch, then metric throughput."""
    from envace import fidelity
    from envace.build import build_engine
    from envace.embedding import cosine
    from envace.engine.episode import Pending
    from envace.engine.rehearser import Rehearser
    from envace.engine.sampler import Sampler

    say = console.print if console else print
    benchmark, tasks, bank, backend = _bfcl_setup(model, limit)
    result: dict = {"model": model, "episodes": limit, "max_new_tokens": max_new_tokens}
    for mode in ("real", "rehearse+shadow"):
        backend.clear_caches()  # the second mode must not inherit the first one's prefill
        cfg = RolloutConfig(model=model, mode=mode, limit=limit, batch_size=limit, max_new_tokens=max_new_tokens,
                            max_steps_per_turn=2, caller_demo=True, embedding=True)
        say(f"{mode}: {limit} episodes …")
        start = time.perf_counter()
        summary = play(cfg, None, backend, tasks=tasks)
        seconds = time.perf_counter() - start
        result[mode] = {"tokens": summary.generated_tokens, "s": round(seconds, 1),
                        "tok_per_s": round(summary.generated_tokens / seconds, 2), "pairs": summary.pairs,
                        "pairs_per_s": round(summary.pairs / seconds, 3)}
    # Rehearsal itself, whatever the caller does: every reference call of the episodes' first turns,
    # rehearsed in one batch (the engine's per-step unit) and paired with its real response.
    cfg = RolloutConfig(model=model, mode="real+shadow", max_new_tokens=max_new_tokens)
    engine = build_engine(backend, benchmark, cfg, bank)
    rehearser = Rehearser(Sampler(backend, seed=cfg.seed), engine.renderer, bank, cfg.rehearser)
    backend.clear_caches()
    items = []
    for task in tasks:
        ep = engine.start(task, 0)
        items += [Pending(ep, i, ref.call) for i, ref in enumerate(task.reference[0])]
    start = time.perf_counter()
    rehearsals = rehearser.rehearse(items)
    seconds = time.perf_counter() - start
    episodes = {id(p.episode): p.episode for p in items}.values()
    tokens = sum(len(g.gen.ids) for ep in episodes for g in ep.generations)  # rehearser rows only
    result["rehearse_reference_calls"] = {
        "calls": len(items), "s": round(seconds, 1), "tok_per_s": round(tokens / seconds, 2),
        "pairs_per_s": round(len(items) / seconds, 3),
        "malformed": sum(r.parsed.error is not None for r in rehearsals)}
    real = [ref.result.content for t in benchmark.load_tasks("multi_turn_base", "all") for turn in t.reference
            for ref in turn]
    rehearsed = [r.replace("1", "2") for r in real]  # near misses: same structure, some values changed
    start = time.perf_counter()
    for a, b in zip(real, rehearsed, strict=True):
        fidelity.score_pair(a, b, False, False, [a])
    text_s = time.perf_counter() - start
    start = time.perf_counter()
    cosine(real, rehearsed)
    embed_s = time.perf_counter() - start
    result["metrics"] = {"pairs": len(real), "text_metrics_pairs_per_s": round(len(real) / text_s),
                         "with_embedding_pairs_per_s": round(len(real) / (text_s + embed_s))}
    say(result)
    return result


class _OnePromptPerCall:
    """A backend wrapper that sends every prompt in its own call: the unbatched baseline."""

    def __init__(self, backend: HFBackend) -> None:
        self.inner = backend
        self.tokenizer, self.max_context = backend.tokenizer, backend.max_context

    def generate(self, prompts: list[list[int]], params: SamplingParams):
        return [g for p in prompts for g in self.inner.generate([p], params)]


def bench_private(model: str = "default", limit: int = 2, max_new_tokens: int = 32, budgets: tuple[int, ...] = (1, 2),
                  console=None) -> dict:
    """Cost per committed turn of private rehearsal (parallel) at each N, every attempt of every episode
    in one backend call per step; and, at the largest N, one episode at a time with one prompt per call."""
    from envace.config import PrivateOptions, RehearserOptions

    say = console.print if console else print
    benchmark, tasks, bank, backend = _bfcl_setup(model, limit)
    result: dict = {"model": model, "episodes": limit, "max_new_tokens": max_new_tokens}
    plan = [(f"N={n}", n, limit, False) for n in (0, *budgets)] + [(f"N={max(budgets)} unbatched", max(budgets), 1,
                                                                     True)]
    for name, n, batch, one_per_call in plan:
        backend.clear_caches()
        cfg = RolloutConfig(model=model, limit=limit, batch_size=batch, max_new_tokens=max_new_tokens,
                            max_steps_per_turn=2, caller_demo=True, tool_docs="compact", embedding=False,
                            rehearser=RehearserOptions(fewshot="other_tasks", max_examples=4,
                                                       max_new_tokens=max_new_tokens),
                            private=PrivateOptions(mode="parallel" if n else "none", budget=n, max_steps=2,
                                                   memory_tokens=max_new_tokens))
        say(f"{name}: {limit} episodes, batch {batch} …")
        start = time.perf_counter()
        summary = play(cfg, None, _OnePromptPerCall(backend) if one_per_call else backend, tasks=tasks)
        seconds = time.perf_counter() - start
        turns = max(summary.turns, 1)
        result[name] = {"s": round(seconds, 1), "turns": summary.turns, "s_per_turn": round(seconds / turns, 2),
                        "private_tokens_per_turn": round(summary.private_tokens / turns, 1)}
    top = max(budgets)
    result["unbatched_over_batched"] = round(result[f"N={top} unbatched"]["s"] / result[f"N={top}"]["s"], 2)
    say(result)
    return result
