"""Bootstrap confidence intervals, the paired bootstrap test (paper 001, 5.4; one-tailed there, two-sided
by default here) and the paired randomization test (the default, Smucker, Allan & Carterette 2007)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats as sps

from museum_search.core.evaluation import _metrics as m
from museum_search.core.evaluation._stats import (
    SIGNIFICANCE_LEVELS,
    bootstrap_ci,
    bootstrap_cis,
    format_p,
    paired_bootstrap_test,
    paired_randomization_test,
    paired_test_by_query,
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
# paired bootstrap test (two-sided by default; paper 001's one-tailed test is alternative='greater')
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
    assert (r.direction, r.alternative) == ("better", "two-sided")
    # two-sided: the same pair the other way round is as significant, and "worse"
    rev = paired_bootstrap_test(base, run, seed=0)
    assert rev.p_value == r.p_value and rev.direction == "worse" and rev.stars() == "***"
    # one-tailed "better than" (paper 001): the other way round is not significant at all
    one = paired_bootstrap_test(base, run, seed=0, alternative="greater")
    assert one.p_value > 0.99 and not any(one.significant_at.values())
    assert paired_bootstrap_test(base, run, seed=0, alternative="less").p_value <= 0.001
    with pytest.raises(ValueError, match="alternative"):
        paired_bootstrap_test(base, run, alternative="better")


def test_identical_runs_are_not_significant():
    v = ap_like(np.random.default_rng(7), 50)
    r = paired_bootstrap_test(v, v.copy(), seed=0)
    assert r.p_value == 1.0
    assert r.delta == 0.0 and r.direction == "same"
    assert not any(r.significant_at.values())
    assert set(r.significant_at) == set(SIGNIFICANCE_LEVELS)


def test_lower_is_better_metrics_such_as_mnro():
    # paper 001: MNRO = 0 is perfect retrieval, so a *lower* AMNRO is the improvement
    rng = np.random.default_rng(8)
    base = rng.uniform(0.2, 0.6, 70)
    run = base - 0.1 + rng.normal(0, 0.03, 70)
    assert m.HIGHER_IS_BETTER["amnro"] is False
    good = paired_bootstrap_test(run, base, seed=0, higher_is_better=m.HIGHER_IS_BETTER["amnro"])
    assert good.significant_at[0.001] and good.delta < 0 and good.direction == "better"
    wrong = paired_bootstrap_test(run, base, seed=0, higher_is_better=True)
    assert wrong.direction == "worse"
    assert not paired_bootstrap_test(run, base, seed=0, higher_is_better=True, alternative="greater").significant_at[0.05]


def test_p_value_agrees_with_paired_t_test_for_large_samples():
    # for many queries the bootstrap t distribution is close to Student's t
    rng = np.random.default_rng(9)
    base = ap_like(rng, 400)
    run = base + rng.normal(0.01, 0.1, 400)
    r = paired_bootstrap_test(run, base, n_resamples=20000, seed=0)
    t = sps.ttest_rel(run, base, alternative="two-sided")
    assert 0.002 < t.pvalue < 0.2  # a borderline case, where the comparison is informative
    assert r.p_value == pytest.approx(t.pvalue, abs=0.015)
    # the non-studentized statistic gives a similar answer here
    r2 = paired_bootstrap_test(run, base, n_resamples=20000, seed=0, studentized=False)
    assert r2.p_value == pytest.approx(t.pvalue, abs=0.02)
    # one-tailed, as paper 001
    one = paired_bootstrap_test(run, base, n_resamples=20000, seed=0, alternative="greater")
    assert one.p_value == pytest.approx(sps.ttest_rel(run, base, alternative="greater").pvalue, abs=0.01)


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


# ----------------------------------------------------------------------------------------------
# paired randomization (sign-flip permutation) test, the default
# ----------------------------------------------------------------------------------------------


def enumerated_p(run, base, higher_is_better=True, alternative="two-sided"):
    """The p-value written out: every sign assignment of the non-zero differences, by
    itertools.product, in exact rational arithmetic (the inputs' floats are exact rationals);
    two-sided: |sum| at least |observed|; "greater": sum at least observed."""
    d = [Fraction(float(x)) - Fraction(float(y)) for x, y in zip(run, base)]
    d = [x if higher_is_better else -x for x in d if x != 0]
    observed = sum(d)
    if alternative == "two-sided":
        hits = sum(abs(sum(s * abs(x) for s, x in zip(signs, d))) >= abs(observed)
                   for signs in itertools.product((1, -1), repeat=len(d)))
        return hits / 2 ** len(d)
    hits = sum(sum(s * abs(x) for s, x in zip(signs, d)) >= observed
               for signs in itertools.product((1, -1), repeat=len(d)))
    return hits / 2 ** len(d)


def qsd2_w3_example():
    """The issue's case: MP@1 on 30 queries, 2 of them improved from 0 to 1, the others equal."""
    base = np.array([1.0] * 20 + [0.0] * 10)
    run = base.copy()
    run[[21, 27]] = 1.0
    return run, base


def test_randomization_qsd2_w3_example_is_not_significant():
    run, base = qsd2_w3_example()
    r = paired_randomization_test(run, base)
    sign_test = sps.binomtest(2, 2, p=0.5, alternative="two-sided").pvalue  # 2 of 2 improved
    assert sign_test == enumerated_p(run, base) == 0.5
    assert r.p_value == pytest.approx(sign_test, abs=1e-15) and r.direction == "better"
    one = paired_randomization_test(run, base, alternative="greater")  # one-tailed: 1/4 at best
    assert one.p_value == enumerated_p(run, base, alternative="greater") == 0.25
    assert (r.test, r.exact, r.differing_queries, r.n_queries, r.n_resamples) == ("randomization", True, 2, 30, 4)
    assert not any(r.significant_at.values()) and r.stars() == ""
    # the studentized one-tailed bootstrap, the former default, calls the same data significant
    assert paired_bootstrap_test(run, base, alternative="greater").p_value < 0.05
    boot = paired_bootstrap_test(run, base)  # two-sided, as paired_test_by_query's
    # paired_test_by_query (CLI --baseline, GUI) gives the randomization p and the bootstrap one
    names = [f"{i:05d}.jpg" for i in range(30)]
    res = paired_test_by_query(dict(zip(names, run)), dict(zip(names, base)))
    assert (res.test, res.p_value, res.differing_queries) == ("randomization", r.p_value, 2)
    assert res.bootstrap_p_value == boot.p_value
    assert res.delta == pytest.approx(2 / 30)


@pytest.mark.parametrize("case", range(12))
def test_randomization_exact_matches_enumeration(case):
    rng = np.random.default_rng(100 + case)
    n = int(rng.integers(2, 14))
    if case % 3 == 0:  # MP@1-like 0/1 values: many zeros and ties
        base, run = rng.integers(0, 2, n).astype(float), rng.integers(0, 2, n).astype(float)
    elif case % 3 == 1:  # grades in steps of 1/4: ties among the non-zero differences
        base, run = rng.integers(0, 5, n) / 4, rng.integers(0, 5, n) / 4
    else:  # AP-like values
        base = ap_like(rng, n)
        run = np.where(rng.random(n) < 0.3, base, ap_like(rng, n))
    for higher in (True, False):
        r = paired_randomization_test(run, base, higher_is_better=higher)
        assert r.exact and r.differing_queries == int(np.count_nonzero(run != base))
        assert r.p_value == pytest.approx(enumerated_p(run, base, higher), abs=1e-12)
        assert r.significant_at == {a: r.p_value <= a for a in SIGNIFICANCE_LEVELS}
        one = paired_randomization_test(run, base, higher_is_better=higher, alternative="greater")
        assert one.p_value == pytest.approx(enumerated_p(run, base, higher, "greater"), abs=1e-12)


def test_randomization_exact_matches_scipy_exact():
    rng = np.random.default_rng(21)
    base = ap_like(rng, 13)
    run = base + rng.normal(0.08, 0.1, 13)
    run[[2, 7]] = base[[2, 7]]  # zeros: scipy enumerates 2^13 arrangements, they contribute nothing

    def mean_difference(x, y, axis):
        return np.mean(x - y, axis=axis)

    for higher, alternative in ((True, "greater"), (False, "less")):
        ref = sps.permutation_test((run, base), mean_difference, permutation_type="samples", vectorized=True,
                                   n_resamples=np.inf, alternative=alternative)
        r = paired_randomization_test(run, base, higher_is_better=higher, alternative="greater")
        assert r.exact and r.differing_queries == 11
        assert r.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    # the default: two-sided, as scipy's, whichever the better direction
    ref = sps.permutation_test((run, base), mean_difference, permutation_type="samples", vectorized=True,
                               n_resamples=np.inf, alternative="two-sided")
    for higher, direction in ((True, "better"), (False, "worse")):
        r = paired_randomization_test(run, base, higher_is_better=higher)
        assert r.alternative == "two-sided" and r.direction == direction
        assert r.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    assert 0.001 < paired_randomization_test(run, base).p_value < 0.2  # an informative case


def integer_exact_p(diffs, two_sided=False):
    """Exact p for integer differences (one-tailed "greater", or two-sided): the distribution of
    sum(+-|d_i|) by convolution."""
    counts = {0: 1}
    for x in (abs(int(v)) for v in diffs if v != 0):
        nxt: dict[int, int] = {}
        for total, c in counts.items():
            nxt[total + x] = nxt.get(total + x, 0) + c
            nxt[total - x] = nxt.get(total - x, 0) + c
        counts = nxt
    observed = int(sum(diffs))
    if two_sided:
        return Fraction(sum(c for t, c in counts.items() if abs(t) >= abs(observed)), sum(counts.values()))
    return Fraction(sum(c for t, c in counts.items() if t >= observed), sum(counts.values()))


def test_randomization_monte_carlo_agrees_with_exact_and_scipy():
    # 80 queries, 54 differing (Monte Carlo): grades 0..4, so the exact p is known by convolution
    rng = np.random.default_rng(22)
    base = rng.integers(0, 5, 80).astype(float)
    run = np.clip(base + rng.choice([-2, -1, -1, 0, 1, 1, 2], 80), 0, 4)
    exact = float(integer_exact_p(run - base))
    assert 0.005 < exact < 0.2  # informative: neither 0 nor 1
    b = 9999
    se = np.sqrt(exact * (1 - exact) / b)
    r = paired_randomization_test(run, base, n_resamples=b, seed=3, alternative="greater")
    assert not r.exact and r.n_resamples == b and r.differing_queries == int(np.count_nonzero(run - base)) > 20
    assert abs(r.p_value - exact) < 4.5 * se
    # two-sided (the default), Monte Carlo against the exact convolution
    both = float(integer_exact_p(run - base, two_sided=True))
    two = paired_randomization_test(run, base, n_resamples=b, seed=3)
    assert abs(two.p_value - both) < 4.5 * np.sqrt(both * (1 - both) / b) + 1 / b

    def mean_difference(x, y, axis):
        return np.mean(x - y, axis=axis)

    ref = sps.permutation_test((run, base), mean_difference, permutation_type="samples", vectorized=True,
                               n_resamples=b, alternative="greater", rng=np.random.default_rng(4))
    assert abs(ref.pvalue - exact) < 4.5 * se
    assert abs(r.p_value - ref.pvalue) < 4.5 * np.sqrt(2) * se
    # lower is better: the other tail, as scipy's "less"
    low = paired_randomization_test(run, base, n_resamples=b, seed=3, higher_is_better=False, alternative="greater")
    other = float(integer_exact_p(base - run))
    assert abs(low.p_value - other) < 4.5 * np.sqrt(other * (1 - other) / b) + 1 / b


def test_randomization_exact_up_to_exact_max_then_seeded_monte_carlo():
    rng = np.random.default_rng(23)
    base = ap_like(rng, 40)
    run = base + rng.normal(0.03, 0.1, 40)
    r20 = paired_randomization_test(run[:20], base[:20])
    assert r20.exact and r20.n_resamples == 2**20
    assert r20.p_value * 2**20 == round(r20.p_value * 2**20)  # a count of assignments
    r21 = paired_randomization_test(run[:21], base[:21], seed=5)
    assert not r21.exact and r21.n_resamples == 9999
    assert r21 == paired_randomization_test(run[:21], base[:21], seed=5)  # reproducible
    assert paired_randomization_test(run[:21], base[:21], seed=6).p_value != r21.p_value
    exact21 = paired_randomization_test(run[:21], base[:21], exact_max=21)
    assert exact21.exact and exact21.n_resamples == 2**21
    assert abs(r21.p_value - exact21.p_value) < 4.5 * np.sqrt(exact21.p_value * (1 - exact21.p_value) / 9999)
    with pytest.raises(ValueError):
        paired_randomization_test(run, base, exact_max=41)


def test_randomization_extremes_and_tails():
    v = ap_like(np.random.default_rng(24), 30)
    same = paired_randomization_test(v, v.copy())
    assert same.p_value == 1.0 and same.differing_queries == 0 and same.exact and same.delta == 0
    assert same.direction == "same"
    # every query better: two assignments of 2^D are as extreme (all +, all -); Monte Carlo is never 0
    assert paired_randomization_test(v[:12] + 0.1, v[:12]).p_value == 2.0**-11
    assert paired_randomization_test(v[:12] + 0.1, v[:12], alternative="greater").p_value == 2.0**-12
    mc = paired_randomization_test(v + 0.1, v, n_resamples=999)
    assert not mc.exact and mc.p_value == 1 / 1000 and mc.stars() == "***"
    # with distinct sums, the two tails share only the observed assignment
    run = ap_like(np.random.default_rng(25), 30)
    hi = paired_randomization_test(run[:15], v[:15], alternative="greater")
    lo = paired_randomization_test(run[:15], v[:15], higher_is_better=False, alternative="greater")
    assert hi.p_value + lo.p_value == pytest.approx(1 + 2.0**-15)
    assert lo.p_value == pytest.approx(paired_randomization_test(run[:15], v[:15], alternative="less").p_value)
    # two-sided: twice the smaller tail (the distribution is symmetric), the same in both directions
    two = paired_randomization_test(run[:15], v[:15])
    assert two.p_value == pytest.approx(2 * min(hi.p_value, lo.p_value))
    assert paired_randomization_test(run[:15], v[:15], higher_is_better=False).p_value == two.p_value
    # lower-is-better metrics (MNRO): a lower run is the improvement
    base = np.random.default_rng(26).uniform(0.2, 0.6, 30)
    better = paired_randomization_test(base - 0.1, base, higher_is_better=m.HIGHER_IS_BETTER["amnro"])
    assert better.significant_at[0.001] and better.delta < 0 and better.direction == "better"


def test_randomization_size_under_the_null():
    # exact test, 12 differing queries: P(p <= 0.05) = 204/4096 under the null
    rng = np.random.default_rng(27)
    trials = 400
    rejections = sum(paired_randomization_test(base + rng.normal(0, 0.1, 12), base).significant_at[0.05]
                     for base in (ap_like(rng, 12) for _ in range(trials)))
    nominal = 204 / 4096
    assert abs(rejections / trials - nominal) < 4 * np.sqrt(nominal * (1 - nominal) / trials)


def test_randomization_pairing_and_open_set_handling():
    base = np.array([0.1, np.nan, 0.5, 0.7, 0.2])
    run = np.array([0.3, np.nan, 0.6, 0.9, 0.3])
    r = paired_randomization_test(run, base)
    assert r.n_queries == 4 and r.differing_queries == 4 and r.p_value == 2 / 16
    with pytest.raises(ValueError, match="same queries"):
        paired_randomization_test(np.array([0.3, 0.2, 0.6, 0.9, 0.3]), base)
    with pytest.raises(ValueError):
        paired_randomization_test(run[:3], base)


def test_paired_test_by_query_uses_common_queries():
    run = {"a": 0.9, "b": 0.5, "c": None, "d": 0.7, "e": 0.4}
    base = {"a": 0.2, "b": 0.5, "c": 0.3, "d": 0.1, "x": 0.0, "e": 0.1}
    res = paired_test_by_query(run, base, seed=1)
    common_run, common_base = [0.9, 0.5, 0.7, 0.4], [0.2, 0.5, 0.1, 0.1]
    assert res.n_queries == 4 and res.differing_queries == 3 and res.test == "randomization"
    assert res.p_value == enumerated_p(common_run, common_base) == 2 / 8
    assert res.bootstrap_p_value == paired_bootstrap_test(common_run, common_base, seed=1).p_value
    assert paired_test_by_query({"a": 0.1}, {"a": 0.2}) is None


def test_a_clear_drop_is_worse_and_significant_two_sided():
    # issue 23: ICFRR on the paintings, MP@1 0.967 -> 0.567 on 30 queries, 12 of them worse
    base = np.array([1.0] * 29 + [0.0])
    run = np.array([0.0] * 12 + [1.0] * 17 + [0.0])
    r = paired_randomization_test(run, base)
    d = run - base
    ref = sps.permutation_test((d[d != 0],), np.sum, permutation_type="samples", alternative="two-sided",
                               n_resamples=np.inf)
    assert r.p_value == pytest.approx(ref.pvalue, rel=1e-12) == 2 / 2**12
    assert (r.direction, r.differing_queries, r.stars()) == ("worse", 12, "***")
    assert (r.run_mean, r.baseline_mean) == (pytest.approx(17 / 30), pytest.approx(29 / 30))
    assert paired_randomization_test(run, base, alternative="greater").p_value == 1.0  # what it said before
    assert paired_bootstrap_test(run, base).p_value < 0.001


def test_format_p():
    assert [format_p(p) for p in (1.0, 0.0123, 2 / 4096, 1e-6, None, float("nan"))] == \
        ["1.000", "0.012", "0.0005", "< 0.0001", "n/a", "n/a"]
