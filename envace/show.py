"""`envace show RUN`: the tables that describe one stored run, whatever its kind.

rollout / eval: episodes per category and phase, the rubric judge's sub-score when the run was judged
(`envace judge`), the most called tools; train: the SFT warm-up, every GRPO step per role, where the steps'
time went (each part's busy share, the staleness of what was trained), the evaluations,
the stored episodes per phase (and the rubric judge's); sweep: its cells; ladder: its comparisons and per-turn
diagnosis. Each table reads the store only, so a run that is still writing shows what it has so far.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from envace.record import actor_of
from envace.store import StoreIndex


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return format(value, spec) if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def warnings(index: StoreIndex, run_id: str) -> list[str]:
    """The store's warnings that concern this run (a skipped shard of it, its unreadable metadata)."""
    return [w for w in index.warnings if f"/{run_id}/" in w or f"run {run_id}:" in w]


def _query_table(con, sql: str, run_id: str, title: str, columns: tuple[str, ...],
                 cells: Callable[..., tuple[str, ...]]) -> Table | None:
    """One line per row of `sql` (its one parameter: the run), formatted by `cells`; None when it has none."""
    rows = con.execute(sql, [run_id]).fetchall()
    if not rows:
        return None
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*cells(*row))
    return table


def _episodes(con, run_id: str) -> Table | None:
    return _query_table(
        con, "SELECT category, phase, count(*), avg(success::INT), avg(checklist), sum(n_calls), sum(n_parse_errors), "
        "sum(n_rehearsal_errors) FROM episodes WHERE run_id = ? GROUP BY ALL ORDER BY phase, category", run_id,
        "stored episodes", ("category", "phase", "episodes", "success", "checklist", "calls", "parse errors",
                            "rehearsal errors"),
        lambda category, phase, n, success, checklist, calls, errors, rehearsal: (
            str(category), str(phase), str(n), f"{success:.1%}", _fmt(checklist), str(calls), str(errors),
            str(rehearsal)))


def _tools(con, run_id: str) -> Table | None:
    return _query_table(con, "SELECT name, count(*) AS n, avg(is_error::INT) FROM calls WHERE run_id = ? GROUP BY "
                        "name ORDER BY n DESC, name LIMIT 10", run_id, "most called tools",
                        ("tool", "calls", "error rate"), lambda name, n, err: (name, str(n), f"{err:.1%}"))


_STEP_METRICS = (("caller", "reward_mean"), ("rehearser", "reward_mean"), ("caller", "signal_groups"),
                 ("rehearser", "signal_groups"), ("all", "checklist_mean"), ("all", "loss"), ("all", "grad_norm"))


def _grpo(con, run_id: str) -> Table | None:
    rows = con.execute("SELECT step, role, name, value FROM metrics WHERE run_id = ? AND phase = 'grpo' "
                       "ORDER BY step", [run_id]).fetchall()
    if not rows:
        return None
    by_step: dict[int, dict[tuple[str, str], float]] = {}
    for step, role, name, value in rows:
        by_step.setdefault(step, {})[(role, name)] = value
    shown = [m for m in _STEP_METRICS if any(m in values for values in by_step.values())]
    table = Table("step", *(f"{role} {name}" if role != "all" else name for role, name in shown),
                  title="GRPO steps")
    for step, values in sorted(by_step.items()):
        table.add_row(str(step + 1), *(_fmt(values.get(m)) for m in shown))
    return table


_PARTS = (("rollout_s", "rollouts (actor)"), ("update_s", "update (learner)"), ("sync_s", "weight push"),
          ("load_s", "actor loads a version"), ("wait_s", "learner waits for rollouts"))


def _time(con, run_id: str) -> Table | None:
    """Where a training run's GRPO wall time went: each part's seconds and its share of the steps' wall time
    (`step_s`), and how stale what the learner trained on was. Synchronous steps add up to 100%; with
    `grpo.max_staleness` the actor's rollouts overlap the update, so their shares add up to more."""
    rows = dict(con.execute("SELECT name, sum(value) FROM metrics WHERE run_id = ? AND phase = 'grpo' AND role = 'all' "
                            "AND (name IN ('step_s', 'actor_restarts', " + ", ".join(f"'{n}'" for n, _ in _PARTS) +
                            ") OR regexp_matches(name, '^actor[0-9]+_rollout_s$')) GROUP BY name",
                            [run_id]).fetchall())
    actors = sorted((n for n in rows if actor_of(n) is not None), key=actor_of)  # Ray: each actor's own share
    wall = rows.get("step_s")
    if not wall:
        return None
    stale = con.execute("SELECT value, count(*) FROM metrics WHERE run_id = ? AND phase = 'grpo' AND role = 'all' "
                        "AND name = 'staleness' GROUP BY value ORDER BY value", [run_id]).fetchall()
    table = Table("part", "seconds", "share of wall", title=f"where the GRPO time went ({wall:.1f} s of steps)")
    for name, label in _PARTS + tuple((n, f"  actor {actor_of(n)} playing its share") for n in actors):
        if name in rows:
            table.add_row(label, f"{rows[name]:.1f}", f"{rows[name] / wall:.0%}")
    if rows.get("actor_restarts"):
        table.add_row("actors restarted (shares replayed)", str(int(rows["actor_restarts"])), "")
    if stale:
        table.add_row("steps by staleness", "", ", ".join(f"{int(v)}: {n}" for v, n in stale))
    return table


def _evals(con, run_id: str) -> Table | None:
    rows = con.execute("SELECT step, name, value FROM metrics WHERE run_id = ? AND phase = 'eval' ORDER BY step",
                       [run_id]).fetchall()
    if not rows:
        return None
    names = ("success_rate", "checklist", "well_formed_rate", "pairs", "exact", "structure_f1")
    by_step: dict[int, dict[str, float]] = {}
    for step, name, value in rows:
        by_step.setdefault(step, {})[name] = value
    table = Table("after update", *names, title="evaluations (test split, real environment, greedy)")
    for step, values in sorted(by_step.items()):
        table.add_row(str(step), *(_fmt(values.get(n)) for n in names))
    return table


def _summary(meta: dict[str, Any]) -> Table | None:
    summary = meta.get("summary") or {}
    if not isinstance(summary, dict) or not summary:
        return None
    table = Table(title="summary", show_header=False)
    for key, value in summary.items():
        table.add_row(str(key), _fmt(value, ".4g"))
    return table


def _sweep(con, run_id: str) -> Table | None:
    return _query_table(
        con, "SELECT label, mode, budget, episodes, success_rate, checklist, private_tokens_per_episode, cell_run "
        "FROM sweep WHERE run_id = ? ORDER BY label, mode, budget", run_id, "sweep cells",
        ("model", "mode", "N", "episodes", "success", "checklist", "private tokens / episode", "cell run"),
        lambda label, mode, budget, episodes, success, checklist, tokens, cell: (
            label, mode, str(budget), str(episodes), _fmt(success, ".1%"), _fmt(checklist), _fmt(tokens, ".0f"),
            cell))


def _ladder(con, meta: dict[str, Any]) -> Table | None:
    """A private-rehearsal ladder's comparisons (`envace private-ladder`): each rung against N = 0 and against the
    rehearsed memory, paired by turn, Holm-adjusted over the table (its caption names the family)."""
    rows = con.execute("SELECT label, rung, vs, pairs, a, b, delta, lo, hi, mde, up, down, mcnemar_p, holm_mcnemar_p, "
                       "permutation_p, holm_permutation_p FROM ladder WHERE run_id = ?", [meta["run_id"]]).fetchall()
    if not rows:
        return None
    table = Table("model", "rung", "vs", "pairs", "A", "B", "Δ = B − A", "95% CI", "MDE 80%", "up/down",
                  "McNemar p (Holm)", "permutation p (Holm)", caption=(meta.get("summary") or {}).get("caption"),
                  title="private-rehearsal ladder: each rung against N = 0 and the rehearsed memory, paired by turn "
                        "(95% interval resampled by task)")
    for label, rung, vs, pairs, a, b, delta, lo, hi, mde, up, down, mc, mc_holm, perm, perm_holm in rows:
        table.add_row(label, rung, vs, str(pairs), _fmt(a), _fmt(b), _fmt(delta, "+.3f"),
                      f"{_fmt(lo, '+.3f')} … {_fmt(hi, '+.3f')}", _fmt(mde), f"{up}/{down}",
                      f"{_fmt(mc)} ({_fmt(mc_holm)})", f"{_fmt(perm)} ({_fmt(perm_holm)})")
    return table


def _ladder_turns(con, run_id: str) -> Table | None:
    """What each rung's memory did, turn by turn (`envace.private.ladder.diagnosis`)."""
    from envace.private.ladder import DIAGNOSIS, diagnosis

    cursor = con.execute("SELECT label, rung, memory, decision_changed, copied, copied_failed, fidelity, "
                         "fidelity_exact FROM ladder_turns WHERE run_id = ?", [run_id])
    names = [d[0] for d in cursor.description]
    summary = diagnosis([dict(zip(names, r, strict=True)) for r in cursor.fetchall()])
    if not summary:
        return None
    table = Table(*DIAGNOSIS, title="per turn: the memory changed the committed first action / the committed call "
                                    "copies an imagined one / fidelity of the answers it was written from")
    for r in summary:
        table.add_row(*(str(r[c]) if c == "turns" else _fmt(r[c]) for c in DIAGNOSIS))
    return table


def _judgements(con, run_id: str) -> Group | None:
    """The optional `rubric_judge` sub-score (`envace judge`), per judge model, with its caveat."""
    from envace.judge import SUBSCORE, caveat

    rows = con.execute(
        "WITH e AS (SELECT judge_model, step, episode_id, count(*) AS n, count(*) FILTER (WHERE verdict) AS met, "
        "count(*) - count(verdict) AS unparsed FROM judgements WHERE run_id = ? GROUP BY ALL) "
        "SELECT judge_model, count(*), sum(n), sum(met), sum(unparsed), avg(met / n) FROM e "
        "GROUP BY judge_model ORDER BY judge_model", [run_id]).fetchall()
    if not rows:
        return None
    table = Table("judge", "episodes", "rubrics", "met", "unparsed", SUBSCORE, title="rubric judge")
    for model, episodes, n, met, unparsed, mean in rows:
        table.add_row(str(model), str(episodes), str(n), str(met), str(unparsed), _fmt(mean))
    return Group(table, *(Text(caveat(r[0])) for r in rows))  # the caveat on its own line, below


def _study(con, meta: dict[str, Any]):
    """A study's report (`envace/study`) once it has written one; until then, its stage runs so far (`NAME-STAGE-sSEED`;
    a sweep stage's cells are runs of their own, not stages)."""
    import re
    import time
    from pathlib import Path

    from rich.markdown import Markdown

    report = Path((meta.get("summary") or {}).get("report", ""))
    if report.is_file():
        return Markdown(report.read_text())
    stages = con.execute("SELECT run_id, kind, status, created_at, updated_at FROM runs WHERE regexp_full_match("
                         "run_id, ?) ORDER BY created_at", [re.escape(meta["run_id"]) + r"-.+-s\d+"]).fetchall()
    done = sum(status == "completed" for *_, status, _, _ in stages)
    table = Table("stage", "kind", "status", "started", "minutes", title=f"{done} of "
                  f"{(meta.get('summary') or {}).get('stages', '?')} stages completed; no report yet")
    for run_id, kind, status, created, updated in stages:
        table.add_row(run_id, str(kind), str(status), time.strftime("%m-%d %H:%M", time.localtime(created or 0)),
                      f"{((updated or 0) - (created or 0)) / 60:.1f}")
    return Group(table, Text("`envace study FILE` again goes on where it stopped (completed stages are kept); "
                             "`envace study FILE --so-far` writes the tables over the stages completed so far"))


def tables(con, meta: dict[str, Any]) -> list[Table | Group]:
    run_id, kind = meta["run_id"], meta.get("kind")
    if kind == "train":
        parts = [_summary(meta), _grpo(con, run_id), _time(con, run_id), _evals(con, run_id),
                 _episodes(con, run_id), _judgements(con, run_id)]
    elif kind == "sweep":
        parts = [_sweep(con, run_id)]
    elif kind == "study":
        parts = [_study(con, meta)]
    elif kind == "ladder":
        parts = [_ladder(con, meta), _ladder_turns(con, run_id)]
    else:
        parts = [_episodes(con, run_id), _judgements(con, run_id), _tools(con, run_id)]
    return [t for t in parts if t is not None]
