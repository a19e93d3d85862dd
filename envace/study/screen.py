"""The units of a pass-rate screen worth training on: those whose G rewards differ (only then does a GRPO group
get a signal), at most `most` of them, spread over as many scenarios as they can."""

from __future__ import annotations

from envace.units import whole_uid


def capped(units, most: int) -> list[str]:
    """At most `most` uids of `units` (rows with task_uid, hits, episodes): round robin over their scenarios (whole
    tasks), each scenario's unit closest to half scored (the most signal a group of G can expect) first (ties:
    uid order)."""
    queues: dict[str, list] = {}
    ranked = sorted(units, key=lambda u: (-min(u.hits, u.episodes - u.hits), u.task_uid))
    for u in ranked:
        queues.setdefault(whole_uid(u.task_uid), []).append(u.task_uid)
    chosen: list[str] = []
    while len(chosen) < most and any(queues.values()):
        for queue in queues.values():
            if queue and len(chosen) < most:
                chosen.append(queue.pop(0))
    return sorted(chosen)


def spread_units(con, run_id: str, most: int) -> tuple[list[str], int]:
    """(the units a study trains on, how many of the screen's units had rewards that differ): the spread units
    capped at `most`; when none differ, the first `most` units by the same rule (every group will be flat)."""
    units = con.execute(
        "SELECT task_uid, count(*) AS episodes, count(*) FILTER (checklist > 0) AS hits, "
        "min(checklist) < max(checklist) AS spread FROM episodes WHERE run_id = ? GROUP BY task_uid "
        "ORDER BY task_uid", [run_id]).df()
    spread = units[units["spread"]]
    chosen = spread if len(spread) else units
    return capped(list(chosen.itertuples(index=False)), most), len(spread)
