"""`stats.detectable`: the minimum detectable effect every paired comparison prints beside its p-values, as the
power of the permutation test the comparison reports (`stats.paired_permutation`), simulated on the design."""

import itertools
import math

import numpy as np
import pytest

from envace.stats import detectable, paired_outcomes


def brute_force_mde(sums: list[float], pairs: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The same definition enumerated exactly on a small design: every way the k clusters can
    point, with its probability at effect Δ, and the exact sign-flip p of each; the smallest Δ on a fine grid
    whose power reaches `power`."""
    s = np.abs(np.asarray(sums, dtype=float))
    k = len(s)
    flips = np.array(list(itertools.product([1, -1], repeat=k)), dtype=float)
    stats = np.abs(flips @ s)
    p = np.array([np.mean(np.abs(flips @ (f * s)) >= v * (1 - 1e-12)) for f, v in zip(flips, stats, strict=True)])
    ups = (flips > 0).sum(axis=1)
    reach = s.sum() / pairs
    for delta in np.linspace(0, reach, 2001):
        q = 0.5 * (1 + delta / reach)
        prob = q ** ups * (1 - q) ** (k - ups)
        if prob[p <= alpha].sum() >= power:
            return float(delta)
    return math.inf


@pytest.mark.parametrize("sums, sizes", [
    ([1, 1, 1, 1, 2, 2, 1, 3], [2, 2, 3, 1, 2, 4, 1, 3]),  # clusters of several pairs, unequal moves
    ([1] * 7 + [0] * 5, [1] * 12),                          # 7 discordant pairs, 5 ties, each pair alone
    ([0.5, 0.25, 1.0, 0.75, 0.5, 0.25, 0.5, 1.0, 0.25], [3] * 9),  # graded scores
])
def test_the_mde_matches_the_power_enumerated_exactly_on_small_designs(sums, sizes):
    diffs = [v if i == 0 else 0.0 for s, n in zip(sums, sizes, strict=True) for i, v in enumerate([s] * n)]
    clusters = [c for c, n in enumerate(sizes) for _ in range(n)]
    mde = detectable(diffs, clusters)
    assert mde == pytest.approx(brute_force_mde(sums, sum(sizes)), abs=0.02)


def test_a_few_discordant_pairs_all_one_way_detect_nothing():
    """4 turns up, none down, of 40 (the normal approximation gave 0.034 here): even all four up is p = 0.125, so
    no effect these pairs could show is found; 5 tasks all up is p = 2/32 > 0.05 too."""
    assert detectable([1.0] * 4 + [0.0] * 36) == math.inf
    assert detectable([1.0] * 5 + [0.0] * 35) == math.inf
    assert math.isfinite(detectable([1.0] * 7 + [0.0] * 33))  # all 7 up: p = 2/128


def test_copies_inside_a_cluster_add_no_power():
    """Each pair repeated five times in its own cluster (one task, five seeds that moved alike) detects no
    smaller an effect than the pairs once: clustering counts tasks, not rows."""
    d = np.random.default_rng(1).normal(0.1, 1.0, 60)
    once = detectable(d, list(range(60)))
    copied = detectable(np.repeat(d, 5), np.repeat(np.arange(60), 5))
    assert math.isclose(copied, once, rel_tol=1e-9)
    assert detectable(np.repeat(d, 5)) < 0.6 * copied  # ignoring the clusters would claim more than it has


def test_on_many_normal_pairs_it_is_near_the_normal_approximation():
    """Where the approximation holds (200 independent pairs, σ = 1) the simulated MDE is near
    (z_.975 + z_.8) · σ/√n."""
    mde = detectable(np.random.default_rng(0).normal(0.0, 1.0, 200))
    assert math.isclose(mde, 2.8016 / math.sqrt(200), rel_tol=0.2)


def test_no_spread_or_one_cluster_tells_nothing():
    assert math.isnan(detectable([0.0] * 12))
    assert math.isnan(detectable([1.0, -1.0, 0.0], ["t", "t", "t"]))
    assert not math.isnan(paired_outcomes([0, 1, 0, 1], [1, 1, 0, 0], [1, 1, 2, 2])["mde"])
