"""What finished GUI work lets go of, so that a long session does not keep every job it ran.

A signal connected to a Python callable keeps that callable alive from the C++ side, where
Python's garbage collector cannot see it. A job's callbacks refer to the job (to know whether it
was cancelled), the job to its worker and the worker to its signals: a cycle through C++ that is
never collected. Each search then kept its worker, its callbacks and what they close over (the
query photo, about 1 MB), for good (``bench/bench_session.py``: 0.9 MB per search).
:func:`release_when_idle` disconnects a finished worker's signals once the event loop is idle, which
breaks the cycle: the job, its worker and their callbacks are freed as soon as no view holds the job;
then the C heap's free pages go back to the system (:func:`museum_search.core.memory.trim_heap_soon`).
"""

from __future__ import annotations

import warnings
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from museum_search.core.memory import trim_heap_soon


def disconnect_all(signals: QObject) -> int:
    """Disconnect every receiver of every signal ``signals`` declares; the number of signals."""
    n = 0
    for name in dir(type(signals)):
        if not isinstance(getattr(type(signals), name, None), Signal):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Failed to disconnect": nothing was connected
            try:
                getattr(signals, name).disconnect()
            except (RuntimeError, TypeError):  # nothing connected, or the object is gone
                pass
        n += 1
    return n


def release_when_idle(worker: Any) -> None:
    """Disconnect the signals of a finished superqt worker when the event loop is next idle (not
    while one of its signals is being delivered), then trim the C heap. The worker stays usable
    as a finished object."""
    signals = getattr(worker, "signals", None)
    if signals is None:
        return

    def release() -> None:
        disconnect_all(signals)
        trim_heap_soon()

    QTimer.singleShot(0, release)


__all__ = ["disconnect_all", "release_when_idle"]
