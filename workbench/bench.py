"""`envace bench store`: how fast the app's queries are on a large store.

Builds a synthetic store through the real write path (`Run.write`, one shard per batch and table):
by default 1M pairs (and 1.5M generations, 1M calls) across 50 runs, each run a shadow rollout of 2,000
episodes of 5 caller messages with 2 calls each (so 10 rehearsals and 10 pairs), plus per-step
training metrics. Then times every query the app
issues, each repeated on different runs and episodes, and reports p50 / p95 latency against the
targets (≤ 150 ms for list / filter / aggregate queries, ≤ 300 ms to load one episode).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from envace.store import Run
from workbench.core import Workbench

TOOLS = [f"tool_{i:02d}" for i in range(24)]
_MESSAGES, _CALLS = 5, 2  # caller messages per episode, calls per message: one rehearsal and one pair per call
_EPISODES_PER_BATCH = 100


def _episode(run_id: str, step: int, index: int, rng: random.Random) -> dict[str, list[dict]]:
    episode_id = f"bench.task_{index % 400}#{index}"
    key = {"run_id": run_id, "step": step, "episode_id": episode_id}
    generations, calls, pairs = [], [], []
    for message in range(_MESSAGES):
        where = {**key, "turn": message // 2, "turn_step": message % 2}
        names = [rng.choice(TOOLS) for _ in range(_CALLS)]
        text = "".join(f'<tool_call>\n{{"name": "{n}", "arguments": {{"x": {message}}}}}\n</tool_call>'
                       for n in names)
        generations.append({**where, "role": "caller", "call_index": 0, "user_message": "please do it" * 8,
                            "prompt_len": 900 + 40 * message, "completion_ids": list(range(40)),
                            "completion_text": text, "finish": "stop", "n_calls": _CALLS, "logprobs": [-0.5] * 40})
        for index, name in enumerate(names):
            real = json.dumps({"result": rng.randrange(1000), "items": [rng.randrange(9) for _ in range(4)]})
            rehearsed = real if rng.random() < 0.5 else json.dumps({"result": rng.randrange(1000), "extra": True})
            exact = float(real == rehearsed)
            generations.append({**where, "role": "rehearser", "call_index": index, "prompt_ids": list(range(120)),
                                "completion_ids": list(range(30)), "completion_text": rehearsed, "finish": "stop"})
            calls.append({**where, "call_index": index, "name": name, "arguments": '{"x": 1}', "source": "real",
                          "response": real, "is_error": False})
            pairs.append({**where, "call_index": index, "name": name, "arguments": '{"x": 1}', "fed_back": "real",
                          "real_response": real, "rehearsed_response": rehearsed, "real_is_error": False,
                          "rehearsed_is_error": False, "valid_json": 1.0, "exact": exact,
                          "structure_f1": exact or 0.5, "value_acc": exact, "error_agreement": "both_ok",
                          "error_agree": 1.0, "string_sim": 0.8, "copied": False,
                          "decision_changed": rng.random() < 0.2 if rng.random() < 0.3 else None})
    checklist = rng.random()
    episode = {**key, "task_uid": f"bench/task_{index % 400}", "env": "bench", "category": "synthetic",
               "split": "test", "group_index": 0, "mode": "real+shadow", "phase": "rollout", "start_turn": 0,
               "success": checklist > 0.8,
               "checklist": checklist, "termination": "completed", "n_turns": 3, "n_ref_turns": 3,
               "n_steps": _MESSAGES, "n_calls": _MESSAGES * _CALLS, "n_parse_errors": 0,
               "n_rehearsals": _MESSAGES * _CALLS, "n_rehearsal_errors": 0,
               "generated_tokens": 350, "context_ids": list(range(1100))}
    return {"episodes": [episode], "generations": generations, "calls": calls, "pairs": pairs}


def build_store(root: Path, runs: int, pairs: int, say: Callable[[str], None] = print) -> dict[str, float]:
    """Write the synthetic store; returns rows written and the ingest rate of `Run.write`."""
    rng = random.Random(0)
    episodes_per_run = max(pairs // (_MESSAGES * _CALLS * runs), 1)
    written = {"generations": 0, "pairs": 0, "write_s": 0.0}
    for r in range(runs):
        run = Run.create(root, "rollout", {"synthetic": True}, "bench", f"bench-{r:02d}")
        for step, start in enumerate(range(0, episodes_per_run, _EPISODES_PER_BATCH)):
            tables: dict[str, list[dict]] = {"episodes": [], "generations": [], "calls": [], "pairs": []}
            for i in range(start, min(start + _EPISODES_PER_BATCH, episodes_per_run)):
                for table, rows in _episode(run.run_id, step, i, rng).items():
                    tables[table].extend(rows)
            started = time.perf_counter()
            for table, rows in tables.items():
                run.write(table, f"batch-{step:05d}", rows)
            written["write_s"] += time.perf_counter() - started
            written["generations"] += len(tables["generations"])
            written["pairs"] += len(tables["pairs"])
        run.write("metrics", "grpo-00000", [{"run_id": run.run_id, "step": s, "phase": "grpo", "role": role,
                                             "name": name, "value": rng.random()}
                                            for s in range(50) for role in ("caller", "rehearser")
                                            for name in ("reward_mean", "loss", "grad_norm", "entropy")])
        run.update(status="finished", summary={"episodes": episodes_per_run})
        if (r + 1) % 10 == 0:
            say(f"  {r + 1}/{runs} runs written ({written['generations']:,} generations)")
    written["rows_per_s"] = (written["generations"] + written["pairs"]) / written["write_s"]
    return written


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


def time_queries(wb: Workbench, repeats: int = 20) -> list[tuple[str, str, float, float, float]]:
    """(query, kind, p50 ms, p95 ms, target ms) for every query the app issues."""
    rng = random.Random(1)
    runs = sorted(wb.runs()["run_id"])
    episodes = {r: list(wb.episodes(r, limit=50)["episode_id"]) for r in runs[:5]}

    def some_run() -> str:
        return rng.choice(runs)

    def one_episode() -> None:
        run = rng.choice(list(episodes))
        episode = rng.choice(episodes[run])
        wb.steps(run, episode)
        wb.calls(run, episode)

    queries: list[tuple[str, str, Callable[[], object]]] = [
        ("refresh (every tick)", "list", wb.refresh),
        ("runs", "list", wb.runs),
        ("episodes of a run", "filter", lambda: wb.episodes(some_run())),
        ("episodes: success + checklist", "filter", lambda: wb.episodes(some_run(), success=True, min_checklist=0.5)),
        ("episodes: fidelity bucket, worst first", "filter",
         lambda: wb.episodes(some_run(), fidelity="low", worst_first=True)),
        ("episodes: uses tool", "filter", lambda: wb.episodes(some_run(), tool=rng.choice(TOOLS))),
        ("fidelity per tool, one run", "aggregate", lambda: wb.fidelity_by_tool(some_run())),
        ("fidelity per tool, whole store", "aggregate", wb.fidelity_by_tool),
        ("calibration, one run", "aggregate", lambda: wb.calibration(some_run())),
        ("calibration, whole store", "aggregate", wb.calibration),
        ("training curves", "aggregate", lambda: wb.training(some_run())),
        ("load one episode (steps + calls)", "episode", one_episode),
    ]
    # whole-store queries are served from per-run results cached until a run writes: time their first
    # call on a fresh Workbench too (new connection, nothing cached), which is what opening the app costs
    queries += [(f"{name} (first call after opening)", "cold", lambda fn=fn: fn(Workbench(wb.root)))
                for name, fn in (("fidelity per tool, whole store", Workbench.fidelity_by_tool),
                                 ("calibration, whole store", Workbench.calibration))]
    targets = {"list": 150.0, "filter": 150.0, "aggregate": 150.0, "episode": 300.0, "cold": float("nan")}
    results = []
    for name, kind, fn in queries:
        times = sorted(_timed(fn, repeats if kind != "cold" else 3))
        p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
        results.append((name, kind, statistics.median(times), p95, targets[kind]))
    return results


def bench_store(runs: int, pairs: int, console, keep: Path | None = None) -> list[tuple[str, str, float, float, float]]:
    """Build the store (in a temporary folder unless `keep`), time the queries, print both."""
    import shutil
    import tempfile

    from rich.table import Table

    root = keep or Path(tempfile.mkdtemp(prefix="envace-bench-store-"))
    try:
        console.print(f"building a synthetic store of {pairs:,} pairs across {runs} runs in {root} …")
        written = build_store(root, runs, pairs, console.print)
        console.print(f"ingest through Run.write: {written['generations']:,} generations + {written['pairs']:,} pairs "
                      f"(+ their episodes and calls) in {written['write_s']:.1f} s = "
                      f"{written['rows_per_s']:,.0f} generation+pair rows/s")
        started = time.perf_counter()
        wb = Workbench(root)
        console.print(f"first open (every shard's footer checked once): {time.perf_counter() - started:.2f} s, "
                      f"{sum(len(v) for v in wb.index.shards.values()):,} shards")
        results = time_queries(wb)
        table = Table(title=f"app queries on {written['generations']:,} generations / {written['pairs']:,} pairs, "
                                    f"{runs} runs")
        for column in ("query", "kind", "p50 ms", "p95 ms", "target p95 ms", "ok"):
            table.add_column(column)
        for name, kind, p50, p95, target in results:
            verdict = "–" if target != target else ("yes" if p95 <= target else "NO")  # NaN: no target
            table.add_row(name, kind, f"{p50:.1f}", f"{p95:.1f}", "–" if target != target else f"{target:.0f}",
                          verdict)
        console.print(table)
        return results
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # `envace bench store` runs this module (the CLI never imports a layer above envace)
    import argparse

    from rich.console import Console

    parser = argparse.ArgumentParser(prog="envace bench store")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    bench_store(args.runs, args.rows, Console(highlight=False), args.keep)
