"""The Search tab: a query photo (file, drag-and-drop, clipboard or webcam) → the top-k references.

A view over the core query pipeline (:mod:`museum_search.core.answer._pipeline`): the controls make a
:class:`QuerySettings`, a worker calls :meth:`QueryPipeline.answer`, and the tab shows the
:class:`Answer` as it comes (results, "in the collection" verdict and its reason). A file query goes
through :func:`load_query`, exactly as ``museum-search query`` does, so both give the same answer.
Every object found in the photo (:attr:`Answer.objects`) is outlined on the query photo, and when
there are several, "2 objects in this photo" shows a card for each (:mod:`.widgets.objects`). A box
dragged on the photo asks about that part only, through core's region query, as ``query --region``
(:meth:`SearchTab.ask_region`, :mod:`.widgets.region_view`).

At most one background job runs at a time; :meth:`SearchTab._reconcile` starts whatever the shown
answer lacks once it ends. Pipelines are kept per (index, settings) and the query's descriptors per
(query, index), so changing k, one-per-instance, the re-ranker or verification never describes the
photo again. Double-clicking a result opens :class:`ResultDialog`, which draws the verification
evidence (computed on a worker).
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QGuiApplication, QImage, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.answer import (
    Answer,
    QueryImage,
    QueryPipeline,
    QuerySettings,
    RegionError,
    Result,
    icfrr_advice,
    load_query,
    query_from_array,
    query_from_bytes,
)
from museum_search.core.capture import CameraSource, OpenCVCamera, list_cameras
from museum_search.core.errors import ImageError
from museum_search.core.images import SUPPORTED_EXTENSIONS, is_image_file, load_image
from museum_search.gui import workers
from museum_search.gui.state import AppState, query_start_folder
from museum_search.gui.widgets.camera_view import CameraView
from museum_search.gui.widgets.evidence_view import EvidenceView, where_text
from museum_search.gui.widgets.objects import ObjectCards
from museum_search.gui.widgets.region_view import FOR_THE_BOX, RegionBar, RegionView, region_query
from museum_search.gui.widgets.rerank_controls import RerankControls
from museum_search.gui.widgets.result_grid import ResultGrid, catalogue_form, evidence_text, result_title

log = logging.getLogger(__name__)

#: Longest side of the reference photo in the result dialog.
REFERENCE_SIDE = 1024
NO_INDEX = "Open or build an index in the Collection tab first."
#: The Camera list when the computer has no camera (Start camera is then disabled).
NO_CAMERA = "No camera found"
LOOKING_FOR_CAMERAS = "Looking for cameras…"
IMAGE_FILTER = "Images ({});;All files (*)".format(" ".join(f"*{e}" for e in sorted(SUPPORTED_EXTENSIONS)))
_PIPELINES_KEPT = 8

#: What the banner's confidence is (its tooltip).
CONFIDENCE_TIP = ("Confidence: the probability that the best match is right and the object is in this collection, "
                  "as calibrated on this collection's views.")
_BANNER_STYLE = {
    "out": "background:#fde2df; color:#7a1a12; border:1px solid #d0342c;",
    "in": "background:#e1f3e6; color:#18542a; border:1px solid #2e9d4c;",
}
_MESSAGE_STYLE = {
    "error": "background:#fff4e5; color:#6b3d00; border:1px solid #e0a040;",
    "warning": "background:#fff4e5; color:#6b3d00; border:1px solid #e0a040;",
    "info": "background:palette(alternate-base); border:1px solid palette(mid);",
}


@dataclass
class LoadedPhoto:
    id: int
    item: QueryImage  # the photo as the pipeline sees it (decoded once, at most 640 px)
    path: str | None = None
    whole: QueryImage | None = None  # the whole photo, when ``item`` is a part of it (a region query)

    @property
    def image(self) -> np.ndarray:
        return self.item.image

    @property
    def name(self) -> str:
        return self.item.name


@dataclass
class _JobResult:
    pipeline: QueryPipeline
    descriptors: np.ndarray
    answer: Answer
    timings: dict[str, float]


def _answer_job(query: QueryImage, index, settings: QuerySettings, pipeline: QueryPipeline | None,
                extractor, descriptors: np.ndarray | None) -> _JobResult:
    """Answer ``query`` (describing it unless its ``descriptors`` are given); on a worker thread."""
    if pipeline is None:
        pipeline = QueryPipeline(index, settings, extractor=extractor)
    timings: dict[str, float] = {}
    if descriptors is None:
        t0 = time.perf_counter()
        descriptors = pipeline.embed([query])
        timings["describe"] = time.perf_counter() - t0
    (answer,) = pipeline.answer([query], descriptors=descriptors)
    timings.update(search=pipeline.timings.get("search", 0.0), verify=pipeline.timings.get("verify", 0.0))
    return _JobResult(pipeline, descriptors, answer, timings)


# --------------------------------------------------------------------------------------------
#: Whether "One result per instance" was ticked (kept between sessions, as k is).
PER_INSTANCE_SETTING = "search/per_instance"

# Clipboard and drag-and-drop


def local_image_path(mime: QMimeData) -> str | None:
    """The first local image file named by ``mime`` (URLs, or text holding a path or file URL)."""
    candidates: list[str] = []
    if mime.hasUrls():
        candidates += [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]
    if mime.hasText():
        for line in mime.text().splitlines():
            line = line.strip().strip('"')
            if line.startswith("file:"):
                line = QUrl(line).toLocalFile()
            if line:
                candidates.append(line)
    for c in candidates:
        if c and is_image_file(c) and Path(c).is_file():
            return c
    return None


def query_from_mime(mime: QMimeData, name: str = "pasted image") -> QueryImage | None:
    """The query photo carried by ``mime`` (encoded bytes or a QImage), or None.

    Raises :class:`ImageError` when the data is there but cannot be decoded.
    """
    for fmt in ("image/png", "image/jpeg", "image/webp", "image/bmp", "image/tiff"):
        if mime.hasFormat(fmt):
            data = bytes(mime.data(fmt).data())
            if data:
                return query_from_bytes(data, name)
    if mime.hasImage():
        img = mime.imageData()
        if isinstance(img, QImage) and not img.isNull():  # to PNG bytes, decoded by core like any image
            ba = QByteArray()
            buf = QBuffer(ba)
            buf.open(QIODevice.OpenModeFlag.WriteOnly)
            if not img.save(buf, "PNG"):
                raise ImageError(name, "the image data could not be converted")
            buf.close()
            return query_from_bytes(bytes(ba.data()), name)
    return None


# --------------------------------------------------------------------------------------------
# Result dialog


def _evidence_job(pipeline: QueryPipeline | None, query: QueryImage | None, result: Result,
                  answer: Answer | None = None):
    """The reference photo and, when there is a pipeline and a photo, the verification evidence
    (with the photo's local features of ``answer``, when it kept them: not extracted again)."""
    reference = load_image(result.abspath, max_side=REFERENCE_SIDE)
    photo = pipeline is not None and query is not None and query.image is not None
    evidence = pipeline.matches(query, result.row, answer) if photo else None
    return reference, evidence


def verdict_line(answer: Answer | None, result: Result) -> tuple[str, str] | None:
    """(rich text, kind: "in", "out" or "info") of the answer's verdict as seen from ``result``;
    None without an answer."""
    if answer is None or answer.top is None:
        return None
    reason = html.escape(answer.verdict_text())
    if not answer.in_collection:
        which = "the most similar one" if result.rank == 1 else f"result #{result.rank} of the most similar"
        return f"<b>Not in this collection:</b> {reason}. This reference is only {which}.", "out"
    if result.instance == answer.top.instance:
        return f"<b>In the collection:</b> {reason}.", "in"
    best = html.escape(result_title(answer.top) or answer.top.instance)
    return f"<b>In the collection</b> as {best} — {reason}. This reference is result #{result.rank}.", "info"


class ResultDialog(QDialog):
    """The answer's verdict, then the query and one reference side by side, large, with the
    verification evidence drawn (the outline of what matched in each, the matching points) and
    where the points lie, then the reference's catalogue entry (quieter when the verdict rejected
    the answer: the reference is only the most similar)."""

    def __init__(self, query: QueryImage | None, result: Result, pipeline: QueryPipeline | None = None,
                 parent: QWidget | None = None, answer: Answer | None = None):
        super().__init__(parent)
        self.setObjectName("resultDialog")
        self.result = result
        self.pipeline = pipeline
        self.answer = answer
        self.setWindowTitle(f"#{result.rank}: {result_title(result) or result.instance}")
        self.verdict_label = QLabel()
        self.verdict_label.setObjectName("evidenceVerdict")
        self.verdict_label.setWordWrap(True)
        self.verdict_label.setTextFormat(Qt.TextFormat.RichText)
        line = verdict_line(answer, result)
        if line is not None:
            self.verdict_label.setText(line[0])
            self.verdict_label.setProperty("verdict", line[1])
            self.verdict_label.setStyleSheet(
                f"QLabel {{ {_BANNER_STYLE.get(line[1], _MESSAGE_STYLE['info'])} padding:6px; border-radius:4px; }}")
        self.verdict_label.setVisible(line is not None)
        self.evidence_view = EvidenceView()
        self.evidence_view.set_query(query.image if query is not None else None)
        self.evidence_view.set_titles(f"Query: {Path(query.name).name}" if query else "Query",
                                      f"Reference #{result.rank}: {result.instance}")
        self.where_label = QLabel()
        self.where_label.setObjectName("evidenceWhere")
        self.where_label.setWordWrap(True)
        self.where_label.hide()
        self.catalogue = QGroupBox("Catalogue entry of this reference")
        self.catalogue.setObjectName("evidenceCatalogue")
        self.catalogue.setLayout(catalogue_form(result.instance, result.metadata, result.abspath,
                                                [("Rank", str(result.rank)), ("Evidence", evidence_text(result))]))
        if line is not None and line[1] == "out":  # only the most similar: said quietly
            pal = self.catalogue.palette()
            pal.setColor(QPalette.ColorRole.WindowText, pal.color(QPalette.ColorRole.PlaceholderText))
            self.catalogue.setPalette(pal)
            font = self.catalogue.font()
            font.setPointSizeF(font.pointSizeF() * 0.9)
            self.catalogue.setFont(font)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        for w, stretch in ((self.verdict_label, 0), (self.evidence_view, 1), (self.where_label, 0),
                           (self.catalogue, 0), (buttons, 0)):
            lay.addWidget(w, stretch)
        screen = (parent.screen() if parent is not None else self.screen()).availableGeometry()
        self.resize(min(1100, screen.width() - 40), min(760, screen.height() - 40))
        self._job = workers.start(lambda: _evidence_job(pipeline, query, result, answer),
                                  on_result=self._loaded, on_error=self._failed)

    def is_busy(self) -> bool:
        return self._job.running

    def _loaded(self, value) -> None:
        reference, evidence = value
        self.evidence_view.set_reference(reference)
        if evidence is None:
            self.evidence_view.set_evidence(None, "not verified")
            return
        need = self.pipeline.verdict.min_inliers
        caption = None
        if evidence.outline is not None and evidence.inliers < need:
            caption = f"{evidence.inliers} matching points — too few to verify ({need} needed)"
        rejected = self.answer is not None and not self.answer.in_collection
        self.evidence_view.set_evidence(evidence, caption, emphasis=not rejected)
        where = where_text(evidence.inliers, self.evidence_view.matched_area())
        self.where_label.setText(where)
        self.where_label.setVisible(bool(where))

    def _failed(self, exc: BaseException) -> None:
        self.evidence_view.set_reference_message(workers.error_message(exc))


# --------------------------------------------------------------------------------------------
# The tab


class SearchTab(QWidget):
    """Query by photo or webcam; see the module docstring."""

    results_changed = Signal(list)  # the Results shown

    def __init__(self, state: AppState, parent: QWidget | None = None,
                 camera_factory: Callable[[int], CameraSource] | None = None):
        super().__init__(parent)
        self.state = state
        self.camera_factory = camera_factory or OpenCVCamera
        self._query: LoadedPhoto | None = None
        self._next_qid = 0
        self._extractor = None  # kept across pipelines of the same index and engine
        self._extractor_key: tuple | None = None  # (meta, engine setting) of _extractor
        self._pipelines: dict[tuple, QueryPipeline] = {}  # (index id, settings) → pipeline
        self._descriptors: tuple[tuple, np.ndarray] | None = None  # ((query id, index id), descriptors)
        self._answer: Answer | None = None
        self._shown_for: tuple | None = None  # what the shown answer is for: _wanted()
        self._shown_pipeline: QueryPipeline | None = None
        self._failed_for: tuple | None = None  # what the last failed job was for (no retry loop)
        self._timing: dict[str, float] = {}
        self._job: workers.Job | None = None
        self._job_qid: int | None = None
        self._probe_job: workers.Job | None = None
        self._probed = False
        self._dialog: ResultDialog | None = None
        self.setAcceptDrops(True)
        self._build_ui()
        self._fill_cameras([])
        self.state.index_changed.connect(self._index_changed)
        self._index_changed(self.state.index)

    # ---- UI ------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.query_caption = QLabel("<b>Query</b>")
        self.query_caption.setWordWrap(True)
        self.banner = QLabel()
        self.banner.setObjectName("verdictBanner")
        self.banner.setWordWrap(True)
        self.banner.setTextFormat(Qt.TextFormat.RichText)
        self.banner.hide()
        self.message = QLabel()
        self.message.setObjectName("searchMessage")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.message.hide()
        self.grid = ResultGrid(placeholder=NO_INDEX)
        self.grid.setObjectName("resultGrid")
        self.grid.activated.connect(self.show_result_dialog)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self._query_column())
        self.splitter.addWidget(self._answer_column())
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([420, 760])
        lay = QVBoxLayout(self)
        lay.addLayout(self._source_bar())
        lay.addWidget(self.splitter, 1)
        ctx = Qt.ShortcutContext.WidgetWithChildrenShortcut
        self._space = QShortcut(QKeySequence(Qt.Key.Key_Space), self, context=ctx)
        self._space.activated.connect(self._space_pressed)
        self._paste = QShortcut(QKeySequence.StandardKey.Paste, self, context=ctx)
        self._paste.activated.connect(self.paste)
        self._rerank_timer = QTimer(self, singleShot=True, interval=250)
        self._rerank_timer.timeout.connect(self._reconcile)

    def _source_bar(self) -> QHBoxLayout:
        """The query sources: a file, the clipboard, the camera."""
        self.open_button = QPushButton("Open image…")
        self.open_button.setToolTip("Search with a photo file (you can also drop one on this tab)")
        self.open_button.clicked.connect(self.open_image_dialog)
        self.paste_button = QPushButton("Paste")
        self.paste_button.setToolTip("Search with the image (or image file) in the clipboard (Ctrl+V)")
        self.paste_button.clicked.connect(self.paste)
        self.camera_combo = QComboBox()
        self.camera_combo.setObjectName("cameraCombo")
        self.camera_combo.setToolTip("Which camera to use")
        self.camera_button = QPushButton("Start camera")
        self.camera_button.setCheckable(True)
        self.camera_button.clicked.connect(self.toggle_camera)
        self.capture_button = QPushButton("Capture  (Space)")
        self.capture_button.setToolTip("Search with the current camera image (Space)")
        self.capture_button.setEnabled(False)
        self.capture_button.clicked.connect(self.capture)
        sep = QFrame()
        sep.setFrameShape(QFrame.Shape.VLine)
        sep.setFrameShadow(QFrame.Shadow.Sunken)
        bar = QHBoxLayout()
        bar.addWidget(self.open_button)
        bar.addWidget(self.paste_button)
        bar.addSpacing(8)
        bar.addWidget(sep)
        bar.addSpacing(8)
        for w in (QLabel("Camera:"), self.camera_combo, self.camera_button, self.capture_button):
            bar.addWidget(w)
        bar.addStretch(1)
        return bar

    def _query_column(self) -> QWidget:
        """The query photo, and the live camera below it while it runs."""
        self.query_view = RegionView("Open an image, drop one here, paste one (Ctrl+V) or use the camera.",
                                     alignment=Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignHCenter,
                                     dark=False)
        self.query_view.setObjectName("queryImage")
        self.query_view.region_drawn.connect(self.ask_region)  # a box drawn: only that part is asked
        self.query_view.region_cleared.connect(lambda: self.ask_region(None))
        self.region_bar = RegionBar()
        self.region_bar.whole_photo.connect(lambda: self.ask_region(None))
        self.region_bar.hide()
        self.camera_view = CameraView()
        self.camera_view.setObjectName("cameraView")
        self.camera_view.failed.connect(self._camera_failed)
        self.camera_view.stopped.connect(self._camera_stopped)
        self.camera_view.frame_shown.connect(self._camera_frame)
        self.camera_caption = QLabel("<b>Live camera</b>")
        self.camera_box = QWidget()
        cl = QVBoxLayout(self.camera_box)
        cl.setContentsMargins(0, 6, 0, 0)
        cl.addWidget(self.camera_caption)
        cl.addWidget(self.camera_view, 1)
        self.camera_box.hide()
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(self.query_caption)
        ll.addWidget(self.region_bar)
        ll.addWidget(self.query_view, 1)
        ll.addWidget(self.camera_box, 1)
        return left

    def _answer_column(self) -> QWidget:
        """The controls, core's ICFRR warning, the verdict, messages, the results and the status."""
        self.k_spin = QSpinBox(minimum=1, maximum=200)
        self.k_spin.setObjectName("kSpin")
        self.k_spin.setValue(max(1, min(200, self.state.settings.top_k)))
        self.k_spin.setToolTip("Number of results shown")
        self.k_spin.valueChanged.connect(self._k_changed)
        self.per_instance = QCheckBox("One result per instance")
        self.per_instance.setToolTip("Show only the best photo of each object")
        self.per_instance.setChecked(str(self.state.settings.value(PER_INSTANCE_SETTING, "false")).lower() == "true")
        self.per_instance.toggled.connect(lambda on: self.state.settings.set_value(PER_INSTANCE_SETTING, str(on).lower()))
        self.per_instance.toggled.connect(lambda _on: self._reconcile())
        self.rerank = self._rerank_controls()
        for i, w in enumerate((QLabel("Results:"), self.k_spin, self.per_instance)):
            self.rerank.first_row.insertWidget(2 * i, w)
            self.rerank.first_row.insertSpacing(2 * i + 1, 12 if i else 0)
        # core's warning while ICFRR re-ranks a collection it cannot help (stays while ICFRR is chosen)
        self.icfrr_warning = QLabel()
        self.icfrr_warning.setObjectName("icfrrWarning")
        self.icfrr_warning.setWordWrap(True)
        self.icfrr_warning.setStyleSheet(f"QLabel {{ {_MESSAGE_STYLE['warning']} padding:4px; border-radius:4px; }}")
        self.icfrr_warning.hide()
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setMaximumWidth(120)
        self.busy.setMaximumHeight(12)
        self.busy.setTextVisible(False)
        self.busy.hide()
        self.status = QLabel()
        self.status.setObjectName("searchStatus")
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        self.object_cards = ObjectCards()  # "2 objects in this photo": a card per object
        self.object_cards.activated.connect(self.show_result_dialog)
        for w in (self.rerank, self.icfrr_warning, self.banner, self.object_cards, self.message):
            rl.addWidget(w)
        rl.addWidget(self.grid, 1)
        status_row = QHBoxLayout()
        status_row.addWidget(self.busy)
        status_row.addWidget(self.status, 1)
        rl.addLayout(status_row)
        return right

    def _rerank_controls(self) -> RerankControls:
        """One re-ranker, verification (remembered) and the search mode (remembered)."""
        rerank = RerankControls(single=True)
        rerank.set_verify(str(self.state.settings.value("search/verify", "true")).lower() != "false")
        try:
            rerank.search_mode.set_mode(str(self.state.settings.value("search/mode", "auto") or "auto"))
        except ValueError:
            pass
        rerank.verify_changed.connect(self._verify_changed)
        rerank.choice_changed.connect(self._rerank_changed)
        rerank.params_changed.connect(self._param_changed)
        rerank.search_mode.mode_changed.connect(self._search_mode_changed)
        return rerank

    # ---- public API ----------------------------------------------------------------------
    def query(self) -> LoadedPhoto | None:
        return self._query

    def answer(self) -> Answer | None:
        """The pipeline's answer shown now (None before the first one)."""
        return self._answer

    def results(self) -> list[Result]:
        """The results shown now (best first)."""
        return list(self._answer.results) if self._answer is not None else []

    def verdict(self) -> bool | None:
        """True/False: in/not in the collection for the answer shown; None without an answer."""
        return self._answer.in_collection if self._answer is not None else None

    def is_busy(self) -> bool:
        """True while a query is answered."""
        return self._job is not None and self._job.running

    def is_up_to_date(self) -> bool:
        """True when the answer shown is the one for the current query, index and controls."""
        return not self.is_busy() and self._shown_for is not None and self._shown_for == self._wanted()

    def query_settings(self) -> QuerySettings:
        """The pipeline settings the controls describe, on the session's inference engine."""
        return QuerySettings(k=self.k_spin.value(), per_instance=self.per_instance.isChecked(),
                             rerank=self.rerank.names(), options=self.rerank.options(),
                             verify=self.rerank.verify(), verify_top=self.rerank.verify_top(),
                             search=self.rerank.search_mode.mode(), engine=self.state.engine)

    def search_file(self, path: str | Path) -> bool:
        """Search with the image file at ``path``; False (and a message) if it cannot be read."""
        return self._search(lambda: load_query(path), str(path))

    def _search(self, make: Callable[[], QueryImage | None], path: str | None = None,
                whole: QueryImage | None = None) -> bool:
        try:
            item = make()
        except (ImageError, RegionError) as exc:
            self.show_message(f"This image cannot be used: {exc}", "error")
            return False
        if item is None:
            self.show_message("No image found in what was pasted or dropped. Copy an image, or an image "
                              f"file ({', '.join(sorted(SUPPORTED_EXTENSIONS))}), first.", "error")
            return False
        self._next_qid += 1
        self._query = LoadedPhoto(self._next_qid, item, path, whole)
        self.query_view.set_query(whole or item, item.region)
        self.region_bar.set_region(item.region)
        self.region_bar.show()
        h, w = (whole or item).image.shape[:2]
        name = Path(item.name).name if path else item.name
        self.query_caption.setText(f"<b>Query:</b> {html.escape(name)} <span style='color:gray'>({w}×{h})</span>")
        self.query_caption.setToolTip(path or "")
        self._descriptors = None
        self._set_answer(None)
        self.clear_message()
        if self.state.index is None:
            self.grid.clear(NO_INDEX)
            self.show_message(NO_INDEX, "error")
            return True
        self.grid.clear("Searching…")
        if self._job is not None and self._job.running and self._job_qid != self._query.id:
            self._job.cancel()  # obsolete query; _reconcile runs when it ends
        self._reconcile()
        return True

    def ask_region(self, region: tuple[float, float, float, float] | None) -> bool:
        """Ask about the part ``region`` (x, y, w, h in the photo's pixels; None: the whole photo)
        of the query photo, through core (:func:`region_query`); the photo shown stays whole."""
        q = self._query
        if q is None:
            return False
        whole = q.whole or q.item
        if region is None and q.whole is None:
            return True  # the whole photo is asked already
        return self._search(lambda: region_query(whole, q.path, region), q.path, whole if region else None)

    def open_image_dialog(self) -> None:
        start = query_start_folder(self.state.settings, self.state.index)  # the sample's photos of visitors first
        path, _ = QFileDialog.getOpenFileName(self, "Search with an image", start, IMAGE_FILTER)
        if path:
            self.state.settings.set_value("search/last_dir", str(Path(path).parent))
            self.search_file(path)

    def paste(self) -> bool:
        """Search with the clipboard's image, or the image file it names."""
        mime = QGuiApplication.clipboard().mimeData()
        if mime is not None and not mime.formats():  # an empty clipboard (X11 gives empty data, not none)
            mime = None
        return self.search_mime(mime, "pasted image")

    def search_mime(self, mime: QMimeData | None, name: str = "dropped image") -> bool:
        if mime is None:
            self.show_message("The clipboard is empty. Copy an image or an image file first.", "error")
            return False
        path = local_image_path(mime)
        if path is not None:
            return self.search_file(path)
        return self._search(lambda: query_from_mime(mime, name))

    # camera
    def toggle_camera(self) -> None:
        if self.camera_view.is_running():
            self.stop_camera()
        else:
            self.start_camera()

    def start_camera(self, index: int | None = None) -> None:
        if index is None:
            data = self.camera_combo.currentData()
            index = int(data) if data is not None else self.state.settings.camera
        self.clear_message()
        try:
            source = self.camera_factory(int(index))
        except Exception as exc:
            self._camera_failed(workers.error_message(exc))
            return
        self.camera_box.show()
        self.camera_caption.setText(f"<b>Live camera:</b> {html.escape(str(getattr(source, 'name', index)))}")
        self.camera_view.start(source)
        self.camera_button.setChecked(True)
        self.camera_button.setText("Stop camera")
        self.capture_button.setEnabled(False)  # until the first frame

    def stop_camera(self) -> None:
        self.camera_view.stop()
        self.camera_box.hide()

    def capture(self) -> bool:
        """Search with the newest camera frame."""
        if not self.camera_view.is_running():
            self.show_message("Start the camera first (or open an image file).", "error")
            return False
        frame = self.camera_view.latest_frame()
        if frame is None:
            self.show_message("No image from the camera yet; wait a moment and capture again.", "error")
            return False
        return self._search(lambda: query_from_array(frame, f"camera capture {time.strftime('%H:%M:%S')}"))

    def show_result_dialog(self, result: Result) -> ResultDialog:
        query = self._query.item if self._query is not None else None
        if self._dialog is not None:  # one at a time: a closed dialog (its photos, ~8 MB) is freed
            if self._dialog._job.running:
                self._dialog._job.cancel()
            self._dialog.close()
            self._dialog.deleteLater()
        self._dialog = ResultDialog(query, result, self._shown_pipeline, self, self._answer)
        self._dialog.open()
        return self._dialog

    def show_message(self, text: str, kind: str = "info") -> None:
        self.message.setText(text)
        self.message.setProperty("kind", kind)
        self.message.setStyleSheet(f"QLabel {{ {_MESSAGE_STYLE.get(kind, '')} padding:6px; border-radius:4px; }}")
        self.message.show()

    def clear_message(self) -> None:
        self.message.clear()
        self.message.hide()

    def shutdown(self) -> None:
        """Stop the camera and background work (the window is closing)."""
        self._rerank_timer.stop()
        self.camera_view.stop(message=None)
        for job in (self._job, self._probe_job, self._dialog and self._dialog._job):
            if job is not None and job.running:
                job.cancel()

    # ---- index, controls -----------------------------------------------------------------
    def _index_changed(self, index) -> None:
        self._pipelines.clear()
        self._descriptors = None
        self._failed_for = None
        self._set_answer(None)
        if index is not None and self._extractor_key is not None and self._extractor_key[0] != index.meta:
            self._extractor, self._extractor_key = None, None
        self._suggest_icfrr(index)
        self._update_icfrr_warning()
        self.rerank.search_mode.blockSignals(True)  # the answer is recomputed below anyway
        self.rerank.search_mode.set_index(index)
        self.rerank.search_mode.blockSignals(False)
        if index is None:
            self.grid.clear(NO_INDEX)
            self.status.setText("")
            return
        if self.message.property("kind") == "error" and self.message.text() == NO_INDEX:
            self.clear_message()
        if self._query is None:
            self.grid.clear("Open an image, drop one here, paste one or use the camera to search "
                            f"{len(index):,} references.")
        else:
            self.grid.clear("Searching…")
            self._reconcile()

    def _suggest_icfrr(self, index) -> None:
        if index is None:
            return
        try:
            from museum_search.core.answer import suggest_params

            p = suggest_params(index.labels)
        except (ImportError, ValueError) as exc:
            log.debug("no ICFRR suggestion: %s", exc)
            return
        self.rerank.set_options(replace(self.rerank.options(), k_q=int(p.k_q), k_g=int(p.k_g), beta=float(p.beta),
                                        iterations=int(p.max_iter)), quiet=True)

    def _k_changed(self, k: int) -> None:
        self.state.settings.top_k = k
        self._reconcile()

    def _verify_changed(self, on: bool) -> None:
        self.state.settings.set_value("search/verify", "true" if on else "false")
        self._reconcile()

    def _search_mode_changed(self, mode: str) -> None:
        self.state.settings.set_value("search/mode", mode)
        self._reconcile()

    def _rerank_changed(self) -> None:
        self._update_icfrr_warning()
        self._rerank_timer.stop()
        self._reconcile()

    def _param_changed(self) -> None:
        self._update_icfrr_warning()
        self._rerank_timer.start()  # wait for the user to stop clicking

    def icfrr_advice(self) -> str | None:
        """Core's warning when the chosen ICFRR cannot help the open collection (else None)."""
        if self.rerank.names() != ["icfrr"] or self.state.index is None:
            return None
        return icfrr_advice(self.state.index.labels, self.rerank.options())

    def _update_icfrr_warning(self) -> None:
        advice = self.icfrr_advice()
        self.icfrr_warning.setText(f"⚠ {advice}" if advice else "")
        self.icfrr_warning.setVisible(bool(advice))

    # ---- background work -----------------------------------------------------------------
    def _wanted(self) -> tuple | None:
        """(query id, index id, settings) of the answer the controls ask for, or None."""
        if self._query is None or self.state.index is None:
            return None
        return (self._query.id, id(self.state.index), self.query_settings())

    def _reconcile(self) -> None:
        """Start the job that brings the answer up to date with the inputs, if any is needed."""
        want = self._wanted()
        if want is None or want == self._shown_for or want == self._failed_for:
            return
        if self._job is not None and self._job.running:
            return  # re-evaluated when it ends
        q, index, settings = self._query, self.state.index, self.query_settings()
        pipeline = self._pipelines.get(want[1:])
        desc = self._descriptors[1] if self._descriptors and self._descriptors[0] == want[:2] else None
        extractor = self._extractor if self._extractor_key == (index.meta, settings.engine) else None
        self.busy.show()
        self.status.setText("Answering…" if desc is not None else (
            "Describing the query…" if extractor is not None else "Loading the descriptor model and describing the query…"))
        self._job_qid = q.id
        self._job = workers.start(lambda: _answer_job(q.item, index, settings, pipeline, extractor, desc),
                                  on_result=lambda res, want=want: self._job_result(want, res),
                                  on_error=lambda exc, want=want: self._job_error(want, exc),
                                  on_finished=self._job_finished)

    def _job_result(self, want: tuple, res: _JobResult) -> None:
        if res.pipeline.index is not self.state.index:
            return  # obsolete
        self._extractor = res.pipeline.extractor
        self._extractor_key = (res.pipeline.index.meta, res.pipeline.settings.engine)
        self._pipelines[want[1:]] = res.pipeline
        while len(self._pipelines) > _PIPELINES_KEPT:
            self._pipelines.pop(next(iter(self._pipelines)))
        self._descriptors = (want[:2], res.descriptors)
        if want != self._wanted():
            return  # the controls changed meanwhile: _reconcile answers again from the kept descriptors
        self._timing = res.timings
        self._shown_for = want
        self._shown_pipeline = res.pipeline
        self._set_answer(res.answer)

    def _job_error(self, want: tuple, exc: BaseException) -> None:
        self._failed_for = want
        self.grid.clear("No results.")
        self.show_message(f"The search failed: {workers.error_message(exc)}", "error")
        self.status.setText("")

    def _job_finished(self) -> None:
        self._job = None
        self._job_qid = None
        self.busy.hide()
        self._reconcile()

    # ---- showing the answer --------------------------------------------------------------
    def _set_answer(self, answer: Answer | None) -> None:
        self._answer = answer
        boxed = self._query is not None and self._query.whole is not None
        self.object_cards.set_objects(answer.objects if answer is not None else [], in_box=boxed)
        self.query_view.set_objects(answer.objects if answer is not None else [])
        if answer is None:
            self._shown_for = self._shown_pipeline = None
            self.banner.hide()
            return
        self.grid.set_results(answer.results)
        self._show_verdict(answer)
        if self.message.property("kind") == "error":
            self.clear_message()
        n, t = len(answer.results), self._timing
        parts = [f"{n} result{'s' if n != 1 else ''} of {len(self.state.index):,} references",
                 self._shown_pipeline.settings_text()]
        if getattr(self._shown_pipeline, "search_mode", "exact") == "ann" and self._shown_pipeline.settings.search == "auto":
            parts.append("approximate search (automatic for this size)")
        if "describe" in t:
            parts.append(f"query described in {t['describe']:.2f} s")
        if self._shown_pipeline.settings.verify:
            parts.append(f"verification took {t.get('verify', 0.0):.2f} s")
        self.status.setText(" · ".join(parts))
        self.results_changed.emit(list(answer.results))

    def _show_verdict(self, answer: Answer) -> None:
        if not answer.results:
            self.banner.hide()
            return
        reason = html.escape(answer.verdict_text())
        if answer.in_collection:
            what = html.escape(result_title(answer.top) or answer.top.instance)
            text, kind = f"<b>In the collection</b> — {reason}. <b>Best match:</b> {what}", "in"
        else:
            text, kind = (f"<b>Not in this collection</b> — {reason}. "
                          "The references below are only the most similar."), "out"
        if self._query is not None and self._query.whole is not None:  # a region query's answer
            text = html.escape(FOR_THE_BOX) + text
        self.banner.setText(text)
        self.banner.setToolTip(f"{CONFIDENCE_TIP}\nVerdict: {self._shown_pipeline.verdict.source}")
        self.banner.setProperty("verdict", kind)
        self.banner.setStyleSheet(f"QLabel {{ {_BANNER_STYLE[kind]} padding:8px; border-radius:4px; }}")
        self.banner.show()

    # ---- camera callbacks ----------------------------------------------------------------
    def _camera_frame(self) -> None:
        if not self.capture_button.isEnabled():
            self.capture_button.setEnabled(True)

    def _camera_failed(self, text: str) -> None:
        self.show_message(f"{text} The Camera list next to “Start camera” shows the cameras found.", "error")
        self.camera_button.setChecked(False)
        self.camera_button.setText("Start camera")
        self.capture_button.setEnabled(False)

    def _camera_stopped(self) -> None:
        self.camera_button.setChecked(False)
        self.camera_button.setText("Start camera")
        self.capture_button.setEnabled(False)

    def _space_pressed(self) -> None:
        if self.camera_view.is_running():
            self.capture()

    def _probes_cameras(self) -> bool:
        """True when the cameras are the computer's webcams (core's probe finds them); a replayed
        or test camera is not probed."""
        return self.camera_factory is OpenCVCamera

    def _fill_cameras(self, found: list[int]) -> None:
        """The Camera list: the cameras ``found`` and the one of the settings; "No camera found"
        (and Start disabled) when the probe found none; "Looking for cameras…" until it answers."""
        current = self.camera_combo.currentData()
        wanted = self.state.settings.camera if current is None else int(current)
        probes = self._probes_cameras()
        none = probes and not found
        self.camera_combo.blockSignals(True)
        self.camera_combo.clear()
        if none:
            self.camera_combo.addItem(NO_CAMERA if self._probed else LOOKING_FOR_CAMERAS, None)
        else:
            for n in sorted(set(found) | {self.state.settings.camera}):
                label = f"Camera {n}" + (" (not detected)" if probes and n not in found else "")
                self.camera_combo.addItem(label, n)
            self.camera_combo.setCurrentIndex(max(0, self.camera_combo.findData(wanted)))
        self.camera_combo.blockSignals(False)
        self.camera_combo.setEnabled(not none)
        running = self.camera_view.is_running()
        self.camera_button.setEnabled(running or not none)
        if none and self._probed:
            tip = ("No camera was found on this computer. Connect a webcam: the list is checked again "
                   "when you come back to this tab.")
        else:
            tip = "Which camera to use"
        self.camera_combo.setToolTip(tip)
        self.camera_button.setToolTip(tip if none else "Show the camera's live picture (then Capture searches with it)")

    def _probe_cameras(self) -> None:
        def done(found: list[int]) -> None:
            self._probed = True
            self._fill_cameras(list(found))

        self._probe_job = workers.start(lambda: list_cameras(), on_result=done)

    def cameras_found(self) -> bool | None:
        """Whether the probe found a camera (None: not probed, or not probed yet)."""
        if not self._probes_cameras() or not self._probed:
            return None
        return self.camera_combo.currentData() is not None

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if not self._probes_cameras():
            return
        # probed once, and again when the tab comes back while no camera was found (one plugged in since)
        if self._probe_job is None or (self._probed and not self._probe_job.running
                                       and self.camera_combo.currentData() is None):
            self._probe_cameras()

    # ---- drag and drop -------------------------------------------------------------------
    def dragEnterEvent(self, event) -> None:
        mime = event.mimeData()
        if local_image_path(mime) is not None or mime.hasImage() or any(
                mime.hasFormat(f) for f in ("image/png", "image/jpeg")):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event) -> None:
        if self.search_mime(event.mimeData(), "dropped image"):
            event.acceptProposedAction()
        else:
            event.ignore()
