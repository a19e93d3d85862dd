"""Start `envace train|rollout|eval|sweep` in the background and keep a handle on it.

`launch` never blocks: the job runs as its own process (its own session, so stopping it reaches the
whole process group), writes its log to `<root>/.logs/<run>.log`, and writes the run store as it
goes, so the app's tabs and a notebook's queries see its rows while it runs.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from envace.errors import UsageError
from envace.store import check_run_id

KINDS = ("train", "rollout", "eval", "sweep")


@dataclass
class RunHandle:
    """A launched job: its run name, command line, log file and process."""

    run_id: str
    command: list[str]
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def status(self) -> str:
        """`running`, `finished`, `stopped` (by `stop`) or `failed (exit N)`."""
        code = self.process.poll()
        if code is None:
            return "running"
        if code == 0:
            return "finished"
        return "stopped" if code in (130, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL) else f"failed (exit {code})"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        # a progress bar rewrites its line with '\r': keep only what the line shows last
        shown = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
        return "\n".join(shown[-lines:])

    def wait(self, timeout: float | None = None) -> str:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        return self.status()

    def stop(self, grace_s: float = 15.0) -> str:
        """Interrupt the job (Ctrl-C: it stores what it finished and marks the run interrupted), then
        terminate it if it has not exited after `grace_s` seconds."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.status()


def launch(config: str | Path | None = None, kind: str = "train", root: str | Path = "runs",
           name: str | None = None, resume: str | None = None, args: tuple[str, ...] | list[str] = ()) -> RunHandle:
    """Start `envace <kind>` on `config` (a TOML file under `experiments/`) in the background.

    `name` names the run (generated when omitted); `resume` continues a stopped train run instead;
    `args` are further command-line flags, e.g. `("--limit", "2")`.
    """
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}, not '{kind}'")
    if kind == "train" and config is None:
        raise UsageError("a train job needs a config file")
    if config is not None and not Path(config).is_file():
        raise UsageError(f"no config file '{config}'")
    if resume is not None and kind != "train":
        raise UsageError("only train runs can be resumed")
    run_id = check_run_id(resume or name or f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
    command = [sys.executable, "-u", "-m", "envace.cli", kind]
    if kind == "train":
        command += [str(config), "--resume" if resume else "--run-name", run_id]
    elif kind == "sweep":
        command += ["--name", run_id] + (["--config", str(config)] if config else [])
    else:
        command += ["--run-name", run_id] + (["--config", str(config)] if config else [])
    command += ["--root", str(root), *args]
    logs = Path(root) / ".logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{run_id}.log"
    with log_path.open("a") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    return RunHandle(run_id, command, log_path, process)
