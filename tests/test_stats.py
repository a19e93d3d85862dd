"""envace.stats against scipy and statsmodels on seeded synthetic data: Holm's correction, the exact McNemar and
sign tests, and the coverage and clustering of the bootstrap intervals.

A property checked on many seeded draws is one test looping over its seeds; its message names the failing seed."""

from __future__ import annotations

import gc
import math

import numpy as np
import pytest
from scipy.stats import binomtest
from statsmodels.stats.contingency_tables import mcnemar as sm_mcnemar
from statsmodels.stats.multitest import multipletests

from envace.stats import (
    cluster_bootstrap,
    holm,
    mcnemar,
    paired_bootstrap,
    paired_outcomes,
    paired_permutation,
    sign_test,
)


@pytest.fixture
def statsmodels_holm(monkeypatch):
    """statsmodels' Holm-adjusted p-values. Its `multipletests` runs a full `gc.collect()` on every call (~25 ms
    alone, more in a whole suite's heap), which takes no part in the result: switched off while the test runs."""
    monkeypatch.setattr(gc, "collect", lambda *_: 0)
    return lambda p: multipletests(p, method="holm")[1]


def test_holm_equals_statsmodels_on_random_families(statsmodels_holm):
    for seed in range(200):
        rng = np.random.default_rng(seed)
        m = int(rng.integers(1, 40))
        p = rng.uniform(0, 1, m) ** rng.uniform(0.5, 4)  # some families crowded near 0
        if seed % 3 == 0:  # ties: a few values drawn from a small set
            p = rng.choice([0.001, 0.01, 0.04, 0.2, 1.0], m)
        if seed % 5 == 0:
            p[rng.integers(0, m)] = 0.0
        want = statsmodels_holm(p)
        assert holm(p) == pytest.approx(want.tolist(), rel=1e-12, abs=1e-15), f"seed {seed}: p = {p.tolist()}"


def test_holm_passes_nan_through_and_leaves_it_out_of_the_family(statsmodels_holm):
    for seed in range(50):
        rng = np.random.default_rng(1000 + seed)
        p = rng.uniform(0, 0.2, 12)
        gaps = rng.choice(12, int(rng.integers(1, 6)), replace=False)
        p[gaps] = np.nan
        got = np.array(holm(p))
        assert np.isnan(got[gaps]).all(), f"seed {seed}: p = {p.tolist()}"
        rest = ~np.isnan(p)
        want = statsmodels_holm(p[rest])
        assert got[rest] == pytest.approx(want, rel=1e-12), f"seed {seed}: p = {p.tolist()}"


def test_holm_basic_properties():
    assert holm([]) == []
    assert holm([float("nan")]) == [pytest.approx(float("nan"), nan_ok=True)]
    assert holm([0.04]) == [0.04]  # a family of one is its own p-value
    assert holm([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.04, 0.04])  # monotone: 0.03 lifted to 0.04
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    rng = np.random.default_rng(7)
    p = rng.uniform(0, 1, 30)
    adjusted = np.array(holm(p))
    order = np.argsort(p)
    assert (np.diff(adjusted[order]) >= 0).all() and (adjusted >= p).all() and (adjusted <= 1).all()


def test_mcnemar_equals_statsmodels_and_scipy():
    rng = np.random.default_rng(0)
    cases = [(0, 0), (0, 1), (1, 0), (5, 5), (0, 12), (3, 40), (60, 45), (200, 170)]
    cases += [tuple(int(v) for v in rng.integers(0, 60, 2)) for _ in range(100)]
    for b, c in cases:
        a, d = (int(v) for v in rng.integers(0, 50, 2))  # concordant pairs change nothing
        got = mcnemar(b, c)
        assert got == pytest.approx(sm_mcnemar([[a, b], [c, d]], exact=True).pvalue, rel=1e-10), (b, c)
        if b + c:
            assert got == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-10), (b, c)
        else:
            assert got == 1.0
    with pytest.raises(ValueError):
        mcnemar(-1, 3)


def test_mcnemar_of_paired_binary_outcomes():
    rng = np.random.default_rng(3)
    before = rng.random(300) < 0.4
    after = np.where(rng.random(300) < 0.2, ~before, before)
    b, c = int((~before & after).sum()), int((before & ~after).sum())
    assert mcnemar(b, c) == pytest.approx(binomtest(b, b + c, 0.5).pvalue, rel=1e-10)
    assert mcnemar(b, c) == sign_test(after.astype(float) - before.astype(float))  # the same test, two spellings


def test_sign_test_equals_scipy_binomtest_on_the_signs():
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(0, 80))
        diffs = rng.choice([-1.0, 0.0, 0.5, 2.0, np.nan], n, p=[0.3, 0.3, 0.2, 0.15, 0.05])
        up, down = int((diffs > 0).sum()), int((diffs < 0).sum())
        want = binomtest(up, up + down, 0.5).pvalue if up + down else 1.0
        assert sign_test(diffs) == pytest.approx(want, rel=1e-10), f"seed {seed}: {up} up, {down} down"


def test_cluster_bootstrap_of_singletons_covers_the_mean_at_about_the_nominal_rate():
    hits = 0
    for seed in range(200):
        x = np.random.default_rng(seed).normal(1.5, 2.0, 60)
        lo, hi = cluster_bootstrap(x, draws=2000, seed=seed)
        hits += lo <= 1.5 <= hi
    assert 0.90 <= hits / 200 <= 0.99, hits


def test_clustered_data_give_a_wider_interval_than_the_unclustered_bootstrap():
    rng = np.random.default_rng(11)
    clusters = np.repeat(np.arange(20), 15)  # 20 tasks of 15 calls sharing a strong task effect
    x = rng.normal(0, 3, 20)[clusters] + rng.normal(0, 0.3, len(clusters))
    lo, hi = cluster_bootstrap(x, clusters)
    plain_lo, plain_hi = cluster_bootstrap(x)
    assert hi - lo > 2 * (plain_hi - plain_lo)
    hits = 0  # and it is the clustered one that covers the true mean 0
    for seed in range(100):
        r = np.random.default_rng(500 + seed)
        y = r.normal(0, 3, 20)[clusters] + r.normal(0, 0.3, len(clusters))
        lo, hi = cluster_bootstrap(y, clusters, draws=2000, seed=seed)
        hits += lo <= 0 <= hi
    assert 0.85 <= hits / 100 <= 1.0, hits


def test_paired_bootstrap_is_the_cluster_bootstrap_of_the_differences():
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.6, 0.2, 90), rng.normal(0.5, 0.2, 90)
    clusters = np.repeat(np.arange(30), 3)
    assert paired_bootstrap(a, b, clusters) == cluster_bootstrap(a - b, clusters)
    assert paired_bootstrap(a, b) == cluster_bootstrap(a - b)
    a[3] = np.nan  # a pair with a gap is left out
    assert paired_bootstrap(a, b) == cluster_bootstrap(np.delete(a - b, 3))
    lo, hi = paired_bootstrap(a, b)
    assert lo < 0.1 < hi
    with pytest.raises(ValueError):
        paired_bootstrap(a, b[:-1])
    assert all(math.isnan(v) for v in paired_bootstrap([], []))


def test_paired_permutation_equals_scipys_exact_sign_flip_test():
    """With each difference its own cluster and 2^n ≤ draws, every sign vector is enumerated: scipy's exact
    paired permutation test of the mean gives the same p-value."""
    from scipy.stats import permutation_test

    for seed in range(40):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(2, 12))  # scipy wants two or more
        d = np.round(rng.normal(rng.uniform(-1, 1), 1, n), 2)  # rounded: ties in |d| as real scores have
        if seed % 4 == 0:
            d[: n // 2] = 0.0
        want = permutation_test((d,), np.mean, permutation_type="samples", alternative="two-sided",
                                n_resamples=np.inf).pvalue
        assert paired_permutation(d) == pytest.approx(min(1.0, want), rel=1e-9), f"seed {seed}: d = {d.tolist()}"


def test_paired_permutation_flips_whole_clusters():
    """A cluster is one unit of evidence: duplicating each difference inside its cluster leaves the p-value as it
    was, while as separate items the same duplicates look twice the evidence."""
    d = np.array([0.5, 0.3, 0.4, -0.1, 0.6, 0.2])
    alone = paired_permutation(d)
    twice = np.repeat(d, 2)
    assert paired_permutation(twice, clusters=np.repeat(np.arange(6), 2)) == pytest.approx(alone)
    assert paired_permutation(twice) < alone
    assert paired_permutation([]) == 1.0 and paired_permutation([0.0, 0.0]) == 1.0
    big = np.random.default_rng(0).normal(0.3, 1, 200)  # Monte Carlo: 2^200 sign vectors
    assert 0 < paired_permutation(big) < 0.01 and paired_permutation(big - big.mean()) > 0.5
    with pytest.raises(ValueError):
        paired_permutation([1.0, 2.0], clusters=[0])


def test_paired_outcomes_counts_the_discordant_pairs_and_tests_them():
    before = np.array([0, 0, 0, 1, 1, 0.5, 0, 0, 0, 0])
    after = np.array([1, 1, 0.5, 1, 0, 0.5, 1, 1, 1, 0])
    turns = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"]
    out = paired_outcomes(before, after, turns)
    assert (out["pairs"], out["up"], out["down"]) == (10, 6, 1)
    assert out["mcnemar_p"] == pytest.approx(binomtest(6, 7, 0.5).pvalue)
    assert out["delta"] == pytest.approx((after - before).mean()) and out["lo"] <= out["delta"] <= out["hi"]
    assert out["permutation_p"] == pytest.approx(paired_permutation(after - before, turns))
    with pytest.raises(ValueError):
        paired_outcomes([1.0], [1.0, 0.0])
