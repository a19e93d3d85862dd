"""What two runs stored, compared: the check that a resumed, restarted or relocated run replays another exactly."""

from __future__ import annotations

import pytest


def stored(con, run: str, step: int | None = None) -> tuple[list, list]:
    """A run's generations (what was sampled, by which version, its advantage) and metrics, wall times, clocks and
    the Ray fleet's own figures (restarts, slot-time idle, in-flight target) left out."""
    only = "" if step is None else f" AND step = {step}"
    generations = con.execute("SELECT step, episode_id, role, turn, turn_step, completion_ids, policy_version, "
                              f"advantage, trained FROM generations WHERE run_id = ?{only} "
                              "ORDER BY step, episode_id, role, turn, turn_step, call_index", [run]).fetchall()
    metrics = con.execute(f"SELECT phase, step, role, name, value FROM metrics WHERE run_id = ?{only} "
                          "AND NOT regexp_matches(name, '_(s|t)$') "
                          "AND name NOT IN ('actor_restarts', 'actor_slot_idle', 'actor_in_flight') "
                          "ORDER BY phase, step, role, name", [run]).fetchall()
    return generations, metrics


def same(a: tuple[list, list], b: tuple[list, list]) -> list:
    """The same generations, and the same metrics within float noise; the generations."""
    assert a[0] and a[0] == b[0]
    assert [m[:4] for m in a[1]] == [m[:4] for m in b[1]]
    for x, y in zip(a[1], b[1], strict=True):
        assert x[4] == pytest.approx(y[4], rel=1e-5, abs=1e-7), x[:4]
    return a[0]
