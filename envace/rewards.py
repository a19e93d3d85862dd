"""Episode rewards in [0, 1], each with per-item detail for the store.

`checklist` (default, environment-free) is built deterministically from the reference trajectory:
every ground-truth call of a user turn is an item, with weights summing to 1 per turn; an item passes
when the caller issued, in that turn, a call with the same function and equivalent arguments. The
episode score is Σ turn scores / number of reference turns, so turns lost to early termination score
0 (the reference release's shape, without its 30B judge). A turn whose reference has no call (BFCL
miss_func / miss_param) scores 1 when reached. The official reward is the benchmark checker's verdict
(`Environment.score`, stored as `episodes.success`): an ablation that uses the environment for scoring only.
"""

from __future__ import annotations

import math
from typing import Any

from envace.fidelity import canonical
from envace.types import Task, ToolCall


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def equivalent(expected: Any, actual: Any) -> bool:
    """BFCL-style value equivalence: numbers across int/float/numeric strings, stripped strings,
    lists in any order, dicts key by key."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(equivalent(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, list | tuple) and isinstance(actual, list | tuple):
        if len(expected) != len(actual):
            return False
        if all(equivalent(e, a) for e, a in zip(expected, actual, strict=True)):
            return True
        return sorted(map(canonical, expected)) == sorted(map(canonical, actual))
    if isinstance(expected, bool) or isinstance(actual, bool):
        return expected is actual
    a, b = _number(expected), _number(actual)
    if a is not None and b is not None and not (isinstance(expected, str) and isinstance(actual, str)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, str) and isinstance(actual, str):
        return expected.strip() == actual.strip()
    return expected == actual


def call_matches(expected: ToolCall, actual: ToolCall) -> bool:
    """Same function, every reference argument present and equivalent; extra arguments are optional ones."""
    return expected.name == actual.name and all(
        key in actual.arguments and equivalent(value, actual.arguments[key])
        for key, value in expected.arguments.items())


def checklist(task: Task, issued: list[list[ToolCall]]) -> tuple[float, list[list[bool]]]:
    """(score, passed items per reference turn); `issued[k]` is every call the caller made in turn k.

    A turn task (`start_turn` = s) is scored on its own turns s.. only: the gold prefix is not its doing.
    """
    detail: list[list[bool]] = []
    total = 0.0
    scored = task.reference[task.start_turn:]
    for k, reference in enumerate(scored, task.start_turn):
        reached = k < len(issued)
        unused = list(issued[k]) if reached else []
        passed = []
        for ref in reference:
            hit = next((c for c in unused if call_matches(ref.call, c)), None)
            if hit is not None:
                unused.remove(hit)
            passed.append(hit is not None)
        detail.append(passed)
        if reached:
            total += sum(passed) / len(passed) if passed else 1.0
    return (total / len(scored) if scored else 0.0), detail


FIDELITY_PARTS = ("structure_f1", "value_acc", "error_agree")


def rehearsal_fidelity(pair: dict) -> float:
    """How faithful one rehearsal was to the real response: the mean of structure F1, value accuracy and error
    agreement (`envace.fidelity`), each in [0, 1]; 0 for a malformed rehearsal."""
    return sum(float(pair[k] or 0.0) for k in FIDELITY_PARTS) / len(FIDELITY_PARTS)


def add_fidelity(generations: list, pairs: list[dict], weight: float) -> None:
    """`task+fidelity`: a rehearser row whose call also ran in the real environment gets `weight` × the fidelity
    of its rehearsal on top of the task reward (beyond the reference release, which rewards the task only)."""
    by_call = {(p["turn"], p["turn_step"], p["call_index"]): p for p in pairs}
    for g in generations:
        pair = by_call.get((g.turn, g.turn_step, g.call_index)) if g.role == "rehearser" else None
        if pair is not None:
            g.reward += weight * rehearsal_fidelity(pair)


def share(generations: list, reward: float, roles: tuple[str, ...] = ("caller", "rehearser")) -> None:
    """Give every generation of `roles` the episode's reward: one task reward for both roles (the reference's
    choice); a simulated user's generations get none."""
    for g in generations:
        if g.role in roles:
            g.reward = reward
