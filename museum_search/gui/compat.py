"""Work-arounds for defects of the Qt binding that would otherwise end a long session.

:func:`guard_bool_refcounts`: PySide6 6.12.0 returns ``True`` from ``SignalInstance.emit()``
without taking a reference to it. Every signal emitted from Python (the workers' progress, the
thumbnail cache, pyqtgraph's range changes) then takes one reference from ``True``; on CPython
before 3.12, where ``True`` is an ordinary object with a few thousand references, the process
aborts with "Fatal Python error: bool_dealloc" after a few thousand emits (about 200 searches
and 5 evaluations in ``bench/bench_session.py``). CPython 3.12 makes ``True`` immortal, so the
lost references do no harm there; before 3.12 the guard does the same: when a probe shows that
an emit loses a reference, ``True`` and ``False`` get a reserve of references no session can use
up (2**48). Nothing else changes: the two objects are never freed in any case.

The same binding loses a reference to ``None`` on every static void call (``QThread.msleep``,
``QCoreApplication.processEvents``, ``QTest.qWait``): ``None`` gets the same reserve when a probe
shows it.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

#: References added to True and False when the binding loses them (never used up: 2**48 emits).
RESERVE = 1 << 48
_PROBES = 64
_guarded = False


def emit_loses_true_reference() -> bool:
    """Whether emitting a signal from Python takes a reference from ``True`` (PySide6 6.12.0)."""
    from PySide6.QtCore import QObject, Signal

    class _Probe(QObject):
        probe = Signal()

    p = _Probe()
    before = sys.getrefcount(True)
    for _ in range(_PROBES):
        p.probe.emit()
    return before - sys.getrefcount(True) >= _PROBES // 2


def static_call_loses_none_reference() -> bool:
    """Whether a static void call of the binding (``QThread.msleep``, ``processEvents``, ``qWait``)
    takes a reference from ``None`` (PySide6 6.12.0: about 5,000 such calls end the process)."""
    from PySide6.QtCore import QThread

    before = sys.getrefcount(None)
    for _ in range(_PROBES):
        QThread.msleep(0)
    return before - sys.getrefcount(None) >= _PROBES // 2


def guard_bool_refcounts() -> bool:
    """Give ``True`` and ``False`` a reserve of references if this binding loses them (see the
    module docstring). Returns True when the guard is (now or already) in place. A no-op on
    CPython 3.12+ (immortal booleans) and on other interpreters."""
    global _guarded
    if _guarded:
        return True
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 12) or hasattr(sys, "getobjects"):
        return False  # immortal booleans; or a Py_TRACE_REFS build, where ob_refcnt is not first
    guarded = []
    if emit_loses_true_reference():
        guarded += [True, False]
    if static_call_loses_none_reference():
        guarded.append(None)
    if not guarded:
        return False
    for obj in guarded:
        ctypes.c_ssize_t.from_address(id(obj)).value += RESERVE  # ob_refcnt, the first field
    _guarded = True
    log.info("this PySide6 loses references to %s; they were given a reserve", ", ".join(map(repr, guarded)))
    return True


__all__ = ["RESERVE", "emit_loses_true_reference", "guard_bool_refcounts", "static_call_loses_none_reference"]
