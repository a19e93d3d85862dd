"""`envace migrate FILE.toml`: a config file's flat `[train]` keys of earlier releases moved to their tables.

The file is rewritten line by line, so its comments stay: a moved key keeps its value and its comments (the
comment lines right above it, its own, and the indented ones that continue it) and goes, under its new name, to
its table: `[train.sft]`, … (the file's own, when it has one; else a new one after `[train]`). Every other line
stays where it was. The result is checked before it is written: it must read as the same settings, with no old
key left; a file the rewrite cannot keep equal is refused, unchanged, naming the keys to move by hand.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from envace.config import MOVED, load_toml, moved_key, nest
from envace.errors import UsageError

_HEADER = re.compile(r"\s*\[\[?\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r"(\s*)([A-Za-z0-9_-]+)(\s*=)")
_ORDER = list(dict.fromkeys(new.split(".")[0] for new in MOVED.values()))  # policy, packing, sft, grpo, …


def migrate_file(path: str | Path) -> list[tuple[str, str]]:
    """Rewrite `path`'s old `[train]` keys in place; the (old, new) keys moved, none when there was nothing to do."""
    p = Path(path)
    if p.suffix != ".toml":
        raise UsageError(f"{p}: expected a .toml config file")
    before = load_toml(p)  # a missing, unreadable or malformed file: one line
    if isinstance(before.get("train"), dict):
        nest(before["train"], f"{p} [train]")  # an old key beside its new one: which holds is not guessed
    text = p.read_text(encoding="utf-8")
    new_text, moved = rewrite(text)
    if not moved:
        return []
    check(before, new_text, p)
    p.write_text(new_text, encoding="utf-8")
    return moved


def rewrite(text: str) -> tuple[str, list[tuple[str, str]]]:
    """`text` (a TOML document) with the old keys of its `[train]` table moved to their tables, and the moves."""
    lines = text.splitlines(keepends=True)
    tables = _sections(lines)
    train = next((s for s in tables if s[0] == "train"), None)
    if train is None:
        return text, []
    _, start, end = train
    moving: dict[str, list[str]] = {}  # table → its moved lines
    dropped: set[int] = set()
    moved = []
    i = start + 1
    while i < end:
        statement = _statement(lines, i, end)
        if statement is None:
            i += 1
            continue
        last, key, value = statement
        new = moved_key(key, value)
        if new is not None:
            table, leaf = new.split(".")
            first = i
            while first - 1 > start and first - 1 not in dropped and _comment(lines[first - 1]) \
                    and not lines[first - 1][0].isspace():  # the comment lines right above it
                first -= 1
            if first == start + 1:  # comments right under `[train]` speak of the table: they stay
                first = i
            while last + 1 < end and _comment(lines[last + 1]) and lines[last + 1][0].isspace():  # its continuation
                last += 1
            block = lines[first:i] + [_renamed(lines[i], leaf)] + lines[i + 1:last + 1]
            moving.setdefault(table, []).extend(_ended(line) for line in block)
            dropped.update(range(first, last + 1))
            moved.append((key, new))
        i = last + 1
    if not moved:
        return text, []
    inserts: dict[int, list[str]] = {}  # after which line → the lines that follow it
    fresh = []
    for table in sorted(moving, key=_ORDER.index):
        own = next((s for s in tables if s[0] == f"train.{table}"), None)
        if own is not None:
            inserts.setdefault(_body_end(lines, own[1], own[2], dropped), []).extend(moving[table])
        else:
            fresh += ["\n", f"[train.{table}]\n", *moving[table]]
    if fresh:
        inserts.setdefault(_body_end(lines, start, end, dropped), []).extend(fresh)
    out = []
    for at, line in enumerate(lines):
        if at not in dropped:
            out.append(_ended(line) if at in inserts else line)
        out.extend(inserts.get(at, []))
    return "".join(out), moved


def check(before: dict[str, Any], text: str, path: Path) -> None:
    """Refuse a rewrite of `path` that does not read as `before` did (old keys nested), or keeps an old key."""
    try:
        after = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        after = {"": str(exc)}
    old = before.get("train") if isinstance(before.get("train"), dict) else {}
    same = {**before, "train": nest(old)} == after
    left = [k for k, v in (after.get("train") or {}).items() if moved_key(k, v) is not None]
    if not same or left:
        keys = ", ".join(f"{k} → {moved_key(k, v)}" for k, v in old.items() if moved_key(k, v) is not None)
        raise UsageError(f"{path}: its [train] table cannot be rewritten line by line (dotted keys or an inline "
                         f"table?); nothing was changed: move these keys to their tables by hand: {keys}")


def _sections(lines: list[str]) -> list[tuple[str, int, int]]:
    """Each table header's (dotted name, its line, the line the next header is on)."""
    heads = []
    for at, line in enumerate(lines):
        match = _HEADER.match(line)
        if match and not _in_string(lines, at):
            heads.append((".".join(part.strip() for part in match.group(1).split(".")), at))
    return [(name, at, heads[k + 1][1] if k + 1 < len(heads) else len(lines)) for k, (name, at) in enumerate(heads)]


def _statement(lines: list[str], at: int, end: int) -> tuple[int, str, Any] | None:
    """The `key = value` statement starting on line `at` (its last line, its bare key, its value), else None."""
    match = _KEY.match(lines[at])
    if not match:
        return None
    for last in range(at, end):
        try:
            parsed = tomllib.loads("".join(lines[at:last + 1]))
        except tomllib.TOMLDecodeError:
            continue
        return last, match.group(2), parsed.get(match.group(2))
    return None


def _in_string(lines: list[str], at: int) -> bool:
    """Whether line `at` is inside a multi-line string (a rough count of the triple quotes before it)."""
    before = "".join(lines[:at])
    return (before.count('"""') % 2 == 1) or (before.count("'''") % 2 == 1)


def _comment(line: str) -> bool:
    return line.strip().startswith("#")


def _renamed(line: str, leaf: str) -> str:
    """The statement's first line with its key renamed to `leaf`, its inline comment kept in the same column."""
    match = _KEY.match(line)
    renamed = match.group(1) + leaf + line[match.end(2):]
    hash_at = _comment_at(line)
    if hash_at is None:
        return renamed
    code = renamed[: hash_at + len(renamed) - len(line)].rstrip()
    gap = len(line[:hash_at]) - len(line[:hash_at].rstrip())
    return code + " " * max(hash_at - len(code), min(gap, 2)) + line[hash_at:]


def _comment_at(line: str) -> int | None:
    """Where a line's comment starts (`#` outside a string), else None."""
    quote = None
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#":
            return i
        i += 1
    return None


def _ended(line: str) -> str:
    return line if line.endswith("\n") else line + "\n"


def _body_end(lines: list[str], start: int, end: int, dropped: set[int]) -> int:
    """The last line of a table's own statements (its header when it keeps none): what follows it, blank lines
    and the comments that open the next table, stays below what is inserted."""
    last = start
    for at in range(start + 1, end):
        if at not in dropped and lines[at].strip() and not (_comment(lines[at]) and not lines[at][0].isspace()):
            last = at
    return last
