"""Bootstrap confidence intervals and the paired one-tailed bootstrap test (paper 001, 5.4)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from museum_search.core.evaluation import metrics as m
from museum_search.core.evaluation.stats import (
    SIGNIFICANCE_LEVELS,
    bootstrap_ci,
    bootstrap_cis,
    paired_bootstrap_test,
)


def ap_like(rng, n):
    return rng.beta(2, 3, size=n)


# ----------------------------------------------------------------------------------------------
# confidence intervals
# ----------------------------------------------------------------------------------------------


def test_ci_reproducible_with_seed():
    v = ap_like(np.random.default_rng(0), 120)
    assert bootstrap_ci(v, seed=42) == bootstrap_ci(v, seed=42)
    assert bootstrap_ci(v, seed=42) != bootstrap_ci(v, seed=43)


def test_ci_contains_mean_and_narrows_with_more_queries():
    rng = np.random.default_rng(1)
    small = ap_like(rng, 40)
    large = ap_like(rng, 1600)
    lo_s, hi_s = bootstrap_ci(small, seed=0)
    lo_l, hi_l = bootstrap_ci(large, seed=0)
    assert lo_s < small.mean() < hi_s
    assert lo_l < large.mean() < hi_l
    # width ~ 1/sqrt(Q): 40x more queries -> about 6.3x narrower
    ratio = (hi_s - lo_s) / (hi_l - lo_l)
    assert 4.5 < ratio < 9
    # and matches the normal approximation 2·1.96·sd/sqrt(n) roughly
    assert hi_l - lo_l == pytest.approx(2 * 1.96 * large.std(ddof=1) / np.sqrt(large.size), rel=0.1)


def test_ci_matches_scipy_percentile_bootstrap():
    rng = np.random.default_rng(2)
    for values in (ap_like(rng, 200), (rng.random(150) < 0.7).astype(float)):  # AP-like, P@1-like
        ours = bootstrap_ci(values, n_resamples=20000, seed=0)
        ref = sps.bootstrap(
            (values,), np.mean, n_resamples=20000, confidence_level=0.95,
            method="percentile", random_state=np.random.default_rng(1),
        ).confidence_interval
        se = values.std(ddof=1) / np.sqrt(values.size)
        # independent resampling: the end points agree up to Monte-Carlo noise (<< 1 SE)
        assert ours[0] == pytest.approx(ref.low, abs=0.1 * se)
        assert ours[1] == pytest.approx(ref.high, abs=0.1 * se)


def test_ci_drops_open_set_nan_and_rejects_empty():
    v = np.array([0.2, np.nan, 0.4, 0.9, np.nan, 0.5])
    assert bootstrap_ci(v, seed=3) == bootstrap_ci(v[~np.isnan(v)], seed=3)
    with pytest.raises(ValueError):
        bootstrap_ci([np.nan, np.nan])
    with pytest.raises(ValueError):
        bootstrap_ci([0.1, 0.2], confidence=1.5)


def test_cis_for_summary_metrics():
    rng = np.random.default_rng(4)
    rel = rng.random((300, 500)) < 0.02
    rel[::10] = False  # queries with nothing in their top 500
    # half of those have one relevant reference outside the top 500, the others are open-set
    n_rel = rel.sum(axis=1) + rng.integers(0, 2, 300) * (~rel.any(axis=1))
    s = m.summarize(rel, n_rel, n_collection=2000)
    assert s["open_set_queries"] > 0
    cis = bootstrap_cis(s["per_query"], seed=0)
    assert set(cis) == {"mp@1", "map", "amnro"}
    for key, (mean, lo, hi) in cis.items():
        assert mean == pytest.approx(s[key])
        assert lo < mean < hi
        assert 0.0 <= lo and hi <= 1.0


# ----------------------------------------------------------------------------------------------
# paired one-tailed test
# ----------------------------------------------------------------------------------------------


def test_test_reproducible_with_seed():
    rng = np.random.default_rng(5)
    base = ap_like(rng, 60)
    run = np.clip(base + rng.normal(0.02, 0.1, 60), 0, 1)
    a = paired_bootstrap_test(run, base, seed=7)
    b = paired_bootstrap_test(run, base, seed=7)
    assert a == b
    assert paired_bootstrap_test(run, base, seed=8).p_value != a.p_value


def test_clearly_better_run_is_significant_at_0001():
    rng = np.random.default_rng(6)
    base = ap_like(rng, 80)
    run = np.clip(base + 0.15 + rng.normal(0, 0.05, 80), 0, 1)
    r = paired_bootstrap_test(run, base, seed=0)
    assert r.p_value <= 0.001
    assert r.significant_at == {0.05: True, 0.01: True, 0.001: True}
    assert r.stars() == "***"
    assert r.delta == pytest.approx(run.mean() - base.mean())
    assert r.relative_delta == pytest.approx(r.delta / base.mean())
    assert r.p_value >= 1 / (r.n_resamples + 1)  # never 0
    # one-tailed: the same pair the other way round is not significant at all
    rev = paired_bootstrap_test(base, run, seed=0)
    assert rev.p_value > 0.99 and not any(rev.significant_at.values())


def test_identical_runs_are_not_significant():
    v = ap_like(np.random.default_rng(7), 50)
    r = paired_bootstrap_test(v, v.copy(), seed=0)
    assert r.p_value == 1.0
    assert r.delta == 0.0
    assert not any(r.significant_at.values())
    assert set(r.significant_at) == set(SIGNIFICANCE_LEVELS)


def test_lower_is_better_metrics_such_as_mnro():
    # paper 001: MNRO = 0 is perfect retrieval, so a *lower* AMNRO is the improvement
    rng = np.random.default_rng(8)
    base = rng.uniform(0.2, 0.6, 70)
    run = base - 0.1 + rng.normal(0, 0.03, 70)
    assert m.HIGHER_IS_BETTER["amnro"] is False
    good = paired_bootstrap_test(run, base, seed=0, higher_is_better=m.HIGHER_IS_BETTER["amnro"])
    assert good.significant_at[0.001] and good.delta < 0
    wrong = paired_bootstrap_test(run, base, seed=0, higher_is_better=True)
    assert not wrong.significant_at[0.05]


def test_p_value_agrees_with_paired_t_test_for_large_samples():
    # for many queries the bootstrap t distribution is close to Student's t
    rng = np.random.default_rng(9)
    base = ap_like(rng, 400)
    run = base + rng.normal(0.01, 0.1, 400)
    r = paired_bootstrap_test(run, base, n_resamples=20000, seed=0)
    t = sps.ttest_rel(run, base, alternative="greater")
    assert 0.001 < t.pvalue < 0.2  # a borderline case, where the comparison is informative
    assert r.p_value == pytest.approx(t.pvalue, abs=0.01)
    # the non-studentized statistic gives a similar answer here
    r2 = paired_bootstrap_test(run, base, n_resamples=20000, seed=0, studentized=False)
    assert r2.p_value == pytest.approx(t.pvalue, abs=0.015)


def test_size_under_the_null_is_close_to_nominal():
    # paired runs whose per-query differences have mean 0: reject at 5% about 5% of the time
    rng = np.random.default_rng(10)
    rejections = 0
    trials = 300
    for i in range(trials):
        base = ap_like(rng, 30)
        run = base + rng.normal(0, 0.1, 30)
        rejections += paired_bootstrap_test(run, base, n_resamples=999, seed=i).significant_at[0.05]
    assert 0.02 <= rejections / trials <= 0.09


def test_pairing_and_open_set_handling():
    base = np.array([0.1, np.nan, 0.5, 0.7, 0.2])
    run = np.array([0.3, np.nan, 0.6, 0.9, 0.3])
    r = paired_bootstrap_test(run, base, seed=0)
    assert r.n_queries == 4
    with pytest.raises(ValueError, match="same queries"):
        paired_bootstrap_test(np.array([0.3, 0.2, 0.6, 0.9, 0.3]), base)
    with pytest.raises(ValueError):
        paired_bootstrap_test(run[:3], base)
    with pytest.raises(ValueError):
        paired_bootstrap_test([0.1], [0.2])


def test_constant_improvement_is_significant():
    base = ap_like(np.random.default_rng(11), 25)
    r = paired_bootstrap_test(base + 0.05, base, seed=0)
    assert r.significant_at[0.001]
