"""One progress record for every long job, and one way to drive a progress generator.

Long work in core (indexing, local features, calibration, evaluation, sweeps) is a generator that
yields :class:`Progress` records and returns its result; the CLI draws them with tqdm, the GUI runs
the generator on a worker thread (``gui/workers.py``). Closing the generator cancels the job.

A generator can only be stopped where it yields, so a single call that runs for seconds (loading
a network, describing a batch of photos, verifying a photo's shortlist) would hold a cancel back:
:func:`wait` runs such a call on a helper thread and yields a heartbeat record while it runs, so a
job stops within one heartbeat (0.1 s) in every phase.

``Progress.eta`` extrapolates the stage's rate so far; :class:`EtaEstimator` gives a steadier one
(the rate over a recent window, smoothed in time), which the GUI's worker fills in. A job of several
counted stages (a build: describing, local features, neighbour lists, calibration) declares them
with their relative costs (:class:`PlannedStage`); :class:`JobEta` (:func:`with_plan`) then fills in
the step and the time left in the *whole* job (``Progress.step``, ``steps``, ``job_eta``).
"""

from __future__ import annotations

import atexit
import math
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Callable, Generator, Hashable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
P = TypeVar("P", bound="Progress")

#: Seconds between heartbeats while :func:`wait` waits (the longest a cancel waits for).
HEARTBEAT = 0.1


@dataclass
class Progress:
    """``done`` of ``total`` steps of ``stage``; the file (or query) just handled; new skips.

    ``total == 0``: a step of unknown length (e.g. "loading the network"); ``stage`` says what is
    happening in words a user reads.
    """

    done: int
    total: int
    current: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason), new since last
    elapsed: float = 0.0  # seconds since this stage started
    stage: str = "describing"
    #: a steadier estimate of :attr:`eta`, filled in by an :class:`EtaEstimator` (None: not set;
    #: NaN: the estimator does not know yet)
    smoothed_eta: float | None = field(default=None, repr=False, compare=False)
    #: the step of the whole job this record belongs to (1-based) and how many steps the job has,
    #: filled in by a :class:`JobEta` (0: not known, or a step outside the job's plan)
    step: int = field(default=0, repr=False, compare=False)
    steps: int = field(default=0, repr=False, compare=False)
    #: seconds left in the whole job (this step and the steps to come), filled in by a
    #: :class:`JobEta`; None: not known (yet)
    job_eta: float | None = field(default=None, repr=False, compare=False)
    #: the error of :attr:`smoothed_eta` and of :attr:`job_eta` (seconds, one standard deviation),
    #: filled in with them (None: not known)
    eta_band: float | None = field(default=None, repr=False, compare=False)
    job_eta_band: float | None = field(default=None, repr=False, compare=False)
    #: how many steps stages still to come will take (stage → total), when the job knows it before
    #: they start (e.g. the calibration's views, once the photos are labelled); read by :class:`JobEta`
    expected: dict[str, int] | None = field(default=None, repr=False, compare=False)

    @property
    def eta(self) -> float | None:
        """Seconds left in this stage: the smoothed estimate when one was filled in, else the
        stage's rate so far extrapolated (None before the first step)."""
        if self.smoothed_eta is not None:
            return None if math.isnan(self.smoothed_eta) else self.smoothed_eta
        if self.done <= 0 or self.elapsed <= 0:
            return None
        return self.elapsed / self.done * max(0, self.total - self.done)

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


#: The least relative error of a reading however many steps it was measured on: the readings of
#: one window share most of their steps, and a job's speed moves (calibration's views are not alike).
READING_FLOOR = 0.1
#: Once this many steps ended after a stage's first, the time of the first (often slow: a warm-up) is
#: left out of the stage's rate.
WARM_STEPS = 5


class _Steady:
    """A time left that counts down steadily, corrected by readings in proportion to how much
    each is worth (a one-dimensional Kalman filter on the seconds left).

    The estimate carries its own error (``sd``, seconds): a reading of ``reading`` seconds worth
    ``sd_reading`` moves it by the share its error leaves (``k``), and never by more than the
    estimate's own error at that moment, so the time shown never jumps by more than the band it
    claims; in between readings it counts down with the clock and its error grows with the time
    passed (``drift``: how far a job's speed may move, relative, in ``horizon`` seconds)."""

    def __init__(self, drift: float, horizon: float):
        self.drift, self.horizon = drift, horizon
        self.eta: float | None = None
        self.var = 0.0
        self.at = 0.0

    def start(self, eta: float, sd: float, at: float) -> None:
        self.eta, self.var, self.at = max(0.0, eta), sd * sd, at

    def predict(self, at: float) -> float:
        """The estimate at ``at``: counted down since the last one, its error grown with the time passed."""
        assert self.eta is not None
        dt = max(0.0, at - self.at)
        self.eta = max(0.0, self.eta - dt)
        if self.horizon > 0:
            self.var += (self.drift * self.eta) ** 2 * dt / self.horizon
        self.at = max(self.at, at)
        return self.eta

    def correct(self, reading: float, sd_reading: float) -> float:
        assert self.eta is not None
        r_var = max(sd_reading * sd_reading, 1e-9)
        k = self.var / (self.var + r_var) if self.var + r_var > 0 else 1.0
        band = math.sqrt(self.var)
        step = min(band, max(-band, k * (reading - self.eta)))
        self.eta = max(0.0, self.eta + step)
        self.var = (1.0 - k) * self.var
        return self.eta

    @property
    def sd(self) -> float:
        return math.sqrt(max(self.var, 0.0))


class EtaEstimator:
    """A steady, honest ETA for a sequence of :class:`Progress` records of one job.

    ``elapsed / done`` since the start of a stage swings when steps come in bursts (a batch of
    answers at once), and lags when the rate changes (a slow first step that loads something, a
    machine that gets busy). Here each new step done gives a reading: the steps left at the rate
    over the last ``window`` seconds of the stage (from the first record of its oldest moment),
    worth more the more steps it was measured on (its relative error ``1/sqrt(steps)``). The
    estimate counts down with the clock and moves towards each reading by the share their errors
    give it (:class:`_Steady`), never by more than its own error band (``Progress.eta_band``), so a
    first reading spoilt by a slow first step is left behind within a few steps, and a new rate
    takes over within a few seconds (``smoothing``: the time in which the job's speed may drift by
    ``drift``). Records that come at the same moment (a burst) do not move it, and while no step
    ends the reading only keeps it from counting below what the time already spent says.
    There is no estimate before two records at different times (unless :meth:`prime` gave one).

    The stage starts again (its readings are forgotten) when ``total`` changes, or ``done`` or
    ``elapsed`` go back; records with ``total == 0`` have no ETA. Records of different ``stage``
    names with the same counts are one stage (an evaluation's "describing" and "verifying"
    heartbeats count the same queries).
    """

    def __init__(self, window: float = 15.0, smoothing: float = 3.0, drift: float = 0.3):
        self.window = float(window)
        self.smoothing = float(smoothing)
        self.drift = float(drift)
        self._prior: tuple[float, float] | None = None
        self._reset(None)

    def _reset(self, total: int | None) -> None:
        self._total = total
        self._samples: deque[tuple[float, int]] = deque()  # (elapsed, done): the first record of each moment
        self._last: tuple[float, int] | None = None
        self._filter = _Steady(self.drift, self.smoothing)
        self._read_done, self._read_at = -1, -math.inf  # ``done`` and time of the last reading taken in
        self._warm: tuple[float, int] | None = None  # (elapsed, done) when the stage's first step ended

    def prime(self, eta: float, sd: float) -> None:
        """What the next stage's time left is believed to be before it has a reading of its own
        (e.g. its steps at the job's measured rate and planned cost), ``sd`` its error (seconds)."""
        self._prior = (float(eta), float(sd))

    @property
    def band(self) -> float | None:
        """The error of the estimate (seconds, one standard deviation); None while unknown."""
        return None if self._filter.eta is None else self._filter.sd

    def _reading(self, t: float, d: int, total: int) -> tuple[float, float] | None:
        """The time left at the rate over the window, and its error; None before a step ended in it."""
        t0, d0 = self._samples[0]
        if self._warm is not None and d0 < self._warm[1] and d - self._warm[1] >= WARM_STEPS:
            t0, d0 = self._warm  # the stage's first step (a warm-up: caches filled, a model loaded) left out
        if d <= d0 or t <= t0:
            return None
        left = (total - d) * (t - t0) / (d - d0)
        return left, left * max(READING_FLOOR, 1.0 / math.sqrt(d - d0))

    def update(self, p: Progress) -> float | None:
        """The ETA after ``p`` (seconds), also stored in ``p.smoothed_eta`` (its error in
        ``p.eta_band``); None while unknown (before two records at different times in the stage)."""
        if p.total <= 0:
            p.smoothed_eta = math.nan
            return None
        t, d = float(p.elapsed), int(p.done)
        if p.total != self._total or (self._last is not None and (d < self._last[1] or t < self._last[0])):
            self._reset(p.total)
        self._last = (t, d)
        f = self._filter
        if d >= p.total:
            f.start(0.0, 0.0, t)
            p.smoothed_eta, p.eta_band = 0.0, 0.0
            return 0.0
        if not self._samples or self._samples[-1][0] < t:
            self._samples.append((t, d))
        if self._warm is None and d > self._samples[0][1] and t > self._samples[0][0]:
            self._warm = (t, d)  # the first record of the moment the first step(s) ended
        while len(self._samples) > 2 and self._samples[1][0] <= t - self.window:
            self._samples.popleft()
        reading = self._reading(t, d, p.total)
        if f.eta is None:
            if self._prior is not None:
                f.start(*self._prior, at=t)
                self._prior = None
            elif reading is None:
                p.smoothed_eta = math.nan
                return None
            else:
                f.start(reading[0], reading[1], t)
                self._read_done, self._read_at = d, t
        predicted = f.predict(t)
        if reading is not None and d > self._read_done and t > self._read_at:  # a step ended: a new reading
            f.correct(*reading)
            self._read_done, self._read_at = d, t
        elif reading is not None and reading[0] > predicted and t > self._read_at:  # no step ended for longer than the rate says
            f.correct(*reading)
        p.smoothed_eta, p.eta_band = f.eta, f.sd
        return f.eta


#: A time left is shown as one number when its error band is at most this share of it (or
#: :data:`PRECISE_SECONDS`), as a range while wider, and not at all while wider than :data:`UNKNOWN_SHARE`.
PRECISE_SHARE = 0.2
PRECISE_SECONDS = 2.0
UNKNOWN_SHARE = 0.8


def time_left(p: Progress) -> tuple[float, float] | None:
    """What a view shows of the time left after ``p``: ``(low, high)`` seconds, equal when the
    estimate is precise enough to be one number, a range (the estimate ± its error band) while it
    is not, None while it is unknown or too uncertain to say. The whole job's when a
    :class:`JobEta` filled it in (``p.steps``), else the stage's (:class:`EtaEstimator`)."""
    whole = p.steps > 0
    eta = p.job_eta if whole else p.eta
    band = p.job_eta_band if whole else p.eta_band
    if eta is None or math.isnan(eta):
        return None
    band = 0.0 if band is None else band
    if band <= max(PRECISE_SECONDS, PRECISE_SHARE * eta):
        return eta, eta
    if band > UNKNOWN_SHARE * eta:
        return None
    step = 5.0 if eta + band < 120 else 15.0 if eta + band < 600 else 60.0
    low = max(0.0, math.floor((eta - band) / step) * step)
    return low, max(low + step, math.ceil((eta + band) / step) * step)


def tap(gen: Generator[T, None, R], on_record: Callable[[Progress], object]) -> Generator[T, None, R]:
    """``gen``, with ``on_record`` called on each of its :class:`Progress` records before it is
    passed on (to fill something in); returns ``gen``'s result, and closing it closes ``gen``."""
    try:
        while True:
            try:
                item = next(gen)
            except StopIteration as stop:
                return stop.value
            if isinstance(item, Progress):
                on_record(item)
            yield item
    finally:
        gen.close()


def with_eta(gen: Generator[T, None, R], estimator: EtaEstimator | None = None) -> Generator[T, None, R]:
    """``gen``, with :attr:`Progress.smoothed_eta` filled in on its records (closing it closes ``gen``)."""
    return tap(gen, (estimator or EtaEstimator()).update)



@dataclass(frozen=True)
class PlannedStage:
    """A counted stage a job runs (its ``Progress.stage``), what one of its steps costs relative
    to the job's other stages (``cost``: e.g. seconds per photo relative to describing one), and
    how many steps it takes in a job of ``n`` (``units(n)``; None: ``n``), unless the job says so
    before (``Progress.expected``). ``n`` is the total of the first stage of the plan (for a build,
    the photos to describe); a stage of 0 units is not run."""

    stage: str
    cost: float
    units: Callable[[int], float] | None = None

    def size(self, n: int) -> float:
        return float(n) if self.units is None else float(self.units(n))


#: How far a stage's cost may be from the plan's ratio (relative, one standard deviation): the
#: error of the time left in stages not yet run (measured: calibration took 1.2x to 3x the planned
#: cost on the sample and the paintings, under different loads; bench/bench_eta.py).
PLAN_ERROR = 0.5


class JobEta:
    """The step and the time left in a whole job of :class:`PlannedStage` stages, from its records.

    The time left is the current stage's own (its :class:`EtaEstimator`, or, before it has one, its
    steps left at the measured rate below) plus the stages still to come, each its ``cost`` ×
    ``units(n)`` at the rate measured so far: the seconds the counted stages already run took per
    unit of cost (their steps done × their cost). So the estimate starts with the first stage's
    measured speed and the plan's cost ratios, and follows the machine as later stages are timed.
    A job that starts with a later stage (an update with nothing to describe) has ``n = 0``.

    A stage not in the plan (or out of its order) is shown as the current step's and adds only its
    own time left; records of unknown length (``total == 0``) keep the last estimate. A stage is
    found in the plan at or after the current one, so a plan may run a stage twice (local features
    and calibration again for a second matcher)."""

    def __init__(self, plan: Sequence[PlannedStage], estimator: EtaEstimator | None = None):
        if not plan:
            raise ValueError("a job plan needs at least one stage")
        self.plan = tuple(plan)
        self._stage_eta = estimator or EtaEstimator()
        self._pos = -1  # the plan's stage running now (-1: none yet)
        self._n: int | None = None
        self._measured: dict[int, tuple[float, int]] = {}  # plan position → (elapsed, done) of its last record
        self._last: float | None = None
        self._band: float | None = None
        self._expected: dict[str, int] = {}

    @property
    def n(self) -> int | None:
        """The job's size: the total of the plan's first stage (None before it is seen)."""
        return self._n

    def _position(self, stage: str) -> int | None:
        for j in range(max(self._pos, 0), len(self.plan)):
            if self.plan[j].stage == stage:
                return j
        return None

    def _size(self, j: int) -> float:
        stage = self.plan[j]
        if stage.stage in self._expected:
            return float(self._expected[stage.stage])
        return stage.size(self._n) if self._n is not None else math.nan

    def _runs(self, j: int) -> bool:
        return self._n is None or j in self._measured or self._size(j) > 0

    def rate(self) -> float | None:
        """Seconds per unit of cost, measured on the planned stages run so far (None: not yet)."""
        secs = sum(t for t, d in self._measured.values() if d > 0 and t > 0)
        work = sum(self.plan[j].cost * d for j, (t, d) in self._measured.items() if d > 0 and t > 0)
        return secs / work if secs > 0 and work > 0 else None

    def update(self, p: Progress) -> float | None:
        """Fill in ``p.step``, ``p.steps`` and ``p.job_eta`` (seconds); returns ``p.job_eta``."""
        if p.expected:
            self._expected.update(p.expected)
        if p.total <= 0:  # a step of unknown length: the estimate stays as it was
            self._number(p, self._pos)
            p.job_eta, p.job_eta_band = self._last, self._band
            return self._last
        j = self._position(p.stage)
        if j is not None:
            rate = self.rate()
            if j != self._pos and rate is not None:  # a stage starts: its time left at the plan's cost, until measured
                planned = rate * self.plan[j].cost * max(0, p.total - p.done)
                self._stage_eta.prime(planned, PLAN_ERROR * planned)
            self._pos = j
            if self._n is None:  # the plan's first stage sets the size; a job that skips it has none of it
                self._n = p.total if j == 0 else 0
            self._measured[j] = (float(p.elapsed), int(p.done))
        self._number(p, self._pos)
        own = self._stage_eta.update(p)
        rate = self.rate()
        if own is None and j is not None and rate is not None:
            own = rate * self.plan[j].cost * max(0, p.total - p.done)
        if own is None or self._n is None:
            p.job_eta = self._last = None
            return None
        later = sum(self.plan[i].cost * self._size(i) for i in range(self._pos + 1, len(self.plan))
                    if i not in self._measured)
        if later > 0 and rate is None:
            p.job_eta = self._last = None
            return None
        later_s = (rate or 0.0) * later
        p.job_eta = self._last = own + later_s
        own_band = self._stage_eta.band if self._stage_eta.band is not None else PLAN_ERROR * own
        p.job_eta_band = self._band = math.hypot(own_band, PLAN_ERROR * later_s)
        return p.job_eta

    def _number(self, p: Progress, pos: int) -> None:
        runs = [j for j in range(len(self.plan)) if self._runs(j)]
        p.steps = len(runs)
        p.step = sum(1 for j in runs if j <= pos) if pos >= 0 and p.total > 0 else 0


def with_plan(gen: Generator[T, None, R], plan: Sequence[PlannedStage]) -> Generator[T, None, R]:
    """``gen``, with the step and the whole job's time left (:class:`JobEta`) filled in on its
    records (closing it closes ``gen``)."""
    return tap(gen, JobEta(plan).update)


def with_expected(gen: Generator[T, None, R], expected: dict[str, int]) -> Generator[T, None, R]:
    """``gen``, its first progress record saying how many steps later stages will take
    (``Progress.expected``, read by :class:`JobEta`); closing it closes ``gen``."""
    told: list[bool] = []

    def tell(p: Progress) -> None:
        if not told:
            p.expected = {**(p.expected or {}), **expected}
            told.append(True)

    return tap(gen, tell)


# ---- waiting for one long call without blocking a cancel ----------------------------------------

_shared: dict[Hashable, Future] = {}
_shared_lock = threading.Lock()


def _call(fn: Callable[[], R], key: Hashable | None) -> Future:
    """A future of ``fn()`` run on its own (daemon) thread; ``key``: share a call still running."""
    with _shared_lock:
        if key is not None and key in _shared:
            return _shared[key]
        fut: Future = Future()

        def target() -> None:
            me = threading.current_thread()
            with _busy_guard:  # the exit waits for it as for a decode (see DecodePool): it may be in C++
                _busy_threads.add(me)
            try:
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn())
                    except BaseException as exc:  # handed to the waiting job
                        fut.set_exception(exc)
            finally:
                with _busy_guard:
                    _busy_threads.discard(me)
                if key is not None:
                    with _shared_lock:
                        if _shared.get(key) is fut:
                            del _shared[key]

        if key is not None:
            _shared[key] = fut
        threading.Thread(target=target, name="museum-search-wait", daemon=True).start()
        return fut


def wait(
    call: Callable[[], R] | Future,
    beat: P | Callable[[], P],
    *,
    key: Hashable | None = None,
    announce: bool = False,
    interval: float = HEARTBEAT,
) -> Generator[P, None, R]:
    """Run ``call()`` (or wait for a ``Future``) on a helper thread; yield ``beat`` every
    ``interval`` seconds until it is done; return its result (its exception is raised here).

    ``beat``: the record to yield, or a function making it (e.g. with a fresh ``elapsed``).
    ``announce``: yield it once at once, so that a new stage is shown before the call ends.
    ``key``: calls with the same key share one call while it runs (a job started again after a
    cancel waits for the call already under way instead of starting a second one).

    Closing the generator stops the waiting at once: the call itself cannot be interrupted, so it
    runs to its end on its thread and its result is dropped; what it keeps (a loaded network, an
    index's gallery ranks) is there for the next job.
    """
    fut = call if isinstance(call, Future) else _call(call, key)

    def make() -> P:
        return beat() if callable(beat) else beat

    if announce and not fut.done():
        yield make()
    while True:
        try:
            return fut.result(timeout=interval)
        except FutureTimeout:
            if fut.done():  # the call's own TimeoutError
                raise
            yield make()


def drive(gen: Generator[T, None, R], on_progress: Callable[[T], object] | None = None) -> R:
    """Drive a progress generator to its end and return its result (closing it on any exception)."""
    try:
        while True:
            try:
                item = next(gen)
            except StopIteration as stop:
                return stop.value
            if on_progress is not None:
                on_progress(item)
    finally:
        gen.close()


__all__ = ["HEARTBEAT", "EtaEstimator", "JobEta", "PlannedStage", "Progress", "drive", "wait", "with_eta",
           "tap", "with_expected", "with_plan"]


class DecodePool:
    """A fixed pool of daemon threads running submitted calls (the part of a thread pool that
    decoding needs), whose :meth:`shutdown` need not wait for the running calls.

    Unlike :class:`concurrent.futures.ThreadPoolExecutor`, whose threads the interpreter joins at
    exit, a call that never returns (a read blocked on a dead network share) neither blocks
    :meth:`shutdown` with ``wait=False`` nor the exit of the program (Ctrl-C exits at once).

    At exit, the threads still running a call get up to :data:`EXIT_GRACE` seconds to finish it: a
    daemon thread that comes back from OpenCV or ONNX Runtime (C++) after the interpreter has
    finalized is unwound through their frames, which aborts the process ("FATAL: exception not
    rethrown"); a call still stuck after that is left behind.
    """

    def __init__(self, workers: int, name: str = "decode") -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True)
                         for i in range(max(1, workers))]
        for t in self._threads:
            t.start()

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        self._tasks.put((fut, fn, args))
        return fut

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            fut, fn, args = task
            if not fut.set_running_or_notify_cancel():  # cancelled while queued
                continue
            me = threading.current_thread()
            with _busy_guard:
                _busy_threads.add(me)
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as an executor does
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            finally:
                with _busy_guard:
                    _busy_threads.discard(me)
            del task, fut, fn, args

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop the threads once their current call returns; ``cancel_futures``: the calls not
        started yet are cancelled; ``wait``: wait for the threads to stop."""
        if cancel_futures:
            while True:
                try:
                    task = self._tasks.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    task[0].cancel()
        for _ in self._threads:
            self._tasks.put(None)
        if wait:
            for t in self._threads:
                t.join()


#: Seconds the threads of :class:`DecodePool` get at exit to finish the call they are running.
EXIT_GRACE = 10.0
_busy_threads: set[threading.Thread] = set()  # the DecodePool threads running a call now
_busy_guard = threading.Lock()


@atexit.register
def _let_running_calls_finish() -> None:
    """At exit (before the interpreter finalizes), wait up to :data:`EXIT_GRACE` seconds for the
    decode threads still running a call to finish it (see :class:`DecodePool`); idle ones wait on
    their queue and are left as they are."""
    deadline = time.monotonic() + EXIT_GRACE
    try:
        while time.monotonic() < deadline:
            with _busy_guard:
                if not _busy_threads:
                    return
            time.sleep(0.01)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting, without a traceback
        return
