"""The staff's review queue of kept visitors' photos (issue 34): newest first, each with its best
candidates (their thumbnails and figures, as the answer recorded them) and the evidence view of the
one chosen, and three actions on one photo or many:

* **This is object X** (an instance picker that completes over the index's objects, the top
  candidate preselected): core's ``add_views_job`` makes each photo a new reference view of X
  through the incremental update, as a background job with progress and Cancel; the index is
  opened again when it is done;
* **Not in our collection**: core's ``mark_unknown`` keeps them as real unknown views;
* **Discard** (asked first): core's ``discard`` deletes them.

A thin view over :mod:`museum_search.core.visitors`: the list is ``VisitorLog.kept("new")``, the
evidence is the query pipeline's (``QueryPipeline.matches``, on a worker), and every figure shown is
one the log or the pipeline gave.
"""

from __future__ import annotations

import html
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import (
    QAbstractListModel,
    QItemSelectionModel,
    QModelIndex,
    QPersistentModelIndex,
    QSize,
    Qt,
    Signal,
)
from PySide6.QtGui import QIcon, QPainter, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QCompleter,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListView,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.errors import MuseumSearchError
from museum_search.gui import workers
from museum_search.gui.widgets.evidence_view import EvidenceView, where_text
from museum_search.gui.widgets.layout import split
from museum_search.gui.widgets.progress_panel import FittingLine, ProgressPanel
from museum_search.gui.widgets.thumbnails import ThumbnailCache

log = logging.getLogger(__name__)

#: Longest side of the kept photos' thumbnails in the list, and of the candidates'.
PHOTO_THUMB = 96
CANDIDATE_THUMB = 72
#: Longest side of the photos drawn in the evidence view.
EVIDENCE_SIDE = 1200
SOURCES = {"kiosk": "at the kiosk", "phone": "on a phone", "app": "in the app"}


def object_photo(index, instance: str) -> tuple[Path | None, str]:
    """The first reference photo of ``instance`` in ``index`` and its "Title — Artist" ("" when the
    catalogue has neither); (None, "") when the index has no such object."""
    rows = np.flatnonzero(index.labels == instance)
    if not len(rows):
        return None, ""
    row = int(rows[0])
    md = {k.strip().lower(): v for k, v in (index.items[row].metadata or {}).items() if v}
    return index.abspath(row), " — ".join(s for s in (md.get("title", ""), md.get("artist", "")) if s)


def photo_line(photo) -> str:
    """One line about a kept photo: when, where and what the answer was."""
    when = photo.hour.strftime("%d %b %Y, %H:00") if hasattr(photo.hour, "strftime") else str(photo.hour)
    where = SOURCES.get(photo.source, photo.source)
    verdict = "recognised" if photo.in_collection else "not recognised"
    conf = "" if photo.confidence is None else f" (confidence {photo.confidence:.2f})"
    return f"{when}, {where}: {verdict}{conf}"


def candidate_short(candidate: dict) -> str:
    """A candidate's figures in a few words (under its thumbnail)."""
    inliers = candidate.get("inliers")
    points = "not verified" if inliers is None else f"{int(inliers)} points"
    return points if candidate.get("score") is None else f"score {float(candidate['score']):.2f} · {points}"


def candidate_line(candidate: dict) -> str:
    """A candidate's figures as the answer recorded them."""
    parts = []
    if candidate.get("score") is not None:
        parts.append(f"score {float(candidate['score']):.3f}")
    if candidate.get("cosine") is not None:
        parts.append(f"cosine {float(candidate['cosine']):.2f}")
    inliers = candidate.get("inliers")
    parts.append("not verified" if inliers is None else f"{int(inliers)} matching points")
    return " · ".join(parts)


def square_icon(pm: QPixmap | None, size: int) -> QIcon:
    """``pm`` (a thumbnail, else the cache's "loading" placeholder) centred on a transparent square
    ``size`` wide: icons of landscape and portrait photos then take the same room, and the texts
    beside or under them line up."""
    pm = pm if pm is not None else ThumbnailCache.instance().loading(size)
    out = QPixmap(size, size)
    out.fill(Qt.GlobalColor.transparent)
    p = QPainter(out)
    p.drawPixmap((size - pm.width()) // 2, (size - pm.height()) // 2, pm)
    p.end()
    return QIcon(out)


def best_per_object(candidates: list[dict]) -> list[dict]:
    """Each object's first (best) candidate, in their order (an answer ranked by reference photo
    lists an object once per photo)."""
    seen: set[str] = set()
    return [c for c in candidates if not (c["instance"] in seen or seen.add(c["instance"]))]


def button(text: str, name: str, tip: str, slot) -> QPushButton:
    """A push button named ``name`` with its tooltip, calling ``slot()`` when clicked."""
    b = QPushButton(text)
    b.setObjectName(name)
    b.setToolTip(tip)
    b.clicked.connect(lambda _checked=False: slot())
    return b


class KeptModel(QAbstractListModel):
    """The kept photos (``KeptPhoto``, newest first): a line each and its thumbnail, loaded by the
    shared :class:`ThumbnailCache` only when the list paints it."""

    ID_ROLE = Qt.ItemDataRole.UserRole + 1

    def __init__(self, parent=None):
        super().__init__(parent)
        self.photos: list[Any] = []
        self._rows: dict[str, int] = {}
        self._cache = ThumbnailCache.instance()
        self._cache.ready.connect(self._thumbnail_ready)

    def set_photos(self, photos: list) -> None:
        self.beginResetModel()
        self.photos = list(photos)
        self._rows = {str(p.path): i for i, p in enumerate(self.photos)}
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.photos)

    def data(self, idx: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not idx.isValid() or idx.row() >= len(self.photos):
            return None
        photo = self.photos[idx.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            best = photo.candidates[0]["instance"] if photo.candidates else "no candidate"
            return f"{photo_line(photo)}\nbest: {best}"
        if role == Qt.ItemDataRole.DecorationRole:
            return square_icon(self._cache.get(photo.path, PHOTO_THUMB), PHOTO_THUMB)
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{html.escape(photo_line(photo))}<br>{html.escape(photo.reason or '')}"
        if role == self.ID_ROLE:
            return photo.id
        return None

    def _thumbnail_ready(self, path: str, size: int) -> None:
        row = self._rows.get(path)
        if size == PHOTO_THUMB and row is not None:
            i = self.index(row, 0)
            self.dataChanged.emit(i, i, [Qt.ItemDataRole.DecorationRole])


def _evidence_job(pipeline_for, photo_path: Path, instance: str):
    """The kept photo, ``instance``'s reference that matches it best and the evidence between them:
    the query pipeline answers the photo again (this index, now) and the evidence is that of the
    candidate's verified reference (else its best ranked one, else its first photo)."""
    from museum_search.core.answer import query_from_array
    from museum_search.core.images import load_image

    pipeline = pipeline_for()
    query = query_from_array(load_image(photo_path, max_side=EVIDENCE_SIDE), photo_path.name)
    (answer,) = pipeline.answer([query])
    labels = pipeline.index.labels
    verified = [(n, r) for r, n in answer.verified_inliers.items() if labels[r] == instance]
    ranked = [r.row for r in answer.results if r.instance == instance]
    rows = np.flatnonzero(labels == instance)
    row = max(verified)[1] if verified else ranked[0] if ranked else int(rows[0]) if len(rows) else None
    if row is None:
        return query.image, None, None, None
    reference = load_image(pipeline.index.abspath(row), max_side=EVIDENCE_SIDE)
    return query.image, reference, pipeline.matches(query, row, answer), pipeline.verdict.min_inliers


class ReviewQueue(QWidget):
    """See the module docstring. :meth:`set_source` gives it the visitor log and the open index;
    ``changed`` fires after each action (the Visitors tab counts the queue again)."""

    changed = Signal()

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("reviewQueue")
        self.state = state
        self.log = None  # the VisitorLog (None: none open)
        self.index = None
        self._pipeline = None  # the query pipeline of self.index (for the evidence), built on a worker
        self._pipeline_lock = threading.Lock()
        self._job: workers.Job | None = None  # the action running (add, unknown, discard)
        self._adding: list[str] = []  # the photos of the add running
        self._evidence_job: workers.Job | None = None
        self._evidence_key: tuple | None = None
        self._shown_id: str | None = None  # the kept photo whose candidates and evidence are shown
        self._cache = ThumbnailCache.instance()
        self._cache.ready.connect(self._candidate_thumbnail_ready)
        self._build_ui()
        self._update_buttons()

    # ---- layout ------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.model = KeptModel(self)
        self.photos = QListView()
        self.photos.setObjectName("keptPhotos")
        self.photos.setModel(self.model)
        self.photos.setIconSize(QSize(PHOTO_THUMB, PHOTO_THUMB))
        self.photos.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.photos.setUniformItemSizes(True)
        self.photos.setWordWrap(True)
        self.photos.selectionModel().selectionChanged.connect(self._selection_changed)
        self.photos.selectionModel().currentChanged.connect(self._current_changed)
        self.count_label = QLabel("")
        self.count_label.setObjectName("keptCount")
        self.count_label.setWordWrap(True)
        left = QWidget()
        lay = QVBoxLayout(left)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.count_label)
        lay.addWidget(self.photos, 1)
        lay.addWidget(self._actions_box())
        right = QWidget()
        rlay = QVBoxLayout(right)
        rlay.setContentsMargins(0, 0, 0, 0)
        self.details = QLabel("")
        self.details.setObjectName("keptDetails")
        self.details.setWordWrap(True)
        self.details.setTextFormat(Qt.TextFormat.PlainText)
        self.candidates = QListWidget()
        self.candidates.setObjectName("keptCandidates")
        self.candidates.setViewMode(QListView.ViewMode.IconMode)
        self.candidates.setFlow(QListView.Flow.LeftToRight)
        self.candidates.setWrapping(False)
        self.candidates.setMovement(QListView.Movement.Static)
        self.candidates.setIconSize(QSize(CANDIDATE_THUMB, CANDIDATE_THUMB))
        self.candidates.setGridSize(QSize(CANDIDATE_THUMB + 110, CANDIDATE_THUMB + 44))
        self.candidates.setFixedHeight(CANDIDATE_THUMB + 64)
        self.candidates.setWordWrap(True)
        self.candidates.currentRowChanged.connect(self._candidate_chosen)
        self.evidence_view = EvidenceView()
        self.evidence_view.setMinimumSize(320, 200)
        self.where_label = QLabel("")
        self.where_label.setObjectName("keptWhere")
        self.where_label.setWordWrap(True)
        for w, stretch in ((self.details, 0), (self.candidates, 0), (self.evidence_view, 1), (self.where_label, 0)):
            rlay.addWidget(w, stretch)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(split(Qt.Orientation.Horizontal, (left, 0, 330), (right, 1, 700)))

    def _actions_box(self) -> QGroupBox:
        box = QGroupBox("The selected photos")
        lay = QVBoxLayout(box)
        self.instance = QComboBox()
        self.instance.setObjectName("instancePicker")
        self.instance.setEditable(True)
        self.instance.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.instance.setToolTip("The object the selected photos show: type a few letters of its name")
        self.instance.currentTextChanged.connect(self._update_buttons)
        self.add_button = button("This is object …", "addViewsButton", "Add the selected photos as new reference "
                                 "photos of this object (its catalogue entry is copied); the index is updated in "
                                 "place, in seconds", self.add_selected)
        self.into_collection = QCheckBox("Also copy the photos into the collection folder")
        self.into_collection.setToolTip("Off: the photos stay in the visitors' folder and the index refers to them "
                                        "there. On: they are added to the collection folder as new files (never "
                                        "replacing one).")
        self.unknown_button = button("Not in our collection", "unknownButton", "Keep the selected photos as real "
                                     "photos of objects that are not in the collection: the verdict's next "
                                     "calibration learns from them", self.mark_selected_unknown)
        self.discard_button = button("Discard", "discardButton", "Delete the selected photos (asked first)",
                                     self.discard_selected)
        self.cancel_button = button("Cancel", "reviewCancel", "Stop adding: the index stays as it was", self.cancel)
        lay.addWidget(self.instance)
        lay.addWidget(self.add_button)
        lay.addWidget(self.into_collection)
        others = QHBoxLayout()
        others.addWidget(self.unknown_button)
        others.addWidget(self.discard_button)
        lay.addLayout(others)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        self.progress = ProgressPanel(buttons, "reviewProgress", "reviewStatus", FittingLine(""))
        self.progress.bar.setTextVisible(False)
        self.progress.bar.hide()  # shown while an action runs, with Cancel
        self.cancel_button.hide()
        lay.addWidget(self.progress)
        return box

    # ---- content -----------------------------------------------------------------------------
    def set_source(self, visitor_log, index) -> None:
        """The visitor log (None: none) and the open index (the objects the picker offers)."""
        if index is not self.index:
            self._pipeline = None
            self._shown_id = None  # its candidates and evidence are shown again on the new index
            self.index = index
            names = list(index.instances) if index is not None else []
            self.instance.clear()
            self.instance.addItems(names)
            completer = QCompleter(names, self.instance)
            completer.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
            completer.setFilterMode(Qt.MatchFlag.MatchContains)
            self.instance.setCompleter(completer)
        self.log = visitor_log

    def set_photos(self, photos: list) -> None:
        """Show ``photos`` (``VisitorLog.kept("new")``: newest first). The photo shown and those
        selected stay so when they are still there; else the first one is chosen."""
        current = self.current_photo()
        selected = {p.id for p in self.selected()}
        self.model.set_photos(photos)
        n = len(photos)
        self.count_label.setText(f"{n:,} kept photo{'s' if n != 1 else ''} to review, newest first. Select one "
                                 "or many (Ctrl, Shift)." if n else "No kept photo to review.")
        rows = {p.id: i for i, p in enumerate(photos)}
        if n:
            self.photos.setCurrentIndex(self.model.index(rows.get(current.id, 0) if current else 0, 0))
            sel = self.photos.selectionModel()
            for pid in selected & set(rows):
                sel.select(self.model.index(rows[pid], 0), QItemSelectionModel.SelectionFlag.Select)
        else:
            self._show_photo(None)
        self._update_buttons()

    def selected(self) -> list:
        """The KeptPhotos selected, newest first."""
        rows = sorted(i.row() for i in self.photos.selectionModel().selectedIndexes())
        return [self.model.photos[r] for r in rows if r < len(self.model.photos)]

    def current_photo(self):
        i = self.photos.currentIndex()
        return self.model.photos[i.row()] if i.isValid() and i.row() < len(self.model.photos) else None

    def _current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        photo = self.model.photos[current.row()] if current.isValid() else None
        if photo is None or photo.id != self._shown_id:  # the same photo read again: its evidence stays
            self._show_photo(photo)

    def _selection_changed(self, *_args) -> None:
        self._update_buttons()

    def _show_photo(self, photo) -> None:
        self._shown_id = photo.id if photo is not None else None
        self.candidates.clear()
        self.where_label.clear()
        if photo is None:
            self._evidence_key = None  # what is still being matched is not wanted
            self.details.setText("")
            self.evidence_view.set_titles("Visitor's photo", "Candidate")
            self.evidence_view.set_query(None)
            self.evidence_view.set_reference_message("Choose a kept photo on the left")
            self.evidence_view.set_evidence(None, " ")  # no caption (an empty one says "no geometric match")
            return
        self.details.setText(f"{photo_line(photo)} — {photo.reason}." if photo.reason else f"{photo_line(photo)}.")
        for rank, cand in enumerate(best_per_object(photo.candidates), 1):
            path, title = object_photo(self.index, cand["instance"]) if self.index is not None else (None, "")
            item = QListWidgetItem(f"#{rank} {cand['instance']}\n{candidate_short(cand)}")
            item.setData(Qt.ItemDataRole.UserRole, str(path) if path else "")
            item.setToolTip(f"{cand['instance']}{' — ' + title if title else ''}\n{candidate_line(cand)}")
            item.setIcon(square_icon(self._cache.get(path, CANDIDATE_THUMB) if path else None, CANDIDATE_THUMB))
            self.candidates.addItem(item)
        if photo.candidates and self.instance.findText(photo.candidates[0]["instance"]) >= 0:
            self.instance.setCurrentText(photo.candidates[0]["instance"])  # the top candidate preselected
        if photo.candidates:
            self.candidates.setCurrentRow(0)
        else:
            self._load_evidence(photo, None)

    def _candidate_thumbnail_ready(self, path: str, size: int) -> None:
        if size != CANDIDATE_THUMB:
            return
        for i in range(self.candidates.count()):
            item = self.candidates.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == path:
                pm = self._cache.peek(path, size)
                if pm is not None:
                    item.setIcon(square_icon(pm, size))

    def _candidate_chosen(self, row: int) -> None:
        photo = self.current_photo()
        candidates = best_per_object(photo.candidates) if photo is not None else []
        if 0 <= row < len(candidates):
            self._load_evidence(photo, candidates[row]["instance"])

    # ---- the evidence view -------------------------------------------------------------------
    def _pipeline_for(self, index, engine: str):
        """The query pipeline of ``index`` (built once, on the worker that first needs it)."""
        from museum_search.core.answer import QueryPipeline, QuerySettings

        with self._pipeline_lock:
            if self._pipeline is None or self._pipeline.index is not index:
                self._pipeline = QueryPipeline(index, QuerySettings(engine=engine))
            return self._pipeline

    def _load_evidence(self, photo, instance: str | None) -> None:
        self.evidence_view.set_titles("Visitor's photo", f"Candidate: {instance}" if instance else "No candidate")
        self.evidence_view.set_reference(None)
        self.evidence_view.set_evidence(None, "Matching…" if instance else "no candidate")
        self.where_label.clear()
        key = (photo.id, instance)
        self._evidence_key = key
        if instance is None or self.index is None:
            self._evidence_job = workers.start(lambda: _load_photo(photo.path),
                                               on_result=lambda img: self._evidence_loaded(key, (img, None, None, 0)),
                                               on_error=lambda exc: self._evidence_failed(key, exc))
            return
        index, engine = self.index, self.state.engine
        self._evidence_job = workers.start(
            lambda: _evidence_job(lambda: self._pipeline_for(index, engine), Path(photo.path), instance),
            on_result=lambda value: self._evidence_loaded(key, value),
            on_error=lambda exc: self._evidence_failed(key, exc))

    def _evidence_loaded(self, key: tuple, value) -> None:
        if key != self._evidence_key:
            return  # another photo or candidate chosen since
        image, reference, evidence, need = value
        self.evidence_view.set_query(image)
        if reference is None:
            self.evidence_view.set_reference_message("No reference photo of this object in the index")
            return
        self.evidence_view.set_reference(reference)
        caption = None
        if evidence is not None and evidence.outline is not None and evidence.inliers < need:
            caption = f"{evidence.inliers} matching points — too few to verify ({need} needed)"
        self.evidence_view.set_evidence(evidence, caption)
        if evidence is not None:
            self.where_label.setText(where_text(evidence.inliers, self.evidence_view.matched_area()))

    def _evidence_failed(self, key: tuple, exc: BaseException) -> None:
        if key == self._evidence_key:
            self.evidence_view.set_reference_message(workers.error_message(exc))

    def evidence_busy(self) -> bool:
        return self._evidence_job is not None and self._evidence_job.running

    # ---- the actions -------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._job is not None and self._job.running

    def _update_buttons(self, *_args) -> None:
        some = bool(self.selected()) and self.log is not None and not self.running
        name = self.instance.currentText().strip()
        shown = name if len(name) <= 32 else name[:31] + "…"
        self.add_button.setText(f"This is object “{shown}”" if name else "This is object …")
        self.add_button.setEnabled(some and bool(name) and self.index is not None)
        for w in (self.unknown_button, self.discard_button, self.into_collection):
            w.setEnabled(some)
        self.instance.setEnabled(not self.running)
        self.cancel_button.setEnabled(self.running)

    def add_selected(self, instance: str | None = None) -> bool:
        """"This is object X" for the selected photos (X: ``instance``, else the picker's), as a job."""
        from museum_search.core.visitors import add_views_job

        photos, name = self.selected(), (instance or self.instance.currentText()).strip()
        if not photos or self.log is None or self.index is None or self.running:
            return False
        if name not in set(self.index.instances):
            workers.show_error(self, "This is object …", f"There is no object named “{name}” in this index: "
                               "choose one from the list (type a few letters of its name).")
            return False
        refs = [p.id for p in photos]
        self._adding = refs
        gen = add_views_job(self.index.path, self.log, refs, name, into_collection=self.into_collection.isChecked(),
                            engine=self.state.engine)
        self._start(gen, f"Adding {len(refs)} photo{'s' if len(refs) != 1 else ''} as views of {name}…",
                    on_result=self._added)
        return True

    def mark_selected_unknown(self) -> bool:
        """"Not in our collection" for the selected photos."""
        from museum_search.core.visitors import mark_unknown

        photos = self.selected()
        if not photos or self.log is None or self.running:
            return False
        log_, refs = self.log, [p.id for p in photos]
        self._start(lambda: mark_unknown(log_, refs), f"Keeping {len(refs)} as not in the collection…")
        return True

    def discard_selected(self) -> QMessageBox | None:
        """Ask, then delete the selected photos; returns the question (answered later)."""
        photos = self.selected()
        if not photos or self.log is None or self.running:
            return None
        n = len(photos)
        box = QMessageBox(QMessageBox.Icon.Question, "Discard", f"Delete {n} kept photo{'s' if n != 1 else ''}?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, self)
        box.setObjectName("discardDialog")
        box.setInformativeText("They are deleted from the visitors' folder; the counts stay.")
        box.button(QMessageBox.StandardButton.Yes).setText("Discard")
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        refs = [p.id for p in photos]
        box.accepted.connect(lambda: self._discard(refs))
        box.open()
        return box

    def _discard(self, refs: list[str]) -> None:
        from museum_search.core.visitors import discard

        log_ = self.log
        if log_ is not None and not self.running:
            self._start(lambda: discard(log_, refs), f"Discarding {len(refs)}…")

    def _start(self, gen, text: str, on_result=None) -> None:
        self.progress.bar.show()
        self.cancel_button.show()
        self.progress.set_busy()
        self.progress.item_label.setText(text)
        self.progress.set_status("")
        self._job = workers.start(gen, on_progress=self._on_progress, on_result=on_result,
                                  on_error=self._on_error, on_finished=self._on_finished)
        self._update_buttons()

    def _on_progress(self, p) -> None:
        from museum_search.gui.collection_tab import progress_line

        if getattr(p, "total", 0) > 0:
            self.progress.set_step(p.done, p.total)
            texts, tip = progress_line(p, job="update")
            self.progress.item_label.set_texts(texts)
            self.progress.item_label.setToolTip(tip)

    def _added(self, report) -> None:
        self.progress.set_status(f"Added: {report.summary()}.")
        self.state.set_index(report.index)  # the index is opened again, with the new views

    def _on_error(self, exc: BaseException) -> None:
        self.progress.set_status(workers.error_message(exc))
        workers.show_error(self, "Review", exc)

    def _on_finished(self) -> None:
        job, self._job = self._job, None
        self.progress.stop_busy()
        self.progress.bar.hide()
        self.cancel_button.hide()
        self.progress.item_label.setText("")
        adding, self._adding = self._adding, []
        if job is not None and job.cancelled:
            if adding and self._added_meanwhile(adding):
                return
            self.progress.set_status("Cancelled — the index is as it was.")
        self._update_buttons()
        self.changed.emit()

    def _added_meanwhile(self, refs: list[str]) -> bool:
        """After a cancel: whether the add had already finished (the log says "added"); then the
        index it saved is opened (on a worker) and the status says so."""
        from museum_search.core.index import Index

        try:
            done = self.log is not None and any(self.log.photo(r).status == "added" for r in refs)
        except MuseumSearchError:
            done = False
        if not done or self.index is None:
            return False
        self.progress.set_status("The photos were already added when you cancelled; the index is open again.")
        path = self.index.path
        self._job = workers.start(lambda: Index.load(path), on_result=self.state.set_index, on_error=self._on_error,
                                  on_finished=self._on_finished)
        return True

    def cancel(self) -> None:
        if self._job is not None and self._job.running:
            self._job.cancel()
            self.progress.set_status("Cancelling…")
            self.cancel_button.setEnabled(False)

    def shutdown(self) -> None:
        for job in (self._job, self._evidence_job):
            if job is not None and job.running:
                job.cancel()


def _load_photo(path) -> np.ndarray:
    from museum_search.core.images import load_image

    return load_image(path, max_side=EVIDENCE_SIDE)
