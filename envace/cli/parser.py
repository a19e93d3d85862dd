"""The `envace` argument parser: each family of commands registers its own (`register(sub)` in its module)."""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from envace.cli.bench import register as register_bench
from envace.cli.envs import register as register_envs
from envace.cli.flags import rewrite_deprecated
from envace.cli.play import register as register_play
from envace.cli.private import register as register_private
from envace.cli.runs import register as register_runs
from envace.cli.serve import register as register_serve
from envace.cli.train import register as register_train
from envace.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)  # `--ro DIR` must never mean `--root DIR`
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, exit 2, like every other bad input
        raise UsageError(message)


def _version() -> str:
    try:
        return version("envace-workbench")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="envace", description="World-rehearsal agentic RL workbench.")
    parser.add_argument("--version", action="version", version=f"envace {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for register in (register_play, register_private, register_train, register_serve, register_runs, register_envs,
                     register_bench):
        register(sub)  # in this order in `envace --help`
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """`argv` parsed, deprecated flags renamed first; `args.func(args)` runs the command."""
    return build_parser().parse_args(rewrite_deprecated(argv))
