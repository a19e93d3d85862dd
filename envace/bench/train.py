"""`envace bench train`: one role-wise GRPO update against TRL's `GRPOTrainer` update on the same rows.

The rows are every caller message and rehearsal of BFCL train reference trajectories (the prompts
the policy sees in RL, token for token), with the role-wise advantages of `role_advantages`. Both
sides start from the same weights (LoRA on the same model, as the CPU recipe trains) and take one
optimiser step over all rows:

- envace: `grpo_step` (rows packed so an episode's caller messages share one forward pass);
- TRL: `GRPOTrainer.compute_loss` (its own loss: on-policy ratio, clipping, token mean per sequence)
  on the same rows, one row per micro-batch as its `per_device_train_batch_size = 1` would, then
  backward and AdamW. Generation and reward are outside both timings: the same rows feed both.

Tokens/s counts every row's prompt + completion tokens (the work a per-row trainer does) over wall
time; peak memory is the resident-set high-water mark above the level before the phase, sampled.
"""

from __future__ import annotations

import copy
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from envace.config import RehearserOptions
from envace.envs import registry
from envace.policy.models import add_lora, load_policy
from envace.rehearsal.examples import ExampleBank
from envace.training.grpo import Row, grpo_step, pack, role_advantages
from envace.training.rows import reference_rows


class _PeakRSS:
    """Resident-set high-water mark above the starting level while the block runs (MiB)."""

    def __enter__(self) -> _PeakRSS:
        import psutil

        self._proc = psutil.Process()
        self._base = self._proc.memory_info().rss
        self.peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def mib(self) -> float:
        return (self.peak - self._base) / 2**20


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


def _timed(step: Callable[[], Any]) -> tuple[float, float]:
    with _PeakRSS() as mem:
        start = time.perf_counter()
        step()
        seconds = time.perf_counter() - start
    return seconds, mem.mib


def bench_train(model: str = "default", tasks: int = 1, console=None) -> dict[str, float]:
    say = console.print if console else print
    benchmark = registry.get("bfcl")
    train_tasks = benchmark.load_tasks("multi_turn_base", "train")
    base, tok = load_policy(model)
    rows = reference_rows(train_tasks[:tasks], benchmark, tok, RehearserOptions(fewshot="other_tasks", max_examples=4),
                          True, ExampleBank(train_tasks), "compact")
    # Rewards differ per trajectory in RL; alternate them so advantages are not all zero.
    rows = [Row(r.task_uid, r.role, r.prompt_ids, r.completion_ids, float(i % 2)) for i, r in enumerate(rows)]
    advantages = role_advantages(rows)
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    say(f"{len(rows)} rows ({len(pack(rows))} packed sequences), {tokens} tokens, from {tasks} BFCL train task(s)")

    ours_model = add_lora(copy.deepcopy(base), 16)
    theirs_model = add_lora(copy.deepcopy(base), 16)
    theirs_model.load_state_dict(ours_model.state_dict())
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = _trl_trainer(theirs_model, tok, out_dir)
        say("TRL GRPOTrainer update …")
        trl_s, trl_mib = _timed(lambda: _trl_update(trainer, rows, advantages))
    say("envace grpo_step …")
    optimizer = torch.optim.AdamW([p for p in ours_model.parameters() if p.requires_grad], lr=1e-5)
    ours_model.train()
    ours_s, ours_mib = _timed(lambda: grpo_step(ours_model, optimizer, rows, advantages, tok.pad_token_id))
    result = {"rows": len(rows), "tokens": tokens, "envace_s": round(ours_s, 1), "trl_s": round(trl_s, 1),
              "envace_tokens_per_s": round(tokens / ours_s, 1), "trl_tokens_per_s": round(tokens / trl_s, 1),
              "ratio": round(trl_s / ours_s, 2), "envace_peak_mib": round(ours_mib), "trl_peak_mib": round(trl_mib)}
    say(f"envace {result['envace_tokens_per_s']} tokens/s ({ours_s:.1f} s, peak +{ours_mib:.0f} MiB) vs TRL "
        f"{result['trl_tokens_per_s']} tokens/s ({trl_s:.1f} s, peak +{trl_mib:.0f} MiB): ratio {result['ratio']:.2f}")
    return result


def bench_train_vllm(model: str = "default", tasks: int = 2, console=None) -> dict[str, dict[str, float]]:
    """One GRPO step (rollouts + update + weight sync) with HF rollouts, with vLLM rollouts and a LoRA adapter
    synced, and with vLLM rollouts and full weights reloaded; the same seed, tasks and settings each time
    (`rollout_s`, `step_s`, `sync_s` as the trainer stores them per step)."""
    from envace.config import TrainConfig
    from envace.jobs import Reporter, train_job
    from envace.store import connect

    say = console.print if console else print
    quiet = type("Quiet", (Reporter,), {"say": lambda self, text: None})()
    base = {"model": model, "sft_tasks": 0, "grpo_steps": 1, "tasks_per_step": tasks, "lr": 2e-4,
            "rollout": {"group_size": 4, "temperature": 0.7, "max_new_tokens": 48, "max_steps_per_turn": 2,
                        "tool_docs": "compact", "caller_demo": True,
                        "rehearser": {"max_new_tokens": 48, "max_examples": 4}}}
    arms = {"hf_lora": ({"lora": True}, "hf"), "vllm_lora": ({"lora": True}, "vllm"),
            "vllm_full": ({"lora": False}, "vllm")}
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
