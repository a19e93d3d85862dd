"""The few statistics the workbench reports, in one place: bootstrap intervals and the exact sign test.

Measurements come in clusters (the calls of one episode share its context, the turns of one task its
scenario), so intervals resample whole clusters: `cluster_bootstrap` draws clusters with replacement and
takes the mean over every value of the drawn clusters, which is the plain bootstrap when each value is its
own cluster. A paired comparison is the same bootstrap over the per-item differences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

DRAWS = 10_000


def cluster_bootstrap(values: Sequence[float], clusters: Sequence[object] | None = None, draws: int = DRAWS,
                      seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean of `values`, resampling `clusters` (one per value; None: each value alone).

    NaN values are left out. No values: (nan, nan); one cluster: the interval is the mean itself.
    """
    x = np.asarray(values, dtype=float)
    keys = np.arange(len(x)) if clusters is None else np.asarray([str(c) for c in clusters])
    keep = ~np.isnan(x)
    x, keys = x[keep], keys[keep]
    if not len(x):
        return float("nan"), float("nan")
    _, index = np.unique(keys, return_inverse=True)
    sums = np.bincount(index, weights=x)
    counts = np.bincount(index).astype(float)
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, len(sums), (draws, len(sums)))
    means = sums[drawn].sum(axis=1) / counts[drawn].sum(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def sign_test(diffs: Sequence[float]) -> float:
    """Exact two-sided sign test p-value over the non-zero differences (1.0 when none differ)."""
    d = np.asarray(diffs, dtype=float)
    d = d[~np.isnan(d)]
    up, down = int((d > 0).sum()), int((d < 0).sum())
    n = up + down
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(up, down) + 1)) / 2 ** n
    return min(1.0, 2 * tail)
