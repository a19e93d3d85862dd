"""The few statistics the workbench reports, in one place: bootstrap intervals, paired tests (the exact sign test,
McNemar's, the sign-flip permutation test by cluster) and Holm's correction for a table's family of tests.

Measurements come in clusters (the calls of one episode share its context, the turns of one task its
scenario), so intervals resample whole clusters: `cluster_bootstrap` draws clusters with replacement and
takes the mean over every value of the drawn clusters, which is the plain bootstrap when each value is its
own cluster. A paired comparison is the same bootstrap over the per-item differences (`paired_bootstrap`).

A report that prints several p-values prints them Holm-adjusted too (`holm`), over the family it names.
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


def paired_bootstrap(a: Sequence[float], b: Sequence[float], clusters: Sequence[object] | None = None,
                     draws: int = DRAWS, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of the mean paired difference a − b: `cluster_bootstrap` of d_i = a_i − b_i, resampling
    `clusters` (one per pair; None: each pair alone).

    A pair with NaN on either side is left out. `a`, `b` (and `clusters`) of different lengths are a ValueError.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape or (clusters is not None and len(clusters) != len(x)):
        raise ValueError(f"paired_bootstrap: {len(x)} and {len(y)} values"
                         + ("" if clusters is None else f", {len(clusters)} clusters") + " do not pair up")
    return cluster_bootstrap(x - y, clusters, draws=draws, seed=seed, level=level)


def _binomial_half(k: int, n: int) -> float:
    """Exact two-sided binomial test of k successes in n trials at p = ½: min(1, 2 · Σ_{i ≤ min(k, n−k)} C(n, i) / 2ⁿ)
    (the null is symmetric, so doubling the smaller tail is the same as summing every outcome at most as likely as
    the one seen); 1.0 when n = 0."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def sign_test(diffs: Sequence[float]) -> float:
    """Exact two-sided sign test p-value over the non-zero differences (1.0 when none differ): with u differences
    above 0 and v below, the binomial test of u in u + v at p = ½ (ties and NaN left out)."""
    d = np.asarray(diffs, dtype=float)
    d = d[~np.isnan(d)]
    up, down = int((d > 0).sum()), int((d < 0).sum())
    return _binomial_half(up, up + down)


def mcnemar(b: int, c: int) -> float:
    """Exact McNemar test of paired binary outcomes: b pairs went 0 → 1 and c went 1 → 0 (the concordant pairs carry
    no information). Under H0 (the same success rate on both sides) a discordant pair is as likely either way, so
    b ~ Binomial(b + c, ½) and p = min(1, 2 · Σ_{i ≤ min(b, c)} C(b + c, i) / 2^(b+c)); 1.0 when b + c = 0."""
    if b < 0 or c < 0:
        raise ValueError(f"mcnemar: counts must be >= 0, got b={b}, c={c}")
    return _binomial_half(int(b), int(b) + int(c))


def paired_permutation(diffs: Sequence[float], clusters: Sequence[object] | None = None, draws: int = DRAWS,
                       seed: int = 0) -> float:
    """Two-sided sign-flip permutation p-value of a mean paired difference, flipping whole `clusters` (one per
    difference; None: each alone). Under H0 each cluster's differences are as likely negated, so with S_c the sum
    of cluster c's differences the statistic |Σ_c s_c·S_c| is compared over sign vectors s ∈ {±1}^C: all 2^C of them
    when 2^C ≤ `draws` (exact), else `draws` random ones (p = (hits + 1) / (draws + 1)). NaN differences are left
    out; none left: 1.0."""
    d = np.asarray(diffs, dtype=float)
    keys = np.arange(len(d)) if clusters is None else np.asarray([str(c) for c in clusters])
    if len(keys) != len(d):
        raise ValueError(f"paired_permutation: {len(d)} differences and {len(keys)} clusters")
    keep = ~np.isnan(d)
    d, keys = d[keep], keys[keep]
    if not len(d):
        return 1.0
    _, index = np.unique(keys, return_inverse=True)
    sums = np.bincount(index, weights=d)
    seen = abs(sums.sum()) * (1 - 1e-12)  # float sums of the same terms in another order may differ in the last bit
    if 2 ** len(sums) <= draws:
        signs = 1 - 2 * ((np.arange(2 ** len(sums))[:, None] >> np.arange(len(sums))) & 1)
        return float(np.mean(np.abs(signs @ sums) >= seen))
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], (draws, len(sums)))
    return float((np.sum(np.abs(signs @ sums) >= seen) + 1) / (draws + 1))


def detectable(diffs: Sequence[float], clusters: Sequence[object] | None = None, alpha: float = 0.05,
               power: float = 0.8, sims: int = 1000, draws: int = 1000, seed: int = 0) -> float:
    """The minimum detectable effect of a paired mean difference: the smallest |Δ| that the test these pairs are
    reported with (`paired_permutation`: signs flipped by cluster, two-sided, p ≤ `alpha`) finds in `power` of
    the data sets drawn like them. The power of that test on this design, simulated, not a normal approximation
    (which, on a few discordant pairs, claims effects no outcome could show).

    A data set at effect Δ: the observed clusters (one per pair, e.g. the task; None: each pair alone), each
    keeping its observed differences and turned up or down as a whole, up with probability
    q = ½ (1 + Δ · n / Σ_c |S_c|) (S_c a cluster's sum, n the pairs), so the expected mean difference is Δ. At
    Δ = 0 this is the test's own null, and the largest Δ the design can show is Σ_c |S_c| / n (every cluster up).
    Conditional on how much each cluster moved, as the test is; copies of a pair inside its cluster (seeds that
    moved alike) add no power. Found by bisection to 1/200 of that largest Δ, with the same `sims` random draws
    at every Δ (and `draws` sign vectors per test, or all 2^k when fewer). inf when even every cluster up is
    found in less than `power` of draws (4 discordant pairs all one way: p = 0.125); NaN when it cannot be told
    (fewer than two clusters, or no cluster moved)."""
    d = np.asarray(diffs, dtype=float)
    keys = np.arange(len(d)) if clusters is None else np.asarray([str(c) for c in clusters])
    if len(keys) != len(d):
        raise ValueError(f"detectable: {len(d)} differences and {len(keys)} clusters")
    keep = ~np.isnan(d)
    d, keys = d[keep], keys[keep]
    _, index = np.unique(keys, return_inverse=True)
    mass = np.abs(np.bincount(index, weights=d))
    k, reach = len(mass), float(np.abs(np.bincount(index, weights=d)).sum() / max(len(d), 1))
    if k < 2 or reach == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    u = rng.random((sims, k))
    exact = 2 ** k <= draws
    flips = 1 - 2 * ((np.arange(2 ** k)[:, None] >> np.arange(k)) & 1) if exact else \
        rng.choice([-1.0, 1.0], (draws, k))

    def found(delta: float) -> float:
        signed = np.where(u < 0.5 * (1 + delta / reach), mass, -mass)
        seen = np.abs(signed.sum(axis=1)) * (1 - 1e-12)
        hits = (np.abs(signed @ flips.T) >= seen[:, None]).sum(axis=1)
        p = hits / len(flips) if exact else (hits + 1) / (len(flips) + 1)
        return float(np.mean(p <= alpha))

    if found(reach) < power:
        return float("inf")
    lo, hi = 0.0, reach
    while hi - lo > reach / 200:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if found(mid) >= power else (mid, hi)
    return hi


def paired_outcomes(before: Sequence[float], after: Sequence[float], clusters: Sequence[object] | None = None,
                    draws: int = DRAWS, seed: int = 0) -> dict[str, float]:
    """Everything a report prints for one paired comparison of scores in [0, 1] (item i scored `before[i]` and
    `after[i]`, e.g. one episode seed under two policies): the pairs, the mean of each side and Δ = after − before
    with its cluster-bootstrap 95% interval and sign-flip permutation p (`clusters`: one per pair, e.g. the turn),
    and, on "scored" (> 0), the discordant pairs `up` (0 → scored) and `down` with McNemar's exact p; `mde`, the
    smallest |Δ| the permutation test on these pairs would find at 80% power (`detectable`; inf: none it could)."""
    x, y = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired_outcomes: {len(x)} and {len(y)} values do not pair up")
    diffs = y - x
    lo, hi = cluster_bootstrap(diffs, clusters, draws=draws, seed=seed)
    up, down = int(((x <= 0) & (y > 0)).sum()), int(((x > 0) & (y <= 0)).sum())
    return {"pairs": len(x), "before": float(x.mean()) if len(x) else float("nan"),
            "after": float(y.mean()) if len(y) else float("nan"), "delta": float(diffs.mean()) if len(x) else
            float("nan"), "lo": lo, "hi": hi, "permutation_p": paired_permutation(diffs, clusters, draws, seed),
            "up": up, "down": down, "mcnemar_p": mcnemar(up, down), "mde": detectable(diffs, clusters)}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the order given. With the m non-NaN p-values sorted,
    p_(1) ≤ … ≤ p_(m), the adjusted p_(i) is min(1, max_{j ≤ i} (m − j + 1) · p_(j)): step-down, monotone in p, and
    rejecting where it is ≤ α controls the family-wise error rate at α under any dependence. NaN (no test) stays NaN
    and is not counted in m; tied p-values get the same adjusted value."""
    p = np.asarray(pvalues, dtype=float).reshape(-1)
    out = np.full(len(p), np.nan)
    keep = np.flatnonzero(~np.isnan(p))
    m = len(keep)
    if m:
        order = keep[np.argsort(p[keep], kind="stable")]
        scaled = (m - np.arange(m)) * p[order]
        out[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return [float(v) for v in out]
