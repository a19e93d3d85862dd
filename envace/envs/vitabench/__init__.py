"""VitaBench delivery and in-store (meituan-longcat/vitabench, commit 96f3b85), offline, from TOOLS.md's specification.

The task files and tool schemas in `data/` are upstream's, under its MIT licence (`data/LICENSE`, copyright
Sierra Research and Meituan), which travels with them. `README.md` beside this file has the details.

Categories: `delivery`, `instore`, `delivery_zh` (a simulated user plays the task's instructions and profile)
and their `_solo` variants (the instruction opens the episode; no user). `data.py` loads, splits (by persona,
sha256 of the group; delivery 26 / in-store 29 test tasks of 100) and builds gold references from
`required_orders` (`gold.py`); `db.py` is the database and its text forms; `tools_*.py` the 20 delivery and 24
in-store tools; `env.py` the environment; `scoring.py` the score, an offline deterministic substitute for the
official LLM judge (final database against `required_orders`); not comparable with published numbers.
`user.py` and `prompts.py` are the user simulator's and the agent's prompts.

Gold replay (`envace check-env vitabench`, every gold call through `execute()`):
delivery 98/100, instore 97/100, delivery_zh 98/100, each solo variant the same. Unreachable, by defects of
the data: `80715001`, `I0716002` (delivery: a gold product is not in the database), `10826019` (in-store: the
gold product belongs to another shop), `10826031` (a booking at a shop that takes none), `10826084` (one
product id twice in an order with two quantities, which shared in-store product objects cannot show); they are
`data.KNOWN_DEFECTS`, which check-env names with their reasons.
"""

from envace.envs.benchmark import Benchmark
from envace.envs.vitabench.data import CATEGORIES, KNOWN_DEFECTS, judge_context, load_task, load_tasks, rubrics
from envace.envs.vitabench.env import VitaBenchEnv

__all__ = ["CATEGORIES", "VitaBenchEnv", "benchmark", "load_task", "load_tasks"]


def benchmark() -> Benchmark:
    """The built-in `vitabench` (`envace.envs.registry` loads it by this module's path, as it loads a plugin)."""
    return Benchmark("vitabench", CATEGORIES, "delivery_solo", load_tasks, VitaBenchEnv,
                     known_defects=KNOWN_DEFECTS, rubrics=rubrics, judge_context=judge_context)
