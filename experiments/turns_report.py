"""The tables of docs/log/results-earlier.md "Learning you can see", read from the store `bfcl_turns_cpu.sh` wrote.

    .venv/bin/python experiments/turns_report.py [--root runs] [--tag turns] [--seed 0] [--arms envace real_env ...]
        [--screened]   # the arms trained on the screened turns (run names ARM-screened-TAG-sSEED)
        [--screens RUN ...]   # pass-rate screens of the pool side by side (e.g. one per temperature)

Per arm: the GRPO steps (groups with signal per role, mean checklist, the fitted slope of the checklist over
steps with its 95% interval); then every evaluation on the same test turns, each paired with SFT by turn
(mean difference with a 95% bootstrap interval resampled by task, and an exact two-sided sign test over the turns
that differ). Every table that prints p-values prints them Holm-adjusted too (`Holm …` columns), over the family
its caption names: all the tests of that table.

Every comparison is paired (`envace.stats.paired_outcomes`): two screens of the pool with one seed draw episode
k of a turn with the same sampling seed, as do an arm and the control at one GRPO step, so episodes pair by id
(McNemar's exact test on "scored", a sign-flip permutation test by turn on the checklist); the first and last GRPO
steps play the same turns with other draws, so they pair by turn. Screens that share no episode are not a
comparison: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import pandas as pd

from envace.compare import episode_pairs, holm_columns, markdown
from envace.config import nest
from envace.errors import UsageError
from envace.stats import cluster_bootstrap as bootstrap
from envace.stats import paired_outcomes, sign_test
from envace.store import connect
from envace.units import whole_uid
from workbench import Workbench

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 10: 2.228, 15: 2.131,
         20: 2.086, 30: 2.042}


def slope(steps: np.ndarray, values: np.ndarray) -> tuple[float, float, float]:
    """Least-squares slope of `values` over `steps` and its 95% t-interval (n - 2 degrees of freedom)."""
    n = len(steps)
    if n < 3:
        return float("nan"), float("nan"), float("nan")
    x = steps - steps.mean()
    b = float((x * (values - values.mean())).sum() / (x * x).sum())
    resid = values - values.mean() - b * x
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / float((x * x).sum()))
    t = T_975[min((k for k in T_975 if k >= n - 2), default=30)]
    return b, b - t * se, b + t * se


def print_with_holm(frame: pd.DataFrame, columns: list[str]) -> None:
    """`markdown(frame)`, Holm-adjusted columns beside `columns` (those present), the caption naming the family."""
    columns = [c for c in columns if c in frame]
    if not columns:
        print(markdown(frame))
        return
    frame, n = holm_columns(frame, columns)
    print(markdown(frame) + f"\n\nHolm: Holm-adjusted over the {n} tests of this table ({'; '.join(columns)}).")


def training_table(wb: Workbench, run: str) -> pd.DataFrame:
    long = wb.training(run)
    if long.empty:
        return pd.DataFrame()
    wide = long.pivot_table(index="step", columns=["role", "name"], values="value")
    out = pd.DataFrame(index=wide.index)
    for role in ("caller", "rehearser"):
        if (role, "signal_groups") in wide:
            out[f"{role} signal"] = wide[(role, "signal_groups")]
            out[f"{role} adv ±"] = wide[(role, "adv_std")]
    out["checklist"] = wide[("all", "checklist_mean")]
    for name in ("rollout_s", "step_s"):
        if ("all", name) in wide:
            out[name] = wide[("all", name)]
    return out.reset_index()


def fidelity_table(wb: Workbench, run: str) -> pd.DataFrame:
    """Per GRPO step, the rehearser's fidelity on that step's own shadow pairs (empty without shadow pairs)."""
    long = wb.fidelity_over_training(run)
    long = long[long["source"] == "train"]
    if long.empty:
        return pd.DataFrame()
    wide = long.pivot_table(index="step", columns="name", values="value")
    grpo = wb.episodes(run, limit=1_000_000).query("phase == 'grpo'")[["step", "episode_id"]]
    pairs = wb.pairs(run).merge(grpo, on=["step", "episode_id"])  # not the pairs of a train-time evaluation
    counts = pd.DataFrame({"pairs": pairs.groupby("step").size(),
                           "malformed": pairs["rehearsal_error"].notna().groupby(pairs["step"]).mean()})
    columns = [c for c in ("valid_json", "exact", "structure_f1", "value_acc", "error_agree") if c in wide]
    return counts.join(wide[columns]).reset_index()


def screen_table(wb: Workbench, runs: list[str]) -> pd.DataFrame:
    """Per screen: how many units have reward spread, and the share of GRPO groups of G = 8 expected to have a
    signal, 1 - Σ_v p_v^8 per unit (p_v: the share of its episodes that scored v), averaged over the whole pool
    and over the units with spread. A plug-in estimate from the screen's own samples: a unit seen 0/8 counts 0."""
    rows = []
    for run in runs:
        temperature = json.loads((wb.root / run / "run.json").read_text())["config"]["temperature"]
        episodes = wb.episodes(run, limit=1_000_000)
        shares = episodes.groupby("task_uid")["checklist"].apply(
            lambda v: 1 - float((v.value_counts(normalize=True) ** 8).sum()))
        units = wb.unit_rewards(run)
        rows.append({"screen": run, "temperature": temperature, "episodes": len(episodes),
                     "scored": int((episodes["checklist"] > 0).sum()), "units": len(units),
                     "units with spread": int(units["spread"].sum()), "E[signal] pool": shares.mean(),
                     "E[signal] spread units": shares[shares > 0].mean() if (shares > 0).any() else 0.0})
    return pd.DataFrame(rows)


def rescreen_table(wb: Workbench, before: str, after: str, trained: list[str]) -> pd.DataFrame:
    """The same screen of the pool before (SFT) and after training, the turns GRPO trained on apart from the
    others, paired by episode: scored episodes and mean checklist of each side, McNemar's test on the scored
    pairs and a permutation test (signs flipped by turn) on the checklist."""
    both, rows = episode_pairs(connect(wb.root), before, after), []
    for label, keep in (("trained turns", True), ("other turns", False)):
        part = both[both["task_uid"].isin(trained) == keep]
        out = paired_outcomes(part["a"], part["b"], part["task_uid"])
        rows.append({"turns": label, "episodes": out["pairs"], "scored before": int((part["a"] > 0).sum()),
                     "scored after": int((part["b"] > 0).sum()), "up/down": f"{out['up']}/{out['down']}",
                     "checklist before": out["before"], "checklist after": out["after"],
                     "McNemar p (scored)": out["mcnemar_p"], "permutation p (checklist)": out["permutation_p"]})
    return pd.DataFrame(rows)


def _last_step(wb: Workbench, control: str, run: str, step: int) -> tuple[pd.Series, pd.Series, pd.Series]:
    """(control's checklist, the arm's, the turn) of the episodes both played at GRPO `step` with one seed."""
    both = episode_pairs(connect(wb.root), control, run, step)
    return both["a"], both["b"], both["task_uid"]


def first_last(episodes: pd.DataFrame) -> float:
    """Permutation p of the per-turn scored share, first GRPO step against the last, paired by turn (signs flipped
    per turn); NaN when the two steps share no turn."""
    share = (episodes["checklist"] > 0).groupby([episodes["step"], episodes["task_uid"]]).mean().unstack()
    first, last = share.iloc[0], share.iloc[-1]
    common = first.dropna().index.intersection(last.dropna().index)
    return paired_outcomes(first[common], last[common])["permutation_p"] if len(common) else float("nan")


def evaluation(wb: Workbench, run: str) -> tuple[dict[str, float], pd.Series]:
    episodes = wb.episodes(run, limit=100_000).set_index("task_uid")
    meta = wb.runs().set_index("run_id").loc[run]
    fid = wb.fidelity_by_tool(run)
    overall = fid[fid["tool"] == "all"].iloc[0] if len(fid) else None
    row = {"turns": len(episodes), "success": episodes["success"].mean(), "checklist": episodes["checklist"].mean(),
           "well-formed": meta["well_formed_rate"],
           "pairs": int(overall["pairs"]) if overall is not None else 0,
           "malformed": overall["malformed"] if overall is not None else float("nan"),
           "exact": overall["exact"] if overall is not None else float("nan"),
           "struct F1": overall["structure_f1"] if overall is not None else float("nan")}
    return row, episodes["checklist"]


def arm_report(wb: Workbench, arm: str, run: str, sft_screen: str, completed: set[str], summary: list[dict],
               rescreens: list[dict]) -> None:
    """Print one arm's tables (steps, fidelity, per-turn hits, screens before/after) and append its rows to
    the cross-arm `summary` and `rescreens`."""
    table = training_table(wb, run)
    if table.empty:
        return
    b, lo, hi = slope(table["step"].to_numpy(float), table["checklist"].to_numpy(float))
    episodes = wb.episodes(run, limit=1_000_000).query("phase == 'grpo'")
    hit = episodes["checklist"] > 0
    scored, sizes = hit.groupby(episodes["step"]).sum(), episodes.groupby("step").size()
    summary.append({"arm": arm, "checklist per step": " / ".join(f"{v:.3f}" for v in table["checklist"]),
                    "scored per step": " / ".join(f"{int(v)}/{n}" for v, n in zip(scored, sizes, strict=True)),
                    "slope (95% CI)": f"{b:+.3f} ({lo:+.3f} … {hi:+.3f})",
                    "p, scored first vs last step": first_last(episodes),
                    "step_s mean": table["step_s"].mean() if "step_s" in table else float("nan"),
                    "run": run, "last step": int(episodes["step"].max())})
    print(f"\n### {run}: GRPO steps\n")
    print(markdown(table))
    print(f"\nchecklist slope per step {b:+.4f} (95% CI {lo:+.4f} … {hi:+.4f})")
    fidelity = fidelity_table(wb, run)
    if not fidelity.empty:
        b, lo, hi = slope(fidelity["step"].to_numpy(float), fidelity["structure_f1"].to_numpy(float))
        print(f"\n### {run}: rehearser fidelity on the shadow pairs of each step\n")
        print(markdown(fidelity))
        print(f"\nstructure F1 slope per step {b:+.4f} (95% CI {lo:+.4f} … {hi:+.4f})")
    config = nest(json.loads((wb.root / run / "run.json").read_text())["config"])  # old runs' keys too
    units = config.get("grpo", {}).get("units")
    if not units:
        return
    print(f"\n### {run}: scored episodes per turn and step (of G per group)\n")
    print(markdown(hit.groupby([episodes["step"], episodes["task_uid"]]).sum().unstack().reset_index()))
    if {f"screen-{run}", sft_screen} <= completed:
        print(f"\n### {run}: the pool's screen before (SFT) and after training\n")
        table = rescreen_table(wb, sft_screen, f"screen-{run}", units)
        print_with_holm(table, ["McNemar p (scored)", "permutation p (checklist)"])
        trained, other = table.drop(columns="turns").to_dict("records")
        rescreens.append({"arm": arm, **{f"trained: {k}": v for k, v in trained.items()},
                          **{f"other: {k}": v for k, v in other.items()
                             if k not in ("episodes", "checklist before", "checklist after")}})


def main() -> None:
    try:
        report()
    except UsageError as err:
        print(f"turns_report: {err}", file=sys.stderr)  # one line, and the code argparse gives bad input
        raise SystemExit(2) from None


def report() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs")
    parser.add_argument("--tag", default="turns")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", nargs="*",
                        default=["envace", "caller_only", "real_env", "dyna", "fidelity", "control"])
    parser.add_argument("--screened", action="store_true", help="the arms of the screened pool")
    parser.add_argument("--screens", nargs="*", default=[], help="pass-rate screens to compare")
    args = parser.parse_args()
    if args.screened:
        args.arms = [f"{arm}-screened" for arm in args.arms]
    wb = Workbench(args.root)
    runs = wb.runs()
    present, completed = set(runs["run_id"]), set(runs.loc[runs["status"] == "completed", "run_id"])
    pd.set_option("display.width", 200)
    summary, rescreens = [], []
    if args.screens:
        print("\n### Pass-rate screens of the pool\n")
        print(markdown(screen_table(wb, args.screens)))
    for arm in args.arms:
        run = f"{arm}-{args.tag}-s{args.seed}"
        if run in present:
            arm_report(wb, arm, run, f"screen-sft-{args.tag}", completed, summary, rescreens)
    if summary:
        frame = pd.DataFrame(summary)
        control = frame[frame["arm"].str.startswith("control")]
        if len(control):  # the same draws without learning: what the last step scores by chance, episode by episode
            base = control.iloc[0]
            frame["McNemar p vs control, last step"] = [  # the control against itself is no test
                float("nan") if arm == base["arm"] else paired_outcomes(*_last_step(wb, base["run"], run, step))
                ["mcnemar_p"] for arm, run, step in zip(frame["arm"], frame["run"], frame["last step"], strict=True)]
        print("\n### Training reward per step, all arms\n")
        print_with_holm(frame.drop(columns=["run", "last step"]),
                        ["p, scored first vs last step", "McNemar p vs control, last step"])
    if rescreens:
        print("\n### The pool's screen before (SFT) and after training, all arms\n")
        print_with_holm(pd.DataFrame(rescreens), [f"{part}: {test}" for part in ("trained", "other")
                                                  for test in ("McNemar p (scored)", "permutation p (checklist)")])
    rows, sft = [], None
    for arm in ["base", "sft", *args.arms]:
        run = f"eval-{arm}-{args.tag}" + ("" if arm in ("base", "sft") else f"-s{args.seed}")
        if run not in present:
            continue
        row, per_task = evaluation(wb, run)
        if arm == "sft":
            sft = per_task
        elif sft is not None:
            common = per_task.index.intersection(sft.index)
            diffs = (per_task[common] - sft[common]).to_numpy(float)
            lo, hi = bootstrap(diffs, [whole_uid(u) for u in common])  # a task's turns share its scenario
            row.update({"Δ checklist vs SFT": diffs.mean(), "95% CI": f"{lo:+.3f} … {hi:+.3f}",
                        "sign test p": sign_test(diffs), "turns up/down": f"{(diffs > 0).sum()}/{(diffs < 0).sum()}"})
        rows.append({"arm": arm, "eval run": run, **row})
    if rows:
        print("\n### Evaluations on the same test turns\n")
        print_with_holm(pd.DataFrame(rows), ["sign test p"])


if __name__ == "__main__":
    main()
