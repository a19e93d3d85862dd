"""BFCL-v4's overall score as its leaderboard computes it, from per-category accuracies.

`bfcl_eval`'s own `generate_leaderboard_csv` (`eval_checker/eval_runner_helper.py`) groups the categories and
weighs the groups; this module follows it line by line with the same three means (unweighted, weighted by
item count, and a fixed percentage weighting). That module cannot be imported here (it imports every API
vendor's client), so the means are restated below; `tests/test_bfcl_leaderboard.py` runs bfcl_eval's own
`generate_leaderboard_csv`, from its source, on random score sets and checks the overall equals ours:

    non-live AST   10   unweighted: simple (python, java, javascript: unweighted), multiple, parallel,
                        parallel_multiple
    live AST       10   weighted by count: live_simple, live_multiple, live_parallel, live_parallel_multiple
    irrelevance    10   unweighted: irrelevance, live_irrelevance
    multi-turn     30   unweighted: base, miss_func, miss_param, long_context
    agentic        40   unweighted: web search (base, no_snippet), memory (kv, vector, rec_sum)

A category not scored counts 0, as on the leaderboard. Web search needs the internet, so it cannot be scored
here: `offline_overall` is the same formula with web search's weight (half of agentic's: 20) removed and the
others renormalised (to 80). It is not the leaderboard's number and is labelled as such wherever shown.
"""

from __future__ import annotations

from functools import cache
from typing import Any

WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}
OFFLINE_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "memory": 20}
SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE = ("multiple", "parallel", "parallel_multiple")
LIVE = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
IRRELEVANCE = ("irrelevance", "live_irrelevance")
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
WEB_SEARCH = ("web_search_base", "web_search_no_snippet")
MEMORY = ("memory_kv", "memory_vector", "memory_rec_sum")
CATEGORIES = (*SIMPLE, *NON_LIVE, *LIVE, *IRRELEVANCE, *MULTI_TURN, *WEB_SEARCH, *MEMORY)


def _score(accuracy: float, count: int, missing: bool = False) -> dict[str, Any]:
    return {"accuracy": accuracy, "total_count": count, "display_accuracy": "N/A" if missing else accuracy}


def _unweighted(parts: list[dict[str, Any]], na: bool = True) -> dict[str, Any]:
    """bfcl_eval's `calculate_unweighted_accuracy`: the plain mean; "N/A" shown when a part is missing."""
    mean = sum(p["accuracy"] for p in parts) / len(parts)
    return _score(mean, sum(p["total_count"] for p in parts), na and any(p["display_accuracy"] == "N/A"
                                                                          for p in parts))


def _weighted(parts: list[dict[str, Any]], na: bool = True) -> dict[str, Any]:
    """bfcl_eval's `calculate_weighted_accuracy`: the mean weighted by item counts."""
    count = sum(p["total_count"] for p in parts)
    return _score(sum(p["accuracy"] * p["total_count"] for p in parts) / count, count,
                  na and any(p["display_accuracy"] == "N/A" for p in parts))


@cache
def category_count(category: str) -> int:
    """How many items a category has (what a missing category counts for in a weighted mean)."""
    from bfcl_eval.utils import load_dataset_entry

    return len(load_dataset_entry(category, include_prereq=False, include_language_specific_hint=False))


def groups(scores: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each group's score (`accuracy`, `total_count`, `display_accuracy`: "N/A" when a category is missing) from
    `scores[category] = {"accuracy": a, "total_count": n}`, formed as the leaderboard forms them: a category not
    scored is 0 over its item count."""
    c = {k: _score(scores[k]["accuracy"], scores[k]["total_count"]) if k in scores else
         _score(0, category_count(k), missing=True) for k in CATEGORIES}
    simple = _unweighted([c[k] for k in SIMPLE])
    out = {"simple": simple,
           "non_live": _unweighted([simple, *(c[k] for k in NON_LIVE)], na=False),
           "live": _weighted([c[k] for k in LIVE], na=False),
           "irrelevance": _unweighted([c[k] for k in IRRELEVANCE]),
           "multi_turn": _unweighted([c[k] for k in MULTI_TURN], na=False),
           "web_search": _unweighted([c[k] for k in WEB_SEARCH]),
           "memory": _unweighted([c[k] for k in MEMORY])}
    out["agentic"] = _unweighted([out["web_search"], out["memory"]], na=False)
    return out


def overall(scores: dict[str, dict[str, Any]]) -> float:
    """The leaderboard's overall accuracy: its five groups, weighted 10/10/10/30/40."""
    return _percentages(groups(scores), WEIGHTS)


def offline_overall(scores: dict[str, dict[str, Any]]) -> float:
    """The overall without web search (it cannot run offline): weights 10/10/10/30 and memory's 20, renormalised.
    Not the leaderboard's number."""
    return _percentages(groups(scores), OFFLINE_WEIGHTS)


def _percentages(grouped: dict[str, dict[str, Any]], weights: dict[str, int]) -> float:
    """bfcl_eval's `calculate_percentage_weighted_accuracy`: fixed weights, normalised to sum to 1."""
    total = sum(weights.values())
    return sum(grouped[name]["accuracy"] * w / total for name, w in weights.items())
