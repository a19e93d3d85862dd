"""Flags several commands share: `--root`, the rollout config's fields over a `--config` file, whole numbers."""

from __future__ import annotations

import argparse
import sys
import typing
from dataclasses import MISSING, fields
from typing import Any

from envace.config import PrivateOptions, RolloutConfig, choices, load_toml, toml_literal
from envace.errors import UsageError

ROLLOUT_FLAGS = ("env", "category", "split", "limit", "offset", "mode", "model", "group_size", "batch_size",
                 "episode_loop", "max_steps_per_turn", "max_new_tokens", "temperature", "top_p", "seed",
                 "on_parse_error", "decision_sample", "tool_docs", "user_model", "user_max_new_tokens",
                 "max_user_turns", "backend", "thinking", "past_thinking", "unit", "min_turn_calls", "max_turn_calls",
                 "report_to", "rehearser_model", "shadow_turns")
_PRIVATE_FLAGS = {"private": "mode", "budget": "budget", "private_scope": "scope", "private_steps": "max_steps",
                  "private_memory": "memory", "private_temperature": "temperature",
                  "measure_change": "measure_change"}  # flag → field of [rollout.private]
_DEPRECATED = {"--rehearsal": "--private", "--rehearsal-scope": "--private-scope",
               "--rehearsal-steps": "--private-steps"}


def with_root(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--root", default=None, help="run store root (default: $ENVACE_RUNS or runs/)")
    return p


def root_hint(args: argparse.Namespace) -> str:
    """The `--root` a printed next command needs to reach the same store."""
    return f" --root {args.root}" if args.root else ""


def positive(flag: str):
    """An argparse type: a whole number of at least 1, else one line naming `flag`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise UsageError(f"{flag}: expected an integer, got '{text}'") from None
        if value < 1:
            raise UsageError(f"{flag}: must be at least 1, got {value}")
        return value
    return parse


def _help(f, hint: Any) -> str:
    text = f.metadata.get("help", "")
    if choices(hint):
        text += f" {{{', '.join(map(str, choices(hint)))}}}"
    default = f.default if f.default is not MISSING else None
    return (text + f" (default: {default})").replace("%", "%%")  # argparse %-formats help text


def add_config_flags(p: argparse.ArgumentParser, names: tuple[str, ...] = ROLLOUT_FLAGS,
                     private: bool = True) -> None:
    """A flag for each named `RolloutConfig` field (its help, choices and default from the field), `--domain`, and
    with `private` the `[rollout.private]` fields."""
    hints = typing.get_type_hints(RolloutConfig)
    by_name = {f.name: f for f in fields(RolloutConfig)}
    for name in names:
        plain = hints[name] is str  # text fields take the flag's text as it is
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, type=str if plain else toml_literal,
                       help=_help(by_name[name], hints[name]))
    p.add_argument("--domain", dest="category", default=None,
                   help="τ²: airline | retail | telecom | telecom_solo (the category)")
    p.add_argument("--rehearser-temperature", dest="rehearser_temperature", default=None, type=toml_literal,
                   help="sampling temperature of rehearsals, imagined attempts' included (default: the config's; "
                        "unset, the temperature of the engine it answers, recorded in run.json's sampling)")
    if private:
        hints = typing.get_type_hints(PrivateOptions)
        options = {f.name: f for f in fields(PrivateOptions)}
        for flag, key in _PRIVATE_FLAGS.items():
            kind = {"action": "store_const", "const": True} if key == "measure_change" else {"type": toml_literal}
            p.add_argument("--" + flag.replace("_", "-"), dest=flag, default=None,
                           help="private rehearsal: " + _help(options[key], hints[key]), **kind)


def rollout_config(args: argparse.Namespace, names: tuple[str, ...] = ROLLOUT_FLAGS) -> RolloutConfig:
    """The `--config` file's `[rollout]` table with the given flags over it, checked."""
    data: dict[str, Any] = {}
    where = ""
    if args.config:
        raw = load_toml(args.config)
        table = raw.get("rollout", raw)
        if not isinstance(table, dict):
            raise UsageError(f"{args.config}: [rollout] must be a table")
        data.update(table)
        where = f"{args.config} [rollout]"
    data.update({k: getattr(args, k) for k in names + ("category",) if getattr(args, k, None) is not None})
    if "env" in data and "category" not in data and isinstance(data["env"], str):
        from envace.envs import registry

        data["category"] = registry.get(data["env"]).default_category  # `--env shop` alone plays shop's default
    private = {key: getattr(args, flag) for flag, key in _PRIVATE_FLAGS.items()
               if getattr(args, flag, None) is not None}
    if private:
        if not isinstance(data.get("private", {}), dict):
            raise UsageError(f"{where}: private must be a table")
        data["private"] = {**data.get("private", {}), **private}
    if getattr(args, "rehearser_temperature", None) is not None:
        if not isinstance(data.get("rehearser", {}), dict):
            raise UsageError(f"{where}: rehearser must be a table")
        data["rehearser"] = {**data.get("rehearser", {}), "temperature": args.rehearser_temperature}
    return RolloutConfig.from_dict(data, where=where)


def rewrite_deprecated(argv: list[str]) -> list[str]:
    """Old flag names replaced by their new ones, with a warning each."""
    out = []
    for arg in argv:
        flag, sep, value = arg.partition("=")
        if flag in _DEPRECATED:
            print(f"warning: {flag} is deprecated, use {_DEPRECATED[flag]}", file=sys.stderr)
            arg = _DEPRECATED[flag] + sep + value
        out.append(arg)
    return out
