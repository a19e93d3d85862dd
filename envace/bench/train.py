"""`envace bench train`: one real GRPO step's update timed under `row`, `chain` and `tree` packing, side by side.

The rows are those of real GRPO steps: played with the trainer's own code (`train_job`, HF rollouts, the
recipe's settings from `--config`) or read from a stored training run (`--from-run`), with the
advantages the update used. Every strategy starts from the same weights (LoRA rank 16 on the same
model, as the CPU recipe trains) and takes one AdamW step over the same rows:

- `row`: each row its own forward pass (what a per-row trainer does; the reference for gradients);
- `chain`: an episode's caller rows joined into one sequence;
- `tree`: the step's prefix trees, every shared token computed once (`envace.training.packing.tree`);
- the same tree with rows of advantage 0 not back-propagated (the trainer's default);
- with `--trl`, TRL's `GRPOTrainer.compute_loss` (its own loss) on the same rows, one row per micro-batch
  as its `per_device_train_batch_size = 1` would, then backward and AdamW.

Then the same rows' tree packs forwarded without gradient, their masked attention once as a dense additive
mask (SDPA) and once as FlexAttention (`training/flex_tree.py`), side by side: forward only off CUDA, since
FlexAttention has no backward pass on a CPU (where it runs eagerly, unfused).

Row-tokens/s counts every row's prompt + completion tokens (the work a per-row trainer does) over wall
time; peak memory is the high-water mark above the level before the phase, sampled every 50 ms, of the heap
in use (malloc'd and not freed: what a strategy holds at once) and of the resident set (after freed heap was
handed back; it also depends on what earlier phases left to reuse). Max |Δgrad| is the largest difference of
any trainable gradient from `row`'s, relative to the norm of `row`'s gradient. `--sft-tasks K` adds one SFT
epoch of K train tasks' reference rows, the same optimiser steps under `chain` and `tree`.
"""

from __future__ import annotations

import copy
import ctypes
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from envace.engine.examples import ExampleBank
from envace.envs import registry
from envace.errors import UsageError
from envace.policy.models import add_lora, load_policy
from envace.training import flex_tree
from envace.training.forward import attention_blocks
from envace.training.grpo import Row, backward, grpo_step
from envace.training.packing import build
from envace.training.packing.tree import Restore, tree_tokens
from envace.training.rows import reference_rows


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                        "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use() -> int | None:
    """Bytes the process has malloc'd and not freed (glibc's mallinfo2: arenas' chunks in use + mmap'd chunks),
    where torch's CPU tensors live; None off glibc."""
    global _MALLINFO2
    if _MALLINFO2 is None:
        try:
            _MALLINFO2 = ctypes.CDLL("libc.so.6").mallinfo2
            _MALLINFO2.restype = _Mallinfo2
        except (OSError, AttributeError):
            _MALLINFO2 = False
    if not _MALLINFO2:
        return None
    info = _MALLINFO2()
    return info.uordblks + info.hblkhd


_MALLINFO2 = None


class _Peak:
    """High-water marks above the starting level while the block runs (MiB), sampled every 50 ms: of the heap
    in use (what the strategy holds at once, the comparison) and of the resident set (which also depends on how
    the allocator reuses what earlier phases freed: ±600 MiB from one run to the next here)."""

    def __enter__(self) -> _Peak:
        import psutil

        self._proc = psutil.Process()
        self._rss0, self._heap0 = self._proc.memory_info().rss, _heap_in_use()
        self._rss, self._heap = self._rss0, self._heap0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        self._rss = max(self._rss, self._proc.memory_info().rss)
        if self._heap is not None:
            self._heap = max(self._heap, _heap_in_use() or 0)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self._read()

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._read()

    @property
    def mib(self) -> float:
        """The heap's peak above the start (the resident set's where mallinfo2 is missing)."""
        if self._heap is None:
            return self.rss_mib
        return (self._heap - self._heap0) / 2**20

    @property
    def rss_mib(self) -> float:
        return (self._rss - self._rss0) / 2**20


def _trl_trainer(model, tok, out_dir: str):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=2, num_generations=2, beta=0.0,
                      loss_type="grpo", report_to="none", use_cpu=True, bf16=False, logging_steps=1,
                      max_completion_length=64, gradient_checkpointing=False)
    data = Dataset.from_list([{"prompt": "unused"}] * 2)  # the update below never samples from it
    return GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                       args=args, train_dataset=data, processing_class=tok)


def _trl_update(trainer, rows: list[Row], advantages: list[float]) -> None:
    model = trainer.model
    trainer.current_gradient_accumulation_steps = 1  # set by its training loop, which this update bypasses
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    for row, adv in zip(rows, advantages, strict=True):  # per_device_train_batch_size = 1: no padding
        completion = row.completion_ids or [trainer.processing_class.pad_token_id]
        inputs = {"prompt_ids": torch.tensor([row.prompt_ids]), "prompt_mask": torch.ones(1, len(row.prompt_ids),
                                                                                         dtype=torch.long),
                  "completion_ids": torch.tensor([completion]),
                  "completion_mask": torch.tensor([[1 if row.completion_ids else 0] * len(completion)]),
                  "advantages": torch.tensor([adv]), "num_items_in_batch": torch.tensor(float(len(rows)))}
        (trainer.compute_loss(model, inputs) / len(rows)).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _timed(step: Callable[[], Any]) -> tuple[float, _Peak, Any]:
    """(wall seconds, the memory peaks above the start, what `step` returned)."""
    with _Peak() as mem:
        start = time.perf_counter()
        value = step()
        seconds = time.perf_counter() - start
    return seconds, mem, value


def _free() -> None:
    """Give freed heap back to the OS, so the next phase's resident-set peak starts from what is in use."""
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: peaks are then only upper bounds
        pass


def stored_step_rows(root, run_id: str, steps: int) -> list[tuple[list[Row], list[float]]]:
    """The rows and advantages of a stored training run's first `steps` GRPO updates, exactly as they were used
    (a caller's prompt is its episode's context up to the message; the sampler's log-probs ride along)."""
    from envace.store import connect

    con = connect(root)
    context = dict(con.execute("SELECT episode_id, context_ids FROM episodes WHERE run_id = ? AND phase = 'grpo'",
                               [run_id]).fetchall())
    found = con.execute(
        "SELECT g.step, g.episode_id, g.role, g.prompt_len, g.prompt_ids, g.completion_ids, g.logprobs, e.task_uid, "
        "g.reward, g.advantage, g.temperature, g.top_p FROM generations g JOIN episodes e USING (run_id, episode_id) "
        "WHERE g.run_id = ? AND e.phase = 'grpo' AND g.advantage IS NOT NULL ORDER BY g.step, g.episode_id, g.turn, "
        "g.turn_step, g.role, g.call_index", [run_id]).fetchall()
    by_step: dict[int, tuple[list[Row], list[float]]] = {}
    for step, episode, role, plen, pids, cids, logprobs, task, reward, adv, temperature, top_p in found:
        prompt = list(pids) if pids is not None else list(context[episode][:plen])  # a caller's, re-rendered or not
        rows, advantages = by_step.setdefault(step, ([], []))
        rows.append(Row(task, role, prompt, list(cids), reward, list(logprobs) if logprobs is not None else None,
                        temperature, top_p))
        advantages.append(adv)
    if not by_step:
        raise UsageError(f"--from-run: run '{run_id}' has no stored GRPO rows with advantages under {root}")
    return [by_step[k] for k in sorted(by_step)[:steps]]


def played_step_rows(cfg, steps: int, root, say) -> tuple[str, list[tuple[list[Row], list[float]]]]:
    """Play `steps` real GRPO steps (rollouts and update: the trainer's own code) into a training run under `root`
    and read their rows back; the run stays, so `--from-run` can time the same rows again."""
    from envace.jobs import Reporter, train_job

    quiet = type("Quiet", (Reporter,), {"say": lambda self, text: say("  " + text) if "GRPO step" in text else None})()
    name = f"bench-train-{time.strftime('%Y%m%d-%H%M%S')}"
    train_job(cfg, root, name, reporter=quiet)
    return name, stored_step_rows(root, name, steps)


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _update(base, rows: list[Row], advantages: list[float], pad: int, packing: str, lr: float,
            max_pack_tokens: int | None, skip_flat: bool) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One `grpo_step` on a fresh LoRA copy of `base` (seeded: every strategy starts from the same adapters)."""
    torch.manual_seed(0)
    model = add_lora(copy.deepcopy(base), 16)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    _free()
    stats: dict[str, Any] = {}
    with _Peak() as mem:
        started = time.perf_counter()
        stats = grpo_step(model, optimizer, rows, advantages, pad, packing=packing, max_pack_tokens=max_pack_tokens,
                          skip_flat=skip_flat)
        stats["wall_s"] = time.perf_counter() - started
    stats["peak_mib"], stats["peak_rss_mib"] = mem.mib, mem.rss_mib
    return stats, _grads(model)


def _relative_gap(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """max |g − g_row| over every parameter, relative to ‖g_row‖ (fp32); a gradient never computed is zero."""
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in reference.values())).item()
    gap = max((grads.get(n, torch.zeros_like(g)) - g).abs().max().item() for n, g in reference.items())
    return gap / norm if norm > 0 else gap


def bench_train(model: str = "default", limit: int = 3, group_size: int = 8, unit: str = "turn", steps: int = 1,
                from_run: str | None = None, root: str = "runs", train: dict | None = None, sft_tasks: int = 0,
                trl: bool = False, max_pack_tokens: int | None = None, console=None) -> dict[str, Any]:
    """One real GRPO step's rows (played with the trainer's own code, or read `from_run`), the update timed as
    `row`, `chain` and `tree` on them side by side (and TRL's per-row update with `trl`); then one SFT epoch of
    `sft_tasks` train tasks' reference rows under `chain` and `tree`. `train` is a config's `[train]` table
    (the recipe's settings); the bench sets the model, the pool size, G, the unit and HF rollouts."""
    from envace.config import TrainConfig, nest, overlay, warn_old

    say = console.print if console else print
    cfg = TrainConfig.from_dict(overlay(nest(dict(train or {}), "bench train"), {
        "model": model, "sft": {"tasks": 0}, "grpo": {"steps": steps, "tasks_per_step": limit}, "eval": {"every": 0},
        "policy": {"lora": True}, "rollout": {"group_size": group_size, "unit": unit, "backend": "hf"}}),
        where="bench train")
    warn_old(dict(train or {}), "bench train")
    base, tok = load_policy(model)
    result: dict[str, Any] = {"grpo": {}, "sft": {}}
    if steps:
        result.update(_grpo_arms(base, tok, cfg, steps, from_run, root, trl, max_pack_tokens, say))
    if sft_tasks:
        result["sft"] = _sft_epoch(base, tok, cfg, sft_tasks, say)
        result["sft_tree_over_chain"] = round(result["sft"]["chain"]["wall_s"] / result["sft"]["tree"]["wall_s"], 2)
        say(f"SFT epoch tree ÷ chain wall: {result['sft_tree_over_chain']:.2f}")
    return result


def _grpo_arms(base, tok, cfg, steps: int, from_run: str | None, root: str, trl: bool,
               max_pack_tokens: int | None, say) -> dict[str, Any]:
    """The GRPO part of `bench_train`: the rows of `steps` steps, each update timed per packing arm."""
    if from_run:
        batches = stored_step_rows(root, from_run, steps)
        say(f"{len(batches)} stored GRPO step(s) of {from_run}")
    else:
        say(f"playing {steps} GRPO step(s): {cfg.grpo.tasks_per_step} {cfg.rollout.unit}(s) × G = "
            f"{cfg.rollout.group_size}, temperature {cfg.rollout.temperature}, {cfg.model} …")
        run, batches = played_step_rows(cfg, steps, root, say)
        say(f"  stored as run {run}: `envace bench train --from-run {run}` times the same rows again")
    result: dict[str, Any] = {}
    # Every row back-propagated (the same work for all three), then the trainer's default: rows with A = 0 skipped.
    # The lowest expected peak first: a later phase reuses freed memory, so it can only under-read its own peak.
    arms = {"tree": ("tree", False), "chain": ("chain", False), "row": ("row", False),
            "tree, A = 0 skipped": ("tree", True)}
    totals: dict[str, dict[str, float]] = {k: {"rows": 0, "rows_skipped": 0, "tokens": 0, "forward_tokens": 0,
                                               "recomputed_tokens": 0, "wall_s": 0.0, "peak_mib": 0.0,
                                               "peak_rss_mib": 0.0, "grad_gap": 0.0} for k in arms}
    for k, (rows, advantages) in enumerate(batches):
        say(f"step {k}: {len(rows)} rows ({advantages.count(0.0)} with advantage 0), "
            f"{sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)} row tokens, "
            f"{tree_tokens(rows)} distinct prefix tokens")
        _time_step(base, tok, rows, advantages, cfg.grpo.lr, max_pack_tokens, arms, totals, say)
    del totals["tree, A = 0 skipped"]["grad_gap"]
    if trl:
        totals["trl"] = _trl_totals(base, tok, batches)
    _table(say, "one GRPO update", totals)
    result["grpo"] = totals
    result["tree_over_chain"] = round(totals["chain"]["wall_s"] / max(totals["tree"]["wall_s"], 1e-9), 2)
    result["skipping_tree_over_chain"] = round(totals["chain"]["wall_s"] /
                                               max(totals["tree, A = 0 skipped"]["wall_s"], 1e-9), 2)
    say(f"tree ÷ chain wall: {result['tree_over_chain']:.2f} (every row back-propagated); with the rows whose "
        f"advantage is 0 skipped: {result['skipping_tree_over_chain']:.2f}")
    result["tree_attention"] = _tree_attention_forward(base, tok, batches, max_pack_tokens, say)
    return result


def _tree_attention_forward(base, tok, batches, max_pack_tokens: int | None, say) -> dict[str, dict[str, float]]:
    """The steps' tree packs forwarded without gradient, masked attention `dense` (SDPA, additive mask) against
    `flex` (FlexAttention, block mask); every row forwarded with advantage 1 (the loss is then the rows' mean NLL,
    which both must give). One untimed pass of each first (FlexAttention's tracing). Off CUDA this is forward
    only: FlexAttention has no backward pass there."""
    device = next(base.parameters()).device.type
    out: dict[str, dict[str, float]] = {}
    for kind in ("dense", "flex"):
        t = out[kind] = {"packs": 0, "flex_packs": 0, "forward_tokens": 0, "wall_s": 0.0, "loss": 0.0}
        for k, (rows, _) in enumerate(batches):
            with torch.no_grad():
                if k == 0:
                    _forward_only(base, tok, rows, max_pack_tokens, kind)
                _free()
                started = time.perf_counter()
                stats = _forward_only(base, tok, rows, max_pack_tokens, kind)
                t["wall_s"] += time.perf_counter() - started
            t["packs"] += stats["packs"]
            t["flex_packs"] += stats["tree_attention_flex_packs"]
            t["forward_tokens"] += stats["forward_tokens"]
            t["loss"] += stats["loss"]
    only = " (FlexAttention has no backward pass here)" if device != "cuda" else ""
    say(f"tree attention on {device}, forward without gradient{only}: kernel | packs (of them FlexAttention) | "
        f"tokens forwarded | wall s | tokens/s | loss at A = 1 (mean NLL)")
    for kind, t in out.items():
        say(f"  {kind} | {t['packs']} ({t['flex_packs']}) | {t['forward_tokens']} | {t['wall_s']:.2f} | "
            f"{t['forward_tokens'] / max(t['wall_s'], 1e-9):.1f} | {t['loss']:.6f}")
    out["tiles"] = tiles = _tiles(batches, max_pack_tokens)
    speed = out["dense"]["wall_s"] / max(out["flex"]["wall_s"], 1e-9)
    say(f"  flex's speed ÷ dense's (dense wall / flex wall): {speed:.2f}; FlexAttention computes "
        f"{tiles['computed']} of the masked blocks' {tiles['total']} tiles of 128 × 128; |Δ mean NLL| "
        f"{abs(out['flex']['loss'] - out['dense']['loss']):.1e}")
    return out


def _tiles(batches, max_pack_tokens: int | None) -> dict[str, int]:
    """128 × 128 tiles of the tree packs' masked blocks: those FlexAttention computes (a visible pair in them), all."""
    computed = total = 0
    for rows, _ in batches:
        for op in build(rows, "tree", max_pack_tokens):
            if isinstance(op, Restore):
                continue
            for block, keys, masked in attention_blocks(op.tree):
                if masked:
                    c, t = flex_tree.tiles(flex_tree.tree_block_mask(op.tree, block, keys, "cpu"))
                    computed, total = computed + c, total + t
    return {"computed": computed, "total": total}


def _forward_only(model, tok, rows: list[Row], max_pack_tokens: int | None, kind: str) -> dict:
    return backward(model, rows, [1.0] * len(rows), tok.pad_token_id, packing="tree", max_pack_tokens=max_pack_tokens,
                    skip_flat=False, tree_attention=kind)


def _time_step(base, tok, rows: list[Row], advantages: list[float], lr: float, max_pack_tokens: int | None,
               arms: dict[str, tuple[str, bool]], totals: dict[str, dict[str, float]], say) -> None:
    """One step's update under every arm, added into `totals`; each arm's gradient against `row`'s."""
    compared = advantages
    if not any(advantages):  # no gradient to compare: the mechanisms are compared under A = ±0.5 instead
        compared = [0.5 if i % 2 else -0.5 for i in range(len(rows))]
        say("  every advantage is 0: row, chain and tree are compared with A = ±0.5 alternating by row")
    grads = {}
    for arm, (packing, skip) in arms.items():
        stats, grads[arm] = _update(base, rows, advantages if skip else compared, tok.pad_token_id, packing, lr,
                                    max_pack_tokens, skip)
        t = totals[arm]
        t["rows"] += len(rows)
        t["rows_skipped"] += stats["rows_skipped"]
        t["tokens"] += sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        t["forward_tokens"] += stats["forward_tokens"]
        t["recomputed_tokens"] += stats["recomputed_tokens"]
        t["wall_s"] += stats["wall_s"]
        t["peak_mib"] = max(t["peak_mib"], stats["peak_mib"])
        t["peak_rss_mib"] = max(t["peak_rss_mib"], stats["peak_rss_mib"])
        say(f"  {arm}: {stats['packs']} forward passes, {stats['forward_tokens']} tokens "
            f"({stats['recomputed_tokens']} of them forwarded again in their deferred backward), "
            f"{stats['wall_s']:.1f} s, peak +{stats['peak_mib']:.0f} MiB in use, +{stats['peak_rss_mib']:.0f} MiB "
            f"resident")
    for arm in ("tree", "chain", "row"):  # the skipping arm's own exactness is a test (tests/test_packing.py)
        totals[arm]["grad_gap"] = max(totals[arm]["grad_gap"], _relative_gap(grads[arm], grads["row"]))


def _table(say, title: str, totals: dict[str, dict[str, float]]) -> None:
    say(f"{title}: strategy | rows | rows skipped (A = 0) | tokens forwarded | wall s | row-tokens/s | "
        f"peak MiB in use | peak MiB resident | max |Δgrad| / ‖grad‖ vs row")
    for name, t in totals.items():
        gap = f"{t['grad_gap']:.1e}" if "grad_gap" in t else "–"
        say(f"  {name} | {t['rows']} | {t.get('rows_skipped', '–')} | {t.get('forward_tokens', '–')} | "
            f"{t['wall_s']:.1f} | {t['tokens'] / max(t['wall_s'], 1e-9):.1f} | {t['peak_mib']:.0f} | "
            f"{t['peak_rss_mib']:.0f} | {gap}")


def _trl_totals(base, tok, batches) -> dict[str, float]:
    totals = {"rows": 0, "tokens": 0, "wall_s": 0.0, "peak_mib": 0.0, "peak_rss_mib": 0.0}
    for rows, advantages in batches:
        torch.manual_seed(0)
        model = add_lora(copy.deepcopy(base), 16)
        with tempfile.TemporaryDirectory() as out_dir:
            trainer = _trl_trainer(model, tok, out_dir)
            _free()
            seconds, mem, _ = _timed(lambda t=trainer, r=rows, a=advantages: _trl_update(t, r, a))
        totals["rows"] += len(rows)
        totals["tokens"] += sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        totals["wall_s"] += seconds
        totals["peak_mib"] = max(totals["peak_mib"], mem.mib)
        totals["peak_rss_mib"] = max(totals["peak_rss_mib"], mem.rss_mib)
    return totals


def _sft_steps(model, optimizer, rows: list[Row], chunks, tok, packing: str) -> int:
    """The epoch's optimiser steps (every advantage 1: the policy loss is the NLL); returns the tokens forwarded."""
    forwarded = 0
    for chunk in chunks:
        batch = [rows[j] for pk in chunk for j in pk]
        forwarded += grpo_step(model, optimizer, batch, [1.0] * len(batch), tok.pad_token_id,
                               packing=packing)["forward_tokens"]
    return forwarded


def _sft_epoch(base, tok, cfg, tasks: int, say) -> dict[str, dict[str, float]]:
    """One SFT epoch of `tasks` train tasks' reference rows, the same steps (`sft.rows_per_step`) under chain and
    tree."""
    from envace.training.packing.chain import chains
    from envace.training.sft import sft_chunks

    benchmark = registry.get(cfg.rollout.env)
    train_tasks = benchmark.load_tasks(cfg.rollout.category, "train")
    rows = reference_rows(train_tasks[:tasks], benchmark, tok, cfg.rollout.rehearser, cfg.rollout.caller_demo,
                          ExampleBank(train_tasks), cfg.rollout.tool_docs)
    chunks = sft_chunks(chains(rows), cfg.sft.rows_per_step)
    say(f"SFT: {len(rows)} reference rows of {tasks} train task(s), {len(chunks)} steps of ≥ "
        f"{cfg.sft.rows_per_step} rows")
    out = {}
    for packing in ("tree", "chain"):
        torch.manual_seed(0)
        model = add_lora(copy.deepcopy(base), 16)
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.sft.lr)
        _free()
        seconds, mem, forwarded = _timed(lambda m=model, o=optimizer, p=packing: _sft_steps(m, o, rows, chunks, tok, p))
        out[packing] = {"rows": len(rows), "forward_tokens": forwarded, "wall_s": seconds, "peak_mib": mem.mib,
                        "peak_rss_mib": mem.rss_mib,
                        "tokens": sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)}
        say(f"  SFT {packing}: {forwarded} tokens forwarded, {seconds:.1f} s, peak +{mem.mib:.0f} MiB in use, "
            f"+{mem.rss_mib:.0f} MiB resident")
    _table(say, "one SFT epoch", out)
    return out


def bench_train_vllm(model: str = "default", tasks: int = 2, console=None) -> dict[str, dict[str, float]]:
    """One GRPO step (rollouts + update + weight sync) with HF rollouts, with vLLM rollouts and a LoRA adapter
    synced, and with vLLM rollouts and full weights reloaded; the same seed, tasks and settings each time
    (`rollout_s`, `step_s`, `sync_s` as the trainer stores them per step)."""
    from envace.config import TrainConfig
    from envace.jobs import Reporter, train_job
    from envace.store import connect

    say = console.print if console else print
    quiet = type("Quiet", (Reporter,), {"say": lambda self, text: None})()
    base = {"model": model, "sft": {"tasks": 0}, "grpo": {"steps": 1, "tasks_per_step": tasks, "lr": 2e-4},
            "rollout": {"group_size": 4, "temperature": 0.7, "max_new_tokens": 48, "max_steps_per_turn": 2,
                        "tool_docs": "compact", "caller_demo": True,
                        "rehearser": {"max_new_tokens": 48, "max_examples": 4}}}
    arms = {"hf_lora": ({"policy": {"lora": True}}, "hf"), "vllm_lora": ({"policy": {"lora": True}}, "vllm"),
            "vllm_full": ({"policy": {"lora": False}}, "vllm")}
    result: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as root:
        for name, (extra, backend) in arms.items():
            data = {**base, **extra, "rollout": {**base["rollout"], "backend": backend}}
            say(f"{name}: one GRPO step, {tasks} tasks × 4 rollouts …")
            started = time.perf_counter()
            train_job(TrainConfig.from_dict(data), root, name, reporter=quiet)
            wall = time.perf_counter() - started
            metrics = dict(connect(root).execute(
                "SELECT name, value FROM metrics WHERE run_id = ? AND phase = 'grpo' AND role = 'all'",
                [name]).fetchall())
            # seconds to the hundredth; the log-prob gap and KL are ~1e-5, so three significant digits
            result[name] = {k: round(metrics[k], 2) if k.endswith("_s") else float(f"{metrics[k]:.3g}")
                            for k in ("rollout_s", "step_s", "sync_s", "logprob_gap", "kl_estimate") if k in metrics}
            result[name]["tokens"] = sum(v for (v,) in connect(root).execute(
                "SELECT value FROM metrics WHERE run_id = ? AND phase = 'grpo' AND name = 'tokens' "
                "AND role <> 'all'", [name]).fetchall())
            result[name]["job_wall_s"] = round(wall, 1)
            say(f"  {result[name]}")
    return result
