"""The study's report: every comparison paired, every interval resampled by task, every table's p-values
Holm-adjusted over the family its caption names.

    test turns      arm − SFT of its seed, pairs (seed, turn)          McNemar on scored, sign-flip by task
    controls        arm − control, arm − random, pairs (seed, turn)    the same tests
    pool screens    after − before training, pairs (seed, episode)     trained units apart from the rest
    world model     arm − SFT, pairs (seed, gold call), per metric     sign-flip by task
    private         N > 0 − N = 0 of one model and mode, pairs (seed, turn)

An arm with an SFT of its own (`memory`) is also its SFT − the seed's SFT and the arm − its own SFT in the test
turns, and its two checkpoints are rows of the private table (labels `sft_<arm>` and `<arm>`).

A cluster is a task (its scenario): a task's turns share it, and so do the same turn's pairs in every seed, so
seeds add evidence only as far as tasks do. Pairs that do not pair up (another seed, pool or limit) are a
UsageError, never an unpaired test (`envace/compare.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd

from envace import world_model
from envace.compare import episode_pairs, row
from envace.stats import cluster_bootstrap
from envace.units import whole_uid


def call_pairs(con, before: str, after: str, metric: str) -> pd.DataFrame:
    """The world-model benchmark's `metric` on the same gold calls in two runs: task_uid, a, b."""
    both = world_model.matched(world_model.pairs(con, "pairs", before), world_model.pairs(con, "pairs", after),
                               (before, after))
    both = both[[f"{metric}_a", f"{metric}_b", "episode_id"]].dropna()
    return pd.DataFrame({"task_uid": both["episode_id"].str.rsplit("#", n=1).str[0],
                         "a": both[f"{metric}_a"], "b": both[f"{metric}_b"]})


class Tables:
    """The report's tables from a finished (or partly finished) study: `name(stage, seed)` gives a stage's run."""

    def __init__(self, con, name: Callable[[str, int], str], completed: Callable[[str], bool], seeds: list[int],
                 arms: list[str], swept: list[int], modes: list[str], budgets: list[int], pools: dict[int, dict],
                 sft: str, own_sft: dict[str, str] | None = None):
        self.con, self.name, self.completed, self.sft = con, name, completed, sft
        self.own_sft = own_sft or {}  # arm → the stage of the SFT it started from, when not the seed's
        self.seeds, self.arms, self.swept, self.pools = seeds, arms, swept, pools
        self.modes, self.budgets = modes, budgets

    def _frames(self, pair: Callable, before: str, after: str) -> dict[int, pd.DataFrame]:
        """Per seed whose two stages completed, `pair(con, before's run, after's run)`."""
        runs = {s: (self.name(before, s), self.name(after, s)) for s in self.seeds}
        return {s: pair(self.con, a, b) for s, (a, b) in runs.items() if self.completed(a) and self.completed(b)}

    def test_turns(self) -> list[dict]:
        rows = [row({"arm": arm, "vs": "SFT"}, list(frames.values())) for arm in self.arms
                if (frames := self._frames(episode_pairs, f"eval-{self.sft}", f"eval-{arm}"))]
        for arm, own in self.own_sft.items():  # its own SFT against the seed's, and the arm against its own SFT
            for (label, vs), (a, b) in (((f"sft_{arm}", "SFT"), (self.sft, own)), ((arm, f"sft_{arm}"), (own, arm))):
                if frames := self._frames(episode_pairs, f"eval-{a}", f"eval-{b}"):
                    rows.append(row({"arm": label, "vs": vs}, list(frames.values())))
        return rows

    def controls(self) -> list[dict]:
        return [row({"arm": arm, "vs": control}, list(frames.values()))
                for control in ("control", "random") if control in self.arms
                for arm in self.arms if arm not in ("control", "random")
                if (frames := self._frames(episode_pairs, f"eval-{control}", f"eval-{arm}"))]

    def screens(self) -> list[dict]:
        """The pool's screen after training against before, the units GRPO trained on apart from the others."""
        rows = []
        for arm in self.arms:
            frames = self._frames(episode_pairs, f"screen-{self.sft}", f"screen-{arm}")
            for part, keep in (("trained units", True), ("other units", False)):
                picked = [f[f["task_uid"].isin(self.pools[s]["units"]) == keep] for s, f in frames.items()]
                if sum(len(f) for f in picked):
                    rows.append(row({"arm": arm, "units": part}, [f for f in picked if len(f)]))
        return rows

    def world_model(self, metrics: tuple[str, ...] = ("exact", "structure_f1")) -> list[dict]:
        return [row({"arm": arm, "metric": world_model.LABELS[m]}, list(frames.values()))
                for arm in self.arms for m in metrics
                if (frames := self._frames(lambda con, a, b, m=m: call_pairs(con, a, b, m), f"wm-{self.sft}",
                                           f"wm-{arm}"))]

    def private(self) -> list[dict]:
        from envace.private import sweep

        rows = sweep.against_none(self.con, [self.name("private", s) for s in self.swept], ["sft", "envace"],
                                  self.modes, self.budgets, self.completed)
        for arm in self.own_sft:
            rows += sweep.against_none(self.con, [self.name(f"private-{arm}", s) for s in self.swept],
                                       [f"sft_{arm}", arm], self.modes, self.budgets, self.completed)
        return rows


def floor_table(tables: Tables, success: dict[int, float], chosen: int) -> pd.DataFrame:
    """Per SFT size: test turns, the share succeeded with its 95% interval (tasks resampled), the size chosen."""
    rows = []
    for n, rate in sorted(success.items()):
        run = tables.name(f"eval-sft-n{n}", tables.seeds[0])
        e = tables.con.execute("SELECT task_uid, success::DOUBLE AS s FROM episodes WHERE run_id = ?", [run]).df()
        lo, hi = cluster_bootstrap(e["s"], [whole_uid(u) for u in e["task_uid"]])
        rows.append({"SFT tasks": n, "test turns": len(e), "success": rate, "95% CI": f"{lo:.3f} … {hi:.3f}",
                     "chosen": "←" if n == chosen else ""})
    return pd.DataFrame(rows)


def figure(sections: dict[str, pd.DataFrame], out: Path) -> None:
    """Δ with its 95% interval for each row of the test-turn and world-model tables, one panel each."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    shown = {k: f for k, f in sections.items() if not f.empty}
    if not shown:
        return
    fig = make_subplots(rows=1, cols=len(shown), subplot_titles=list(shown))
    for k, (title, frame) in enumerate(shown.items(), 1):
        labels = [" · ".join(str(v) for v in r) for r in frame[[c for c in frame.columns[:2]]].itertuples(index=False)]
        delta = frame["Δ = B − A"].to_numpy(float)
        fig.add_trace(go.Scatter(
            x=delta, y=labels, mode="markers", name=title, showlegend=False,
            error_x={"type": "data", "symmetric": False, "array": frame["_hi"].to_numpy(float) - delta,
                     "arrayminus": delta - frame["_lo"].to_numpy(float)}), row=1, col=k)
        fig.add_vline(x=0, line_dash="dot", row=1, col=k)
    fig.update_layout(height=120 + 40 * max(len(f) for f in shown.values()), width=520 * len(shown),
                      title="Δ with 95% interval (resampled by task), pooled over seeds")
    fig.write_html(out, include_plotlyjs="cdn")
