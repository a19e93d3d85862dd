"""Plotly figures over `Workbench` query results; the app and the notebooks draw the same charts.

One style for all (`_style`): axis ranges from the metric's own domain (a rate in [0, 1] is drawn on
[0, 1]), whole-number step axes, legends above the plot where they cannot cover an axis title, units in
the axis titles. Curves over training steps take several runs at once (one line per run and role) and an
optional exponential smoothing.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from envace.record import actor_of

# Metrics whose values live in [0, 1]: their axes are drawn on that range.
UNIT_METRICS = {"success_rate", "checklist", "well_formed_rate", "parse_error_rate", "exact", "structure_f1",
                "value_acc", "error_agree", "valid_json", "string_sim", "embed_cos", "copied", "malformed",
                "signal_groups", "reward_mean", "error_rate", "checklist_mean", "rehearsal_error_rate",
                "real_fraction"}
LABELS = {"success_rate": "official success (share)", "checklist": "checklist reward (0-1)",
          "well_formed_rate": "well-formed calls (share of messages)", "reward_mean": "mean reward (0-1)",
          "signal_groups": "groups with reward spread (share)", "adv_abs_mean": "mean |advantage|",
          "loss": "policy loss", "entropy": "entropy (nats/token)", "grad_norm": "gradient norm (before clipping)",
          "error_rate": "malformed outputs (share)", "logprob_gap": "mean |Δ log p| sampler vs trainer",
          "sync_s": "weight sync (s)", "step_s": "step wall time (s)"}


def _style(fig: go.Figure, title: str, x_title: str, y_title: str | None = None, unit_y: bool = False,
           integer_x: bool = False, height: int | None = None) -> go.Figure:
    fig.update_layout(title={"text": title, "y": 0.98, "yanchor": "top"}, template="plotly_white",
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
                      margin={"t": 90, "l": 60, "r": 20, "b": 50}, height=height)
    fig.update_xaxes(title_text=x_title)
    if integer_x:
        fig.update_xaxes(tickformat="d", rangemode="tozero", dtick=1 if _span(fig) <= 12 else None)
    if y_title is not None:
        fig.update_yaxes(title_text=y_title)
    if unit_y:
        fig.update_yaxes(range=[-0.02, 1.02])
    return fig


def _span(fig: go.Figure) -> float:
    xs = [x for trace in fig.data for x in (trace.x if trace.x is not None else []) if x is not None]
    return (max(xs) - min(xs)) if xs else 0


def smooth(values: pd.Series, weight: float) -> pd.Series:
    """Exponential moving average (TensorBoard's smoothing): 0 leaves the curve as it is."""
    return values.ewm(alpha=1 - weight, adjust=False).mean() if weight > 0 else values


def budget_curves(sweep: pd.DataFrame, metric: str = "checklist") -> go.Figure:
    """`metric` against the private-rehearsal budget N, one line per (model, mode); cost on the second axis.

    N = 0 (the plain policy) starts both modes' lines of its model.
    """
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for label, runs in sweep.groupby("label"):
        plain = runs[runs["budget"] == 0]
        for mode in ("parallel", "sequential"):
            line = pd.concat([plain, runs[runs["mode"] == mode]]).sort_values("budget")
            if len(line) == len(plain):
                continue
            fig.add_trace(go.Scatter(x=line["budget"], y=line[metric], mode="lines+markers",
                                     name=f"{label} · {mode}"), secondary_y=False)
            fig.add_trace(go.Scatter(x=line["budget"], y=line["private_tokens_per_episode"], mode="lines",
                                     line={"dash": "dot"}, name=f"{label} · {mode} · tokens", opacity=0.5),
                          secondary_y=True)
    _style(fig, f"Private rehearsal: {LABELS.get(metric, metric)} against the budget", "imagined attempts N",
           integer_x=True)
    fig.update_yaxes(title_text=LABELS.get(metric, metric), range=[-0.02, 1.02], secondary_y=False)
    fig.update_yaxes(title_text="private-rehearsal tokens per episode", rangemode="tozero", secondary_y=True)
    return fig


TRAINING_METRICS = ("reward_mean", "signal_groups", "adv_abs_mean", "loss", "entropy", "grad_norm", "error_rate")
# What each phase's step counts, and what a training curve may be drawn against besides it: the running sum of a
# per-step metric of the run (`all` role), so runs of different speeds or batch sizes line up.
STEP_AXES = {"grpo": "GRPO step (1 = the first update)", "sft": "SFT step", "eval": "updates before the evaluation"}
X_AXES = {"step": None, "wall time": ("step_s", "seconds of GRPO steps"), "tokens": ("tokens", "tokens trained on")}


def curve_metrics(metrics: pd.DataFrame, phase: str = "grpo") -> list[str]:
    """The metrics worth a curve in one phase's long frame: every stored name but the bookkeeping (an SFT step's
    epoch, a span's wall-clock start, each Ray actor's share), the default ones first."""
    names = [n for n in dict.fromkeys(metrics["name"]) if n != "epoch" and not n.endswith("_t")
             and actor_of(n) is None]
    first = [n for n in (TRAINING_METRICS if phase == "grpo" else ()) if n in names]
    return first + sorted(n for n in names if n not in first)


def _x(metrics: pd.DataFrame, phase: str, x: str) -> tuple[pd.Series, str]:
    """Each row's x and the axis title: its step (SFT and GRPO from 1; an evaluation at the updates before it), or
    the running sum of `X_AXES[x]`'s metric up to its step in its run; its step where the run has none."""
    step = metrics["step"] + (0 if phase == "eval" else 1)
    if X_AXES.get(x) is None or phase == "eval":
        return step, STEP_AXES.get(phase, "step")
    name, title = X_AXES[x]
    runs = metrics["run_id"] if "run_id" in metrics else pd.Series("", index=metrics.index)
    per_step = metrics[(metrics["name"] == name) & (metrics["role"] == "all")].assign(run=runs)
    if per_step.empty:
        return step, STEP_AXES.get(phase, "step") + f" (no {name} stored)"
    per_step = per_step.sort_values("step")
    per_step["x"] = per_step.groupby("run")["value"].cumsum()
    lookup = dict(zip(zip(per_step["run"], per_step["step"], strict=True), per_step["x"], strict=True))
    return pd.Series([lookup.get(k, float("nan")) for k in zip(runs, metrics["step"], strict=True)],
                     index=metrics.index), title


def training_curves(metrics: pd.DataFrame, names: tuple[str, ...] = TRAINING_METRICS,
                    smoothing: float = 0.0, phase: str = "grpo", x: str = "step") -> go.Figure:
    """One panel per metric, one line per role (and per run, when `metrics` has a `run_id` column holding
    several), against the phase's step, or the run's wall time or trained tokens so far (`X_AXES`)."""
    shown = [n for n in names if n in set(metrics["name"])]
    fig = make_subplots(rows=max(len(shown), 1), cols=1, shared_xaxes=True,
                        subplot_titles=[LABELS.get(n, n) for n in shown], vertical_spacing=0.06)
    runs = metrics["run_id"].nunique() if "run_id" in metrics else 1
    keys = ["run_id", "role"] if runs > 1 else ["role"]
    xs, title = _x(metrics, phase, x)
    metrics = metrics.assign(x=xs)
    seen: set[str] = set()
    for row, name in enumerate(shown, 1):
        for key, part in metrics[metrics["name"] == name].groupby(keys):
            label = " · ".join(key) if isinstance(key, tuple) else str(key)
            part = part.sort_values("step")
            fig.add_trace(go.Scatter(x=part["x"], y=smooth(part["value"], smoothing), mode="lines+markers",
                                     name=label, legendgroup=label, showlegend=label not in seen), row=row, col=1)
            seen.add(label)
        if name in UNIT_METRICS:
            fig.update_yaxes(range=[-0.02, 1.02], row=row, col=1)
    phase_title = {"grpo": "GRPO", "sft": "SFT", "eval": "Evaluations"}.get(phase, phase)
    _style(fig, f"{phase_title}, per role" + (" and run" if runs > 1 else ""), title,
           integer_x=X_AXES.get(x) is None, height=200 * max(len(shown), 1) + 120)
    fig.update_xaxes(title_text="")
    fig.update_xaxes(title_text=title, row=max(len(shown), 1), col=1)
    return fig


def step_timeline(metrics: pd.DataFrame) -> go.Figure | None:
    """When each GRPO step's rollouts, update and publish ran (a bar per span, on the run's wall clock:
    `rollout_start_t`, `update_start_t` with their durations; one lane per Ray actor), and how many steps were
    trained at each staleness. The publish is the new version reaching the generator: pushed to the vLLM servers
    right after the update (`sync_s`), or, a step ahead, loaded by the actor just before it plays the step that
    samples with it (`load_s`). None for runs stored without span starts."""
    wide = metrics[metrics["role"] == "all"].pivot_table(index="step", columns="name", values="value")
    if not {"rollout_start_t", "update_start_t", "rollout_s", "update_s"} <= set(wide.columns):
        return None
    spans = {"update_s": wide["update_start_t"]}
    if wide.get("sync_s", pd.Series(dtype=float)).notna().any():
        spans["sync_s"] = wide["update_start_t"] + wide["update_s"]
    elif wide.get("load_s", pd.Series(dtype=float)).gt(0).any():
        spans["load_s"] = wide["rollout_start_t"] - wide["load_s"]
    t0 = min(wide["rollout_start_t"].min(), *(start.min() for start in spans.values()))
    actors = sorted((c for c in wide.columns if actor_of(c) is not None), key=actor_of)  # Ray: one lane each
    lanes = [(f"actor {actor_of(c)}", c) for c in actors] or [("actor", "rollout_s")]
    lanes += [("learner", "update_s"), *(("publish", c) for c in spans if c != "update_s")]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.78, 0.22], horizontal_spacing=0.08,
                        subplot_titles=["spans on the wall clock (s since the first rollout)", "steps by staleness"])
    for lane, column in lanes:
        start = spans.get(column, wide["rollout_start_t"]) - t0
        fig.add_trace(go.Bar(y=[lane] * len(wide), x=wide[column], base=start, orientation="h", name=lane,
                             text=[f"step {k + 1}" for k in wide.index], textposition="inside",
                             hovertemplate="%{text}: %{base:.1f} s → +%{x:.1f} s<extra>" + lane + "</extra>"),
                      row=1, col=1)
    if "staleness" in wide.columns:
        counts = wide["staleness"].value_counts().sort_index()
        fig.add_trace(go.Bar(x=counts.index.astype(int), y=counts.values, name="steps", showlegend=False),
                      row=1, col=2)
        fig.update_xaxes(title_text="policy versions behind", tickformat="d", dtick=1, row=1, col=2)
    _style(fig, "Where the GRPO time went: actors, learner and publish", "seconds", height=140 + 40 * len(lanes))
    fig.update_xaxes(title_text="policy versions behind", row=1, col=2)
    return fig


def lanes(spans: pd.DataFrame) -> pd.Series:
    """A lane per episode: under its actor where episodes say which played them (`actor`), episodes packed into
    that actor's slots in start order (an episode takes the first of the actor's lanes free by its start, so an
    actor's lanes are the episodes it had in flight at once: its slots, with the gaps where one sat empty);
    without actors, a lane per episode of its step. Labelled "actor a · slot k"."""
    if "actor" not in spans or spans["actor"].isna().all():
        return spans.groupby("step").cumcount().astype(str)
    out, free = pd.Series("", index=spans.index), {}
    for i, row in spans.sort_values(["start_s", "end_s"], kind="stable").iterrows():
        actor = "?" if pd.isna(row["actor"]) else int(row["actor"])
        ends = free.setdefault(actor, [])
        slot = next((k for k, end in enumerate(ends) if end <= row["start_s"]), len(ends))
        ends[slot:slot + 1] = [row["end_s"]]
        out[i] = f"actor {actor} · slot {slot}"
    return out


def actor_slot_idle(metrics: pd.DataFrame, run_id: str) -> pd.Series:
    """One run's slot-time idle of its actors per step (`actor_slot_idle`), from the Training tab's long metrics."""
    rows = metrics[(metrics["run_id"] == run_id) & (metrics["name"] == "actor_slot_idle") & (metrics["role"] == "all")]
    return rows.set_index("step")["value"]


def episode_timeline(spans: pd.DataFrame, slot_idle: pd.Series | None = None) -> go.Figure | None:
    """Each episode of `Workbench.episode_spans` as a bar from its start to its end on the run's wall clock (a lane
    per slot of the actor that played it, `lanes`; a colour per step; a slot left empty shows as a gap in its lane),
    and beside it each step's idle share: the actors' slot-time idle where the run stored it (`slot_idle`, by step:
    the metric `actor_slot_idle`, slot-seconds offered but empty, a finished episode's slot empty until refilled),
    else the episodes' own wait share, Σ wait_s / Σ (end_s − start_s) (`engine.episode.idle_share`: the time
    episodes sat ready while others' work ran; it cannot see an empty slot). None when no episode stored its times."""
    if spans.empty:
        return None
    spans = spans.assign(wall=spans["end_s"] - spans["start_s"], slot=lanes(spans))
    slots_measured = slot_idle is not None and not slot_idle.dropna().empty
    fig = make_subplots(rows=1, cols=2, column_widths=[0.78, 0.22], horizontal_spacing=0.08,
                        subplot_titles=["episodes on the wall clock (s since the first began)",
                                        "actors' slot-time idle" if slots_measured else "episodes' wait share"])
    for step, rows in spans.groupby("step"):
        fig.add_trace(go.Bar(y=rows["slot"], x=rows["wall"], base=rows["start_s"], orientation="h",
                             name=f"step {step + 1}", text=[f"step {step + 1}"] * len(rows), textposition="inside",
                             customdata=rows[["episode_id", "wait_s"]],
                             hovertemplate="%{customdata[0]}: %{base:.1f} s → +%{x:.1f} s, waited "
                                           "%{customdata[1]:.1f} s<extra></extra>"), row=1, col=1)
    if slots_measured:
        idle = slot_idle.dropna().sort_index()
    else:
        sums = spans.groupby("step")[["wait_s", "wall"]].sum()
        idle = (sums["wait_s"] / sums["wall"]).where(sums["wall"] > 0)
    fig.add_trace(go.Bar(x=idle.index + 1, y=idle.values, name="idle share", text=[f"{v:.0%}" for v in idle],
                         textposition="outside"), row=1, col=2)
    order = sorted(spans["slot"].unique(), key=_lane_key)
    slots = len(order)
    _style(fig, "Where each episode's time went", "seconds", height=240 + 18 * slots)
    fig.update_layout(showlegend=False)  # each bar says its step
    fig.update_yaxes(title_text="actor's slot" if order[0].startswith("actor") else "episode slot",
                     type="category", categoryorder="array", categoryarray=order, autorange="reversed",
                     row=1, col=1)
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%", row=1, col=2)
    fig.update_xaxes(title_text="step", tickformat="d", dtick=1, row=1, col=2)
    return fig


def _lane_key(lane: str) -> tuple:
    """Lanes in order: by actor, then slot (numbers as numbers)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in lane.replace("·", " ").split())


def fidelity_bars(by_tool: pd.DataFrame, metrics: tuple[str, ...] = ("exact", "structure_f1", "value_acc",
                                                                     "error_agree")) -> go.Figure:
    """Per-tool fidelity of the rehearser against the real environment (the overall `all` row last)."""
    fig = go.Figure([go.Bar(x=by_tool["tool"], y=by_tool[m], name=m) for m in metrics])
    fig.update_layout(barmode="group")
    return _style(fig, "Rehearsal fidelity per tool (mean over pairs)", "tool", "score (0-1)", unit_y=True)


def fidelity_over_training(long: pd.DataFrame, metrics: tuple[str, ...] = ("exact", "structure_f1", "value_acc",
                                                                          "error_agree"),
                           smoothing: float = 0.0) -> go.Figure:
    """Each fidelity metric against the GRPO updates: solid from the test-split evaluations, dotted from the
    step's own shadow pairs (`Workbench.fidelity_over_training`); one set of lines per run when several."""
    fig = go.Figure()
    keys = ["run_id", "source", "name"] if "run_id" in long and long["run_id"].nunique() > 1 else ["source", "name"]
    for key, part in long[long["name"].isin(metrics)].groupby(keys):
        part = part.sort_values("step")
        fig.add_trace(go.Scatter(x=part["step"], y=smooth(part["value"], smoothing), mode="lines+markers",
                                 name=" · ".join(map(str, key)),
                                 line={"dash": "solid" if key[-2] == "eval" else "dot"}))
    return _style(fig, "Rehearsal fidelity over training", "GRPO updates", "mean over pairs (0-1)", unit_y=True,
                  integer_x=True)


def calibration(per_episode: pd.DataFrame) -> go.Figure:
    """Episode checklist score against its mean rehearsal exact-match, coloured by official success."""
    fig = go.Figure()
    for success, part in per_episode.groupby("success"):
        fig.add_trace(go.Scatter(x=part["fidelity"], y=part["checklist"], mode="markers",
                                 name="success" if success else "failure", text=part["episode_id"],
                                 marker={"size": 9, "opacity": 0.7}))
    _style(fig, "Does fidelity go with success? (one point per episode)", "mean exact-match of its rehearsals (0-1)",
           "checklist score (0-1)", unit_y=True)
    fig.update_xaxes(range=[-0.02, 1.02])
    return fig
