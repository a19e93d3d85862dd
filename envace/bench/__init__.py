"""Performance benchmarks (`envace bench …`), each measured side by side in one process; see docs/benchmarks.md.

The store's benchmark times the workbench's own queries, so it lives with them (`workbench/bench.py`).
"""

from envace.bench.rollout import bench_private, bench_rehearsal, bench_rollout, bench_rollout_vllm
from envace.bench.train import bench_train, bench_train_vllm

__all__ = ["bench_private", "bench_rehearsal", "bench_rollout", "bench_rollout_vllm", "bench_train",
           "bench_train_vllm"]
