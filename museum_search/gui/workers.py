"""The one mechanism that runs core work off the GUI thread.

Core long work is a generator (``yield`` progress, ``return`` result). :func:`start` runs it on
superqt's ``GeneratorWorker`` (a QThreadPool runnable) and connects four callbacks, all called on
the GUI thread: ``on_progress(item)``, ``on_result(value)``, ``on_error(exc)`` and
``on_finished()`` (always, last). :meth:`Job.cancel` asks the worker to stop at the next yield;
the generator is then closed, so its ``finally`` blocks run and nothing is left half-written.
Core jobs yield at least every 0.1 s (:func:`museum_search.core.progress.wait`), so a cancel
takes effect within that. Progress records get a steady ETA
(:class:`museum_search.core.progress.EtaEstimator`, one per job) in ``Progress.eta``.

Errors never reach stderr as a traceback: :func:`error_message` turns an exception into a
sentence and :func:`show_error` puts it in a dialog.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Generator

from PySide6.QtCore import QObject, QThreadPool, Signal
from PySide6.QtWidgets import QMessageBox, QWidget
from superqt.utils import FunctionWorker, GeneratorWorker

from museum_search.core.errors import MuseumSearchError
from museum_search.core.progress import EtaEstimator, with_eta
from museum_search.gui.lifetime import release_when_idle

log = logging.getLogger(__name__)


def error_message(exc: BaseException) -> str:
    """A one-paragraph message for the user (no traceback)."""
    if isinstance(exc, MuseumSearchError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "Not enough memory for this operation. Try a smaller image size or fewer images."
    if isinstance(exc, JobError):
        exc = exc.original
        return f"Unexpected error ({type(exc).__name__}): {exc}"
    if isinstance(exc, OSError):
        return f"A file could not be read or written: {exc}"
    return f"Unexpected error ({type(exc).__name__}): {exc}"


def show_error(parent: QWidget | None, title: str, exc: BaseException | str) -> None:
    text = exc if isinstance(exc, str) else error_message(exc)
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setObjectName("errorDialog")
    box.open()


class JobError(Exception):
    """An unexpected error inside a job (superqt treats a bare RuntimeError as a deleted worker)."""

    def __init__(self, original: BaseException):
        super().__init__(f"{type(original).__name__}: {original}")
        self.original = original


def _closing(gen: Generator) -> Generator:
    """Wrap ``gen`` so it is closed when the worker stops early (cancel, error), with a steady
    ETA filled in on its progress records."""
    try:
        result = yield from with_eta(gen, EtaEstimator())
        return result
    except RuntimeError as exc:
        raise JobError(exc) from exc
    finally:
        gen.close()


def _calling(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except RuntimeError as exc:
        raise JobError(exc) from exc


class Job(QObject):
    """A running generator. Keep a reference while it runs."""

    finished = Signal()

    def __init__(self, worker: GeneratorWorker | FunctionWorker):
        super().__init__()
        self.worker = worker
        self.cancelled = False
        self.running = True

    def cancel(self) -> None:
        self.cancelled = True
        self.worker.quit()


_ACTIVE: set[Job] = set()


def start(
    gen: Generator[Any, None, Any] | Callable[[], Any],
    *,
    on_progress: Callable[[Any], None] | None = None,
    on_result: Callable[[Any], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
    on_finished: Callable[[], None] | None = None,
    on_cancelled: Callable[[], None] | None = None,
) -> Job:
    """Run a generator (or a plain callable) on the global thread pool; see module docstring."""
    if callable(gen) and not hasattr(gen, "send"):
        worker: Any = FunctionWorker(functools.partial(_calling, gen))
    else:
        worker = GeneratorWorker(functools.partial(_closing, gen))
    job = Job(worker)
    if on_progress is not None and hasattr(worker, "yielded"):
        worker.yielded.connect(on_progress)
    if on_result is not None:
        worker.returned.connect(lambda value: None if job.cancelled else on_result(value))

    def errored(exc: BaseException) -> None:
        log.debug("background job failed", exc_info=exc)
        if on_error is not None:
            on_error(exc)

    worker.errored.connect(errored)
    if on_cancelled is not None and hasattr(worker, "aborted"):
        worker.aborted.connect(on_cancelled)

    def done() -> None:
        if job.cancelled and hasattr(gen, "close"):
            gen.close()  # superqt leaves an aborted generator suspended: run its finally blocks now
        job.running = False
        _ACTIVE.discard(job)
        if on_finished is not None:
            on_finished()
        job.finished.emit()
        release_when_idle(worker)  # break the callbacks ↔ job cycle (lifetime.py)

    worker.finished.connect(done)
    _ACTIVE.add(job)
    QThreadPool.globalInstance().start(worker)
    return job


def wait_all(timeout_ms: int = 30000) -> bool:
    """Wait for every running job (used at exit and in tests)."""
    return QThreadPool.globalInstance().waitForDone(timeout_ms)

