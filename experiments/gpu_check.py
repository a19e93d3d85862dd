"""The prepared device check (`bash experiments/gpu_check.sh`): one table, under 8 minutes on one GPU, offline.

Nothing can be downloaded on the device and at most 64 MiB travels, so the model is a random-init Qwen3 of
Qwen3-1.7B's shape with its real 151,936-token vocabulary, built from a config on the GPU itself, and the
prompts are the tiny tokenizer's (it ships in the repository; sampled ids it does not know decode to
nothing). Each row is printed the moment it is measured, so a run cut short by its timeout keeps every
finished row; a row that fails says which check failed and the rest still run. Measured, in one process:
- rollout tokens/s of the HF backend (padded batches, the GPU strategy) at batch 1, 32 and 128;
- the same through a vLLM server, when `ENVACE_VLLM_PYTHON` names an interpreter with vLLM (the device
  image has none; it is too large to carry), and the LoRA sync time (save + hot-load);
- one tree-packed role-wise GRPO update (LoRA, checkpointing on as in the GPU configs) on a group of
  `--packs` tokens (one shared prompt, G = 8 completions), with each tree attention path (`dense`, `flex`):
  seconds and peak memory, after one untimed warm-up update of the same shape; and one with checkpointing off;
- tree against row packing in bf16 on a long group packed under a budget smaller than its tree (the shared
  prompt is deferred, and its pack's key count is odd, no multiple of 8): per-token log-probs and LoRA gradients,
  each path measured against the same weights run in fp32, so bf16 rounding is told apart from a defect;
- the update beside a stand-in for a co-located vLLM server (a block of `share × total` GPU memory held, as
  vLLM's gpu_memory_utilization takes it): at vLLM's default share (0.92) and the configs' `serving.gpu_memory` (0.4).
On CUDA the updates run with only the flash and memory-efficient SDPA kernels allowed, so a fallback to the
math kernel (every score materialised, slow) fails its row loudly instead of being timed.
On one H200 (2026-12-04, docs/benchmarks.md has the table) the whole table took under 3 minutes; rows past
`--budget-s` are skipped, not started.
Only torch, transformers and peft are needed besides the project's own code (no trl, no datasets).
`--shape tiny --device cpu` runs every row that does not need a GPU in a minute on a CPU (`make gpu-rehearsal`).
"""

from __future__ import annotations

import argparse
import copy
import inspect
import os
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from envace.policy.backend import SamplingParams  # noqa: E402
from envace.policy.hf import HFBackend  # noqa: E402
from envace.policy.models import add_lora, enable_checkpointing  # noqa: E402
from envace.policy.tiny import build_tiny_tokenizer  # noqa: E402
from envace.training import grpo  # noqa: E402
from envace.training.grpo import Row, backward, grpo_step, role_advantages  # noqa: E402
from envace.training.packing import build  # noqa: E402

QWEN3_VOCAB = 151_936
# Qwen3-1.7B's config.json, and a tiny one of the same architecture for a CPU.
SHAPES = {"1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
          "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16)}
GROUP = 8
KEY_WIDTH = 62
# tree against row in bf16, both against fp32: what "as exact as row packing" means (the row prints the numbers)
MEAN_RATIO, MAX_RATIO, ERROR_FLOOR, GRAD_COSINE, GRAD_NORM = 1.5, 2.0, 1e-3, 0.99, 0.05


class Table:
    """Rows printed (and flushed) as they are measured: a timeout keeps every finished row. Rows past the time
    budget are skipped rather than started, so the table ends before the shell's `timeout` cuts it."""

    def __init__(self, budget_s: float) -> None:
        self.rows: list[tuple[str, str]] = []
        self.started, self.budget_s = time.perf_counter(), budget_s

    def add(self, key: str, value: str) -> None:
        self.rows.append((key, value))
        print(f"| {key:<{KEY_WIDTH}} | {value} |", flush=True)

    def measure(self, key: str, fn: Callable[[], str]) -> str:
        """`fn()`'s text as the row, or what stopped it (out of memory, a failed check): the next rows still run."""
        if time.perf_counter() - self.started > self.budget_s:
            value = f"skipped: the {self.budget_s:.0f} s budget is spent"
        else:
            try:
                value = fn()
            except torch.OutOfMemoryError:
                value = "out of memory"
            except Exception as exc:  # noqa: BLE001 - one failed check is a row, not the end of the table
                value = failure(exc)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        self.add(key, value)
        return value


def failure(exc: Exception) -> str:
    """A failed row in one line, naming the SDPA guard when that is what tripped."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    if "No available kernel" in str(exc) or "No viable backend for scaled_dot_product" in str(exc):  # CUDA, CPU
        return f"FAILED (SDPA kernel guard): neither flash nor memory-efficient attention accepts these inputs: {first}"
    return f"FAILED ({type(exc).__name__}): {first}"


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


def _random_ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(10, vocab, (n,), generator=gen).tolist()


def pack_rows(tok, pack: int) -> list[Row]:
    """One GRPO group whose prefix tree is `pack` tokens: a shared prompt of half of it, G completions."""
    prompt_len, completion_len = pack // 2, pack // 2 // GROUP
    gen = torch.Generator().manual_seed(3)
    prompt = _random_ids(prompt_len, len(tok), gen)
    return [Row("t0", "caller", prompt, _random_ids(completion_len, len(tok), gen), float(i % 2))
            for i in range(GROUP)]


def deferred_rows(tok, tokens: int) -> tuple[list[Row], int]:
    """A group of about `tokens` tree tokens and a pack budget that makes the tree path take its hard turns: the
    budget (prompt + 3 completions) is smaller than the tree, so the shared prompt is deferred (forwarded
    alone, its gradient restored after its 8 children, packed 3 + 3 + 2); the prompt and every completion are
    an odd number of tokens, so the deferred pack's key count is no multiple of 8 (torch pads a copy)."""
    prompt_len = tokens // 2 | 1
    completion_len = (tokens - prompt_len) // GROUP
    completion_len -= 1 - completion_len % 2
    gen = torch.Generator().manual_seed(5)
    prompt = _random_ids(prompt_len, len(tok), gen)
    rows = [Row("t0", "caller", prompt, _random_ids(completion_len, len(tok), gen), float(i % 2))
            for i in range(GROUP)]
    return rows, prompt_len + 3 * completion_len


def set_checkpointing(model, on: bool) -> None:
    base = model.get_base_model()
    if on:
        enable_checkpointing(base)
    else:
        off = getattr(base, "activation_checkpointing_disable", None) or base.gradient_checkpointing_disable
        off()


def has_tree_attention() -> bool:
    """Whether this tree's training API takes `tree_attention` ("dense" | "flex" | "auto"): before it did, the
    dense mask was the only path and the flex rows say so instead of failing."""
    return all("tree_attention" in inspect.signature(fn).parameters for fn in (grpo_step, backward))


def attention_kwargs(path: str | None) -> dict:
    return {"tree_attention": path} if path and has_tree_attention() else {}


def kernel_guard(device: str):
    """On CUDA only flash and memory-efficient SDPA kernels may run: a silent fallback to the math kernel
    (every [query × key] score materialised per head) would be timed as if it were the real path."""
    if device != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])


def update(model, rows: list[Row], pad: int, device: str, attention: str | None = None,
           warm_up: bool = True) -> tuple[bool, str]:
    """One tree-packed update, timed after an untimed one of the same shape (CUDA context, kernels, flex's
    compile): (finished, '<seconds> s, <tokens> in <passes>, peak <GiB>'), or (False, what stopped it)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5)
    budget = sum(len(r.completion_ids) for r in rows) + len(rows[0].prompt_ids)  # the whole tree: one pass

    def run() -> dict:
        return grpo_step(model, optimizer, rows, role_advantages(rows), pad, packing="tree",
                         max_pack_tokens=budget, **attention_kwargs(attention))

    try:
        with kernel_guard(device):
            if warm_up:
                run()
            synchronize(device)
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            stats = run()
            synchronize(device)
    except torch.OutOfMemoryError:
        return False, "out of memory"
    except Exception as exc:  # noqa: BLE001 - the row says which check failed; the table goes on
        return False, failure(exc)
    finally:
        model.zero_grad(set_to_none=True)
    out = f"{time.perf_counter() - start:.2f} s, {stats['forward_tokens']} tokens in {stats['packs']} pass(es)"
    if "tree_attention_flex_packs" in stats:  # what ran, not what was asked: `auto` may pick either
        out += f", {stats['tree_attention_flex_packs']} ran flex"
    if device == "cuda":
        out += f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    return True, out


def server_reservation(share: float, free: int, total: int) -> int | None:
    """Bytes a vLLM server started with `share` beside this trainer holds: `share` of the GPU's *total* memory
    (vLLM's gpu_memory_utilization), whatever the trainer already uses. None when that much is not free:
    vLLM would refuse to start (`vllm.check_memory_share`). The trainer's own use is not subtracted from it."""
    held = int(share * total)
    return held if held <= free else None


def beside_vllm(model, rows: list[Row], pad: int, share: float, attention: str | None) -> str:
    """The update with a co-located server's share of the GPU held: whether it fits, and in how much."""
    torch.cuda.empty_cache()  # the caching allocator's idle blocks are the trainer's to give, not the server's
    free, total = torch.cuda.mem_get_info()
    held = server_reservation(share, free, total)
    if held is None:
        return (f"does not fit: the server's {share:.2f} × {total / 2**30:.0f} GiB = {share * total / 2**30:.1f} "
                f"GiB is more than the {free / 2**30:.1f} GiB free beside the trainer (vLLM would not start)")
    block = torch.empty(held, dtype=torch.uint8, device="cuda")
    try:
        fits, text = update(model, rows, pad, "cuda", attention, warm_up=False)
    finally:
        del block
        torch.cuda.empty_cache()
    verdict = "fits" if fits else "does not fit" if text == "out of memory" else "not known"
    return (f"{verdict}: {text}; {held / 2**30:.1f} GiB held for the server of {total / 2**30:.0f} GiB "
            f"({free / 2**30:.1f} GiB was free)")


@contextmanager
def recorded_logprobs(into: dict[tuple[int, int], float]):
    """Every scored (row, token)'s log-prob exactly as the real update computes it: grpo's loss is wrapped for
    the duration, so nothing of the forward path is re-implemented here."""
    original = grpo.policy_loss

    def recording(forwarded, pk, *args, **kwargs):
        node = torch.tensor(pk.entry_node, dtype=torch.long, device=forwarded.logp.device)
        values = forwarded.logp.detach()[node].float().tolist()
        into.update(zip(zip(pk.entry_row, pk.entry_token, strict=True), values, strict=True))
        return original(forwarded, pk, *args, **kwargs)

    grpo.policy_loss = recording
    try:
        yield
    finally:
        grpo.policy_loss = original


def logprobs_and_grads(model, rows: list[Row], pad: int, packing: str, budget: int | None,
                       attention: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One backward pass of the whole group under `packing`: the scored tokens' log-probs in (row, token) order
    and the LoRA gradients, flattened, in fp32."""
    model.zero_grad(set_to_none=True)
    logps: dict[tuple[int, int], float] = {}
    kwargs = attention_kwargs(attention) if packing == "tree" else {}
    with recorded_logprobs(logps):
        backward(model, rows, role_advantages(rows), pad, packing=packing, max_pack_tokens=budget, **kwargs)
    grads = torch.cat([p.grad.detach().float().flatten() for p in model.parameters()
                       if p.requires_grad and p.grad is not None])
    model.zero_grad(set_to_none=True)
    return torch.tensor([logps[k] for k in sorted(logps)]), grads


def bf16_copy(model):
    """The model with bf16 base weights and fp32 LoRA, as on the GPU (a CPU run builds it in fp32)."""
    if next(model.get_base_model().parameters()).dtype == torch.bfloat16:
        return model
    copied = copy.deepcopy(model)
    for name, param in copied.named_parameters():
        if "lora_" not in name:
            param.data = param.data.to(torch.bfloat16)
    return copied


def randomise_lora_b(model, seed: int = 7) -> None:
    """LoRA's B starts at zero, which makes every A gradient zero: small random B, so both are compared."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.01)


def gaps(got: tuple[torch.Tensor, torch.Tensor], truth: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """How far one path's (log-probs, gradients) are from the fp32 truth: log-prob |Δ| max and mean, gradient
    cosine and relative norm difference."""
    gap = (got[0] - truth[0]).abs()
    cosine = torch.nn.functional.cosine_similarity(got[1], truth[1], dim=0).item()
    norm = abs(got[1].norm().item() - truth[1].norm().item()) / max(truth[1].norm().item(), 1e-30)
    return {"max": gap.max().item(), "mean": gap.mean().item(), "cosine": cosine, "norm": norm}


def compare(tree: tuple[torch.Tensor, torch.Tensor], row: tuple[torch.Tensor, torch.Tensor],
            truth: tuple[torch.Tensor, torch.Tensor]) -> tuple[bool, str]:
    """bf16 tree against bf16 row, both measured against the same weights computed in fp32 (the truth): the tree
    passes when its mean (max) log-prob error is no more than MEAN_RATIO (MAX_RATIO) × the row path's own bf16
    error, plus a floor for errors near zero, its gradient cosine to the truth is > GRAD_COSINE and its norm
    within GRAD_NORM. Absolute limits alone cannot tell a defect from bf16 rounding: on the H200 (2026-12-04),
    bf16 tree and bf16 row log-probs of this group were 0.024 apart on average, with no fp32 reference to say
    which path the gap came from."""
    t, r = gaps(tree, truth), gaps(row, truth)
    ok = (len(tree[0]) == len(row[0]) == len(truth[0])
          and t["mean"] <= MEAN_RATIO * r["mean"] + ERROR_FLOOR and t["max"] <= MAX_RATIO * r["max"] + ERROR_FLOOR
          and t["cosine"] > GRAD_COSINE and t["norm"] < GRAD_NORM)
    return ok, (f"against fp32, log-prob |Δ| max {t['max']:.3g} mean {t['mean']:.2g} (row, bf16: max {r['max']:.3g} "
                f"mean {r['mean']:.2g}; limits {MAX_RATIO} and {MEAN_RATIO} × row + {ERROR_FLOOR}); "
                f"grad cosine {t['cosine']:.5f} (row {r['cosine']:.5f}; > {GRAD_COSINE}), "
                f"norm diff {t['norm']:.2%} (row {r['norm']:.2%}; "
                f"< {GRAD_NORM:.0%}); {len(row[0])} tokens, spread {truth[0].std().item():.2g}")


class TreeVsRow:
    """bf16 tree packing against bf16 row packing on a deferred, unaligned group (`deferred_rows`), each measured
    against the same weights run in fp32 with row packing: the references are computed once, each tree
    attention path is compared with them."""

    def __init__(self, model, tok, tokens: int, device: str) -> None:
        self.rows, self.budget = deferred_rows(tok, tokens)
        self.pad, self.device, self.source = tok.pad_token_id, device, model
        self.model = None  # prepared by the first comparison, inside its row (whatever fails there is its row)
        self.reference: tuple[torch.Tensor, torch.Tensor] | None = None
        self.truth: tuple[torch.Tensor, torch.Tensor] | None = None

    def shape(self) -> str:
        ops = build(self.rows, "tree", self.budget)
        deferred = sum(type(op).__name__ == "Restore" for op in ops)
        tokens = len(self.rows[0].prompt_ids) + sum(len(r.completion_ids) for r in self.rows)
        return f"{tokens:,}-token tree, budget {self.budget:,}: {len(ops) - deferred} packs, {deferred} deferred"

    def _references(self) -> None:
        self.model = bf16_copy(self.source)
        randomise_lora_b(self.model)
        fp32 = copy.deepcopy(self.model).float()  # bf16 weights upcast exactly: the same function, in fp32
        # without the kernel guard: flash has no fp32, and the math kernel is the more exact reference here
        self.truth = logprobs_and_grads(fp32, self.rows, self.pad, "row", None, None)
        del fp32
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        with kernel_guard(self.device):
            self.reference = logprobs_and_grads(self.model, self.rows, self.pad, "row", None, None)

    def against(self, path: str) -> str:
        if self.model is None:
            self._references()
        with kernel_guard(self.device):
            tree = logprobs_and_grads(self.model, self.rows, self.pad, "tree", self.budget, path)
        ok, text = compare(tree, self.reference, self.truth)
        return f"{'ok' if ok else 'FAILED (tree vs row)'}: {text}; {self.shape()}"


def vllm_rows(base_dir: Path, peft_model, tok, folder: Path, new_tokens: int, device: str) -> list[tuple[str, str]]:
    """Through the training API's own served policy (start, generate, sync), whatever names it loads adapters under."""
    from envace.training.served import ServedPolicy

    served = ServedPolicy.start(str(base_dir), "", 16, "bfloat16", tok, folder / "served", gpu_memory=0.4)
    rows = []
    try:
        for n in (1, 32, 128):
            speed = tokens_per_s(served.backend, prompts(tok, n), new_tokens, device)
            rows.append((f"vLLM tokens/s, batch {n}", f"{speed:.0f}"))
        rows.append(("LoRA sync (save + hot-load)", f"{served.sync(peft_model):.2f} s"))
    finally:
        served.close()
    return rows


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="1.7b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--packs", default=None, help="tokens of the timed updates' prefix trees (default: "
                        "2048,8192,16384 on CUDA, 256,512 on a CPU)")
    parser.add_argument("--check-tokens", type=int, default=None, help="tokens of the tree-vs-row check's group "
                        "(default: 16384 on CUDA, 600 on a CPU)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per generation (128; 16 on a CPU)")
    parser.add_argument("--batches", default=None, help="generation batch sizes (1,32,128; 1,4 on a CPU)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="rows past this many seconds are skipped")
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    args.packs = args.packs or ("2048,8192,16384" if gpu else "256,512")
    args.check_tokens = args.check_tokens or (16384 if gpu else 600)
    args.new_tokens = args.new_tokens or (128 if gpu else 16)
    args.batches = args.batches or ("1,32,128" if gpu else "1,4")
    return args


def generation_rows(table: Table, model, tok, args) -> None:
    hf = HFBackend(model, tok, prefix_cache=False)
    table.add("HF strategy", "padded batches")
    for n in (int(b) for b in args.batches.split(",")):
        table.measure(f"HF tokens/s, batch {n}",
                      lambda n=n: f"{tokens_per_s(hf, prompts(tok, n), args.new_tokens, args.device):.0f}")


def update_rows(table: Table, model, tok, args) -> None:
    """Each pack size with each tree attention path (checkpointing on), then the middle size with it off."""
    device, pad = args.device, tok.pad_token_id
    packs = sorted(int(p) for p in args.packs.split(","))
    model.train()
    set_checkpointing(model, True)
    for pack in packs:
        batch = pack_rows(tok, pack)
        for path in ("dense", "flex"):
            key = f"GRPO update, {pack:,}-token tree, {path}, checkpointing on"
            if path == "flex" and device != "cuda":
                table.add(key, "n/a on CPU (FlexAttention has no backward on CPU)")
            elif path == "flex" and not has_tree_attention():
                table.add(key, "not timed: grpo_step here has no tree_attention keyword (dense is the only path)")
            else:
                table.measure(key, lambda b=batch, p=path: update(model, b, pad, device, p)[1])
    middle = packs[len(packs) // 2]
    set_checkpointing(model, False)
    table.measure(f"GRPO update, {middle:,}-token tree, dense, checkpointing off",
                  lambda: update(model, pack_rows(tok, middle), pad, device, "dense")[1])
    set_checkpointing(model, True)


def check_rows(table: Table, model, tok, args) -> None:
    """The bf16 tree-vs-row check for every path this device can back-propagate; flex said to be n/a otherwise."""
    check = TreeVsRow(model, tok, args.check_tokens, args.device)
    for path in ("dense", "flex"):
        key = f"bf16 tree ({path}) vs row, {args.check_tokens:,} tokens, deferred + unaligned"
        if path == "flex" and args.device != "cuda":
            table.add(key, "n/a on CPU (FlexAttention has no backward on CPU)")
        elif path == "flex" and not has_tree_attention():
            table.add(key, "not run: grpo_step here has no tree_attention keyword")
        else:
            table.measure(key, lambda p=path: check.against(p))


def memory_rows(table: Table, model, tok, args) -> None:
    largest = max(int(p) for p in args.packs.split(","))
    batch = pack_rows(tok, largest)
    for share in (0.92, 0.4):
        table.measure(f"{largest:,}-token update beside vLLM holding {share:.2f} of the GPU",
                      lambda s=share: beside_vllm(model, batch, tok.pad_token_id, s, None))


def main(argv: list[str] | None = None) -> list[tuple[str, str]]:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device here (run with --shape tiny --device cpu on a CPU)")
    import transformers

    table = Table(args.budget_s)
    table.add("device", torch.cuda.get_device_name() if args.device == "cuda" else "CPU")
    table.add("torch / transformers", f"{torch.__version__} / {transformers.__version__}")
    model, tok = model_and_tokenizer(args.shape, args.device)
    table.add("parameters (vocabulary)", f"{model.num_parameters() / 1e6:.0f} M ({QWEN3_VOCAB:,})")
    folder = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    if os.environ.get("ENVACE_VLLM_PYTHON"):  # saved before LoRA wraps it: a server loads plain weights
        model.save_pretrained(folder / "base")
        tok.save_pretrained(folder / "base")
    generation_rows(table, model, tok, args)
    peft_model = add_lora(model, 16)
    if os.environ.get("ENVACE_VLLM_PYTHON"):
        for key, value in vllm_rows(folder / "base", peft_model, tok, folder, args.new_tokens, args.device):
            table.add(key, value)
    else:
        table.add("vLLM", "not run: no ENVACE_VLLM_PYTHON (the device image has no vLLM)")
    table.add("tree attention paths", "dense, flex (keyword tree_attention)" if has_tree_attention()
              else "dense only (no tree_attention keyword here)")
    update_rows(table, peft_model, tok, args)
    check_rows(table, peft_model, tok, args)
    if args.device == "cuda":
        memory_rows(table, peft_model, tok, args)
    return table.rows


if __name__ == "__main__":
    main()
