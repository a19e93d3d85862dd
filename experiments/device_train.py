"""The device training check (`bash experiments/device_train.sh`): `envace train`'s own job on one GPU, one table.

Where gpu_check.py times the update's parts, this runs the training job a user runs (`envace.jobs.train_job`,
what `envace train` calls) end to end, with only the device image's packages (torch, transformers 5.17, peft,
accelerate, safetensors, pyarrow, pandas; no duckdb, ray, vllm, trl, datasets, gradio nor benchmark packages)
and the wheels `experiments/device-wheels.txt` names. The model is gpu_check's random-init Qwen3 of Qwen3-1.7B's
shape with its real 151,936-token vocabulary, saved as a model folder; the tokenizer is the tiny one shipped in the
repository (sampled ids it does not know decode to nothing); the environment is the example shop
(`envace.envs.example:benchmark`, no benchmark package). Every run on the device: bf16, LoRA, checkpointing, tree
packing with `packing.attention = "auto"` under a 16,384-token budget, HF generation, a short SFT warm-up, and
`packing.flat_row_metrics` on.

Three runs into one root, then checks read back from their Parquet shards with pyarrow (no duckdb):
- `sync`: two synchronous GRPO steps; the golden run for resume, and its checkpoint is merged and reloaded;
- `resumed`: one step, then `--resume` to two: the next step, the units and the state against `sync`;
- `stale`: two steps with `grpo.max_staleness = 1`: step 2 is sampled by policy version 0.
A random init earns reward 0 on every rollout, so every GRPO advantage is 0 and the steps back-propagate nothing
(the table says so); SFT is the backward pass, and the GRPO rows are forwarded without gradient for the entropy
and the log-prob gap between generation and training. Each row is printed (and flushed) the moment it is
checked: `| check | value | ok/FAIL | seconds |`; the exit status is 1 when any row failed.

Files go to a temporary root under `$OUT` when it is set (what the device tool brings back: the table, the jobs'
log, the runs' Parquet shards) or under the system's temp folder; the model weights are deleted at the end.
`--cpu` is the rehearsal of the same script on a CPU with tiny shapes (`tests/test_gpu_rehearsal.py`, with the
packages the device lacks made unimportable); on one H200 or H100 the whole table should take under 10 minutes.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check, when this file is imported, not run

import gpu_check  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from envace.config import TrainConfig, overlay  # noqa: E402
from envace.jobs import Reporter, train_job  # noqa: E402
from envace.policy.hf import prefers_prefix_cache  # noqa: E402
from envace.training import checkpoint, flex_tree, grpo  # noqa: E402

EXAMPLE_ENV = "envace.envs.example:benchmark"


@dataclass(frozen=True)
class Shape:
    """What differs between the device and its CPU rehearsal; every other setting is the same."""

    model: str  # a key of gpu_check.SHAPES
    device: str
    dtype: str
    budget: int  # packing.max_tokens
    tasks: int  # grpo.tasks_per_step
    group: int
    new_tokens: int
    gap_tolerance: float  # mean |log π_train − log π_generate| allowed (fp32 on a CPU, bf16 on a GPU)
    state_tolerance: float  # per-tensor relative difference of resumed and golden weights
    logit_tolerance: float  # max |Δ logit| between the merged model in memory and its reloaded checkpoint
    time_limit_s: float


# GPU: 4 tasks (the whole example pool) × G = 8 × up to 2 turns of 256 tokens is a ~18k-token step, more than one
# 16,384-token pack. bf16 rounding of a 151,936-way log-softmax of a random 28-layer model put tree and row
# log-probs 0.024 apart on average on the H200 (docs/benchmarks.md); a misaligned token is off by the log-probs'
# own spread, ~0.9 here. Deterministic fp32 on a CPU leaves nothing but summation order.
GPU = Shape("1.7b", "cuda", "bfloat16", 16384, 4, 8, 256, 0.1, 1e-2, 1e-2, 600.0)
CPU = Shape("tiny", "cpu", "float32", 2048, 2, 2, 8, 1e-3, 1e-5, 1e-4, 180.0)


class Table:
    """One row per check, printed and flushed when it is checked (a timeout keeps every finished row), and
    appended to `path`. A check that raises is a failed row; the next checks still run."""

    def __init__(self, path: Path) -> None:
        self.path, self.failed, self.started = path, [], time.perf_counter()
        self._line("| check | value | ok | s |")
        self._line("|---|---|---|---|")

    def _line(self, text: str) -> None:
        print(text, flush=True)
        with self.path.open("a") as f:
            f.write(text + "\n")

    def row(self, name: str, check: Callable[[], tuple[str, bool]]) -> bool:
        started = time.perf_counter()
        try:
            value, ok = check()
        except Exception as exc:  # noqa: BLE001 - one failed check is a row, not the end of the table
            traceback.print_exc()  # stderr: where it failed, for a device run that cannot be repeated at will
            value, ok = gpu_check.failure(exc), False
        if not ok:
            self.failed.append(name)
        value = value.replace("|", "\\|")  # |Δ| inside a cell would end it
        self._line(f"| {name} | {value} | {'ok' if ok else 'FAIL'} | {time.perf_counter() - started:.1f} |")
        return ok


class Log(Reporter):
    """The jobs' own lines, kept in a file beside the table (stdout carries the table alone)."""

    def __init__(self, path: Path) -> None:
        self.path, self.lines = path, []

    def say(self, text: str) -> None:
        self.lines.append(text)
        with self.path.open("a") as f:
            f.write(text + "\n")


@contextmanager
def recorded_packs(into: list[dict]):
    """Every pack plan the updates build (SFT's and GRPO's), as the real `grpo.build` returns it: what the
    budget did is observed, nothing of the packing is re-implemented here."""
    original = grpo.build

    def recording(rows, packing, budget, *args, **kwargs):
        ops = original(rows, packing, budget, *args, **kwargs)
        into.append({"packing": packing, "budget": budget,
                     "row_tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows),
                     "packs": [len(op.ids) for op in ops if hasattr(op, "ids")]})  # a Restore has no ids
        return ops

    grpo.build = recording
    try:
        yield
    finally:
        grpo.build = original


@contextmanager
def merged_logits(ids: list[int], into: dict):
    """The logits of `ids` under the final model exactly as the job merged it in memory, right after it was saved
    (`checkpoint.write_checkpoint` merges LoRA in place, then saves): the job's own writer, wrapped."""
    original = checkpoint.write_checkpoint

    def recording(out, model, tokenizer, seen, lora):
        written = original(out, model, tokenizer, seen, lora)
        model.eval()
        with torch.no_grad():
            device = next(model.parameters()).device
            into["logits"] = model(input_ids=torch.tensor([ids], device=device)).logits.float().cpu()
        return written

    checkpoint.write_checkpoint = recording
    try:
        yield
    finally:
        checkpoint.write_checkpoint = original


def compile_counts() -> dict[str, int]:
    """Dynamo's compilations in this process so far: frames compiled, graphs, recompilations (a compile whose cache
    already held an entry for that frame: its guards failed), and the most compilations of any one frame (at
    dynamo's `recompile_limit` a frame silently runs eager from then on). The metrics keep the last 64."""
    from torch._dynamo import utils

    metrics = getattr(utils, "get_compilation_metrics", list)()
    per_frame: dict[tuple, int] = {}
    for m in metrics:
        key = (getattr(m, "co_filename", None), getattr(m, "co_name", None), getattr(m, "co_firstlineno", None))
        per_frame[key] = per_frame.get(key, 0) + 1
    return {"frames": utils.counters["frames"]["total"], "graphs": utils.counters["stats"]["unique_graphs"],
            "recompiles": sum(getattr(m, "recompile_reason", None) is not None for m in metrics),
            "worst": max(per_frame.values(), default=0)}


def recompiles() -> tuple[str, bool]:
    limit = getattr(torch._dynamo.config, "recompile_limit", 8)
    c = compile_counts()
    return (f"{c['recompiles']} recompilation(s); {c['frames']} frame(s) compiled, {c['graphs']} graph(s); at most "
            f"{c['worst']} compilation(s) of one frame (< dynamo's recompile_limit {limit})"), c["worst"] < limit


def shards(run: Path, table: str) -> list[dict]:
    """Every row of one table of a stored run, read from its Parquet shards with pyarrow alone."""
    return [row for f in sorted((run / table).glob("*.parquet")) for row in pq.read_table(f).to_pylist()]


def metrics(run: Path, phase: str = "grpo") -> dict[int, dict[str, float]]:
    """{step: {name: value}} of the run's `all` metrics of `phase`."""
    out: dict[int, dict[str, float]] = {}
    for row in shards(run, "metrics"):
        if row["phase"] == phase and row["role"] == "all":
            out.setdefault(row["step"], {})[row["name"]] = row["value"]
    return out


def ints(per_step: dict[int, dict[str, float]], name: str) -> list[int]:
    """One metric of every step, in step order, as the whole numbers it counts."""
    return [int(per_step[s][name]) for s in sorted(per_step)]


def state(run: Path) -> dict:
    return torch.load(run / "state.pt", weights_only=True, map_location="cpu")


def config(shape: Shape, model: Path, **changes) -> TrainConfig:
    """The device run's `[train]` table, with `changes` (tables: `grpo={"steps": 1}`) laid over it."""
    table = {"model": str(model),
             "policy": {"dtype": shape.dtype, "lora": True, "lora_rank": 16, "gradient_checkpointing": True},
             "packing": {"strategy": "tree", "attention": "auto", "max_tokens": shape.budget, "flat_row_metrics": True},
             "sft": {"tasks": 2, "epochs": 1},
             "grpo": {"steps": 2, "tasks_per_step": shape.tasks, "pool_overlap": True}, "eval": {"every": 0},
             "rollout": {"env": EXAMPLE_ENV, "category": "groceries", "group_size": shape.group,
                         "max_new_tokens": shape.new_tokens}}
    return TrainConfig.from_dict(overlay(table, changes))


class Check:
    """The three runs and what the table reads of them (module docstring)."""

    def __init__(self, shape: Shape, root: Path, model: Path, tok) -> None:
        self.shape, self.root, self.model, self.tok = shape, root, model, tok
        self.log = Log(root / "train.log")
        self.packs: list[dict] = []
        self.merged: dict = {}
        self.probe = gpu_check.prompts(tok, 1, words=4)[0]

    def train(self, name: str, resume: bool = False, **changes) -> Path:
        with recorded_packs(self.packs):
            run, _ = train_job(config(self.shape, self.model, **changes), self.root, None if resume else name,
                               name if resume else None, self.log)
        gc.collect()  # the job's model and its copies go before the next job loads its own
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return run.path

    # --- sync: the golden run ---------------------------------------------------------------------------------
    def synchronous(self) -> tuple[str, bool]:
        with merged_logits(self.probe, self.merged):
            self.sync = self.train("sync")
        m = metrics(self.sync)
        ok = sorted(m) == [0, 1] and all(m[s]["staleness"] == 0 and m[s]["policy_version"] == s for s in m)
        trained, skipped = ints(m, "rows_backpropagated"), ints(m, "rows_skipped")
        rows = [a + b for a, b in zip(trained, skipped, strict=True)]
        return (f"steps {sorted(m)}, staleness {ints(m, 'staleness')}, policy versions "
                f"{ints(m, 'policy_version')}; rows back-propagated {trained} of {rows} (a random init "
                f"earns reward 0: every advantage 0); update {m[0]['update_s']:.2f} s, step {m[0]['step_s']:.2f} s"), ok

    def generation(self) -> tuple[str, bool]:
        gens = [g for g in shards(self.sync, "generations") if g["step"] == 0]
        tokens = sum(len(g["completion_ids"]) for g in gens)
        aligned = all(g["logprobs"] is not None and len(g["logprobs"]) == len(g["completion_ids"]) and
                      all(math.isfinite(x) for x in g["logprobs"]) for g in gens)
        seconds = metrics(self.sync)[0]["rollout_s"]
        strategy = "one prompt at a time, prefix cache" if prefers_prefix_cache(self.shape.device) else "padded batches"
        return (f"{len(gens)} messages, {tokens:,} tokens in {seconds:.1f} s ({tokens / seconds:,.0f} tokens/s, "
                f"{strategy}); a finite log-prob per token: {aligned}"), bool(gens) and tokens > 0 and aligned

    def lora(self) -> tuple[str, bool]:
        weights = state(self.sync)["model"]
        params = sum(t.numel() for t in weights.values())
        moved = max((t.abs().max().item() for n, t in weights.items() if "lora_B" in n), default=0.0)
        only_lora = bool(weights) and all("lora_" in n for n in weights)
        return (f"{len(weights)} trainable tensors, {params / 1e6:.2f} M parameters, all LoRA: {only_lora}; "
                f"SFT moved B off zero: max |B| {moved:.2e}"), only_lora and moved > 0

    def merge(self) -> tuple[str, bool]:
        """The saved checkpoint loaded back with transformers: its logits on a probe against the merged model's
        in memory, and its weights against the base's (a merge that dropped LoRA would equal the base)."""
        from safetensors import safe_open
        from transformers import AutoModelForCausalLM

        folder = self.sync / "checkpoint"
        reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, self.shape.dtype))
        reloaded.to(self.shape.device).eval()
        with torch.no_grad():
            logits = reloaded(input_ids=torch.tensor([self.probe], device=self.shape.device)).logits.float().cpu()
        del reloaded
        gap = (logits - self.merged["logits"]).abs().max().item()
        key = "model.layers.0.self_attn.q_proj.weight"

        def tensor(where: Path) -> torch.Tensor:
            for f in sorted(where.glob("*.safetensors")):
                with safe_open(f, "pt") as st:
                    if key in st.keys():
                        return st.get_tensor(key).float()
            raise KeyError(f"{key} in {where}")

        moved = (tensor(folder) - tensor(self.model)).abs().max().item()
        return (f"max |Δ logit| reloaded vs merged in memory {gap:.2e} (≤ {self.shape.logit_tolerance:g}) over "
                f"{len(self.probe)} tokens; layer 0 q_proj moved by the merge: max |Δ| {moved:.2e}"), \
            gap <= self.shape.logit_tolerance and moved > 0

    # --- resumed: one step, then --resume to two, against sync ----------------------------------------------------
    def resume(self) -> tuple[str, bool]:
        first = self.train("resumed", grpo={"steps": 1})
        saved_step = state(first)["next_step"]
        before = len(self.log.lines)
        self.train("resumed", resume=True, grpo={"steps": 2})
        said = self.log.lines[before:]
        resumed = any("resuming at GRPO step 2" in line for line in said)
        no_sft = not any(line.startswith("SFT:") for line in said)
        ran = sum(line.startswith("GRPO step ") for line in said)
        after, golden = state(first), state(self.sync)
        steps = sorted(metrics(first))
        rel = max(((after["model"][n] - t).norm() / t.norm().clamp_min(1e-12)).item()
                  for n, t in golden["model"].items())
        units, opening, same = self._against_golden(first)
        cpu = self.shape.device == "cpu"
        ok = (saved_step == 1 and after["next_step"] == 2 and resumed and no_sft and ran == 1 and steps == [0, 1]
              and units and opening and rel <= self.shape.state_tolerance and (same == 1.0 or not cpu))
        return (f"state.pt next step {saved_step} → {after['next_step']}; resumed at step 2: {resumed}, without SFT: "
                f"{no_sft}, {ran} step(s) run; stored steps {steps}; step 2's units and opening prompts as the "
                f"uninterrupted run's: {units and opening}; weights vs it: max relative {rel:.1e} "
                f"(≤ {self.shape.state_tolerance:g}); identical completions {same:.0%}"
                + ("" if cpu else " (bf16 kernels need not repeat bit for bit: not required)")), ok

    def _against_golden(self, run: Path) -> tuple[bool, bool, float]:
        """Step 2 of `run` against `sync`'s: the same units (task, group index), the same opening prompts (they
        depend on the task alone), and the share of generations whose tokens are identical."""
        def step1(where: Path):
            episodes = {e["episode_id"]: e for e in shards(where, "episodes") if e["step"] == 1}
            gens = sorted((g for g in shards(where, "generations") if g["step"] == 1),
                          key=lambda g: (g["episode_id"], g["turn"], g["turn_step"], g["role"], g["call_index"] or 0))
            first = {}
            for g in gens:
                if g["role"] == "caller" and g["episode_id"] not in first:
                    first[g["episode_id"]] = episodes[g["episode_id"]]["context_ids"][:g["prompt_len"]]
            units = sorted((e["episode_id"], e["task_uid"], e["group_index"]) for e in episodes.values())
            return units, first, [(g["episode_id"], g["turn"], g["turn_step"], g["completion_ids"]) for g in gens]

        (units, first, gens), (g_units, g_first, g_gens) = step1(run), step1(self.sync)
        same = sum(a == b for a, b in zip(gens, g_gens, strict=False)) / max(len(g_gens), 1)
        return bool(units) and units == g_units, bool(first) and first == g_first, same

    # --- stale: grpo.max_staleness = 1 -------------------------------------------------------------------------------
    def staleness(self) -> tuple[str, bool]:
        self.stale = self.train("stale", grpo={"max_staleness": 1, "importance_cap": 2.0})
        m = metrics(self.stale)
        versions = sorted({g["policy_version"] for g in shards(self.stale, "generations") if g["step"] == 1})
        ok = (sorted(m) == [0, 1] and m[0]["staleness"] == 0 and m[1]["staleness"] == 1 and versions == [0]
              and "dropped_stale_steps" not in m[1])
        return (f"step 2 sampled by version(s) {versions}, staleness {ints(m, 'staleness')}; "
                f"learner waited {m[1].get('wait_s', math.nan):.2f} s for it"), ok

    # --- across the runs ----------------------------------------------------------------------------------------
    def gap(self) -> tuple[str, bool]:
        parts, ok, sampled = [], True, []
        for name, run in (("sync", self.sync), ("stale", self.stale)):
            m = metrics(run)
            sampled += [x for g in shards(run, "generations") for x in (g["logprobs"] or [])]
            gaps = [m[s].get("logprob_gap", math.nan) for s in sorted(m)]
            kls = [m[s].get("kl_estimate", math.nan) for s in sorted(m)]
            ok = ok and len(gaps) == 2 and all(math.isfinite(g) and g <= self.shape.gap_tolerance for g in gaps)
            parts.append(f"{name} {', '.join(f'{g:.2e}' for g in gaps)} (KL {', '.join(f'{k:.1e}' for k in kls)})")
        # beside the sampled log-probs' own spread: what a token read at the wrong position would be off by
        spread = torch.tensor(sampled).std().item() if len(sampled) > 1 else math.nan
        return (f"mean |log π_train − log π_generate| per step: {'; '.join(parts)}; ≤ {self.shape.gap_tolerance:g}; "
                f"sampled log-probs' spread {spread:.2f}"), ok

    def packing(self) -> tuple[str, bool]:
        plans = [p for p in self.packs if p["packs"]]
        sizes = [n for p in plans for n in p["packs"]]
        forwarded, tokens = sum(sizes), sum(p["row_tokens"] for p in plans)
        ok = (bool(plans) and all(p["packing"] == "tree" and p["budget"] == self.shape.budget for p in plans)
              and max(sizes) <= self.shape.budget and forwarded < tokens)
        return (f"{len(plans)} pack plans (SFT and GRPO), {len(sizes)} packs, largest {max(sizes):,} of the "
                f"{self.shape.budget:,}-token budget; {forwarded:,} tokens forwarded for {tokens:,} row tokens (shared "
                f"prefixes once)"), ok

    def attention(self) -> tuple[str, bool]:
        flex = sum(metrics(run)[s]["tree_attention_flex_packs"] for run in (self.sync, self.stale)
                   for s in metrics(run))
        chosen = {f"{bucket[0]:,} keys": kind for bucket, kind in flex_tree._chosen.items()}
        if self.shape.device == "cpu":  # auto is dense off CUDA: FlexAttention has no backward on a CPU
            return f"dense off CUDA; GRPO packs that ran flex: {int(flex)}", flex == 0 and not chosen
        return (f"auto measured per key bucket: {chosen or 'nothing'}; GRPO packs that ran flex: {int(flex)}"), \
            bool(chosen) and set(chosen.values()) <= {"dense", "flex"}


def build_model(shape: Shape, folder: Path) -> tuple[str, bool]:
    """gpu_check's random-init Qwen3 (built on the device: a 1.7B init on the host takes minutes), saved with the
    tiny tokenizer as the model folder every run loads."""
    model, tok = gpu_check.model_and_tokenizer(shape.model, shape.device)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    text = (f"{model.config.model_type}, {model.num_parameters() / 1e6:,.0f} M parameters, vocabulary "
            f"{model.config.vocab_size:,}, {shape.dtype}; tokenizer: the tiny one ({len(tok):,} ids)")
    ok = model.config.vocab_size == gpu_check.QWEN3_VOCAB and model.config.model_type == "qwen3"
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # each job loads its own copy from the folder
    return text, ok


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU rehearsal: tiny shapes, the same checks")
    parser.add_argument("--keep-weights", action="store_true", help="keep the model folder, checkpoints and states")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    shape = CPU if args.cpu else GPU
    if shape.device == "cuda" and not torch.cuda.is_available():
        print("device_train: no CUDA device here (run with --cpu on a CPU)", file=sys.stderr)
        return 2
    import peft
    import transformers

    out = os.environ.get("OUT") or None
    root = Path(tempfile.mkdtemp(prefix="device-train-", dir=out))
    # the model folder stays outside $OUT: gigabytes the device tool would try to bring back
    model_dir = Path(tempfile.mkdtemp(prefix="device-train-model-")) / "qwen3-random"
    table = Table(root / "table.md")
    table.row("device", lambda: (torch.cuda.get_device_name() if shape.device == "cuda" else "CPU", True))
    table.row("torch / transformers / peft",
              lambda: (f"{torch.__version__} / {transformers.__version__} / {peft.__version__}", True))
    table.row("files", lambda: (f"{root} (the jobs' log: train.log)", True))
    try:
        if not table.row("model from a config", lambda: build_model(shape, model_dir)):
            return 1
        from transformers import AutoTokenizer

        check = Check(shape, root, model_dir, AutoTokenizer.from_pretrained(model_dir))
        if table.row("synchronous steps (run sync, 2 steps)", check.synchronous):
            table.row("HF generation (sync, step 1)", check.generation)
            table.row("LoRA", check.lora)
            table.row("merge + reload of the checkpoint", check.merge)
            table.row("resume: 1 step, then --resume to 2", check.resume)
            if table.row("staleness-1 step (run stale)", check.staleness):
                table.row("log-prob gap, generation vs training", check.gap)
                table.row("tree attention auto", check.attention)
            table.row("tree packing", check.packing)
        table.row("torch recompiles", recompiles)
        if shape.device == "cuda":
            table.row("peak GPU memory", lambda: (f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", True))
    finally:
        if not args.keep_weights:
            shutil.rmtree(model_dir.parent, ignore_errors=True)
            for path in [*root.glob("*/checkpoint"), *root.glob("*/state.pt")]:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    elapsed = time.perf_counter() - table.started
    table.row("total", lambda: (f"{elapsed:.0f} s (limit {shape.time_limit_s:.0f} s); failed: "
                                f"{', '.join(table.failed) or 'none'}", elapsed < shape.time_limit_s))
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(main())
