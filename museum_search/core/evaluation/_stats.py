"""Bootstrap confidence intervals and paired significance tests (randomization, bootstrap), two-sided by default.

Inputs are the per-query values of one metric (e.g. ``summarize(...)["per_query"]["map"]``),
one value per query, NaN for open-set queries (they are dropped, as in the means).

Method
------
*Resampling unit.* Queries are resampled with replacement (``n`` draws from the ``n`` evaluated
queries), from a ``numpy.random.Generator`` seeded with ``seed``: the same inputs, ``seed`` and
``n_resamples`` always give the same result. The resamples are drawn in blocks of rows whose
size depends only on ``n``, so memory stays bounded.

*Confidence interval* (:func:`bootstrap_ci`): the percentile bootstrap interval (Efron &
Tibshirani 1993, ch. 13): the mean of each resample is computed, the interval is the
``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of those means (numpy's default
linear interpolation, as ``scipy.stats.bootstrap(method="percentile")``).

*Significance test* (:func:`paired_bootstrap_test`), paper 001 section 5.4: "a bootstrap test,
one-tailed [52], at significance levels 0.05, 0.01, and 0.001, against a baseline run"; [52] is
Davidson & MacKinnon, "Bootstrap tests: how many bootstraps?". The paper does not print the
statistic; this module uses the standard paired bootstrap test of IR evaluation (Sakai 2006;
Efron & Tibshirani 1993, section 16.4):

1. per-query differences ``d = run - baseline``, oriented so that positive means "run is better"
   (``d = baseline - run`` when ``higher_is_better=False``, e.g. for MNRO/NMRR/NAR where 0 is
   perfect);
2. observed statistic: the studentized mean ``t = mean(d) / (sd(d) / sqrt(n))`` (``sd`` with
   ``ddof=1``; ``studentized=False`` uses ``mean(d)`` instead);
3. the null hypothesis "no improvement" is imposed by centring: ``z = d - mean(d)``; each
   resample of ``z`` gives ``t*`` (a resample with ``sd = 0`` has ``t* = 0`` if its mean is 0,
   else ``+-inf``);
4. p-value ``p = (1 + #{|t*| >= |t|}) / (B + 1)`` two-sided (``#{t* >= t}`` one-tailed, "greater";
   Davison & Hinkley 1997, Eq. 4.11):
   never 0. The default ``B = 9999`` makes ``alpha (B + 1)`` an integer for every level, as [52]
   recommends; then rejecting at ``p <= alpha`` is the exact level-``alpha`` bootstrap test of
   [52] (same decisions as their ``#{t* > t} / B`` when no ``t*`` equals ``t``);
5. ``significant_at[alpha] = p <= alpha`` for alpha in 0.05, 0.01, 0.001.

*Alternative hypothesis* (``alternative``, as in scipy): **"two-sided" by default** (the run differs
from the baseline, better or worse: a drop must show as significantly as a gain), "greater" (the
run is better: the one-tailed test of paper 001, section 5.4) or "less" (the run is worse). The
two-sided bootstrap p counts ``|t*| >= |t|``; the two-sided randomization p counts the sign
assignments whose mean is at least as extreme in absolute value, ``|T*| >= |T|``. Every result
carries its ``direction``: "better", "worse" or "same" (mean oriented difference > 0, < 0 or 0).

*Randomization test* (:func:`paired_randomization_test`), **the default** of
:func:`paired_test_by_query` (hence of ``evaluate --baseline`` and of the GUI's comparison): the
paired randomization (sign-flip permutation) test that Smucker, Allan & Carterette (CIKM 2007, "A
comparison of statistical significance tests for information retrieval evaluation") recommend for
IR. Under the null hypothesis "run and baseline are interchangeable", the sign of each per-query
difference ``d_i`` (oriented as above) is equally likely + or -. The statistic is ``mean(d)``; the
p-value (two-sided by default) is the share of the ``2^D`` sign assignments of the ``D`` *differing* queries
whose mean is at least as extreme as the observed one (a query with ``d_i = 0`` is the same under both signs and
contributes nothing). ``D <= exact_max`` (20 by default): exact, all ``2^D`` assignments are counted
(meet in the middle: the ``2^(D/2)`` sums of each half, one sorted, ``searchsorted``), ``p = k / 2^D``.
Larger ``D``: Monte Carlo, ``B`` random assignments from a generator seeded with ``seed``,
``p = (1 + #{T* >= T}) / (B + 1)`` as above. Ties are counted as ">=" (relative tolerance 1e-10 of
``sum |d|``, for rounding).

Why it is the default: the studentized shifted bootstrap is anti-conservative when few queries
differ. With 30 queries of which 2 improve MP@1 from 0 to 1 (and 28 are equal), the bootstrap gives
p < 0.05, whereas every test that only uses those two queries cannot go below 1/4: the exact
randomization p is 0.25, the exact sign test's too. The bootstrap p-value is still computed and
reported next to it (``bootstrap_p_value``).

Direction per metric key: the metric table, :data:`museum_search.core.evaluation._metrics.METRICS`
(``higher_is_better``; :data:`~museum_search.core.evaluation._metrics.HIGHER_IS_BETTER`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from museum_search.core.evaluation._metrics import COMPARED

__all__ = [
    "ALTERNATIVES",
    "SIGNIFICANCE_LEVELS",
    "BootstrapResult",
    "PairedTestResult",
    "bootstrap_ci",
    "bootstrap_cis",
    "direction",
    "format_p",
    "paired_bootstrap_test",
    "paired_randomization_test",
    "paired_test_by_query",
]

#: The levels of paper 001, section 5.4 / Table 8 (*, **, ***).
SIGNIFICANCE_LEVELS: tuple[float, ...] = (0.05, 0.01, 0.001)

_BLOCK_ELEMENTS = 2_000_000


@dataclass(frozen=True)
class PairedTestResult:
    """Outcome of :func:`paired_randomization_test` or :func:`paired_bootstrap_test`.

    ``delta`` = mean(run) - mean(baseline) in the metric's own units (negative is an improvement
    for lower-is-better metrics); ``relative_delta`` = delta / mean(baseline) (the percentages of
    paper 001's Table 8), NaN when the baseline mean is 0; ``p_value`` is for ``alternative``:
    "two-sided" (the default: run and baseline differ), "greater" (run is better) or "less" (run is
    worse); ``direction``: "better", "worse" or "same" (the mean difference, oriented by
    ``higher_is_better``); ``run_mean``, ``baseline_mean``: the means over the paired queries. ``test``: "randomization" or "bootstrap"; ``differing_queries``: the
    number of queries whose values differ (the only ones a randomization test uses); ``exact``:
    the randomization p-value counts all ``2^differing_queries`` sign assignments (then
    ``n_resamples`` is that number); ``bootstrap_p_value``: the bootstrap test's p-value on the same
    queries, set by :func:`paired_test_by_query` next to the randomization one.
    """

    p_value: float
    delta: float
    significant_at: dict[float, bool]
    relative_delta: float = float("nan")
    n_queries: int = 0
    n_resamples: int = 0
    higher_is_better: bool = True
    statistic: str = "studentized mean difference"
    extra: dict = field(default_factory=dict)
    test: str = "bootstrap"
    differing_queries: int = 0
    exact: bool = False
    bootstrap_p_value: float | None = None
    alternative: str = "two-sided"
    direction: str = "same"
    run_mean: float = float("nan")
    baseline_mean: float = float("nan")

    def stars(self) -> str:
        """'***', '**', '*' or '' as in paper 001's Table 8."""
        levels = self.significant_at.items()
        return "*" * sum(bool(v) for a, v in levels if a in SIGNIFICANCE_LEVELS)


#: The alternatives of the tests (scipy's names): the run differs from / is better than / is worse than the baseline.
ALTERNATIVES = ("two-sided", "greater", "less")


def _check_alternative(alternative: str) -> str:
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {', '.join(ALTERNATIVES)}, got {alternative!r}")
    return alternative


def format_p(p: float | None) -> str:
    """A p-value in words of one style everywhere: 3 decimals from 0.01, 4 below ("0.0005"),
    "< 0.0001" below that; "n/a" without a value."""
    if p is None or not np.isfinite(p):
        return "n/a"
    if p >= 0.01:
        return f"{p:.3f}"
    return f"{p:.4f}" if p >= 0.0001 else "< 0.0001"


#: The former name (the bootstrap test was the only one).
BootstrapResult = PairedTestResult


def _clean(values, name: str) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per query), got shape {v.shape}")
    v = v[~np.isnan(v)]
    if v.size == 0:
        raise ValueError(f"{name} has no evaluated query (all values are NaN)")
    return v


def _check_resamples(n_resamples: int) -> int:
    b = int(n_resamples)
    if b < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    return b


def _resample_stats(values: np.ndarray, n_resamples: int, rng: np.random.Generator, with_sd: bool):
    """Means (and sds, ddof=1) of ``n_resamples`` resamples with replacement of ``values``."""
    n = values.size
    block = max(1, _BLOCK_ELEMENTS // n)
    means = np.empty(n_resamples)
    sds = np.empty(n_resamples) if with_sd else None
    for start in range(0, n_resamples, block):
        stop = min(n_resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        sample = values[idx]
        means[start:stop] = sample.mean(axis=1)
        if sds is not None:  # with_sd
            sds[start:stop] = sample.std(axis=1, ddof=1) if n > 1 else 0.0
    return means, sds


def bootstrap_ci(
    per_query_values,
    n_resamples: int = 10000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean over queries.

    ``per_query_values``: (Q,) values of one metric, NaN (open-set queries) dropped. Returns
    ``(low, high)``: the ``(1 - confidence)/2`` and ``(1 + confidence)/2`` quantiles (linear
    interpolation) of the means of ``n_resamples`` resamples of the queries with replacement.
    Reproducible for a given ``seed``. The interval describes the uncertainty due to the finite
    query sample; it narrows roughly as 1/sqrt(Q).
    """
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    v = _clean(per_query_values, "per_query_values")
    b = _check_resamples(n_resamples)
    rng = np.random.default_rng(seed)
    means, _ = _resample_stats(v, b, rng, with_sd=False)
    alpha = 1.0 - float(confidence)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def bootstrap_cis(
    per_query: Mapping[str, np.ndarray],
    keys: Sequence[str] = tuple(COMPARED),
    n_resamples: int = 10000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> dict[str, tuple[float, float, float]]:
    """``{key: (mean, low, high)}`` for the given metrics of ``summarize(...)["per_query"]`` (default:
    the :data:`~museum_search.core.evaluation._metrics.COMPARED` ones, MP@1, MAP, AMNRO).

    Every metric uses the same ``seed``, hence the same resampled query sets.
    """
    out = {}
    for key in keys:
        v = _clean(per_query[key], key)
        low, high = bootstrap_ci(v, n_resamples=n_resamples, confidence=confidence, seed=seed)
        out[key] = (float(v.mean()), low, high)
    return out


def _t(means: np.ndarray, sds: np.ndarray, n: int) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        t = means / (sds / np.sqrt(n))
    return np.where(np.isnan(t), 0.0, t)  # 0/0: a resample (or sample) without any difference


def paired_bootstrap_test(
    run,
    baseline,
    n_resamples: int = 9999,
    seed: int | None = 0,
    higher_is_better: bool = True,
    *,
    levels: Sequence[float] = SIGNIFICANCE_LEVELS,
    studentized: bool = True,
    alternative: str = "two-sided",
) -> BootstrapResult:
    """Paired bootstrap test: do ``run`` and ``baseline`` differ (``alternative="two-sided"``, the
    default), is ``run`` better ("greater", paper 001, 5.4's one-tailed test) or worse ("less")?

    ``run`` and ``baseline``: (Q,) per-query values of the same metric on the same queries (same
    order). NaN (open-set) must be at the same positions in both and is dropped.
    ``higher_is_better``: True for P@k, MP@1, AP/MAP, nDCG; **False for MNRO/AMNRO, NMRR/ANMRR and
    NAR** (paper 001: 0 is perfect retrieval, larger values are worse). The method is described in
    the module docstring. Reproducible for a given ``seed``.
    """
    _check_alternative(alternative)
    a, b, d = _paired(run, baseline, higher_is_better, min_queries=2)
    n = a.size
    bcount = _check_resamples(n_resamples)
    z = d - d.mean()
    rng = np.random.default_rng(seed)
    means, sds = _resample_stats(z, bcount, rng, with_sd=studentized)
    if studentized:
        t_obs = float(_t(np.array([d.mean()]), np.array([d.std(ddof=1)]), n)[0])
        t_star = _t(means, sds, n)
    else:
        t_obs = float(d.mean())
        t_star = means
    if alternative == "two-sided":
        count = int(np.count_nonzero(np.abs(t_star) >= abs(t_obs)))
    elif alternative == "greater":
        count = int(np.count_nonzero(t_star >= t_obs))
    else:
        count = int(np.count_nonzero(t_star <= t_obs))
    p = (1.0 + count) / (bcount + 1.0)
    return _result(a, b, d, p, levels, higher_is_better, test="bootstrap", n_resamples=bcount, alternative=alternative,
                   statistic="studentized mean difference" if studentized else "mean difference",
                   extra={"t_observed": t_obs})


def _paired(run, baseline, higher_is_better: bool, min_queries: int):
    """``(run, baseline, d)`` without open-set NaN; ``d`` oriented so that positive is "run better"."""
    a = np.asarray(run, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"run {a.shape} and baseline {b.shape} must be 1-D of the same length")
    na, nb = np.isnan(a), np.isnan(b)
    if np.any(na != nb):
        raise ValueError(
            "run and baseline have NaN (open-set queries) at different positions: they were "
            "not evaluated on the same queries"
        )
    a, b = a[~na], b[~na]
    if a.size < min_queries:
        raise ValueError(f"the test needs at least {min_queries} evaluated queries, got {a.size}")
    return a, b, (a - b if higher_is_better else b - a)


def direction(d: np.ndarray) -> str:
    """"better", "worse" or "same": the sign of the mean oriented difference ``d`` (positive: the run is
    better), 0 within rounding (relative tolerance 1e-10 of ``mean |d|``)."""
    mean = float(d.mean()) if d.size else 0.0
    tol = 1e-10 * float(np.abs(d).mean()) if d.size else 0.0
    return "better" if mean > tol else "worse" if mean < -tol else "same"


def _result(a, b, d, p: float, levels, higher_is_better: bool, **kw) -> PairedTestResult:
    delta = float(a.mean() - b.mean())
    base = float(b.mean())
    return PairedTestResult(
        direction=direction(d),
        run_mean=float(a.mean()),
        baseline_mean=base,
        p_value=float(p),
        delta=delta,
        significant_at={float(alpha): bool(p <= alpha) for alpha in levels},
        relative_delta=delta / base if base != 0 else float("nan"),
        n_queries=int(a.size),
        higher_is_better=bool(higher_is_better),
        differing_queries=int(np.count_nonzero(d)),
        **kw,
    )


#: Largest ``exact_max`` accepted: 2^20 partial sums (8 MB) on each side of the enumeration.
_EXACT_LIMIT = 40


def _signed_sums(x: np.ndarray) -> np.ndarray:
    """The ``2^len(x)`` sums ``sum(+-x_i)`` of every sign assignment."""
    sums = np.zeros(1)
    for v in x:
        sums = np.concatenate((sums + v, sums - v))
    return sums


def _count_exact(mag: np.ndarray, threshold: float) -> int:
    """How many of the ``2^D`` sign assignments of ``mag`` sum to ``>= threshold`` (meet in the middle)."""
    half = mag.size // 2
    left = _signed_sums(mag[:half])
    right = np.sort(_signed_sums(mag[half:]))
    below = np.searchsorted(right, threshold - left, side="left")  # right_j < threshold - left_i
    return int(left.size * right.size - below.sum())


def _count_monte_carlo(mag: np.ndarray, threshold: float, n_resamples: int, rng: np.random.Generator,
                       two_sided: bool = False) -> int:
    """How many of ``n_resamples`` random sign assignments of ``mag`` sum to ``>= threshold`` (two-sided:
    whose sum's absolute value is ``>= threshold``)."""
    total = float(mag.sum())
    block = max(1, _BLOCK_ELEMENTS // mag.size)
    count = 0
    for start in range(0, n_resamples, block):
        rows = min(n_resamples, start + block) - start
        random_bytes = rng.integers(0, 256, size=(rows, (mag.size + 7) // 8), dtype=np.uint8)
        negative = np.unpackbits(random_bytes, axis=1, count=mag.size)  # one fair coin per query
        sums = total - 2.0 * (negative.astype(np.float64) @ mag)  # flipped: -|d_i| instead of +|d_i|
        count += int(np.count_nonzero((np.abs(sums) if two_sided else sums) >= threshold))
    return count


def paired_randomization_test(
    run,
    baseline,
    n_resamples: int = 9999,
    seed: int | None = 0,
    higher_is_better: bool = True,
    *,
    levels: Sequence[float] = SIGNIFICANCE_LEVELS,
    exact_max: int = 20,
    alternative: str = "two-sided",
) -> PairedTestResult:
    """Paired randomization (sign-flip permutation) test: do ``run`` and ``baseline`` differ?

    Same inputs and direction as :func:`paired_bootstrap_test` (at least 1 evaluated query). The
    statistic is the mean per-query difference; ``alternative``: "two-sided" (the default: the share
    of sign assignments whose mean is at least as extreme in absolute value), "greater" (run is
    better) or "less" (run is worse). The p-value is exact (all ``2^D`` sign assignments of the
    ``D`` differing queries) when ``D <= exact_max``, else Monte Carlo with ``n_resamples``
    assignments, reproducible for a given ``seed`` (see the module docstring). No differing query
    gives ``p = 1``.
    """
    if not 0 <= int(exact_max) <= _EXACT_LIMIT:
        raise ValueError(f"exact_max must be in 0..{_EXACT_LIMIT}, got {exact_max}")
    _check_alternative(alternative)
    a, b, d = _paired(run, baseline, higher_is_better, min_queries=1)
    mag = np.abs(d[d != 0])
    observed = float(d[d != 0].sum())
    tol = 1e-10 * float(mag.sum())  # ties count as "at least as extreme" despite rounding
    # the sign-flip distribution is symmetric about 0: "less" is "greater" for -observed
    threshold = {"two-sided": abs(observed), "greater": observed, "less": -observed}[alternative] - tol
    two_sided = alternative == "two-sided"
    if mag.size <= int(exact_max):
        total = 2**mag.size
        count = _count_exact(mag, threshold)
        if two_sided:  # |T*| >= |T|: both tails, the same size by symmetry (all of them when T = 0)
            count = total if threshold <= 0 else 2 * count
        p = count / total
        kw = {"exact": True, "n_resamples": total}
    else:
        bcount = _check_resamples(n_resamples)
        count = _count_monte_carlo(mag, threshold, bcount, np.random.default_rng(seed), two_sided=two_sided)
        p = (1.0 + count) / (bcount + 1.0)
        kw = {"exact": False, "n_resamples": bcount}
    return _result(a, b, d, p, levels, higher_is_better, test="randomization", statistic="mean difference",
                   extra={"mean_difference": observed / a.size}, alternative=alternative, **kw)


SIGNIFICANCE_STARS = ((0.001, "***"), (0.01, "**"), (0.05, "*"))


def stars(p: float | None) -> str:
    """'***', '**', '*' for p <= 0.001, 0.01, 0.05; '' otherwise."""
    if p is None or not np.isfinite(p):
        return ""
    return next((s for alpha, s in SIGNIFICANCE_STARS if p <= alpha), "")


def paired_test_by_query(run: dict[str, float], baseline: dict[str, float], higher_is_better: bool = True,
                         seed: int | None = 0, alternative: str = "two-sided") -> PairedTestResult | None:
    """The default significance test of a run against a baseline, on the queries both evaluated
    (values by query name, in the order of ``run``): :func:`paired_randomization_test`, with
    :func:`paired_bootstrap_test`'s p-value (same ``alternative``, two-sided by default) as
    ``bootstrap_p_value``. None when fewer than 2
    queries are common (or the tests cannot be computed)."""
    common = [q for q, v in run.items() if q in baseline and v is not None and baseline[q] is not None]
    if len(common) < 2:
        return None
    a = np.array([run[q] for q in common], float)
    b = np.array([baseline[q] for q in common], float)
    try:
        boot = paired_bootstrap_test(a, b, seed=seed, higher_is_better=higher_is_better, alternative=alternative)
        res = paired_randomization_test(a, b, seed=seed, higher_is_better=higher_is_better, alternative=alternative)
    except ValueError:
        return None
    return replace(res, bootstrap_p_value=boot.p_value)
