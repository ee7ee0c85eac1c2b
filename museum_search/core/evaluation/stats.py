"""Bootstrap confidence intervals and the paired one-tailed bootstrap significance test.

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
4. one-tailed p-value ``p = (1 + #{t* >= t}) / (B + 1)`` (Davison & Hinkley 1997, Eq. 4.11):
   never 0. The default ``B = 9999`` makes ``alpha (B + 1)`` an integer for every level, as [52]
   recommends; then rejecting at ``p <= alpha`` is the exact level-``alpha`` bootstrap test of
   [52] (same decisions as their ``#{t* > t} / B`` when no ``t*`` equals ``t``);
5. ``significant_at[alpha] = p <= alpha`` for alpha in 0.05, 0.01, 0.001.

Direction per metric key: :data:`museum_search.core.evaluation.metrics.HIGHER_IS_BETTER`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "SIGNIFICANCE_LEVELS",
    "BootstrapResult",
    "bootstrap_ci",
    "bootstrap_cis",
    "paired_bootstrap_test",
]

#: The levels of paper 001, section 5.4 / Table 8 (*, **, ***).
SIGNIFICANCE_LEVELS: tuple[float, ...] = (0.05, 0.01, 0.001)

_BLOCK_ELEMENTS = 2_000_000


@dataclass(frozen=True)
class BootstrapResult:
    """Outcome of :func:`paired_bootstrap_test`.

    ``delta`` = mean(run) - mean(baseline) in the metric's own units (negative is an improvement
    for lower-is-better metrics); ``relative_delta`` = delta / mean(baseline) (the percentages of
    paper 001's Table 8), NaN when the baseline mean is 0; ``p_value`` is one-tailed for "run is
    better than baseline".
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

    def stars(self) -> str:
        """'***', '**', '*' or '' as in paper 001's Table 8."""
        levels = self.significant_at.items()
        return "*" * sum(bool(v) for a, v in levels if a in SIGNIFICANCE_LEVELS)


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
        if with_sd:
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
    keys: Sequence[str] = ("mp@1", "map", "amnro"),
    n_resamples: int = 10000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> dict[str, tuple[float, float, float]]:
    """``{key: (mean, low, high)}`` for the given metrics of ``summarize(...)["per_query"]``.

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
) -> BootstrapResult:
    """Paired one-tailed bootstrap test: is ``run`` better than ``baseline``? (paper 001, 5.4).

    ``run`` and ``baseline``: (Q,) per-query values of the same metric on the same queries (same
    order). NaN (open-set) must be at the same positions in both and is dropped.
    ``higher_is_better``: True for P@k, MP@1, AP/MAP, nDCG; **False for MNRO/AMNRO, NMRR/ANMRR and
    NAR** (paper 001: 0 is perfect retrieval, larger values are worse). The method is described in
    the module docstring. Reproducible for a given ``seed``.
    """
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
    n = a.size
    if n < 2:
        raise ValueError(f"the test needs at least 2 evaluated queries, got {n}")
    bcount = _check_resamples(n_resamples)
    d = a - b if higher_is_better else b - a
    z = d - d.mean()
    rng = np.random.default_rng(seed)
    means, sds = _resample_stats(z, bcount, rng, with_sd=studentized)
    if studentized:
        t_obs = float(_t(np.array([d.mean()]), np.array([d.std(ddof=1)]), n)[0])
        t_star = _t(means, sds, n)
    else:
        t_obs = float(d.mean())
        t_star = means
    count = int(np.count_nonzero(t_star >= t_obs))
    p = (1.0 + count) / (bcount + 1.0)
    delta = float(a.mean() - b.mean())
    base = float(b.mean())
    return BootstrapResult(
        p_value=p,
        delta=delta,
        significant_at={float(alpha): bool(p <= alpha) for alpha in levels},
        relative_delta=delta / base if base != 0 else float("nan"),
        n_queries=n,
        n_resamples=bcount,
        higher_is_better=bool(higher_is_better),
        statistic="studentized mean difference" if studentized else "mean difference",
        extra={"t_observed": t_obs},
    )


SIGNIFICANCE_STARS = ((0.001, "***"), (0.01, "**"), (0.05, "*"))


def stars(p: float | None) -> str:
    """'***', '**', '*' for p <= 0.001, 0.01, 0.05; '' otherwise."""
    if p is None or not np.isfinite(p):
        return ""
    return next((s for alpha, s in SIGNIFICANCE_STARS if p <= alpha), "")


def paired_test_by_query(run: dict[str, float], baseline: dict[str, float], higher_is_better: bool = True,
                         seed: int | None = 0) -> BootstrapResult | None:
    """:func:`paired_bootstrap_test` on the queries both runs evaluated (values by query name,
    in the order of ``run``); None when fewer than 2 are common (or the test cannot be computed)."""
    common = [q for q, v in run.items() if q in baseline and v is not None and baseline[q] is not None]
    if len(common) < 2:
        return None
    try:
        return paired_bootstrap_test(np.array([run[q] for q in common], float),
                                     np.array([baseline[q] for q in common], float),
                                     seed=seed, higher_is_better=higher_is_better)
    except ValueError:
        return None
