"""The prepared device check (`bash experiments/gpu_check.sh`): one table, under 8 minutes on one GPU, offline.

Nothing can be downloaded on the device and at most 64 MiB travels, so the model is a random-init Qwen3 of
Qwen3-1.7B's shape with its real 151,936-token vocabulary, built from a config on the GPU itself, and the
prompts are the tiny tokenizer's (it ships in the repository; sampled ids it does not know decode to
nothing). Measured, side by side in one process:
- rollout tokens/s of the HF backend (padded batches, the GPU strategy) at batch 1, 32 and 128;
- the same through a vLLM server, when `ENVACE_VLLM_PYTHON` names an interpreter with vLLM (the device
  image has none; it is too large to carry), and the LoRA sync time (save + hot-load);
- one tree-packed role-wise GRPO update (LoRA) on a pack of `--pack` tokens (one shared prompt, G = 8
  completions), with activation checkpointing off and on: seconds and peak memory;
- the same update beside a stand-in for a co-located vLLM server (a block of the GPU's memory held for it):
  at vLLM's default share (0.92) and at the configs' `vllm_gpu_memory` (0.4).
Only torch, transformers and peft are needed besides the project's own code (no trl, no datasets).
`--shape tiny --device cpu` runs every row that does not need a GPU in a minute on a CPU (`make gpu-rehearsal`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from envace.policy.backend import SamplingParams  # noqa: E402
from envace.policy.hf import HFBackend  # noqa: E402
from envace.policy.models import add_lora, enable_checkpointing  # noqa: E402
from envace.policy.tiny import build_tiny_tokenizer  # noqa: E402
from envace.training.grpo import Row, grpo_step, role_advantages  # noqa: E402

QWEN3_VOCAB = 151_936
# Qwen3-1.7B's config.json, and a tiny one of the same architecture for a CPU.
SHAPES = {"1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
          "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16)}
GROUP = 8


def model_and_tokenizer(shape: str, device: str):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tiny_tokenizer()
    cfg = Qwen3Config(vocab_size=QWEN3_VOCAB, max_position_embeddings=40_960, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      **SHAPES[shape])
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 1.7B random init on the host takes minutes
        model = Qwen3ForCausalLM(cfg)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return model.to(dtype).eval(), tok


def prompts(tok, n: int, words: int = 40) -> list[list[int]]:
    text = "<|im_start|>user\n" + "List the files in the folder Documents and then open report.txt. " * words
    return [tok.encode(text + f" ({i})<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
            for i in range(n)]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def tokens_per_s(backend, batch: list[list[int]], new_tokens: int, device: str) -> float:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=1)
    backend.generate(batch[:1], params)  # warm-up
    synchronize(device)
    start = time.perf_counter()
    gens = backend.generate(batch, params)
    synchronize(device)
    return sum(len(g.ids) for g in gens) / (time.perf_counter() - start)


def pack_rows(tok, pack: int) -> list[Row]:
    """One GRPO group whose prefix tree is `pack` tokens: a shared prompt of half of it, G completions."""
    prompt_len, completion_len = pack // 2, pack // 2 // GROUP
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(10, len(tok), (prompt_len,), generator=gen).tolist()
    return [Row("t0", "caller", prompt, torch.randint(10, len(tok), (completion_len,), generator=gen).tolist(),
                float(i % 2)) for i in range(GROUP)]


def set_checkpointing(model, on: bool) -> None:
    base = model.get_base_model()
    if on:
        enable_checkpointing(base)
    else:
        off = getattr(base, "activation_checkpointing_disable", None) or base.gradient_checkpointing_disable
        off()


def update(model, rows: list[Row], pad: int, device: str) -> str:
    """One tree-packed update: '<seconds> s, peak <GiB> GiB' (peak on CUDA only), or what stopped it."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    synchronize(device)
    start = time.perf_counter()
    try:
        stats = grpo_step(model, optimizer, rows, role_advantages(rows), pad, packing="tree",
                          max_pack_tokens=sum(len(r.completion_ids) for r in rows) + len(rows[0].prompt_ids))
    except torch.OutOfMemoryError:
        return "out of memory"
    synchronize(device)
    out = f"{time.perf_counter() - start:.2f} s, {stats['forward_tokens']} tokens in {stats['packs']} pass(es)"
    if device == "cuda":
        out += f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    return out


def beside_vllm(model, rows: list[Row], pad: int, share: float) -> str:
    """The update with `share` of the GPU held, as a co-located vLLM server would hold it."""
    free, total = torch.cuda.mem_get_info()
    held = int(share * total) - (total - free)  # what is in use already counts towards nothing of the server's
    if held > free:
        return f"no room: {share:.2f} of {total / 2**30:.0f} GiB is more than is free"
    block = torch.empty(max(held, 0), dtype=torch.uint8, device="cuda")
    try:
        return update(model, rows, pad, "cuda")
    finally:
        del block
        torch.cuda.empty_cache()


def vllm_rows(base_dir: Path, peft_model, tok, folder: Path, new_tokens: int, device: str) -> list[tuple[str, str]]:
    from envace.policy import vllm
    from envace.policy.remote import RemoteBackend

    server = vllm.start(base_dir, "base", lora_rank=16, dtype="bfloat16", max_model_len=8192, gpu_memory=0.4)
    rows = []
    try:
        remote = RemoteBackend([server.url], "base", tok)
        remote.check()
        for n in (1, 32, 128):
            speed = tokens_per_s(remote, prompts(tok, n), new_tokens, device)
            rows.append((f"vLLM tokens/s, batch {n}", f"{speed:.0f}"))
        start = time.perf_counter()
        peft_model.save_pretrained(folder / "adapter")
        server.load_adapter("policy", folder / "adapter")
        rows.append(("LoRA sync (save + hot-load)", f"{time.perf_counter() - start:.2f} s"))
    finally:
        server.stop()
    return rows


def main(argv: list[str] | None = None) -> list[tuple[str, str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--pack", type=int, default=8192, help="tokens of the update's prefix tree")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,32,128", help="generation batch sizes")
    args = parser.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here (run with --shape tiny --device cpu on a CPU)")
    import transformers

    rows: list[tuple[str, str]] = [
        ("device", torch.cuda.get_device_name() if device == "cuda" else "CPU"),
        ("torch / transformers", f"{torch.__version__} / {transformers.__version__}")]
    model, tok = model_and_tokenizer(args.shape, device)
    rows.append(("parameters (vocabulary)", f"{model.num_parameters() / 1e6:.0f} M ({QWEN3_VOCAB:,})"))
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if os.environ.get("ENVACE_VLLM_PYTHON"):  # saved before LoRA wraps it: a server loads plain weights
        model.save_pretrained(folder / "base")
        tok.save_pretrained(folder / "base")
    hf = HFBackend(model, tok, prefix_cache=False)
    rows.append(("HF strategy", "padded batches"))
    for n in (int(b) for b in args.batches.split(",")):
        rows.append((f"HF tokens/s, batch {n}", f"{tokens_per_s(hf, prompts(tok, n), args.new_tokens, device):.0f}"))
    peft_model = add_lora(model, 16)
    if os.environ.get("ENVACE_VLLM_PYTHON"):
        rows += vllm_rows(folder / "base", peft_model, tok, folder, args.new_tokens, device)
    else:
        rows.append(("vLLM", "not run: no ENVACE_VLLM_PYTHON (the device image has no vLLM)"))
    batch = pack_rows(tok, args.pack)
    peft_model.train()
    for on in (False, True):
        set_checkpointing(peft_model, on)
        rows.append((f"GRPO update, {args.pack}-token tree, checkpointing {'on' if on else 'off'}",
                     update(peft_model, batch, tok.pad_token_id, device)))
    if device == "cuda":
        for share in (0.92, 0.4):
            rows.append((f"the same (on) beside vLLM holding {share:.2f}",
                         beside_vllm(peft_model, batch, tok.pad_token_id, share)))
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"| {k:<{width}} | {v} |" for k, v in rows), flush=True)
    return rows


if __name__ == "__main__":
    main()
