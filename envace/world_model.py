"""The world-model benchmark: a model rehearses every gold call of a benchmark's reference trajectories, in the
call's real context, and each rehearsal is scored against the real response.

    envace world-model MODEL --env E --category C --split S [--limit N] [--turns K..L]
    envace world-model-compare RUN_A RUN_B

The scripted reference policy is the caller (it replays each task's gold calls, and a conversation's scripted
user); the real environment answers every call and is fed back, so call k is rehearsed after the real results
of calls 0..k-1, as recorded; MODEL rehearses each call beside it (`real+shadow` with `rehearser_model =
MODEL`: the prompt of training, the grounding rule of training, never a test task's own gold results). The
caller does not depend on MODEL, so every model answers the same calls and two runs pair call by call.

`table`: per tool and overall, the share of valid results and each metric's mean with a 95% bootstrap
interval that resamples tasks (the calls of one task share its context). `compare`: per metric, B − A over
the same calls with a paired bootstrap interval over tasks, the exact sign test over the calls whose score
differs, and that p-value Holm-adjusted over the table's family (the sign tests of its metrics that have calls);
`compare_table` prints it, naming the family.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from envace.config import PrivateOptions, RolloutConfig
from envace.errors import UsageError
from envace.policy.specs import REFERENCE_MODEL
from envace.stats import cluster_bootstrap, holm, paired_bootstrap, sign_test
from envace.types import Task

KIND = "world-model"
METRICS = ("exact", "structure_f1", "value_acc", "error_agree", "embed_cos")
LABELS = {"valid": "valid", "exact": "exact", "structure_f1": "struct F1", "value_acc": "value acc",
          "error_agree": "error agree", "embed_cos": "embed cos"}
CALL = ["episode_id", "turn", "turn_step", "call_index"]  # one gold call of one task


def config(model: str, base: RolloutConfig, turns: str = "") -> RolloutConfig:
    """`base` (category, split, limit, the rehearser's prompt options) as the benchmark plays it: the reference
    caller, the real world fed back, `model` rehearsing the calls of user turns `turns` beside it (all: empty),
    greedy unless `[rollout.rehearser] temperature` says otherwise, and the embedding cosine on."""
    return replace(base, model=REFERENCE_MODEL, rehearser_model=model, mode="real+shadow", unit="episode",
                   shadow_turns=turns,
                   group_size=1, temperature=0.0, real_fraction=0.0, shadow_fraction=0.0, decision_sample=0.0,
                   frozen_rehearser=False, private=PrivateOptions(), embedding=True, user_model="",
                   rehearser=replace(base.rehearser, on_error="feed_error"))


def check_tasks(cfg: RolloutConfig, tasks: list[Task]) -> RolloutConfig:
    """`cfg` with room for every scripted user message; a category the benchmark cannot replay is a UsageError."""
    where = f"{cfg.env} {cfg.category} ({cfg.split})"
    if not any(step for t in tasks for turn in t.reference for step in turn):
        raise UsageError(f"{where}: no reference trajectory with a call to rehearse; the world-model benchmark "
                         "replays gold calls")
    unscripted = [t.uid for t in tasks if t.simulated_user is not None and not t.simulated_user.script]
    if unscripted:
        raise UsageError(f"{where}: its users are simulated with no scripted messages ({unscripted[0]}), so its "
                         "gold conversations cannot be replayed; use its category whose episodes open with the "
                         "instruction (a `_solo` one)")
    scripts = [len(t.simulated_user.script) + 1 for t in tasks if t.simulated_user is not None]
    return replace(cfg, max_user_turns=max([cfg.max_user_turns, *scripts]))


def pairs(con, source: str, run_id: str) -> pd.DataFrame:
    """One row per rehearsed call of a run: its key, tool and arguments, `valid` and every metric."""
    return con.execute(
        f"SELECT {', '.join(CALL)}, name AS tool, arguments, (rehearsal_error IS NULL)::DOUBLE AS valid, "
        f"{', '.join(f'{m}::DOUBLE AS {m}' for m in METRICS)} FROM {source} WHERE run_id = ? "
        "ORDER BY episode_id, turn, turn_step, call_index", [run_id]).df()


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per tool (most calls first) and a last `all` row: calls, tasks, then `valid` and each metric's mean with
    its 95% interval (`<metric>_lo`, `<metric>_hi`), resampling tasks."""
    rows = []
    groups = [(tool, g) for tool, g in frame.groupby("tool", sort=False)]
    groups.sort(key=lambda item: (-len(item[1]), item[0]))
    for tool, g in [*groups, ("all", frame)]:
        row = {"tool": tool, "calls": len(g), "tasks": g["episode_id"].nunique()}
        for m in ("valid", *METRICS):
            row[m] = float(g[m].mean()) if g[m].notna().any() else float("nan")
            row[f"{m}_lo"], row[f"{m}_hi"] = cluster_bootstrap(g[m], g["episode_id"])
        rows.append(row)
    return pd.DataFrame(rows)


def matched(a: pd.DataFrame, b: pd.DataFrame, names: tuple[str, str] = ("A", "B")) -> pd.DataFrame:
    """The two runs' rehearsals of the same calls side by side (`<metric>_a`, `<metric>_b`); runs over different
    calls are a UsageError saying how many differ."""
    left, right = (f.set_index(CALL) for f in (a, b))
    both = left.index.intersection(right.index)
    differ = len(left.index.union(right.index)) - len(both)
    same = left.loc[both, ["tool", "arguments"]].equals(right.loc[both, ["tool", "arguments"]])
    if not len(left.index.union(right.index)):
        raise UsageError(f"{names[0]} and {names[1]} hold no rehearsed calls to compare")
    if differ or not same:
        moved = differ + (0 if same else int((left.loc[both, ["tool", "arguments"]] !=
                                              right.loc[both, ["tool", "arguments"]]).any(axis=1).sum()))
        raise UsageError(f"{names[0]} and {names[1]} rehearsed different calls: {moved} of "
                         f"{len(left.index.union(right.index))} differ ({len(left)} and {len(right)} calls); "
                         "compare world-model runs of the same env, category, split, limit and turns")
    return left.loc[both].join(right.loc[both, ["valid", *METRICS]], lsuffix="_a", rsuffix="_b").reset_index()


def compare(pairs_ab: pd.DataFrame) -> pd.DataFrame:
    """Per metric over matched calls (`matched`): A's and B's means, Δ = B − A with its paired 95% interval
    (tasks resampled), the calls where B scores higher and lower, the sign test over those (`sign_p`), and
    `holm_p`: the sign test Holm-adjusted over the metrics that have calls (NaN, and outside the family, for a
    metric no call has in both runs)."""
    rows = []
    for m in ("valid", *METRICS):
        both = pairs_ab[[f"{m}_a", f"{m}_b", "episode_id"]].dropna()
        diff = both[f"{m}_b"] - both[f"{m}_a"]
        lo, hi = paired_bootstrap(both[f"{m}_b"], both[f"{m}_a"], both["episode_id"])
        rows.append({"metric": m, "calls": len(both), "a": both[f"{m}_a"].mean(), "b": both[f"{m}_b"].mean(),
                     "delta": diff.mean(), "lo": lo, "hi": hi, "up": int((diff > 0).sum()),
                     "down": int((diff < 0).sum()), "sign_p": sign_test(diff)})
    frame = pd.DataFrame(rows)
    frame["holm_p"] = holm([p if n else float("nan") for p, n in zip(frame["sign_p"], frame["calls"], strict=True)])
    return frame


def holm_note(frame: pd.DataFrame) -> str:
    """The caption that names `compare`'s Holm family."""
    n = int(frame["holm_p"].notna().sum())
    return (f"Holm p: the sign test p Holm-adjusted over the {n} sign test{'s' if n != 1 else ''} of this table "
            "(one per metric with calls in both runs)")


def compare_table(frame: pd.DataFrame, a: str, b: str):
    """`compare`'s frame as the rich table `envace world-model-compare` prints, its Holm family in the caption."""
    from rich.table import Table

    table = Table("metric", "calls", "A", "B", "Δ = B − A", "95% interval", "B higher", "B lower", "sign test p",
                  "Holm p", title=f"world model, paired by call: A = {a}, B = {b}", caption=holm_note(frame))
    for r in frame.to_dict("records"):
        table.add_row(LABELS[r["metric"]], str(r["calls"]), f"{r['a']:.3f}", f"{r['b']:.3f}", f"{r['delta']:+.3f}",
                      f"[{r['lo']:+.3f}, {r['hi']:+.3f}]", str(r["up"]), str(r["down"]), f"{r['sign_p']:.3g}",
                      "–" if r["holm_p"] != r["holm_p"] else f"{r['holm_p']:.3g}")
    return table
