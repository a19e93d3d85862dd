"""BFCL-v4's overall score (`envace/envs/bfcl/leaderboard.py`) against bfcl_eval's own leaderboard code.

`bfcl_eval.eval_checker.eval_runner_helper` imports every API vendor's client, so it cannot be imported here; the
test compiles its functions from the installed source (library code, not model output) into a namespace with a
stand-in model entry, runs its `generate_leaderboard_csv` on random score sets and reads the overall it writes.
"""

from __future__ import annotations

import ast
import csv
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from envace.envs.bfcl import leaderboard


@pytest.fixture(scope="module")
def bfcl_leaderboard():
    import bfcl_eval.constants.column_headers as headers
    import bfcl_eval.constants.eval_config as config
    import bfcl_eval.utils as utils
    from bfcl_eval.eval_checker import __file__ as checker_init

    source = Path(checker_init).parent / "eval_runner_helper.py"
    tree = ast.parse(source.read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    namespace = {**vars(utils), **vars(config), **vars(headers), "np": __import__("numpy"),
                 "pd": __import__("pandas"), "statistics": __import__("statistics"), "Path": Path,
                 "MODEL_CONFIG_MAPPING": {"envace/probe": SimpleNamespace(
                     display_name="probe", url="", org="", license="", input_price=None, output_price=None)}}
    exec(compile(ast.Module(body=functions, type_ignores=[]), str(source), "exec"), namespace)  # noqa: S102
    return namespace["generate_leaderboard_csv"]


@pytest.mark.parametrize("seed, dropped", [(0, ()), (1, ("web_search_base", "web_search_no_snippet")),
                                           (2, ("simple_java", "live_parallel", "memory_vector"))])
def test_the_overall_is_the_leaderboards_on_a_synthetic_score_set(bfcl_leaderboard, tmp_path, seed, dropped):
    rng = random.Random(seed)
    scores = {c: {"accuracy": rng.random(), "total_count": rng.randint(5, 400)}
              for c in leaderboard.CATEGORIES if c not in dropped}
    bfcl_leaderboard({"envace_probe": {k: dict(v) for k, v in scores.items()}}, tmp_path)
    rows = list(csv.reader((tmp_path / "data_overall.csv").open()))
    theirs = float(rows[1][rows[0].index("Overall Acc")].rstrip("%")) / 100
    assert leaderboard.overall(scores) == pytest.approx(theirs, abs=5e-5)  # the file rounds to 0.01%


def test_the_offline_overall_drops_web_search_and_renormalises():
    scores = {c: {"accuracy": 1.0 if c.startswith("web_search") else 0.5, "total_count": 10}
              for c in leaderboard.CATEGORIES}
    assert leaderboard.offline_overall(scores) == pytest.approx(0.5)  # web search's 1.0 left out entirely
    assert leaderboard.overall(scores) == pytest.approx(0.5 + 0.2 * 0.5)  # 20 of 100 points at 1.0, not 0.5
    grouped = leaderboard.groups(scores)
    assert grouped["agentic"]["accuracy"] == pytest.approx(0.75) and grouped["memory"]["accuracy"] == 0.5
