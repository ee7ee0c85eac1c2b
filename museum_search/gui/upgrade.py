"""Opening an index folder, and converting one written by an older museum-search.

Every place the GUI opens an index (File → Open index…, recent indexes, the Evaluation tab, Update
in the Collection tab, the kiosk) goes through :func:`open_index`. An index of an older format that
``core.jobs._indexing.upgrade_index`` can convert (format 2: items in JSON, an N x N gallery-rank matrix) is
not just refused: a dialog (``upgradeIndexDialog``) shows core's message and offers *Convert*,
which runs the conversion on a worker (:mod:`.workers`) with a progress dialog and a Cancel button,
then opens the converted index. The conversion is one atomic save under the index's writer lock: a
cancel or a failure leaves the old index as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QMessageBox, QProgressDialog, QWidget

from museum_search.core.errors import IndexFormatError, MuseumSearchError
from museum_search.core.index import UPGRADABLE, Index, index_version
from museum_search.core.jobs import upgrade_index
from museum_search.gui import workers

log = logging.getLogger(__name__)


def upgradable(path: str | Path) -> bool:
    """True when ``path`` holds an index of an older format that can be converted in place."""
    try:
        return index_version(path) in UPGRADABLE
    except (MuseumSearchError, OSError):
        return False


def open_index(parent: QWidget | None, path: str | Path, on_opened: Callable[[Index], None],
               title: str = "Cannot open index", on_failed: Callable[[], None] | None = None) -> bool:
    """Open the index at ``path`` and give it to ``on_opened``.

    Returns True when it was opened now (``on_opened`` has been called). Otherwise False: the error
    is in a dialog (then ``on_failed`` is called), or, for an index of an older format, conversion
    is offered (:class:`Upgrade`): ``on_opened`` is called later with the converted index, or
    ``on_failed`` if the user declines, cancels or the conversion fails.
    """
    try:
        index = Index.load(path)
    except IndexFormatError as exc:
        if upgradable(path):
            Upgrade(parent, Path(path), exc, on_opened, on_failed).offer()
            return False
        _failed(parent, title, exc, on_failed)
        return False
    except Exception as exc:
        _failed(parent, title, exc, on_failed)
        return False
    on_opened(index)
    return True


def cancel_all() -> None:
    """Close the offers and cancel the conversions under way (the application is closing)."""
    for up in list(Upgrade.active):
        if up.box is not None:
            up.box.reject()
        up.cancel()


def _failed(parent, title, exc, on_failed) -> None:
    workers.show_error(parent, title, exc)
    if on_failed is not None:
        on_failed()


class Upgrade(QObject):
    """Offer to convert an older index, then convert it on a worker and open it (see the module
    docstring). Kept alive by its dialogs until it ends; ``done`` fires with True (converted and
    opened) or False."""

    done = Signal(bool)

    #: the offers and conversions under way (each lives until it ends)
    active: ClassVar[set[Upgrade]] = set()

    def __init__(self, parent: QWidget | None, path: Path, error: BaseException,
                 on_opened: Callable[[Index], None], on_failed: Callable[[], None] | None = None):
        super().__init__(parent)
        self.parent_widget = parent
        self.path = path
        self.error = error
        self.on_opened = on_opened
        self.on_failed = on_failed
        self.box: QMessageBox | None = None
        self.progress: QProgressDialog | None = None
        self.job: workers.Job | None = None
        self._converted = False

    # ---- the question ------------------------------------------------------------------------
    def offer(self) -> QMessageBox:
        Upgrade.active.add(self)
        box = QMessageBox(QMessageBox.Icon.Question, "Convert this index?",
                          "This index was made by an older version of museum-search.",
                          QMessageBox.StandardButton.NoButton, self.parent_widget)
        box.setObjectName("upgradeIndexDialog")
        box.setInformativeText(
            f"{workers.error_message(self.error)}\n\nConvert converts it in place: the descriptors are kept "
            "(nothing is described again), the catalogue moves to a database that opens at once, and each "
            "reference's nearest neighbours are stored for ICFRR. If anything goes wrong, or you cancel, "
            "the index stays as it is.")
        self.convert_button = box.addButton("Convert", QMessageBox.ButtonRole.AcceptRole)
        cancel = box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(self.convert_button)
        box.setEscapeButton(cancel)
        box.finished.connect(self._answered)
        self.box = box
        box.open()
        return box

    def _answered(self, _result: int) -> None:
        box, self.box = self.box, None
        clicked = box.clickedButton() if box is not None else None
        if box is not None:
            box.deleteLater()
        if clicked is not None and clicked is self.convert_button:
            self.start()
        else:
            self._end(False)

    # ---- the conversion ----------------------------------------------------------------------
    def start(self) -> None:
        Upgrade.active.add(self)
        dialog = QProgressDialog(f"Converting the index {self.path}…", "Cancel", 0, 0, self.parent_widget)
        dialog.setObjectName("upgradeProgress")
        dialog.setWindowTitle("Converting the index")
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.canceled.connect(self.cancel)
        self.progress = dialog
        dialog.show()
        self.job = workers.start(upgrade_index(self.path), on_progress=self._on_progress,
                                 on_result=self._on_result, on_error=self._on_error,
                                 on_finished=self._on_finished)

    def cancel(self) -> None:
        if self.job is not None and self.job.running and not self.job.cancelled:
            self.job.cancel()
            if self.progress is not None:
                self.progress.setLabelText("Cancelling… the index stays as it was.")

    def _on_progress(self, p) -> None:
        dialog = self.progress
        if dialog is None or self.job is None or self.job.cancelled:
            return
        stage = getattr(p, "stage", "") or "converting"
        total, done = int(getattr(p, "total", 0) or 0), int(getattr(p, "done", 0) or 0)
        if total > 0:
            text = f"{stage[:1].upper()}{stage[1:]}: {done:,} / {total:,}"
        else:
            text = f"{stage[:1].upper()}{stage[1:]}…"
        dialog.setLabelText(f"Converting the index {self.path}\n{text}")
        # last: a modal progress dialog processes events in setValue (the job may end in there)
        if total > 0:
            dialog.setRange(0, total)
            dialog.setValue(min(done, total))
        else:
            dialog.setRange(0, 0)

    def _on_result(self, index: Index) -> None:
        self._converted = True
        self._close_progress()
        self.on_opened(index)

    def _on_error(self, exc: BaseException) -> None:
        self._close_progress()
        workers.show_error(self.parent_widget, "Cannot convert the index", exc)

    def _on_finished(self) -> None:
        self._close_progress()
        self._end(self._converted)

    def _close_progress(self) -> None:
        if self.progress is not None:
            dialog, self.progress = self.progress, None
            dialog.canceled.disconnect(self.cancel)
            dialog.close()
            dialog.deleteLater()

    def _end(self, ok: bool) -> None:
        if self not in Upgrade.active:
            return
        Upgrade.active.discard(self)
        if not ok and self.on_failed is not None:
            self.on_failed()
        self.done.emit(ok)
        self.deleteLater()
