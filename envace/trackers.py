"""Experiment trackers: the metrics a job stores, mirrored to trackio, TensorBoard or Weights & Biases.

`report_to = "none" | "trackio" | "tensorboard" | "wandb"`. The store stays the record; a tracker gets the
same numbers under `phase/role/name` keys at the same steps, so runs can be compared in the dashboards
researchers already use. trackio is local-first (a SQLite file, its own Gradio dashboard, the wandb API);
TensorBoard's event files go to `<run>/tensorboard`; wandb is used only when installed (offline unless
configured otherwise by its own environment variables).
"""

from __future__ import annotations

from typing import Any

from envace.errors import UsageError


class Tracker:
    """`report_to = "none"`: logs nothing."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        """`metrics` by `phase/role/name` at `step`."""

    def close(self) -> None:
        """Flush and finish."""


class _TensorBoard(Tracker):
    def __init__(self, folder) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        self.writer.close()


class _WandbLike(Tracker):
    """trackio and wandb share an API: init, log, finish."""

    def __init__(self, module, name: str, config: dict[str, Any]) -> None:
        self.module = module
        quiet = {"embed": False} if module.__name__ == "trackio" else {}  # no dashboard launched from a job
        module.init(project="envace", name=name, config=config, **quiet)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.module.log(metrics, step=step)

    def close(self) -> None:
        self.module.finish()


def open_tracker(report_to: str, run, config: dict[str, Any]) -> Tracker:
    """A tracker for `run` (its id names the tracked run; its config travels with it)."""
    if report_to == "none":
        return Tracker()
    if report_to == "tensorboard":
        return _TensorBoard(run.path / "tensorboard")
    try:
        module = __import__(report_to)
    except ImportError:
        raise UsageError(f"report_to: {report_to} is not installed (pip install {report_to})") from None
    return _WandbLike(module, run.run_id, config)


def keyed(phase: str, values: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per-role metrics as one flat dict of `phase/role/name`."""
    return {f"{phase}/{role}/{name}": float(v) for role, named in values.items() for name, v in named.items()}
