"""`envace bench rollout|rehearsal|train|private|pipeline|store`: performance benchmarks, each with its own flags.

What each one measures and how: `envace/bench`, `workbench/bench.py` and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envace.cli.console import new_console
from envace.cli.flags import positive, with_root
from envace.cli.programs import run_module
from envace.config import load_toml
from envace.errors import UsageError
from envace.paths import runs_root


def cmd_bench_rollout(args: argparse.Namespace) -> int:
    from envace import bench

    run = bench.bench_rollout_vllm if args.backend == "vllm" else bench.bench_rollout
    run(model=args.model, limit=args.limit, max_new_tokens=args.max_new_tokens, console=new_console())
    return 0


def cmd_bench_rehearsal(args: argparse.Namespace) -> int:
    from envace import bench

    bench.bench_rehearsal(model=args.model, limit=args.limit, max_new_tokens=args.max_new_tokens,
                          console=new_console())
    return 0


def cmd_bench_private(args: argparse.Namespace) -> int:
    from envace import bench

    budgets = tuple(int(b) for b in args.budgets.split(",") if b.strip().isdigit())
    if not budgets or min(budgets) < 1:
        raise UsageError(f"--budgets takes comma-separated N >= 1, got '{args.budgets}'")
    bench.bench_private(model=args.model, limit=args.limit, max_new_tokens=args.max_new_tokens, budgets=budgets,
                        console=new_console())
    return 0


def cmd_bench_train(args: argparse.Namespace) -> int:
    from envace import bench

    if args.backend == "vllm":
        bench.bench_train_vllm(model=args.model, tasks=args.limit, console=new_console())
        return 0
    train = load_toml(args.config).get("train", {}) if args.config else {}
    for name, least in (("group_size", 1), ("steps", 0), ("sft_tasks", 0), ("limit", 1)):
        if getattr(args, name) < least:
            raise UsageError(f"--{name.replace('_', '-')}: must be at least {least}")
    if not args.steps and not args.sft_tasks:
        raise UsageError("--steps 0 times no GRPO update: give --sft-tasks K to time an SFT epoch")
    bench.bench_train(model=args.model, limit=args.limit, group_size=args.group_size, unit=args.unit,
                      steps=args.steps, from_run=args.from_run, root=str(runs_root(args.root)), train=train,
                      sft_tasks=args.sft_tasks, trl=args.trl, max_pack_tokens=args.max_pack_tokens,
                      console=new_console())
    return 0


def cmd_bench_store(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.rows < args.runs:
        raise UsageError("--runs must be >= 1 and --rows at least --runs")
    return run_module("workbench.bench", ["--runs", str(args.runs), "--rows", str(args.rows),
                                          *(["--keep", str(args.keep)] if args.keep else [])])


def cmd_bench_pipeline(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from envace.bench import pipeline
    from envace.cli.tables import print_pipeline
    from envace.store import connect

    root = runs_root(args.root)
    if not (root.is_dir() and any(root.glob("*/run.json"))):
        raise UsageError(f"no run store at {root}")
    con = connect(str(root))
    runs = {r: pipeline.load_run(con, r) for r in dict.fromkeys([*args.runs, *([args.fit_on] if args.fit_on else [])])}
    overrides = {k: getattr(args, k) for k in ("tool_s", "publish_s") if getattr(args, k) is not None}
    costs = {r: replace(pipeline.fit(m), **overrides) for r, m in runs.items()}
    rows = []
    for r in args.runs:
        fitted_on = args.fit_on or r
        rows.append({**pipeline.validate(runs[r], costs[fitted_on]), "fitted_on": fitted_on})
    used = {args.fit_on or r for r in args.runs}
    projection = inputs = None
    if args.project:
        projection, inputs = pipeline.project(runs[args.runs[0]], steps=args.steps, groups=args.groups,
                                              tokens=args.tokens, prompt=args.prompt_tokens, seed=args.seed,
                                              tool_s=args.tool_s or 0.0)
    print_pipeline(new_console(), rows, {r: asdict(costs[r]) for r in sorted(used)}, projection, inputs)
    return 0


def _model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="model spec (default: default)")


def _episodes(p: argparse.ArgumentParser) -> None:
    """The flags of the benchmarks that play BFCL test episodes in one batch."""
    _model(p)
    p.add_argument("--limit", type=int, default=2, help="BFCL test episodes (= batch size) (default: 2)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per generated message (default: 64)")


def _seconds(flag: str):
    """An argparse type: seconds >= 0, else one line naming `flag`."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0 or value == float("inf"):
            raise UsageError(f"{flag} takes seconds >= 0, got '{text}'")
        return value
    return parse


def _train(benches) -> None:
    """bench train: one GRPO step's update under each packing, side by side."""
    p = with_root(benches.add_parser("train", help="one GRPO step's update under row, chain and tree packing, "
                                                   "side by side"))
    _model(p)
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"],
                   help="vllm: one GRPO step with HF rollouts, vLLM rollouts + LoRA sync, and vLLM rollouts + full "
                        "weights, instead (default: hf)")
    p.add_argument("--limit", type=int, default=2, help="train units a GRPO step plays (default: 2)")
    p.add_argument("--group-size", type=int, default=8, help="G rollouts per unit (default: 8)")
    p.add_argument("--unit", default="turn", choices=["turn", "episode"], help="what one rollout covers "
                   "(default: turn)")
    p.add_argument("--steps", type=int, default=1, help="GRPO steps played and timed (default: 1; 0: only "
                   "the SFT epoch of --sft-tasks)")
    p.add_argument("--from-run", default=None, help="time a stored training run's GRPO steps instead of "
                   "playing new ones")
    p.add_argument("--config", default=None, help="a config whose [train] table sets the rollouts (e.g. "
                   "experiments/bfcl_turns_cpu.toml)")
    p.add_argument("--sft-tasks", type=int, default=0, help="also time one SFT epoch of these train tasks' "
                   "reference rows, chain vs tree (default: 0, none)")
    p.add_argument("--trl", action="store_true", help="also time TRL's GRPOTrainer update on the same rows")
    p.add_argument("--max-pack-tokens", type=int, default=None, help="the tree's token budget (default: "
                   "the longest chain sequence)")
    p.set_defaults(func=cmd_bench_train)


def _pipeline(benches) -> None:
    """bench pipeline: the simulated steps, checked against stored runs, and the GPU projection."""
    p = with_root(benches.add_parser("pipeline", help="a simulation of GRPO steps (generation, update, publish; "
                                                      "sync or ahead, lock-step or per-episode, N actors) checked "
                                                      "against stored runs' steps, and projected onto GPUs"))
    p.add_argument("runs", nargs="+", help="stored training runs: each one's steps simulated and compared")
    p.add_argument("--fit-on", default=None, help="fit the costs on this run for every row (default: each run "
                   "its own)")
    p.add_argument("--tool-s", type=_seconds("--tool-s"), default=None, help="seconds between an answer and an "
                   "episode's next request (default: fitted; 0 in the projection)")
    p.add_argument("--publish-s", type=_seconds("--publish-s"), default=None, help="seconds per published "
                   "version (default: the run's measured sync_s + load_s)")
    p.add_argument("--project", action="store_true", help="also project Qwen3-1.7B and Qwen3-8B on 1, 4, 8 and 32 "
                   "actor GPUs from published throughputs (a projection, not a measurement)")
    p.add_argument("--steps", type=positive("--steps"), default=8, help="steps per projected run (default: 8)")
    p.add_argument("--groups", type=positive("--groups"), default=32, help="groups per projected step, drawn "
                   "from the first run's (default: 32)")
    p.add_argument("--tokens", type=positive("--tokens"), default=256, help="mean generated tokens per request "
                   "in the projection (default: 256)")
    p.add_argument("--prompt-tokens", type=positive("--prompt-tokens"), default=512, help="mean prompt tokens "
                   "prefilled per request in the projection (default: 512)")
    p.add_argument("--seed", type=int, default=0, help="seed of the projection's draw of groups (default: 0)")
    p.set_defaults(func=cmd_bench_pipeline)


def register(sub) -> None:
    """bench, and a subcommand per benchmark."""
    benches = sub.add_parser("bench", help="performance benchmarks (ratios measured side by side)").add_subparsers(
        dest="what", required=True)

    p = benches.add_parser("rollout", help="the engine's tokens/s against raw batched model.generate")
    _episodes(p)
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"],
                   help="vllm: the engine on a vLLM server against the engine on HF and the server's raw "
                        "completions (default: hf)")
    p.set_defaults(func=cmd_bench_rollout)

    p = benches.add_parser("rehearsal", help="rehearse+shadow against real on the same episodes, then rehearsal "
                                             "and metric throughput")
    _episodes(p)
    p.set_defaults(func=cmd_bench_rehearsal)

    _train(benches)

    p = benches.add_parser("private", help="cost per committed turn of private rehearsal at each N, batched and not")
    _episodes(p)
    p.add_argument("--budgets", default="1,2", help="imagined attempts N to measure (default: 1,2)")
    p.set_defaults(func=cmd_bench_private)

    _pipeline(benches)

    p = benches.add_parser("store", help="the app's queries on a large synthetic store (workbench/bench.py)")
    p.add_argument("--runs", type=int, default=50, help="runs in the synthetic store (default: 50)")
    p.add_argument("--rows", type=int, default=1_000_000,
                   help="pairs in it, and 1.5x as many generations (default: 1000000)")
    p.add_argument("--keep", type=Path, default=None, help="build it here and keep it (default: a temp dir)")
    p.set_defaults(func=cmd_bench_store)
