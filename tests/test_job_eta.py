"""The whole job's step and time left (core.progress.JobEta), on simulated stage sequences whose
rates are known, and the build and update plans core declares (core.indexing)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from museum_search.core.progress import EtaEstimator, JobEta, PlannedStage, Progress, with_plan

PLAN = (PlannedStage("describing", 1.0), PlannedStage("local features", 4.0),
        PlannedStage("neighbours", 0.02), PlannedStage("calibrating", 30.0, lambda n: n // 2))


def simulate(stages, start=0.0):
    """Records of stages run one after the other: (name, steps, seconds per step); yields
    (record, the job's true seconds left at that record)."""
    total_time = start + sum(n * dt for _, n, dt in stages)
    now = start
    for name, n, dt in stages:
        for i in range(1, n + 1):
            yield Progress(i, n, elapsed=i * dt, stage=name), total_time - (now + i * dt)
        now += n * dt


def run(plan, stages, expected=None):
    job = JobEta(plan)
    if expected:
        job.update(Progress(0, 0, stage="listing", expected=expected))
    out = []
    for p, truth in simulate(stages):
        job.update(p)
        out.append((p, truth))
    return out


@pytest.mark.parametrize("speed", [0.5, 3.0])
def test_job_eta_is_exact_when_the_stages_run_at_the_planned_cost_ratios(speed):
    # 10 photos at `speed` s each; each later stage costs what the plan says, relative to describing
    stages = [("describing", 10, speed), ("local features", 10, 4 * speed), ("neighbours", 10, 0.02 * speed),
              ("calibrating", 5, 30 * speed)]
    records = run(PLAN, stages)
    for p, truth in records:
        assert p.job_eta == pytest.approx(truth, rel=1e-6, abs=1e-6), (p, truth)
    # already at the first photo described, the whole build's time left is known: far more than the
    # describing stage's own (which a per-step ETA showed)
    first, truth = records[0]
    assert first.job_eta == pytest.approx(truth) and first.job_eta > 20 * (first.total - first.done) * speed
    assert records[-1][0].job_eta == 0.0
    assert [p.step for p, _ in records] == [1] * 10 + [2] * 10 + [3] * 10 + [4] * 5
    assert {p.steps for p, _ in records} == {4}


def test_job_eta_follows_the_measured_rate_of_a_stage_slower_than_planned():
    # local features run at twice the planned cost: the estimate made while describing is short by
    # that, and once they run the rate measured on them moves the calibration's estimate too
    stages = [("describing", 10, 1.0), ("local features", 10, 8.0), ("calibrating", 5, 30.0)]
    records = run(PLAN, stages)
    during_describing = records[4][0].job_eta
    truth = records[4][1]
    assert during_describing < truth
    planned_rest = 5 * 1.0 + 10 * 4.0 + 5 * 30.0  # 5 photos, local features, calibration at the plan's ratios
    assert during_describing == pytest.approx(planned_rest + 0.02 * 10, rel=1e-6)
    end_of_features = records[19][0]
    rate = (10 * 1.0 + 10 * 8.0) / (10 * 1.0 + 10 * 4.0)  # seconds per unit of cost, as measured
    assert end_of_features.job_eta == pytest.approx(rate * (0.02 * 10 + 30 * 5), rel=1e-6)
    # in the last stage its own measured rate takes over, step by step (each reading moves the
    # estimate by the share its error gives it, never by more than the estimate's own band), and
    # the truth is inside the band shown all along
    last = [(p, truth) for p, truth in records if p.stage == "calibrating"]
    errors = [abs(p.job_eta - truth) for p, truth in last]
    assert errors[0] > 50 and all(b <= a for a, b in zip(errors, errors[1:])) and errors[-1] == 0.0
    assert all(abs(p.job_eta - truth) <= 2 * p.job_eta_band for p, truth in last[:-1])


def test_expected_totals_replace_the_plans_guess_and_skipped_stages_are_not_counted():
    # the job says before calibrating how many views it will ask (3, not the plan's n // 2 = 5); it
    # has no neighbour lists (a stage of 0 units: never run, not a step)
    plan = PLAN[:2] + (PlannedStage("neighbours", 0.02, lambda n: 0),) + PLAN[3:]
    stages = [("describing", 10, 1.0), ("local features", 10, 4.0), ("calibrating", 3, 30.0)]
    records = run(plan, stages, expected={"calibrating": 3})
    for p, truth in records:
        assert p.job_eta == pytest.approx(truth, rel=1e-6)
        assert p.steps == 3
    assert [p.step for p, _ in records] == [1] * 10 + [2] * 10 + [3] * 3


def test_unplanned_stages_records_of_unknown_length_and_a_job_that_skips_the_first_stage():
    job = JobEta(PLAN)
    loading = Progress(0, 0, stage="loading the network")
    assert job.update(loading) is None and loading.step == 0 and loading.steps == 4
    for p, _ in simulate([("describing", 4, 1.0)]):
        job.update(p)
    left = p.job_eta
    assert left == pytest.approx(4 * 4.0 + 0.02 * 4 + 30 * 2)
    beat = Progress(0, 0, stage="saving")  # a heartbeat of unknown length keeps the estimate
    assert job.update(beat) == left and beat.step == 0
    # a stage not in the plan: the current step's, its own time left (once it has one) added
    odd = Progress(1, 4, elapsed=1.0, stage="training the approximate index")
    assert job.update(odd) is None and odd.step == 1
    odd = Progress(2, 4, elapsed=2.0, stage="training the approximate index")
    job.update(odd)
    assert odd.step == 1 and odd.job_eta == pytest.approx(2.0 + left)

    # an update with nothing to describe starts at the neighbour lists: n = 0, no describing step
    job = JobEta(PLAN)
    first = Progress(1, 10, elapsed=0.1, stage="neighbours")
    job.update(first)
    assert job.n == 0 and first.step == 1 and first.steps == 1
    assert math.isclose(first.job_eta, 0.9)


def test_with_plan_fills_the_records_and_returns_the_result():
    def job():
        for p, _ in simulate([("describing", 3, 1.0), ("local features", 3, 4.0)]):
            yield p
        return "done"

    gen = with_plan(job(), PLAN[:2])
    records = []
    while True:
        try:
            records.append(next(gen))
        except StopIteration as stop:
            assert stop.value == "done"
            break
    assert [p.step for p in records] == [1, 1, 1, 2, 2, 2]
    assert records[0].job_eta == pytest.approx(2 + 12)


def test_build_and_update_plans_come_from_the_stages_core_runs():
    from museum_search.core.index import _approximate, _modes
    from museum_search.core.jobs._indexing import BUILD_STAGES, STAGE_COSTS, build_plan, calibration_views

    plan = build_plan(matcher="sift")
    assert tuple(s.stage for s in plan if s.size(42) > 0) == BUILD_STAGES
    assert [s.stage for s in build_plan(verification=False, matcher="sift")][:1] == ["describing"]
    assert all(s.cost == STAGE_COSTS[s.stage] for s in plan)
    # the approximate index's stages run from AUTO_MIN_REFERENCES references (or always with "yes")
    train = next(s for s in plan if s.stage == _approximate.TRAIN_STAGE)
    assert train.size(42) == 0 and train.size(_modes.AUTO_MIN_REFERENCES) > 0
    assert next(s for s in build_plan(ann="yes", matcher="sift") if s.stage == _approximate.TRAIN_STAGE).size(42) == 42
    # the calibration's views: the sample's 42 photos of 11 objects ask 42 synthetic and 42 real ones
    calib = next(s for s in plan if s.stage == "calibrating")
    labels = [i // 4 for i in range(42)]
    assert calibration_views(labels) == 84 <= calib.size(42)
    assert calibration_views(list(range(287))) == 50  # one photo per object: no real views
    assert calibration_views([0] * 5) == 0  # one object cannot be calibrated
    assert [s.stage for s in build_plan(matcher="auto")].count("calibrating") == 2
    # on a Ray cluster the first stage is the cluster's, which also computes the local features
    from museum_search.core.jobs._distributed import STAGE

    ray = build_plan(matcher="sift", ray=True)
    assert ray[0].stage == STAGE and "local features" not in [s.stage for s in ray]
    assert ray[0].cost == STAGE_COSTS["describing"] + STAGE_COSTS["local features"]


def test_a_real_build_job_says_its_step_and_whole_time_left(tmp_path, sample_collection):
    """build_job on real photos (one object: no calibration views) fills in the step, the number of
    steps that run and the whole build's time left on its records."""
    import shutil

    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.jobs._indexing import build_job

    coll = tmp_path / "coll"
    coll.mkdir()
    photos = sorted((sample_collection / "collection").glob("valley_at_dusk-*.jpg"))
    for f in photos:
        shutil.copy2(f, coll / f.name)
    (coll / "catalogue.csv").write_text("file,instance\n" + "".join(f"{f.name},valley\n" for f in photos))
    records = []
    gen = build_job(coll, tmp_path / "idx", BackboneConfig(size=64),
                    LabellingSpec("catalogue", str(coll / "catalogue.csv")), batch_size=1)
    while True:
        try:
            p = next(gen)
        except StopIteration as stop:
            report = stop.value
            break
        records.append((p.stage, p.done, p.total, p.step, p.steps, p.job_eta))
    assert len(report.index) == len(photos) >= 3
    counted = [r for r in records if r[2] > 0]
    # describing, local features, neighbour lists; calibration has no views (one object): not a step
    assert [r[0] for r in counted][0] == "describing" and {r[4] for r in counted} == {3}
    assert {r[0]: r[3] for r in counted} == {"describing": 1, "local features": 2,
                                            "finding each reference's nearest neighbours": 3}
    assert all(r[5] is not None and r[5] >= 0 for r in counted[1:])
    assert counted[-1][5] == 0.0
    # while describing, the time left counts the local features to come (4x a photo's cost each)
    describing = [r for r in counted if r[0] == "describing" and r[1] < r[2]]
    assert describing and all(r[5] is not None for r in describing[1:])


def _noisy_stage(seed=0):
    """(elapsed, done, total) of a stage that starts slowly, answers in bursts of 4 at the same
    moment, and whose speed halves two thirds of the way (the machine gets busy)."""
    rng = np.random.default_rng(seed)
    t, d, out = 3.0, 0, [(0.0, 0, 120)]
    while d < 120:
        t += 4 * (0.5 if d < 80 else 1.0) * rng.uniform(0.6, 1.4)
        for _ in range(4):
            d += 1
            out.append((t, d, 120))
        out.append((t + 0.05, d, 120))  # a heartbeat
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_estimate_never_jumps_by_more_than_its_own_band(seed):
    """Between two records the estimate counts down with the clock; a reading moves it by at most
    the error band it had then (its band grown by the time passed), never more."""
    est = EtaEstimator()
    prev = None
    moves = []
    for t, d, n in _noisy_stage(seed):
        p = Progress(d, n, elapsed=t)
        eta = est.update(p)
        if eta is None or d >= n:
            continue
        if prev is not None:
            pt, peta, pband = prev
            dt = t - pt
            counted = max(0.0, peta - dt)
            grown = math.sqrt(pband ** 2 + (est.drift * counted) ** 2 * dt / est.smoothing)
            assert abs(eta - counted) <= grown + 1e-9, (t, d, eta, counted, grown)
            moves.append(abs(eta - counted))
        prev = (t, eta, p.eta_band)
    assert max(moves) > 0  # it does follow its readings


def test_after_the_speed_changes_the_estimate_follows_within_its_window():
    seq = _noisy_stage(0)
    est = EtaEstimator()
    for t, d, n in seq:
        p = Progress(d, n, elapsed=t)
        est.update(p)
        if d == 110 and t == max(tt for tt, dd, _ in seq if dd == 110):
            # 30 steps after the machine got busy: at about 1 s a step now (10 steps left)
            assert 10 * 0.6 <= p.eta <= 10 * 1.4 + 2 * p.eta_band


def test_time_left_is_a_number_a_range_or_nothing_by_its_band():
    from museum_search.core.progress import time_left

    p = Progress(5, 10, elapsed=5.0)
    p.smoothed_eta, p.eta_band = 100.0, 10.0  # ±10 %: one number
    assert time_left(p) == (100.0, 100.0)
    p.eta_band = 40.0  # ±40 %: the range it may be in, on round figures
    low, high = time_left(p)
    assert low <= 60 and high >= 140 and low % 30 == 0 and high % 30 == 0
    p.eta_band = 90.0  # too uncertain to say anything
    assert time_left(p) is None
    p.smoothed_eta, p.eta_band = 4.0, 1.5  # a few seconds: the number
    assert time_left(p) == (4.0, 4.0)
    # a job's whole time left, when a JobEta filled it in
    job = Progress(1, 10, elapsed=1.0)
    job.steps, job.job_eta, job.job_eta_band = 3, 50.0, 5.0
    assert time_left(job) == (50.0, 50.0)


def test_a_stage_costlier_than_planned_starts_from_the_plan_with_a_band_that_holds_the_truth():
    # calibration runs at 1.8x its planned cost (within two of the plan's error bands,
    # progress.PLAN_ERROR): when it starts, the job's time left is the plan's, its band wide enough
    # to hold the truth; the estimate then climbs to it
    stages = [("describing", 10, 1.0), ("local features", 10, 4.0), ("calibrating", 10, 54.0)]
    plan = PLAN[:2] + (PlannedStage("calibrating", 30.0, lambda n: n),)
    records = run(plan, stages)
    first = next((p, truth) for p, truth in records if p.stage == "calibrating")
    p, truth = first
    assert p.job_eta < truth <= p.job_eta + 2 * p.job_eta_band
    later = [(p, truth) for p, truth in records if p.stage == "calibrating" and p.done >= 4]
    assert all(abs(p.job_eta - truth) < 0.3 * truth for p, truth in later[:-1])
