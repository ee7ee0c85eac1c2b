"""Waiting for an evaluation (core): a steady ETA, calls that do not hold a cancel back, stage names
that say what is happening, the first answer after one photo, and core's ICFRR warning."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings
from museum_search.core.answer._rerank import RerankOptions, icfrr_advice
from museum_search.core.evaluation import _runner as runner
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import (
    DESCRIBING,
    EVALUATING,
    LOADING,
    NEIGHBOURS,
    SEARCHING,
    VERIFYING,
    EvalStep,
    evaluate,
    run_evaluation,
)
from museum_search.core.evaluation._sweep import sweep, sweep_advice
from museum_search.core.index._store import Index
from museum_search.core.progress import EtaEstimator, Progress, wait, with_eta

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"


# ---------------------------------------------------------------------------------------------
# the ETA


def _readings(seq, estimator=None):
    """(old, smoothed) ETA after each (elapsed, done, total) of ``seq``."""
    est = estimator or EtaEstimator()
    old, new = [], []
    for t, d, n in seq:
        p = Progress(d, n, elapsed=t)
        old.append(p.eta)
        new.append(est.update(p))
        assert p.eta == new[-1]  # the record carries the smoothed ETA
    return np.array(old, float), np.array(new, float)


def test_eta_does_not_jump_when_answers_come_in_bursts():
    """The old runner answered 8 queries per batch: 8 records at the same moment every 4 s. The
    ETA extrapolated from done/elapsed then jumped by tens of seconds inside one burst."""
    seq = [(4.0 * b, 8 * (b - 1) + i, 80) for b in range(1, 11) for i in range(1, 9)]
    truth = np.array([40.0 - t for t, _d, _n in seq])
    old, new = _readings(seq)
    assert np.isnan(new[:8]).all()  # no estimate before two moments were seen
    assert np.max(np.abs(old[1:8] - old[:7])) > 100  # the old one swung from 316 s to 36 s
    same_moment = np.array([False] + [seq[i][0] == seq[i - 1][0] for i in range(1, len(seq))])
    # within one burst (one moment): the old ETA falls by 30 s (63 s to 32 s in the second);
    # the smoothed one does not move (the last record, done = total, says 0)
    old_ranges = [np.ptp(old[8 * b: 8 * b + 8]) for b in range(1, 10)]
    new_ranges = [np.ptp(new[8 * b: min(8 * b + 8, 79)]) for b in range(1, 10)]
    assert old_ranges[0] > 30 and max(new_ranges) == 0
    # from one burst to the next it counts down by the time that passed, give or take a second
    firsts = [i for i in range(9, len(seq)) if not same_moment[i]]
    assert max(abs((new[i - 1] - new[i]) - 4.0) for i in firsts[1:]) < 1.0
    # and it is within half a burst of the truth
    assert np.nanmax(np.abs(new - truth)) <= 4.0
    assert new[-1] == 0.0


def test_eta_follows_a_new_rate_within_its_window():
    """A slow first step (loading) then 0.5 s per step; later the machine gets busy (2 s per step).
    The rate since the start lags both changes; the windowed, smoothed ETA follows them."""
    seq, t = [], 10.0
    seq.append((t, 1, 100))
    for d in range(2, 61):
        t += 0.5
        seq.append((t, d, 100))
    for d in range(61, 100):
        t += 2.0
        seq.append((t, d, 100))
    old, new = _readings(seq)

    def rate_now(i):  # seconds left at the rate of the moment
        d = seq[i][1]
        return (0.5 if d < 60 else 2.0) * (100 - d)

    # right after the slow first step: the old ETA says 514 s for 49 s of work
    assert old[1] > 5 * rate_now(1) and abs(new[1] - rate_now(1)) < 0.05 * rate_now(1)
    i = 40  # 20 s into the fast part
    assert abs(old[i] - rate_now(i)) > 0.4 * rate_now(i) and abs(new[i] - rate_now(i)) < 0.05 * rate_now(i)
    j = 80  # 40 s after the machine got busy
    assert abs(old[j] - rate_now(j)) > 0.4 * rate_now(j) and abs(new[j] - rate_now(j)) < 0.1 * rate_now(j)


def test_eta_starts_again_with_a_new_stage_and_knows_nothing_of_unknown_lengths():
    est = EtaEstimator()
    loading = Progress(0, 0, stage=LOADING, elapsed=3.0)
    assert est.update(loading) is None and loading.eta is None
    assert est.update(Progress(0, 10, elapsed=0.5)) is None  # nothing done yet
    assert est.update(Progress(5, 10, elapsed=5.0)) == pytest.approx(4.5)  # 5 steps in 4.5 s
    # a new stage: its counts start again (done goes back); the old rate is forgotten
    first = Progress(1, 10, stage="local features", elapsed=0.1)
    assert est.update(first) is None and first.eta is None  # not the 0.9 s extrapolated
    # different names with the same counts are one stage (an evaluation's heartbeats)
    assert est.update(Progress(2, 10, stage=DESCRIBING, elapsed=0.2)) == pytest.approx(0.8)
    assert est.update(Progress(2, 10, stage=VERIFYING, elapsed=0.2)) == pytest.approx(0.8)
    assert est.update(Progress(10, 10, elapsed=1.0)) == 0.0


def test_with_eta_fills_in_the_records_and_closes_the_generator():
    closed = []

    def gen():
        try:
            for d in range(1, 4):
                yield Progress(d, 10, elapsed=float(d))
            yield "a message"
            return "result"
        finally:
            closed.append(True)

    items = []
    g = with_eta(gen())
    try:
        while True:
            items.append(next(g))
    except StopIteration as stop:
        assert stop.value == "result"
    assert [p.eta for p in items[:3]] == [None, pytest.approx(8.0), pytest.approx(7.0)]
    assert items[3] == "a message" and closed == [True]
    g2 = with_eta(gen())
    next(g2)
    g2.close()
    assert closed == [True, True]


# ---------------------------------------------------------------------------------------------
# waiting for a long call


def test_wait_yields_heartbeats_and_returns_the_result():
    release = threading.Event()
    beats = []
    g = wait(lambda: (release.wait(10), 42)[1], lambda: Progress(0, 0, stage="working"), interval=0.01)
    beats.append(next(g))  # the call is still running: a heartbeat
    assert beats[0].stage == "working"
    release.set()
    try:
        while True:
            beats.append(next(g))
    except StopIteration as stop:
        assert stop.value == 42


def test_wait_raises_the_calls_error_even_a_timeout():
    for exc in (ValueError("bad"), TimeoutError("its own")):
        def boom(exc=exc):
            raise exc

        g = wait(boom, Progress(0, 0), interval=0.01)
        with pytest.raises(type(exc), match=str(exc)):
            while True:
                next(g)


def test_closing_a_wait_does_not_wait_for_the_call():
    """A cancel stops the job while the call still runs (it finishes on its own thread)."""
    release, finished = threading.Event(), threading.Event()

    def slow():
        release.wait(30)
        finished.set()
        return "loaded"

    g = wait(slow, Progress(0, 0, stage=LOADING), interval=0.01, announce=True)
    assert next(g).stage == LOADING
    g.close()  # returns at once although the call has not finished
    assert not finished.is_set()
    release.set()
    assert finished.wait(10)


def test_calls_with_the_same_key_are_made_once():
    calls, release = [], threading.Event()

    def load():
        calls.append(1)
        release.wait(10)
        return object()

    first = wait(load, Progress(0, 0), key=("test-key",), interval=0.01, announce=True)
    next(first)
    first.close()  # cancelled while loading
    second = wait(load, Progress(0, 0), key=("test-key",), interval=0.01)  # started again
    release.set()
    result = None
    try:
        while True:
            next(second)
    except StopIteration as stop:
        result = stop.value
    assert result is not None and calls == [1]


# ---------------------------------------------------------------------------------------------
# the runner and the sweep: stages, the first answer, cancelling in every phase


@pytest.fixture(scope="module")
def queries():
    return load_queryset(SAMPLE / "queries")


def _drain(gen):
    items = []
    try:
        while True:
            items.append(next(gen))
    except StopIteration as stop:
        return items, stop.value


@pytest.mark.data
def test_runner_names_its_stages_and_answers_the_first_query_alone(sample_index, queries, monkeypatch):
    sizes = []
    describe = QueryPipeline.embed
    monkeypatch.setattr(QueryPipeline, "embed", lambda self, qs: (sizes.append(len(qs)), describe(self, qs))[1])
    items, report = _drain(evaluate(sample_index, queries, QuerySettings(regions=False, verify=False),
                                    batch_size=4))
    n = len(queries.queries)
    steps = [p for p in items if isinstance(p, EvalStep)]
    assert [s.done for s in steps] == list(range(1, n + 1)) and all(s.stage == EVALUATING for s in steps)
    assert {p.stage for p in items if not isinstance(p, EvalStep)} <= {LOADING, DESCRIBING, SEARCHING}
    # the first photo is described alone, then batches of 4: the first record comes after one photo
    assert sizes[0] == 1 and sizes[1:] == [4] * (len(sizes) - 2) + [sizes[-1]] and sum(sizes) == n
    # the same figures as answering in batches (per-query answers are independent of the batch)
    again = run_evaluation(sample_index, queries, QuerySettings(regions=False, verify=False), batch_size=8)
    for key in ("mp@1", "map", "amnro"):
        assert report.summary[key] == pytest.approx(again.summary[key], abs=1e-12)


def _cancel_while(gen, blocked, stage: str) -> None:
    """Advance ``gen`` until the blocked call runs and a record of ``stage`` comes, then close it:
    the close must not wait for the call."""
    try:
        while True:
            item = next(gen)
            if blocked.started.is_set() and isinstance(item, Progress) and item.stage == stage:
                break
        gen.close()
        assert not blocked.release.is_set()  # closed while the call was still blocked
        with pytest.raises(StopIteration):
            next(gen)
    finally:
        blocked.release.set()


@pytest.mark.data
def test_an_evaluation_stops_in_every_phase(sample_index, queries, monkeypatch, block):
    settings = QuerySettings(regions=False, verify=True, rerank="icfrr")
    # loading the network
    _cancel_while(evaluate(sample_index, queries, settings), block(runner, "extractor_for_meta"), LOADING)
    monkeypatch.undo()
    # the neighbour lists ICFRR needs (as if the index had none stored)
    fresh = Index.load(sample_index.path)
    monkeypatch.setattr(Index, "has_neighbours", lambda self, k: False)
    _cancel_while(evaluate(fresh, queries, settings), block(fresh, "neighbour_lists"), NEIGHBOURS)
    monkeypatch.undo()
    # describing the photos, then answering them (search, ICFRR, verification)
    _cancel_while(evaluate(sample_index, queries, settings), block(QueryPipeline, "embed"), DESCRIBING)
    monkeypatch.undo()
    _cancel_while(evaluate(sample_index, queries, settings), block(QueryPipeline, "answer"), VERIFYING)


@pytest.mark.data
def test_a_sweep_stops_while_describing_and_while_answering(sample_index, queries, monkeypatch, block):
    settings = QuerySettings(regions=False, verify=False)
    _cancel_while(sweep(sample_index, queries, "k", [1, 2], settings=settings), block(QueryPipeline, "embed"),
                  DESCRIBING)
    monkeypatch.undo()
    _cancel_while(sweep(sample_index, queries, "k", [1, 2], settings=settings), block(QueryPipeline, "answer"),
                  "answering at K_q = K_g = 1")


# ---------------------------------------------------------------------------------------------
# can ICFRR help this collection? (core decides; the tabs show it)


def test_icfrr_advice_decides_from_the_photos_per_object():
    one = [f"o{i}" for i in range(10)]
    two = [f"o{i}" for i in range(10) for _ in range(2)]
    four = [f"o{i}" for i in range(10) for _ in range(4)]
    by_hand = RerankOptions(k_q=3, k_g=3)
    # one photo per object: no K helps (MP@1 0.80 → 0.30 at K = 2 on the paintings)
    assert "cannot help" in icfrr_advice(one) and "cannot help" in icfrr_advice(one, by_hand)
    # two per object: the suggested K = 1 hurts, K set by hand may help
    assert icfrr_advice(two) is not None and icfrr_advice(two, by_hand) is None
    assert icfrr_advice(four) is None and icfrr_advice(four, by_hand) is None
    # a sweep of K sets K by hand; a sweep of beta keeps the suggested K
    assert sweep_advice(two, "k") is None and sweep_advice(two, "beta") is not None
    assert sweep_advice(one, "k") is not None


@pytest.mark.data
def test_the_report_says_when_icfrr_cannot_help(single_photo_index, sample_index, queries):
    plain = QuerySettings(regions=False, verify=False)
    icfrr = QuerySettings(regions=False, verify=False, rerank="icfrr")
    rep = run_evaluation(single_photo_index, queries, icfrr)
    assert rep.summary["icfrr_advice"] == icfrr_advice(single_photo_index.labels)
    assert "cannot help" in rep.summary["icfrr_advice"]
    assert run_evaluation(single_photo_index, queries, plain).summary["icfrr_advice"] is None
    assert run_evaluation(sample_index, queries, icfrr).summary["icfrr_advice"] is None  # 3-4 photos per object
    points = _drain(sweep(single_photo_index, queries, "k", [1, 3], settings=plain))[1]
    assert all("cannot help" in p.summary["icfrr_advice"] for p in points)
