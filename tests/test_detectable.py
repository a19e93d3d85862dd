"""`stats.detectable`: the minimum detectable effect every paired comparison prints beside its p-values."""

import math

import numpy as np

from envace.stats import detectable, paired_outcomes


def test_the_mde_is_the_effect_found_80_percent_of_the_time():
    """Pairs whose true mean difference is the MDE are found (two-sided z test, α = 0.05) in about 80% of draws."""
    rng, n, found = np.random.default_rng(0), 200, 0
    mde = detectable(rng.normal(0.0, 1.0, n))
    assert math.isclose(mde, 2.8016 / math.sqrt(n), rel_tol=0.15)  # (z_.975 + z_.8) · σ/√n with σ ≈ 1
    for _ in range(400):
        d = rng.normal(mde, 1.0, n)
        found += abs(d.mean()) / (d.std(ddof=1) / math.sqrt(n)) > 1.959964
    assert 0.72 <= found / 400 <= 0.88, found / 400


def test_copies_inside_a_cluster_add_no_power():
    """Each pair repeated five times in its own cluster (one task, five seeds that moved alike) detects no
    smaller an effect than the pairs once: clustering counts tasks, not rows."""
    d = np.random.default_rng(1).normal(0.1, 1.0, 60)
    once = detectable(d, list(range(60)))
    copied = detectable(np.repeat(d, 5), np.repeat(np.arange(60), 5))
    assert math.isclose(copied, once, rel_tol=1e-9)
    assert detectable(np.repeat(d, 5)) < 0.5 * copied  # ignoring the clusters would claim more than it has


def test_no_spread_or_one_cluster_tells_nothing():
    assert math.isnan(detectable([0.0] * 12))
    assert math.isnan(detectable([1.0, -1.0, 0.0], ["t", "t", "t"]))
    assert not math.isnan(paired_outcomes([0, 1, 0, 1], [1, 1, 0, 0], [1, 1, 2, 2])["mde"])
