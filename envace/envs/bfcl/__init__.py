"""BFCL v4 multi-turn (base, miss_func, miss_param, long_context) on `bfcl_eval`'s own classes.

Self-contained: `data.py` loads tasks and schemas, `calls.py` converts between ground-truth call
strings and parsed calls, `env.py` runs episodes and scores them with BFCL's `multi_turn_checker`.
"""

from envace.envs.bfcl.data import CATEGORIES, load_tasks, truncate
from envace.envs.bfcl.env import BFCLEnv

__all__ = ["BFCLEnv", "CATEGORIES", "load_tasks", "truncate"]
