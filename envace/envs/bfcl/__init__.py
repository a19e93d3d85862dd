"""BFCL v4: multi-turn (base, miss_func, miss_param, long_context) on `bfcl_eval`'s own classes, and the
single-turn categories (AST and relevance) scored by its own checkers.

Self-contained: `data.py` loads multi-turn tasks (`schemas.py`: the function docs as tools; `splits.py`: the
k % 4 split), `calls.py` converts between ground-truth call strings and parsed calls, `env.py` runs episodes
and scores them with BFCL's `multi_turn_checker`; `single.py` loads and scores the single-turn categories
(`source_values.py`: Java and JavaScript values as source text); `memory.py` the memory categories on
bfcl_eval's backends, their prerequisite conversations played first; `leaderboard.py` is BFCL-v4's overall
score as its leaderboard computes it.
"""

from envace.envs.benchmark import Benchmark
from envace.envs.bfcl import memory, single
from envace.envs.bfcl.data import CATEGORIES, load_tasks, truncate
from envace.envs.bfcl.env import BFCLEnv

__all__ = ["BFCLEnv", "CATEGORIES", "benchmark", "load_tasks", "memory", "single", "truncate"]


def benchmark() -> Benchmark:
    """The built-in `bfcl` (`envace.envs.registry` loads it by this module's path, as it loads a plugin)."""
    return Benchmark("bfcl", CATEGORIES + single.CATEGORIES + memory.CATEGORIES, "multi_turn_base", load_tasks,
                     BFCLEnv, truncate, known_defects=single.KNOWN_DEFECTS, call_only=single.CATEGORIES,
                     before_turn=memory.before_turn)
