"""Start `envace train|rollout|eval|sweep` in the background and keep a handle on it.

`launch` never blocks: the job runs as its own process (its own session, so stopping it reaches the
whole process group), writes its log to `<root>/.logs/<run>.log`, and writes the run store as it
goes, so the app's tabs and a notebook's queries see its rows while it runs. The job finds environments as
this process does: installed plugins by their entry points, and a `--env package.module:factory` spec
(passed through unchanged) on this process's own path, which reaches the job's `PYTHONPATH`.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from envace.config import TRAINER_OWNED, RolloutConfig, TrainConfig, choices, load_toml, nest
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
    stopping: bool = False

    def status(self) -> str:
        """`running`, `stopping` (asked to stop, finishing its step), `finished`, `stopped` or `failed (exit N)`."""
        code = self.process.poll()
        if code is None:
            return "stopping" if self.stopping else "running"
        if code == 0:
            return "finished"
        return "stopped" if code in (130, 143, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL) \
            else f"failed (exit {code})"

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
        """Terminate the job (SIGTERM, which it handles as Ctrl-C: it keeps what it finished and marks the run
        interrupted), then kill it if it has not exited after `grace_s` seconds."""
        if self.process.poll() is None:
            self.stopping = True
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.status()


def check_args(kind: str, args: tuple[str, ...] | list[str]) -> None:
    """Refuse flags the job does not accept, an abbreviated one (`--ro DIR` is not `--root DIR`), and `--root`
    (a launched job writes to the launcher's store): the CLI's own parser decides, so nothing else can drift."""
    from envace.cli.parser import build_parser

    placeholder = {"train": ["CONFIG"], "eval": ["MODEL"], "sweep": ["--name", "N"]}.get(kind, [])
    parsed = build_parser().parse_args([kind, *placeholder, *args])  # UsageError on anything it does not know
    if getattr(parsed, "root", None) is not None:
        raise UsageError("the store root is the launcher's own (--root is not accepted here)")


def config_fields(config: str | Path | None, kind: str) -> list[dict[str, Any]]:
    """Every field of the job's config, nested ones dotted (`rehearser.fewshot`), with the value the file sets
    (else the default), the default, the choices, the help text, the widget its type asks for (`widget_of`) and
    the TOML table it lives in (`table_of`): a form to edit before launching."""
    cls, table = _job_config(kind)
    data = load_toml(config).get(table, {}) if config else {}
    if kind == "train":  # a file written before the tables nested shows its values in their new places
        data = nest(data, f"{config} [train]")
    # the trainer sets these rollout fields itself and refuses them from a file: the form leaves them out
    owned = tuple(f"rollout.{name}" for name in TRAINER_OWNED) if kind == "train" else ()
    rows = [row for row in _fields(cls, data, cls(), "")
            if not any(row["field"] == o or row["field"].startswith(o + ".") for o in owned)]
    from envace.envs import registry

    for row in rows:  # the environments this job can name: the built-ins and every installed plugin
        row["table"] = table_of(row["field"], kind)
        if row["field"] in ("env", "rollout.env"):
            row["choices"], row["widget"] = registry.names(), "suggest"  # or a package.module:factory spec
    return rows


def widget_of(hint: Any) -> str:
    """The form widget a field's annotation asks for: `checkbox` (bool), `dropdown` (a `Literal`), `integer` or
    `number` (int, float), `text` (str), else `literal`: text read as a TOML literal, as `--set` reads it (`auto`
    or 128, a list; a number that may be unset, where empty keeps the default: a number box cannot be empty)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    plain = args[0] if len(args) == 1 and typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
    if plain is bool:
        return "checkbox"
    if typing.get_origin(plain) is typing.Literal:
        return "dropdown"
    if plain is str:
        return "text"
    return {int: "integer", float: "number"}.get(hint, "literal")


def table_of(field_name: str, kind: str) -> str:
    """The TOML table a dotted field lives in: `rollout.rehearser.max_examples` → `train.rollout.rehearser`."""
    table = _job_config(kind)[1]
    parent = field_name.rpartition(".")[0]
    return f"{table}.{parent}" if parent else table


def _fields(cls: type, data: dict[str, Any], defaults: Any, prefix: str) -> list[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        value = getattr(defaults, f.name)
        if is_dataclass(hints[f.name]):
            out += _fields(hints[f.name], data.get(f.name, {}) or {}, value, f"{prefix}{f.name}.")
            continue
        out.append({"field": prefix + f.name, "value": data.get(f.name, value), "default": value,
                    "choices": list(choices(hints[f.name])), "widget": widget_of(hints[f.name]),
                    "help": f.metadata.get("help", "")})
    return out


def resolve(kind: str, values: dict[str, Any]) -> Any:
    """The job's config built from dotted field values (checked like a file: one message naming the field)."""
    cls, _ = _job_config(kind)
    nested: dict[str, Any] = {}
    for key, value in values.items():
        if value is None or value == "":
            continue
        *parents, leaf = key.split(".")
        target = nested
        for name in parents:
            target = target.setdefault(name, {})
        target[leaf] = value
    return cls.from_dict(nested)


def write_config(kind: str, cfg: Any, path: Path) -> Path:
    """A resolved config as the TOML file the launched job reads (`[train]` or `[rollout]`)."""
    import toml

    def plain(value: Any) -> Any:  # TOML has no null: an unset field keeps its default by being absent
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if v is not None}
        return value

    data = plain(asdict(cfg))
    if kind == "train":  # the trainer fills its rollouts' own fields and refuses them from a file
        data["rollout"] = {k: v for k, v in data["rollout"].items() if k not in TRAINER_OWNED}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(toml.dumps({_job_config(kind)[1]: data}))
    return path


def _job_config(kind: str) -> tuple[type, str]:
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}, not '{kind}'")
    return (TrainConfig, "train") if kind == "train" else (RolloutConfig, "rollout")


def launch(config: str | Path | None = None, kind: str = "train", root: str | Path = "runs",
           name: str | None = None, resume: str | None = None, args: tuple[str, ...] | list[str] = ()) -> RunHandle:
    """Start `envace <kind>` on `config` (a TOML file under `experiments/`) in the background.

    `name` names the run (generated when omitted); `resume` continues a stopped train run instead;
    `args` are further command-line flags, e.g. `("--limit", "2")`.
    """
    if kind not in KINDS:
        raise UsageError(f"kind must be one of {', '.join(KINDS)}, not '{kind}'")
    check_args(kind, args)
    if kind == "train" and config is None:
        raise UsageError("a train job needs a config file")
    if config is not None and not Path(config).is_file():
        raise UsageError(f"no config file '{config}'")
    if resume is not None and kind != "train":
        raise UsageError("only train runs can be resumed")
    run_id = check_run_id(resume or name or _new_run_id(kind))
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
                                   start_new_session=True, env=child_env())
    return RunHandle(run_id, command, log_path, process)


def _new_run_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def launch_resolved(kind: str, cfg: Any, root: str | Path = "runs", name: str | None = None) -> RunHandle:
    """Start a job on a config built in memory (the app's form), written as `<root>/.logs/<run>.toml`. The kind
    and the run name are checked before anything is written, so nothing is ever created outside the store."""
    _job_config(kind)
    run_id = check_run_id(name or _new_run_id(kind))
    return launch(write_config(kind, cfg, Path(root) / ".logs" / f"{run_id}.toml"), kind, root, run_id)


def child_env() -> dict[str, str]:
    """This process's environment, with the folders it added to its import path (a notebook's `sys.path.insert`,
    the working directory) on the child's `PYTHONPATH`, so a `module:factory` env imports there too. The
    interpreter's own folders (under its prefixes) are left out: the child has them already."""
    env = dict(os.environ)
    prefixes = {str(Path(p).resolve()) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    here = [str(Path(p or ".").resolve()) for p in sys.path]
    added = [p for p in here if Path(p).is_dir() and not any(p == x or p.startswith(x + os.sep) for x in prefixes)]
    paths = list(dict.fromkeys(added + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
