"""The Search tab: a query photo (file, drag-and-drop, clipboard or webcam) → the top-k references.

Work is split so that a control change re-runs only what it must:

* a new query (or index) → describe the query (off the GUI thread; the index's extractor is built
  there the first time and kept), cosine scores against every reference, then re-ranking;
* a re-ranker or one of its parameters → re-ranking only, from the cached cosine scores;
* k or "one result per instance" → a new top-k of the cached final scores (cheap, GUI thread).

At most one background job runs at a time. When the inputs change while it runs, the job is
cancelled if its query is obsolete, and :meth:`SearchTab._reconcile` starts whatever is still
missing once it ends. The "not in the collection" verdict uses the best *cosine* score, before
re-ranking (re-rankers change the scale of the scores).
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import (
    QBuffer,
    QByteArray,
    QIODevice,
    QMimeData,
    Qt,
    QTimer,
    QUrl,
    Signal,
)
from PySide6.QtGui import QGuiApplication, QImage, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from ..core.capture import CameraSource, OpenCVCamera, list_cameras
from ..core.errors import ImageError, MuseumSearchError
from ..core.images import SUPPORTED_EXTENSIONS, decode_image, is_image_file, load_image
from ..core.rerank import RerankOptions, build_pipeline, icfrr_advice
from ..core.rerank import icfrr as _icfrr  # noqa: F401 - imports scipy.sparse at start-up, not on the GUI thread later
from ..core.extract import describe_query_image
from ..core.search import Result, in_collection, results_for, score_matrix, top_k
from . import workers
from .state import AppState
from .widgets.camera_view import CameraView, ImageView
from .widgets.result_grid import ResultGrid, result_title

log = logging.getLogger(__name__)

#: Longest side of a query image kept in memory (display, description, spatial verification).
QUERY_MAX_SIDE = 1600
NO_INDEX = "Open or build an index in the Collection tab first."
RERANKERS = (("None", ""), ("ICFRR", "icfrr"), ("αQE", "aqe"), ("DBA", "dba"), ("Spatial verification", "spatial"))
IMAGE_FILTER = "Images ({});;All files (*)".format(" ".join(f"*{e}" for e in sorted(SUPPORTED_EXTENSIONS)))

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
class Query:
    id: int
    image: np.ndarray  # RGB uint8
    name: str
    path: str | None = None


@dataclass
class _JobResult:
    qid: int
    index: Any
    key: tuple  # the re-ranking the scores are for
    descriptor: np.ndarray
    cosine: np.ndarray  # (G,) cosine scores, before re-ranking
    scores: np.ndarray  # (G,) final scores
    extractor: Any
    describe_seconds: float | None  # None: the cached descriptor was used
    rerank_seconds: float
    rerank_error: str | None = None


def _search_job(query: Query, index, key: tuple, names: list[str], options: RerankOptions,
                descriptor: np.ndarray | None, cosine: np.ndarray | None, extractor) -> _JobResult:
    """Describe the query (unless its descriptor is given) and re-rank; runs on a worker thread.

    A plain function rather than a progress generator: both steps are single calls, so there is
    nothing to report or to cancel between them (an obsolete result is simply dropped).
    """
    from ..core.backbones import extractor_for_meta

    describe_seconds = None
    if descriptor is None or cosine is None:
        t0 = time.perf_counter()
        if extractor is None or extractor.meta != index.meta:
            extractor = extractor_for_meta(index.meta)
        try:
            # (R, D): the query's regions, scored as the best region (core.extract.QUERY_REGIONS)
            descriptor = describe_query_image(query.image, extractor)
            cosine = score_matrix(index, descriptor[None])[0]
        except RuntimeError as exc:  # from torch: say what failed
            raise MuseumSearchError(f"the query could not be described ({exc})") from exc
        describe_seconds = time.perf_counter() - t0
    scores, error, t0 = cosine, None, time.perf_counter()
    if names:
        try:
            scores = np.asarray(build_pipeline(names, options).apply(
                index, cosine[None], descriptor[None], query_images=[query.image])[0], np.float32)
        except Exception as exc:
            log.debug("re-ranking failed", exc_info=True)
            scores, error = cosine, workers.error_message(exc)
    return _JobResult(query.id, index, key, descriptor, cosine, scores, extractor, describe_seconds,
                      time.perf_counter() - t0, error)


# --------------------------------------------------------------------------------------------
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


def image_from_mime(mime: QMimeData, name: str = "pasted image") -> np.ndarray | None:
    """RGB uint8 image data carried by ``mime`` (encoded bytes or a QImage), or None.

    Raises :class:`ImageError` when the data is there but cannot be decoded.
    """
    for fmt in ("image/png", "image/jpeg", "image/webp", "image/bmp", "image/tiff"):
        if mime.hasFormat(fmt):
            data = bytes(mime.data(fmt).data())
            if data:
                return decode_image(data, name=name, max_side=QUERY_MAX_SIDE)
    if mime.hasImage():
        img = mime.imageData()
        if isinstance(img, QImage) and not img.isNull():
            return qimage_to_rgb(img, name)
    return None


def qimage_to_rgb(img: QImage, name: str = "image") -> np.ndarray:
    """A QImage as RGB uint8, through PNG bytes and :func:`decode_image` (one decoding path)."""
    ba = QByteArray()
    buf = QBuffer(ba)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    if not img.save(buf, "PNG"):
        raise ImageError(name, "the image data could not be converted")
    buf.close()
    return decode_image(bytes(ba.data()), name=name, max_side=QUERY_MAX_SIDE)


# --------------------------------------------------------------------------------------------
# Result dialog


class ResultDialog(QDialog):
    """The query and one reference side by side, large, with the reference's metadata."""

    def __init__(self, query: Query | None, result: Result, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("resultDialog")
        self.result = result
        title = result_title(result)
        self.setWindowTitle(f"#{result.rank}: {title or result.instance}")
        self.query_view = ImageView("No query image")
        self.reference_view = ImageView("Loading…")
        if query is not None:
            self.query_view.set_image(query.image)
        try:
            self.reference_view.set_image(load_image(result.abspath, max_side=QUERY_MAX_SIDE))
        except ImageError as exc:
            self.reference_view.set_message(str(exc), error=True)
        images = QHBoxLayout()
        for caption, view in ((f"Query: {query.name}" if query else "Query", self.query_view),
                              (f"Reference #{result.rank}: {result.instance}", self.reference_view)):
            col = QVBoxLayout()
            cap = QLabel(f"<b>{html.escape(caption)}</b>")
            col.addWidget(cap)
            col.addWidget(view, 1)
            images.addLayout(col, 1)
        form = QFormLayout()
        form.addRow("Rank:", QLabel(str(result.rank)))
        form.addRow("Score:", QLabel(f"{result.score:.4f}"))
        form.addRow("Instance:", QLabel(html.escape(result.instance)))
        for k, v in (result.metadata or {}).items():
            if v:
                lab = QLabel(html.escape(v))
                lab.setWordWrap(True)
                form.addRow(f"{k[:1].upper()}{k[1:]}:", lab)
        path = QLabel(html.escape(result.abspath))
        path.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        path.setWordWrap(True)
        form.addRow("File:", path)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addLayout(images, 1)
        lay.addLayout(form)
        lay.addWidget(buttons)
        self.resize(1100, 760)


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
        self._query: Query | None = None
        self._next_qid = 0
        self._extractor = None
        self._desc: np.ndarray | None = None
        self._cos: np.ndarray | None = None
        self._desc_for: tuple | None = None  # (qid, index)
        self._final: np.ndarray | None = None
        self._final_for: tuple | None = None  # (qid, index, rerank key)
        self._failed_for: tuple | None = None  # what the last failed job was for (no retry loop)
        self._timing: dict[str, float] = {}
        self._rerank_error: str | None = None
        self._job: workers.Job | None = None
        self._job_for: tuple | None = None
        self._probe_job: workers.Job | None = None
        self._probed = False
        self._results: list[Result] = []
        self._verdict: bool | None = None
        self._dialog: ResultDialog | None = None
        self.setAcceptDrops(True)
        self._build_ui()
        self._fill_cameras([])
        self.state.index_changed.connect(self._index_changed)
        self._index_changed(self.state.index)

    # ---- UI ------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        # top bar: query sources
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
        bar = QHBoxLayout()
        bar.addWidget(self.open_button)
        bar.addWidget(self.paste_button)
        sep = QFrame()
        sep.setFrameShape(QFrame.Shape.VLine)
        sep.setFrameShadow(QFrame.Shadow.Sunken)
        bar.addSpacing(8)
        bar.addWidget(sep)
        bar.addSpacing(8)
        bar.addWidget(QLabel("Camera:"))
        bar.addWidget(self.camera_combo)
        bar.addWidget(self.camera_button)
        bar.addWidget(self.capture_button)
        bar.addStretch(1)

        # left: query image and live camera
        self.query_view = ImageView("Open an image, drop one here, paste one (Ctrl+V) or use the camera.",
                                    alignment=Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignHCenter,
                                    dark=False)
        self.query_view.setObjectName("queryImage")
        self.query_caption = QLabel("<b>Query</b>")
        self.query_caption.setWordWrap(True)
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
        ll.addWidget(self.query_view, 1)
        ll.addWidget(self.camera_box, 1)

        # right: controls, verdict, messages, results
        self.k_spin = QSpinBox(minimum=1, maximum=200)
        self.k_spin.setObjectName("kSpin")
        self.k_spin.setValue(max(1, min(200, self.state.settings.top_k)))
        self.k_spin.setToolTip("Number of results shown")
        self.k_spin.valueChanged.connect(self._k_changed)
        self.per_instance = QCheckBox("One result per instance")
        self.per_instance.setToolTip("Show only the best photo of each object")
        self.per_instance.toggled.connect(lambda _on: self._show_results())
        self.rerank_combo = QComboBox()
        self.rerank_combo.setObjectName("rerankCombo")
        for label, name in RERANKERS:
            self.rerank_combo.addItem(label, name)
        self.rerank_combo.setToolTip(
            "ICFRR: diffusion over the collection (helps when objects have several photos); "
            "αQE / DBA: query expansion / database-side augmentation; "
            "Spatial verification: geometric check of the top results (slower, robust to clutter)")
        self.rerank_combo.currentIndexChanged.connect(self._rerank_changed)
        self.param_stack = QStackedWidget()
        self.param_stack.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self._build_param_pages()

        controls = QHBoxLayout()
        controls.addWidget(QLabel("Results:"))
        controls.addWidget(self.k_spin)
        controls.addSpacing(8)
        controls.addWidget(self.per_instance)
        controls.addSpacing(16)
        controls.addWidget(QLabel("Re-ranking:"))
        controls.addWidget(self.rerank_combo)
        controls.addWidget(self.param_stack)
        controls.addStretch(1)

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
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setMaximumWidth(120)
        self.busy.setMaximumHeight(12)
        self.busy.setTextVisible(False)
        self.busy.hide()
        self.status = QLabel()
        self.status.setObjectName("searchStatus")
        status_row = QHBoxLayout()
        status_row.addWidget(self.busy)
        status_row.addWidget(self.status, 1)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addLayout(controls)
        rl.addWidget(self.banner)
        rl.addWidget(self.message)
        rl.addWidget(self.grid, 1)
        rl.addLayout(status_row)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 2)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setSizes([420, 760])

        lay = QVBoxLayout(self)
        lay.addLayout(bar)
        lay.addWidget(self.splitter, 1)

        ctx = Qt.ShortcutContext.WidgetWithChildrenShortcut
        self._space = QShortcut(QKeySequence(Qt.Key.Key_Space), self, context=ctx)
        self._space.activated.connect(self._space_pressed)
        self._paste = QShortcut(QKeySequence.StandardKey.Paste, self, context=ctx)
        self._paste.activated.connect(self.paste)

        self._rerank_timer = QTimer(self, singleShot=True, interval=250)
        self._rerank_timer.timeout.connect(self._reconcile)

    def _spin(self, lo: int, hi: int, value: int, tip: str) -> QSpinBox:
        s = QSpinBox(minimum=lo, maximum=hi)
        s.setValue(value)
        s.setToolTip(tip)
        s.valueChanged.connect(self._param_changed)
        return s

    def _dspin(self, lo: float, hi: float, step: float, value: float, tip: str) -> QDoubleSpinBox:
        s = QDoubleSpinBox(minimum=lo, maximum=hi, singleStep=step, decimals=2)
        s.setValue(value)
        s.setToolTip(tip)
        s.valueChanged.connect(self._param_changed)
        return s

    def _build_param_pages(self) -> None:
        d = RerankOptions()

        def page(*rows: tuple[str, QWidget]) -> QWidget:
            w = QWidget()
            h = QHBoxLayout(w)
            h.setContentsMargins(0, 0, 0, 0)
            for label, widget in rows:
                h.addWidget(QLabel(label))
                h.addWidget(widget)
            h.addStretch(1)
            return w

        self.icfrr_kq = self._spin(0, 1000, 0, "K_q: how many current top references vote (0 = suggested)")
        self.icfrr_kg = self._spin(0, 1000, 0, "K_g: gallery-gallery rank cut-off (0 = suggested)")
        for s in (self.icfrr_kq, self.icfrr_kg):
            s.setSpecialValueText("auto")
        self.icfrr_beta = self._dspin(0.0, 1.0, 0.05, d.beta, "β: weight of each update")
        self.icfrr_iter = self._spin(1, 50, d.iterations, "Maximum number of updates")
        self.qe_n = self._spin(1, 100, d.qe_n, "n: number of top references used for expansion")
        self.qe_alpha = self._dspin(0.0, 20.0, 0.5, d.qe_alpha, "α: weighting power of the neighbours")
        self.spatial_top = self._spin(1, 500, d.spatial_top, "Number of top results verified geometrically")
        self._pages = {
            "": page(),
            "icfrr": page(("K_q", self.icfrr_kq), ("K_g", self.icfrr_kg), ("β", self.icfrr_beta),
                          ("iterations", self.icfrr_iter)),
            "qe": page(("n", self.qe_n), ("α", self.qe_alpha)),
            "spatial": page(("top N", self.spatial_top)),
        }
        for w in self._pages.values():
            self.param_stack.addWidget(w)

    # ---- public API ----------------------------------------------------------------------
    def query(self) -> Query | None:
        return self._query

    def results(self) -> list[Result]:
        """The results shown now (best first)."""
        return list(self._results)

    def verdict(self) -> bool | None:
        """True/False: in/not in the collection for the results shown; None without results."""
        return self._verdict

    def is_busy(self) -> bool:
        """True while a query is described or re-ranked."""
        return self._job is not None and self._job.running

    def reranker(self) -> str:
        return str(self.rerank_combo.currentData() or "")

    def set_reranker(self, name: str) -> None:
        i = self.rerank_combo.findData(name)
        if i < 0:
            raise ValueError(f"unknown re-ranker {name!r}")
        self.rerank_combo.setCurrentIndex(i)

    def rerank_options(self) -> RerankOptions:
        return RerankOptions(
            k_q=self.icfrr_kq.value() or None, k_g=self.icfrr_kg.value() or None,
            beta=float(self.icfrr_beta.value()), iterations=int(self.icfrr_iter.value()),
            qe_n=int(self.qe_n.value()), qe_alpha=float(self.qe_alpha.value()),
            spatial_top=int(self.spatial_top.value()),
        )

    def search_file(self, path: str | Path) -> bool:
        """Search with the image file at ``path``; False (and a message) if it cannot be read."""
        try:
            image = load_image(path, max_side=QUERY_MAX_SIDE)
        except ImageError as exc:
            self.show_message(f"This image cannot be used: {exc}", "error")
            return False
        self.search_image(image, Path(path).name, str(path))
        return True

    def search_image(self, image: np.ndarray, name: str = "image", path: str | None = None) -> None:
        """Search with an RGB uint8 image."""
        image = np.ascontiguousarray(image)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected an RGB uint8 image, got {image.dtype} {image.shape}")
        self._next_qid += 1
        self._query = Query(self._next_qid, image, name, path)
        self.query_view.set_image(image)
        h, w = image.shape[:2]
        self.query_caption.setText(f"<b>Query:</b> {html.escape(name)} <span style='color:gray'>({w}×{h})</span>")
        self.query_caption.setToolTip(path or "")
        self._desc = self._cos = self._final = None
        self._desc_for = self._final_for = None
        self._results = []
        self._verdict = None
        self.banner.hide()
        self.clear_message()
        if self.state.index is None:
            self.grid.clear(NO_INDEX)
            self.show_message(NO_INDEX, "error")
            return
        self.grid.clear("Searching…")
        if self._job is not None and self._job.running and self._job_for and self._job_for[0] != self._query.id:
            self._job.cancel()  # obsolete query; _reconcile runs when it ends
        self._reconcile()

    def open_image_dialog(self) -> None:
        start = str(self.state.settings.value("search/last_dir", "") or "")
        path, _ = QFileDialog.getOpenFileName(self, "Search with an image", start, IMAGE_FILTER)
        if path:
            self.state.settings.set_value("search/last_dir", str(Path(path).parent))
            self.search_file(path)

    def paste(self) -> bool:
        """Search with the clipboard's image, or the image file it names."""
        return self.search_mime(QGuiApplication.clipboard().mimeData(), "pasted image")

    def search_mime(self, mime: QMimeData | None, name: str = "dropped image") -> bool:
        if mime is None:
            self.show_message("The clipboard is empty. Copy an image or an image file first.", "error")
            return False
        path = local_image_path(mime)
        if path is not None:
            return self.search_file(path)
        try:
            image = image_from_mime(mime, name)
        except ImageError as exc:
            self.show_message(f"This image cannot be used: {exc}", "error")
            return False
        if image is None:
            self.show_message("No image found in what was pasted or dropped. Copy an image, or an image "
                              f"file ({', '.join(sorted(SUPPORTED_EXTENSIONS))}), first.", "error")
            return False
        self.search_image(image, name)
        return True

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
        except Exception as exc:  # noqa: BLE001 - a factory failure is a camera failure
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
        self.search_image(frame, f"camera capture {time.strftime('%H:%M:%S')}")
        return True

    def show_result_dialog(self, result: Result) -> ResultDialog:
        self._dialog = ResultDialog(self._query, result, self)
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
        for job in (self._job, self._probe_job):
            if job is not None and job.running:
                job.cancel()

    # ---- index, controls -----------------------------------------------------------------
    def _index_changed(self, index) -> None:
        self._desc = self._cos = self._final = None
        self._desc_for = self._final_for = self._failed_for = None
        self._results = []
        self._verdict = None
        self.banner.hide()
        if index is not None and self._extractor is not None and self._extractor.meta != index.meta:
            self._extractor = None
        self._suggest_icfrr(index)
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
            from ..core.rerank.icfrr import suggest_params

            p = suggest_params(index.labels)
        except (ImportError, ValueError) as exc:
            log.debug("no ICFRR suggestion: %s", exc)
            return
        for spin, value in ((self.icfrr_kq, p.k_q), (self.icfrr_kg, p.k_g), (self.icfrr_iter, p.max_iter)):
            spin.blockSignals(True)
            spin.setValue(int(value))
            spin.blockSignals(False)
        self.icfrr_beta.blockSignals(True)
        self.icfrr_beta.setValue(float(p.beta))
        self.icfrr_beta.blockSignals(False)

    def _k_changed(self, k: int) -> None:
        self.state.settings.top_k = k
        self._show_results()

    def _rerank_changed(self, _i: int) -> None:
        name = self.reranker()
        self.param_stack.setCurrentWidget(self._pages["qe" if name in ("aqe", "dba") else name])
        advice = icfrr_advice(self.state.index.labels) if name == "icfrr" and self.state.index is not None else None
        if advice:
            self.show_message(advice, "warning")
        self._rerank_timer.stop()
        self._reconcile()

    def _param_changed(self, *_args) -> None:
        if self.reranker():
            self._rerank_timer.start()  # wait for the user to stop clicking

    def _rerank_key(self) -> tuple:
        names = [self.reranker()] if self.reranker() else []
        o = self.rerank_options()
        if not names:
            return ()
        if names == ["icfrr"]:
            return ("icfrr", o.k_q, o.k_g, o.beta, o.iterations)
        if names[0] in ("aqe", "dba"):
            return (names[0], o.qe_n, o.qe_alpha)
        return ("spatial", o.spatial_top)

    # ---- background work -----------------------------------------------------------------
    def _reconcile(self) -> None:
        """Start the job that brings the results up to date with the inputs, if any is needed."""
        q, index = self._query, self.state.index
        if q is None or index is None:
            return
        key = self._rerank_key()
        want = (q.id, index, key)
        if self._final_for is not None and self._final_for[0] == q.id and self._final_for[1] is index \
                and self._final_for[2] == key:
            self._show_results()
            return
        if self._job is not None and self._job.running:
            return  # re-evaluated when it ends
        if self._failed_for is not None and self._failed_for[0] == q.id and self._failed_for[1] is index \
                and self._failed_for[2] == key:
            return  # it failed; the user must change something
        have_desc = self._desc_for is not None and self._desc_for[0] == q.id and self._desc_for[1] is index
        names = [key[0]] if key else []
        args = (q, index, key, names, self.rerank_options(), self._desc if have_desc else None,
                self._cos if have_desc else None, self._extractor)
        self._job_for = want
        self.busy.show()
        if have_desc:
            self.status.setText("Re-ranking…")
        elif self._extractor is None:
            self.status.setText("Loading the descriptor model and describing the query…")
        else:
            self.status.setText("Describing the query…")
        self._job = workers.start(lambda: _search_job(*args), on_result=self._job_result,
                                  on_error=lambda exc, want=want: self._job_error(want, exc),
                                  on_finished=self._job_finished)

    def _job_result(self, res: _JobResult) -> None:
        if res.extractor is not None:
            self._extractor = res.extractor
        if self._query is None or res.qid != self._query.id or res.index is not self.state.index:
            return  # obsolete
        self._desc, self._cos = res.descriptor, res.cosine
        self._desc_for = (res.qid, res.index)
        if res.describe_seconds is not None:
            self._timing["describe"] = res.describe_seconds
        if res.key != self._rerank_key():
            return  # the re-ranker changed meanwhile: _reconcile re-ranks the kept descriptor
        self._final = res.scores
        self._final_for = (res.qid, res.index, res.key)
        self._timing["rerank"] = res.rerank_seconds
        self._rerank_error = res.rerank_error
        self._show_results()

    def _job_error(self, want: tuple, exc: BaseException) -> None:
        self._failed_for = want
        self.grid.clear("No results.")
        self.show_message(f"The search failed: {workers.error_message(exc)}", "error")
        self.status.setText("")

    def _job_finished(self) -> None:
        self._job = None
        self._job_for = None
        self.busy.hide()
        self._reconcile()

    # ---- showing results -----------------------------------------------------------------
    def _show_results(self) -> None:
        q, index = self._query, self.state.index
        if q is None or index is None or self._final is None or self._cos is None or self._final_for is None:
            return
        if self._final_for[0] != q.id or self._final_for[1] is not index:
            return
        per_instance = self.per_instance.isChecked()
        rows = top_k(self._final[None], self.k_spin.value(), index.labels if per_instance else None,
                     per_instance)[0]
        self._results = results_for(index, rows, self._final)
        best_cos = results_for(index, top_k(self._cos[None], 1)[0], self._cos)
        threshold = self.state.settings.threshold
        self._verdict = in_collection(best_cos, threshold)
        self.grid.set_results(self._results)
        self._show_verdict(best_cos[0].score if best_cos else float("nan"), threshold)
        if self._rerank_error:
            self.show_message(f"Re-ranking failed, so the results are not re-ranked: {self._rerank_error}",
                              "error")
        elif self.message.property("kind") == "error":
            self.clear_message()
        parts = [f"{len(self._results)} result{'s' if len(self._results) != 1 else ''} of {len(index):,} references"]
        if "describe" in self._timing:
            parts.append(f"query described in {self._timing['describe']:.2f} s")
        if self._final_for[2]:
            name = {n: label for label, n in RERANKERS}.get(self._final_for[2][0], self._final_for[2][0])
            parts.append(f"re-ranked with {name} in {self._timing.get('rerank', 0.0):.2f} s")
        self.status.setText("; ".join(parts))
        self.results_changed.emit(list(self._results))

    def _show_verdict(self, best: float, threshold: float) -> None:
        if not self._results:
            self.banner.hide()
            return
        if self._verdict:
            top = self._results[0]
            what = result_title(top) or top.instance
            text = (f"<b>Best match:</b> {html.escape(what)} "
                    f"<span style='color:#3c6e47'>(closest cosine score {best:.2f}, "
                    f"threshold {threshold:.2f})</span>")
            kind = "in"
        else:
            text = (f"<b>Not in the collection.</b> The closest reference scores {best:.2f}, below the "
                    f"threshold {threshold:.2f} (Settings). The references below are only the most similar.")
            kind = "out"
        self.banner.setText(text)
        self.banner.setProperty("verdict", kind)
        self.banner.setStyleSheet(f"QLabel {{ {_BANNER_STYLE[kind]} padding:8px; border-radius:4px; }}")
        self.banner.show()

    # ---- camera callbacks ----------------------------------------------------------------
    def _camera_frame(self) -> None:
        if not self.capture_button.isEnabled():
            self.capture_button.setEnabled(True)

    def _camera_failed(self, text: str) -> None:
        self.show_message(text, "error")
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

    def _fill_cameras(self, found: list[int]) -> None:
        current = self.camera_combo.currentData()
        wanted = self.state.settings.camera if current is None else int(current)
        self.camera_combo.blockSignals(True)
        self.camera_combo.clear()
        numbers = sorted(set(found) | {self.state.settings.camera})
        for n in numbers:
            label = f"Camera {n}" + (" (not detected)" if self._probed and n not in found else "")
            self.camera_combo.addItem(label, n)
        i = self.camera_combo.findData(wanted)
        self.camera_combo.setCurrentIndex(max(0, i))
        self.camera_combo.blockSignals(False)

    def _probe_cameras(self) -> None:
        def done(found: list[int]) -> None:
            self._probed = True
            self._fill_cameras(list(found))
            if not found:
                self.camera_combo.setToolTip("No camera was detected; the number set in Settings is tried.")

        self._probe_job = workers.start(lambda: list_cameras(), on_result=done)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._probe_job is None:
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
