"""Every table the commands print, from what the commands fetched: the CLI renders tables here and nowhere else.

`envace show`'s tables per kind of run are `envace/show.py`'s, and the paired world-model comparison is
`envace.world_model.compare_table`: both are library functions the CLI prints as they are.
"""

from __future__ import annotations

import time
from typing import Any


def _table(*columns: str, **options: Any):
    from rich.table import Table  # rich loads when a command prints, not for `envace --help`

    return Table(*columns, **options)


def print_summary(console, title: str, summary: dict[str, Any]) -> None:
    """A rollout's or an eval's closing table (docs/commands.md says what each row means)."""
    table = _table(title=title, show_header=False)
    rows = [
        ("episodes", f"{summary['episodes']}"),
        ("official success", f"{summary['success_rate']:.1%}"),
        ("checklist reward", f"{summary.get('checklist', 0.0):.3f}"),
        ("calls per turn", f"{summary['calls_per_turn']:.2f}"),
        ("parse-error rate", f"{summary['parse_error_rate']:.1%} of {summary['caller_messages']} caller messages"),
        ("well-formed-call rate", f"{summary.get('well_formed_rate', 0.0):.1%} of caller messages"),
        ("generated tokens/s", f"{summary['tokens_per_s']:.1f} ({summary['generated_tokens']} tokens)"),
        ("pairs (real vs rehearsed)", f"{summary.get('pairs', 0)}"),
        ("private-rehearsal tokens", f"{summary.get('private_tokens', 0)}"),
        ("terminations", ", ".join(f"{k} {v}" for k, v in sorted(summary["terminations"].items()))),
        ("wall time", f"{summary['wall_s']:.0f} s"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def print_world_model(console, frame, run_id: str) -> None:
    """A world-model run's metrics per tool (`envace.world_model.table`), each with its interval."""
    from envace import world_model

    if frame.empty:
        console.print(f"run {run_id} has no rehearsed calls")
        return
    short = lambda v: f"{v:.2f}".replace("0.", ".", 1) if 0 <= v < 1 else f"{v:.2f}"  # noqa: E731  (.45, 1.00)
    cell = lambda r, m: "-" if r[m] != r[m] else f"{short(r[m])} ({short(r[m + '_lo'])}–{short(r[m + '_hi'])})"  # noqa: E731
    table = _table("tool", "calls", "tasks", *world_model.LABELS.values(),
                   title=f"world model of {run_id}: mean (95% bootstrap interval over tasks)")
    table.columns[0].no_wrap = True
    for r in frame.to_dict("records"):
        table.add_row(r["tool"], str(r["calls"]), str(r["tasks"]), *(cell(r, m) for m in world_model.LABELS))
    console.print(table)
    console.print("valid: rehearsals with a valid <execution_result>; exact: same JSON after normalisation; struct "
                  "F1: key paths; value acc: real leaf values reproduced; error agree: both fail or both succeed; "
                  "embed cos: MiniLM cosine")


def print_suite(console, outcomes, run_id: str, limit: int | None) -> None:
    """A suite's cells, the paper's table with ours beside its rows, and with private rehearsal its second table."""
    from envace import suite

    fmt = lambda v: "-" if v != v else f"{v:.1f}"  # noqa: E731
    smoke = f" (first {limit} items each: a smoke, not a score)" if limit else ""
    cells = _table("benchmark", "category", "rehearsal", "items", "success (95% CI)", "note",
                   title=f"{run_id}: every cell{smoke}")
    for r in suite.cell_table(outcomes).to_dict("records"):
        rehearsal = "-" if not r["budget"] else f"{r['private']} N={r['budget']}"
        cells.add_row(r["env"], r["category"], rehearsal, str(r["items"]),
                      "-" if r["success"] != r["success"] else f"{r['success']:.1f} ({r['lo']:.1f}–{r['hi']:.1f})",
                      r.get("note") if isinstance(r.get("note"), str) else "")
    console.print(cells)
    paper = suite.paper()
    headline = suite.headline(outcomes, run_id)
    table = _table(title="the paper's table, ours beside its published rows")
    for n, column in enumerate(headline.columns):
        table.add_column(column, no_wrap=n == 0)
    for row in headline.itertuples(index=False):
        table.add_row(*row)
    console.print(table)
    console.print("comparable: the BFCL categories run, each scored by bfcl_eval's own checker. Not comparable: the "
                  "BFCL-v4 column is offline (web search needs the internet: its weight removed, the rest "
                  "renormalised), τ²'s customer is our own model, VitaBench is scored by a deterministic substitute "
                  "for its LLM judge. "
                  f"Published rows: {paper['source']}.", markup=False)
    if any(c.budget for c in outcomes):
        second = _table("setting", "τ²-Bench", "BFCL multi-turn", "mean", title="private rehearsal, ours and published")
        for r in suite.rehearsal_summary(outcomes).to_dict("records"):
            second.add_row(f"this run: {r['setting']}", fmt(r["tau2"]), fmt(r["bfcl_multi_turn"]), fmt(r["overall"]))
        for r in paper["rehearsal"]:
            second.add_row(f"{r['setting']} (published)", fmt(r["tau2"]), fmt(r["bfcl_multi_turn"]),
                           fmt(r["overall"]))
        console.print(second)


def print_sweep(console, run_id: str, rows: list[dict[str, Any]]) -> None:
    """A sweep's cells: model × mode × N."""
    table = _table("model", "mode", "N", "episodes", "success", "checklist", "well-formed",
                   "private tokens / episode", "s / episode", title=f"sweep {run_id}")
    for r in rows:
        table.add_row(r["label"], r["mode"], str(r["budget"]), str(r["episodes"]), f"{r['success_rate']:.1%}",
                      f"{r['checklist']:.3f}", f"{r['well_formed_rate']:.1%}",
                      f"{r['private_tokens_per_episode']:.0f}", f"{r['wall_s_per_episode']:.0f}")
    console.print(table)


def print_against_none(console, frame, caption: str) -> None:
    """Each N > 0 cell of a sweep against its model's N = 0 cell (`envace.compare.with_holm`); nothing if none."""
    if frame.empty:
        return
    shown = [c for c in frame.columns if not str(c).startswith("_") and c not in ("vs", "Δ per seed")]
    table = _table(*shown, title="against N = 0, paired by turn (95% interval resampled by task)", caption=caption)
    for r in frame[shown].itertuples(index=False):
        table.add_row(*(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r))
    console.print(table)


def print_train_summary(console, run_id: str, summary: dict[str, Any]) -> None:
    table = _table(title=f"{run_id}", show_header=False)
    for key, value in summary.items():
        table.add_row(key, str(value))
    console.print(table)


def print_runs(console, runs: list[dict[str, Any]], stored: dict[str, int]) -> None:
    """`envace runs`: one row per stored run (`stored`: episodes per run, for runs whose summary has none)."""
    table = _table("run", "kind", "status", "model", "episodes", "success", "created")
    for meta in runs:
        s = meta.get("summary") or {}
        table.add_row(meta["run_id"], meta.get("kind", ""), meta.get("status", ""), str(meta.get("model", "")),
                      str(s.get("episodes", stored.get(meta["run_id"], ""))),
                      f"{s['success_rate']:.1%}" if "success_rate" in s else "",
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(meta.get("created_at") or 0)))
    console.print(table)


def print_fidelity(console, frame, run_id: str) -> None:
    """A shadow run's fidelity per tool (`envace.ledger.means`), with what each column means."""
    fmt = lambda v: "-" if v is None or v != v else f"{v:.2f}"  # noqa: E731  (None or NaN)
    table = _table("tool", "pairs", "exact", "struct F1", "value acc", "error agree", "embed cos", "copy rate",
                   "decision Δ", "malformed", title=f"world-model fidelity of {run_id}")
    for r in frame.to_dict("records"):
        forks = f"{fmt(r['decision_change'])} ({r['forks']})" if r["forks"] else "-"
        table.add_row(r["tool"], str(r["pairs"]), *(fmt(r[m]) for m in ("exact", "structure_f1", "value_acc",
                                                                        "error_agree", "embed_cos", "copied")),
                      forks, fmt(r["malformed"]))
    console.print(table)
    console.print("exact: same JSON after normalisation; struct F1: key paths; value acc: real leaf values "
                  "reproduced; error agree: both fail or both succeed; embed cos: MiniLM cosine; copy rate: "
                  "verbatim few-shot copies; decision Δ: next action changed (forks sampled); malformed: "
                  "rehearsals without a valid <execution_result>")


def print_judge(console, run_id: str, rows: list[dict[str, Any]]) -> None:
    """The rubric judge's verdicts per episode, and overall."""
    from envace.judge import SUBSCORE

    table = _table("episode", "task", "rubrics", "met", "unparsed", SUBSCORE, title=f"rubric judge of {run_id}")
    for r in rows:
        table.add_row(r["episode_id"], r["task_uid"], str(r["rubrics"]), str(r["met"]), str(r["unparsed"]),
                      "-" if r[SUBSCORE] is None else f"{r[SUBSCORE]:.3f}")
    shares = [r[SUBSCORE] for r in rows if r[SUBSCORE] is not None]
    met, total = sum(r["met"] for r in rows), sum(r["rubrics"] for r in rows)
    table.add_row("overall", f"{len(rows)} episode(s)", str(total), str(met), str(sum(r["unparsed"] for r in rows)),
                  f"{sum(shares) / len(shares):.3f}" if shares else "-")
    console.print(table)


def print_gold_stats(console, benchmark: str, model: str, stats: list[tuple[str, str, dict[str, list[int]]]]) -> None:
    """`check-env --stats`: per (category, split, `envace.units.gold_stats`), gold call-message lengths and calls
    per turn, and the budgets `auto` resolves to."""
    from envace import units

    table = _table("category", "split", "calls", "tokens p50", "p90", "p95", "max", "> 48", "> 64", "calls/turn",
                   "turns with 1-3", "auto max_new_tokens", title=f"gold calls of {benchmark}, tokenizer of {model}")
    for category, split, found in stats:
        lengths, calls = found["message_tokens"], found["calls_per_turn"]
        if not lengths:
            table.add_row(category, split, "0", *["-"] * 9)
            continue
        p50, p90, p95 = (str(units.percentile(lengths, q)) for q in (0.5, 0.9, 0.95))
        table.add_row(category, split, str(len(lengths)), p50, p90, p95, str(max(lengths)),
                      f"{sum(n > 48 for n in lengths) / len(lengths):.0%}",
                      f"{sum(n > 64 for n in lengths) / len(lengths):.0%}",
                      f"{sum(calls) / len(calls):.2f} (max {max(calls)})",
                      f"{sum(1 <= c <= 3 for c in calls)}/{len(calls)}",
                      str(units.percentile(lengths, 0.95) + units.TOKEN_MARGIN) if split == "train" else "")
    console.print(table)


def print_pipeline(console, rows: list[dict], fitted: dict[str, Any], projection: list[dict] | None = None,
                   inputs: dict[str, dict[str, str]] | None = None) -> None:
    """`envace bench pipeline`: the model against measured steps, then (with --project) its GPU projection."""
    table = _table("run", "staleness", "steps", "costs fitted on", "measured s/step", "simulated s/step", "error",
                   "idle slots (model)", title="pipeline model vs measured GRPO steps (mean step_s)")
    for r in rows:
        table.add_row(r["run"], str(r["staleness"]), str(r["steps"]), r["fitted_on"], f"{r['measured_s']:.3f}",
                      f"{r['simulated_s']:.3f}", f"{r['error']:+.1%}", f"{r['idle_share']:.0%}")
    console.print(table)
    for run_id, costs in fitted.items():
        console.print(f"costs fitted on {run_id}: " + ", ".join(f"{k} {v:.3g}" for k, v in costs.items()))
    if projection is None:
        return
    proj = _table("model", "actor GPUs", "rollout", "sync s/step", "staleness 1", "staleness 2", "idle slots (sync)",
                  "actor util (sync)", "learner util (sync)",
                  title="PROJECTION (simulated, not measured): steady GRPO step on H100s")
    for r in projection:
        proj.add_row(r["model"], str(r["gpus"]), r["mode"], f"{r['s0']:.1f}", f"{r['s1']:.1f}", f"{r['s2']:.1f}",
                     f"{r['idle']:.0%}", f"{r['actor_util']:.0%}", f"{r['learner_util']:.0%}")
    console.print(proj)
    for model, named in (inputs or {}).items():
        console.print(f"inputs, {model}: " + "; ".join(f"{k} {v}" for k, v in named.items()))
