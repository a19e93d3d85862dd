"""Plotly figures over `Workbench` query results; the app and the notebooks draw the same charts."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots


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
    fig.update_xaxes(title_text="imagined attempts N")
    fig.update_yaxes(title_text=metric, secondary_y=False)
    fig.update_yaxes(title_text="private-rehearsal tokens per episode", secondary_y=True)
    fig.update_layout(title=f"Private rehearsal: {metric} vs budget", legend={"orientation": "h"})
    return fig


TRAINING_METRICS = ("reward_mean", "adv_abs_mean", "loss", "entropy", "grad_norm", "error_rate")


def training_curves(metrics: pd.DataFrame, names: tuple[str, ...] = TRAINING_METRICS) -> go.Figure:
    """One panel per metric, one line per role, against the GRPO step."""
    shown = [n for n in names if n in set(metrics["name"])]
    fig = make_subplots(rows=max(len(shown), 1), cols=1, shared_xaxes=True, subplot_titles=shown)
    for row, name in enumerate(shown, 1):
        for role, part in metrics[metrics["name"] == name].groupby("role"):
            fig.add_trace(go.Scatter(x=part["step"] + 1, y=part["value"], mode="lines+markers", name=f"{role}",
                                     legendgroup=role, showlegend=row == 1), row=row, col=1)
    fig.update_xaxes(title_text="GRPO step", row=max(len(shown), 1), col=1)
    fig.update_layout(height=220 * max(len(shown), 1), title="Training, per role")
    return fig


def fidelity_bars(by_tool: pd.DataFrame, metrics: tuple[str, ...] = ("exact", "structure_f1", "value_acc",
                                                                     "error_agree")) -> go.Figure:
    """Per-tool fidelity of the rehearser against the real environment."""
    fig = go.Figure([go.Bar(x=by_tool["tool"], y=by_tool[m], name=m) for m in metrics])
    fig.update_layout(barmode="group", title="Rehearsal fidelity per tool", yaxis={"range": [0, 1]})
    return fig


def fidelity_over_training(long: pd.DataFrame, metrics: tuple[str, ...] = ("exact", "structure_f1", "value_acc",
                                                                          "error_agree")) -> go.Figure:
    """Each fidelity metric against the GRPO step: solid from the test-split eval, dotted from the step's
    own shadow pairs (`Workbench.fidelity_over_training`)."""
    fig = go.Figure()
    for (source, name), part in long[long["name"].isin(metrics)].groupby(["source", "name"]):
        fig.add_trace(go.Scatter(x=part["step"], y=part["value"], mode="lines+markers", name=f"{name} · {source}",
                                 line={"dash": "solid" if source == "eval" else "dot"}))
    fig.update_layout(title="Rehearsal fidelity over training", xaxis_title="GRPO updates",
                      yaxis={"range": [0, 1], "title": "mean over pairs"})
    return fig


def calibration(per_episode: pd.DataFrame) -> go.Figure:
    """Episode checklist score against its mean rehearsal exact-match, coloured by official success."""
    fig = go.Figure()
    for success, part in per_episode.groupby("success"):
        fig.add_trace(go.Scatter(x=part["fidelity"], y=part["checklist"], mode="markers",
                                 name="success" if success else "failure", text=part["episode_id"],
                                 marker={"size": 9, "opacity": 0.7}))
    fig.update_layout(title="Does fidelity go with success?", xaxis={"title": "mean exact-match of its rehearsals",
                                                                      "range": [-0.05, 1.05]},
                      yaxis={"title": "checklist score", "range": [-0.05, 1.05]})
    return fig
