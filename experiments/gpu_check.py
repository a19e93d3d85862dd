"""The prepared device check (`bash experiments/gpu_check.sh`): one table, under 8 minutes on one GPU, offline.

Nothing can be downloaded on the device and at most 64 MiB travels, so the model is a random-init
Qwen3-architecture model of about 300M parameters built from a config, with the tiny tokenizer (it ships
in the repository). Measured, side by side in one process:
- rollout tokens/s of the HF backend (padded batches, the GPU strategy) at batch 1 and 32;
- the same through a vLLM server, when `ENVACE_VLLM_PYTHON` names an interpreter with vLLM (the device
  image has none; it is too large to carry), and the LoRA sync time (save + hot-load);
- one role-wise GRPO update (LoRA) on 32 rows, and the peak GPU memory.
Only torch, transformers and peft are needed (the device image has them) besides the project's own code.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from envace.policy.backend import SamplingParams  # noqa: E402
from envace.policy.hf import HFBackend  # noqa: E402
from envace.policy.models import add_lora  # noqa: E402
from envace.policy.tiny import build_tiny_tokenizer  # noqa: E402
from envace.training.grpo import Row, grpo_step, role_advantages  # noqa: E402

NEW_TOKENS = 128


def model_and_tokenizer():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tiny_tokenizer()
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=3072, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=8192,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).cuda().eval()
    return model, tok


def prompts(tok, n: int) -> list[list[int]]:
    text = "<|im_start|>user\n" + "List the files in the folder Documents and then open report.txt. " * 40
    return [tok.encode(text + f" ({i})<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
            for i in range(n)]


def tokens_per_s(backend, batch: list[list[int]]) -> float:
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=1)
    backend.generate(batch[:1], params)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    gens = backend.generate(batch, params)
    torch.cuda.synchronize()
    return sum(len(g.ids) for g in gens) / (time.perf_counter() - start)


def main() -> None:
    rows: list[tuple[str, str]] = [("GPU", torch.cuda.get_device_name())]
    model, tok = model_and_tokenizer()
    rows.append(("parameters", f"{model.num_parameters() / 1e6:.0f} M"))
    hf = HFBackend(model, tok)
    rows.append(("HF strategy on this device", "prefix cache" if hf.caches else "padded batches"))
    for n in (1, 32):
        rows.append((f"HF tokens/s, batch {n}", f"{tokens_per_s(hf, prompts(tok, n)):.0f}"))
    peft_model = add_lora(model, 16)
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if os.environ.get("ENVACE_VLLM_PYTHON"):
        from envace.policy import vllm
        from envace.policy.remote import RemoteBackend

        model.save_pretrained(folder / "base")
        tok.save_pretrained(folder / "base")
        server = vllm.start(folder / "base", "base", lora_rank=16, dtype="bfloat16", max_model_len=4096)
        try:
            remote = RemoteBackend([server.url], "base", tok)
            for n in (1, 32):
                rows.append((f"vLLM tokens/s, batch {n}", f"{tokens_per_s(remote, prompts(tok, n)):.0f}"))
            start = time.perf_counter()
            peft_model.save_pretrained(folder / "adapter")
            server.load_adapter("policy", folder / "adapter")
            rows.append(("LoRA sync (save + hot-load)", f"{time.perf_counter() - start:.2f} s"))
        finally:
            server.stop()
    else:
        rows.append(("vLLM", "not run: no ENVACE_VLLM_PYTHON (the device image has no vLLM)"))
    gens = HFBackend(peft_model, tok).generate(prompts(tok, 32), SamplingParams(NEW_TOKENS, temperature=1.0,
                                                                                seed=2))
    batch = [Row(f"t{i % 4}", "caller", p, g.ids, float(i % 3 == 0)) for i, (p, g) in
             enumerate(zip(prompts(tok, 32), gens, strict=True))]
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=2e-5)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    start = time.perf_counter()
    stats = grpo_step(peft_model, optimizer, batch, role_advantages(batch), tok.pad_token_id)
    torch.cuda.synchronize()
    rows.append(("GRPO update, 32 rows (LoRA)", f"{time.perf_counter() - start:.2f} s, loss {stats['loss']:.4f}"))
    rows.append(("peak GPU memory in the update", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"))
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"| {k:<{width}} | {v} |" for k, v in rows))


if __name__ == "__main__":
    main()
