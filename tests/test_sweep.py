"""ICFRR parameter sweep (core/evaluation/sweep.py): queries described once, same numbers as evaluate()."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from museum_search.core.answer._pipeline import QuerySettings
from museum_search.core.answer._rerank import RerankOptions
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import DESCRIBING, EVALUATING, LOADING, NEIGHBOURS, evaluate
from museum_search.core.evaluation._sweep import (
    SweepPoint,
    SweepStep,
    options_at,
    parse_values,
    sweep,
)
from museum_search.core.progress import Progress
from museum_search.core.progress import drive as run

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"


@pytest.fixture(scope="module")
def eval_data(sample_index, sample_collection):
    """(index, query folder) of the bundled sample collection."""
    return sample_index, sample_collection / "queries"


def same_summary(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float) and math.isnan(a[k]):
            assert math.isnan(b[k]), k
        else:
            assert a[k] == b[k], k


# ---------------------------------------------------------------------------------------------
# values and options (no data needed)


def test_parse_values_lists_and_ranges():
    assert parse_values("1, 2,5") == [1.0, 2.0, 5.0]
    assert parse_values("1:10:3") == [1.0, 4.0, 7.0, 10.0]
    assert parse_values("0:1:0.25", "beta") == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert parse_values("2:4, 3, 8") == [2.0, 3.0, 4.0, 8.0]  # step 1 by default, duplicates dropped
    for bad in ("", "a", "5:1:1", "1:3:0", "0", "1.5"):
        with pytest.raises(MuseumSearchError):
            parse_values(bad, "k")
    with pytest.raises(MuseumSearchError):
        parse_values("-0.5", "beta")


def test_options_at_sets_only_the_swept_parameter():
    base = RerankOptions(k_q=3, k_g=4, beta=0.7, iterations=6, icfrr_mode="reference")
    o = options_at(base, "k", 2)
    assert (o.k_q, o.k_g, o.beta, o.iterations, o.icfrr_mode) == (2, 2, 0.7, 6, "reference")
    o = options_at(base, "beta", 0.25)
    assert (o.k_q, o.k_g, o.beta, o.iterations) == (3, 4, 0.25, 6)
    assert base.k_q == 3 and base.beta == 0.7  # not modified
    with pytest.raises(MuseumSearchError):
        options_at(base, "iterations", 3)


def test_sweep_rejects_bad_requests_before_any_work():
    base = RerankOptions()
    for parameter, values, names in (("gamma", [1], ("icfrr",)), ("k", [], ("icfrr",)), ("k", [1], ("aqe",))):
        gen = sweep(None, None, parameter, values, base, names=names)  # type: ignore[arg-type]
        with pytest.raises(MuseumSearchError):
            next(gen)


# ---------------------------------------------------------------------------------------------
# on real photos


@pytest.mark.data
def test_sweep_equals_evaluate_at_each_value(eval_data):
    from museum_search.core.inference._engines import extractor_for_meta

    index, qdir = eval_data
    qs = load_queryset(qdir)
    extractor = extractor_for_meta(index.meta)
    base = RerankOptions(beta=0.5, iterations=5)
    steps = []
    gen = sweep(index, qs, "k", [1, 2], base, extractor=extractor)
    points = run(gen, steps.append)

    n = len(qs.queries)
    describing = [s for s in steps if isinstance(s, SweepStep) and s.stage == DESCRIBING]
    evaluating = [s for s in steps if isinstance(s, SweepStep) and s.stage == EVALUATING]
    assert [s.done for s in describing] == list(range(1, n + 1)) and {s.total for s in describing} == {n}
    assert all(s.value is None and s.summary is None for s in describing)
    # after each value: counted in answers (queries x values)
    assert [(s.value, s.done, s.total) for s in evaluating] == [(1.0, n, 2 * n), (2.0, 2 * n, 2 * n)]
    # every record says what is happening; the answers' heartbeats name the value
    assert all(isinstance(s, Progress) and s.stage for s in steps)
    others = {s.stage for s in steps if not isinstance(s, SweepStep)} - {DESCRIBING, LOADING, NEIGHBOURS}
    assert others <= {"answering at K_q = K_g = 1", "answering at K_q = K_g = 2"}
    assert [p.value for p in points] == [1.0, 2.0] and all(isinstance(p, SweepPoint) for p in points)
    assert (points[1].options.k_q, points[1].options.k_g, points[1].options.beta) == (2, 2, 0.5)

    for point, step in zip(points, evaluating):
        assert step.summary is point.summary
        report = run(evaluate(index, qs, QuerySettings(rerank="icfrr", options=point.options), extractor=extractor))
        same_summary(point.summary, report.summary)
        for key in ("map", "p@1", "amnro"):
            np.testing.assert_array_equal(point.per_query[key], report.per_query[key])
        assert point.summary["queries"] + point.summary["open_set_queries"] == len(qs.queries)

    # a beta sweep: its point at K = 2, beta = 0.5 is the K sweep's point at K = 2
    points_b = run(sweep(index, qs, "beta", [0.0, 0.5], RerankOptions(k_q=2, k_g=2, iterations=5), extractor=extractor))
    assert [p.options.beta for p in points_b] == [0.0, 0.5]
    same_summary(points_b[1].summary, points[1].summary)  # k=2, beta=0.5 either way
    for p in points_b:
        assert 0.0 <= p.summary["map"] <= 1.0 and 0.0 <= p.summary["amnro"] <= 1.0


@pytest.mark.data
def test_closing_a_sweep_stops_it(eval_data):
    from museum_search.core.inference._engines import extractor_for_meta

    index, qdir = eval_data
    qs = load_queryset(qdir)
    gen = sweep(index, qs, "beta", [0.1, 0.2, 0.3], RerankOptions(), extractor=extractor_for_meta(index.meta))
    first = next(gen)
    while not isinstance(first, SweepStep):  # heartbeats while the first photo is described
        first = next(gen)
    assert first.stage == DESCRIBING and first.done == 1
    gen.close()  # no exception, nothing left running
    with pytest.raises(StopIteration):
        next(gen)
