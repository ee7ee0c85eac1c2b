"""The Collection tab: choose a folder of reference photos, how to label them and which descriptor
to use, build (or update) its index in the background, and browse what is indexed.

All long work runs through :mod:`museum_search.gui.workers` on core generators
(``core.index.build_index`` / ``update_index``); the network itself is built inside the worker so
a missing-weights error is reported like any other (a dialog, no traceback). Cancelling stops the
generator before it saves: the index on disk is replaced atomically only at the very end, so the
previous index stays as it was.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)
from superqt import QElidingLabel

from ..core import paths
from ..core.backbones import (
    DEFAULT_BACKBONE,
    DEFAULT_HEAD,
    DEFAULT_SIZE,
    HEADS,
    REGISTRY,
    BackboneConfig,
    build_extractor,
)
from ..core.errors import MuseumSearchError
from ..core.extract import ExtractProgress
from ..core.index import (
    MANIFEST,
    BuildReport,
    Index,
    LabellingSpec,
    build_index,
    update_index,
)
from ..core.labels import RULES, describe, find_catalogue, label_collection
from . import workers
from .state import AppState
from .widgets.thumbnails import ThumbnailBrowser, ThumbnailCache

log = logging.getLogger(__name__)

RULE_LABELS = {
    "auto": "Automatic",
    "catalogue": "Catalogue (CSV file)",
    "folder": "One folder per instance",
    "clicide": "CLICIDE file names",
    "garofou": "GaRoFou file names",
    "regex": "Regular expression",
    "none": "None (each image is its own instance)",
}
HEAD_LABELS = {
    "logits": "ImageNet logits (224×224)",
    "gap": "Average pooling (GAP)",
    "mac": "Max pooling (MAC)",
    "gem": "Generalized mean (GeM)",
    "rmac": "Regional max pooling (R-MAC)",
}
INDEX_DIR_NAME = "indexes"
SAMPLE_INDEX_NAME = "sample"


def default_index_dir(collection: str | Path) -> Path:
    """``<user data>/indexes/<collection folder name>``."""
    name = Path(collection).resolve().name or "collection"
    return paths.data_dir() / INDEX_DIR_NAME / name


def sample_index_dir() -> Path:
    return paths.data_dir() / INDEX_DIR_NAME / SAMPLE_INDEX_NAME


def format_duration(seconds: float | None) -> str:
    """``0:42``, ``12:05``, ``1:02:03``; ``…`` when unknown."""
    if seconds is None:
        return "…"
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _manifest_stamp(folder: Path) -> int | None:
    try:
        return (folder / MANIFEST).stat().st_mtime_ns
    except OSError:
        return None


# ---- the generators run in the worker (never touch Qt there) ---------------------------------


def _build_job(collection: Path, out: Path, config: BackboneConfig, spec: LabellingSpec, batch_size: int):
    """Build the extractor (may raise WeightsUnavailableError), then the index."""
    yield ExtractProgress(0, 0, None, stage=f"loading {config.name}")
    extractor = build_extractor(config)
    yield ExtractProgress(0, 0, None, stage="listing and labelling the images")
    report = yield from build_index(collection, out, config, spec, extractor=extractor, batch_size=batch_size)
    return report


def _update_job(index_dir: Path, batch_size: int):
    yield ExtractProgress(0, 0, None, stage="reading the index")
    index = Index.load(index_dir)
    yield ExtractProgress(0, 0, None, stage="looking for new, changed and removed files")
    report = yield from update_index(index, batch_size=batch_size)
    return report


class CollectionTab(QWidget):
    """Build, update and browse the index of a collection. See the module docstring."""

    #: A build or update ended: True if it produced an index, False (error, cancelled) otherwise.
    job_done = Signal(bool)

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.batch_size = 8
        self._job: workers.Job | None = None
        self._job_kind = ""
        self._job_out: Path | None = None
        self._stamp_before: int | None = None
        self._label_job: workers.Job | None = None
        self._label_token = 0
        self._index_dir_auto = True  # the index folder follows the collection until edited by hand
        self._filling = False
        self._succeeded = False
        self._last_progress: ExtractProgress | None = None
        self._last_collection: Path | None = None
        self._build_ui()
        self.state.index_changed.connect(self._index_changed)
        if self.state.index is not None:
            self._index_changed(self.state.index)
        self._update_buttons()

    # ---- UI ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        # collection group
        self.collection_edit = QLineEdit()
        self.collection_edit.setObjectName("collectionFolder")
        self.collection_edit.setPlaceholderText("Folder of reference photos")
        self.collection_edit.editingFinished.connect(self._collection_edited)
        self.collection_edit.textChanged.connect(self.collection_edit.setToolTip)
        browse = QPushButton("Browse…")
        browse.setObjectName("browseCollection")
        browse.clicked.connect(self.choose_collection)
        self.browse_button = browse

        self.rule_combo = QComboBox()
        self.rule_combo.setObjectName("labellingRule")
        for rule in RULES:
            self.rule_combo.addItem(RULE_LABELS.get(rule, rule), rule)
        self.rule_combo.setToolTip("How each photo gets its instance (the object it shows)")
        self.rule_combo.currentIndexChanged.connect(self._rule_changed)
        self.detected_label = QLabel("Choose a collection folder.")
        self.detected_label.setObjectName("detectedLabelling")
        self.detected_label.setWordWrap(True)
        self.detected_label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.detected_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.catalogue_edit = QLineEdit()
        self.catalogue_edit.setObjectName("catalogueFile")
        self.catalogue_edit.setPlaceholderText("CSV with file,instance[,artist,title…] columns")
        self.catalogue_edit.editingFinished.connect(self._labelling_inputs_changed)
        self.catalogue_edit.textChanged.connect(self.catalogue_edit.setToolTip)
        cat_button = QPushButton("Choose…")
        cat_button.clicked.connect(self._choose_catalogue)
        self.catalogue_button = cat_button

        self.regex_edit = QLineEdit()
        self.regex_edit.setObjectName("labelRegex")
        self.regex_edit.setPlaceholderText(r"e.g. obj(?P<instance>\d+)__")
        self.regex_edit.setToolTip("A regular expression searched in each file's path; the group "
                                   "named 'instance' (or the first group) is the instance")
        self._regex_timer = QTimer(self, singleShot=True, interval=500)
        self._regex_timer.timeout.connect(self._labelling_inputs_changed)
        self.regex_edit.textEdited.connect(lambda _t: self._regex_timer.start())

        coll_box = QGroupBox("Collection")
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow("Folder:", _row(self.collection_edit, browse))
        form.addRow("Labels:", self.rule_combo)
        form.addRow("Catalogue:", _row(self.catalogue_edit, cat_button))
        form.addRow("Regex:", self.regex_edit)
        cl = QVBoxLayout(coll_box)
        cl.addLayout(form)
        cl.addWidget(self.detected_label)  # below the form: a wrapped label sizes well in a box layout

        # descriptor group
        self.backbone_combo = QComboBox()
        self.backbone_combo.setObjectName("backbone")
        for name, spec in REGISTRY.items():
            self.backbone_combo.addItem(name, name)
            self.backbone_combo.setItemData(self.backbone_combo.count() - 1, spec.description, Qt.ItemDataRole.ToolTipRole)
        self.backbone_combo.currentIndexChanged.connect(self._backbone_changed)
        self.head_combo = QComboBox()
        self.head_combo.setObjectName("head")
        for head in HEADS:
            self.head_combo.addItem(HEAD_LABELS.get(head, head), head)
        self.head_combo.currentIndexChanged.connect(self._head_changed)
        self.size_spin = QSpinBox()
        self.size_spin.setObjectName("imageSize")
        self.size_spin.setRange(32, 4096)
        self.size_spin.setSingleStep(32)
        self.size_spin.setSuffix(" px")
        self.size_spin.setToolTip("Longest side of the images given to the network")
        desc_box = QGroupBox("Descriptor")
        dform = QFormLayout(desc_box)
        dform.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        dform.addRow("Backbone:", self.backbone_combo)
        dform.addRow("Head:", self.head_combo)
        dform.addRow("Image size:", self.size_spin)
        self._set_combo(self.backbone_combo, DEFAULT_BACKBONE)
        self._set_combo(self.head_combo, DEFAULT_HEAD)
        self.size_spin.setValue(DEFAULT_SIZE)
        self._backbone_changed()

        # index group
        self.index_edit = QLineEdit()
        self.index_edit.setObjectName("indexFolder")
        self.index_edit.setPlaceholderText("Where the index is saved")
        self.index_edit.textEdited.connect(self._index_dir_edited)
        self.index_edit.textChanged.connect(lambda _t: self._update_buttons())
        self.index_edit.textChanged.connect(self.index_edit.setToolTip)
        idx_button = QPushButton("Choose…")
        idx_button.clicked.connect(self._choose_index_dir)
        self.index_button = idx_button
        self.build_button = QPushButton("Build index")
        self.build_button.setObjectName("buildButton")
        self.build_button.setToolTip("Describe every labelled photo of the collection and save the index")
        self.build_button.clicked.connect(self.start_build)
        self.update_button = QPushButton("Update")
        self.update_button.setObjectName("updateButton")
        self.update_button.setToolTip("Describe only new and changed photos, drop deleted ones")
        self.update_button.clicked.connect(self.start_update)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelButton")
        self.cancel_button.clicked.connect(self.cancel)
        self.progress_bar = QProgressBar()
        self.progress_bar.setObjectName("buildProgress")
        self.progress_bar.setRange(0, 1)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(False)
        self.progress_label = QElidingLabel("")
        self.progress_label.setObjectName("progressLabel")
        self.progress_label.setElideMode(Qt.TextElideMode.ElideMiddle)
        self.status_label = QLabel("")
        self.status_label.setObjectName("collectionStatus")
        self.status_label.setWordWrap(True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        index_box = QGroupBox("Index")
        iform = QVBoxLayout(index_box)
        iform.addWidget(_row(self.index_edit, idx_button))
        buttons = QHBoxLayout()
        buttons.addWidget(self.build_button)
        buttons.addWidget(self.update_button)
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        iform.addLayout(buttons)
        iform.addWidget(self.progress_bar)
        iform.addWidget(self.progress_label)
        iform.addWidget(self.status_label)

        # skipped files
        self.skipped_tree = QTreeWidget()
        self.skipped_tree.setObjectName("skippedFiles")
        self.skipped_tree.setHeaderLabels(["File", "Reason"])
        self.skipped_tree.setRootIsDecorated(False)
        self.skipped_tree.setUniformRowHeights(True)
        self.skipped_tree.setAlternatingRowColors(True)
        self.skipped_tree.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.skipped_tree.header().setStretchLastSection(True)
        self.skipped_tree.setColumnWidth(0, 170)
        self.skipped_box = QGroupBox("Skipped and ignored files")
        sl = QVBoxLayout(self.skipped_box)
        sl.addWidget(self.skipped_tree)

        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(coll_box)
        ll.addWidget(desc_box)
        ll.addWidget(index_box)
        ll.addWidget(self.skipped_box, 1)
        left.setMinimumWidth(360)

        self.browser = ThumbnailBrowser(self)
        self.browser.setObjectName("collectionBrowser")
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(self.browser)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([420, 860])
        splitter.setChildrenCollapsible(False)
        self.splitter = splitter
        lay = QVBoxLayout(self)
        lay.addWidget(splitter)
        self._rule_changed()

    @staticmethod
    def _set_combo(combo: QComboBox, value: Any) -> None:
        i = combo.findData(value)
        if i >= 0:
            combo.setCurrentIndex(i)

    # ---- public API --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._job is not None

    def choose_collection(self) -> None:
        start = self.collection_edit.text() or str(self.state.settings.value("collection/last_dir", "") or Path.home())
        folder = QFileDialog.getExistingDirectory(self, "Choose the folder of reference photos", start)
        if folder:
            self.set_collection(folder)

    def set_collection(self, folder: str | Path, detect: bool = True) -> None:
        """Use ``folder`` as the collection: default index folder, catalogue, label detection."""
        folder = Path(folder)
        self._last_collection = folder
        self.collection_edit.setText(str(folder))
        self.state.settings.set_value("collection/last_dir", str(folder))
        if self._index_dir_auto or not self.index_edit.text().strip():
            self.index_edit.setText(str(default_index_dir(folder)))
            self._index_dir_auto = True
        cat = find_catalogue(folder) if folder.is_dir() else None
        self.catalogue_edit.setText(str(cat) if cat else "")
        # a new folder: let "auto" find its layout again (without a second detection run)
        self.rule_combo.blockSignals(True)
        self._set_combo(self.rule_combo, "auto")
        self.rule_combo.blockSignals(False)
        self._rule_changed_enable_only()
        self.skipped_tree.clear()
        if detect:
            self._detect_labels()

    def open_sample_collection(self) -> None:
        """Open the index of the bundled sample collection, building it first if needed."""
        if self.running:
            self.status_label.setText("Wait for the current job to finish (or cancel it) first.")
            return
        root = paths.sample_collection()
        collection, catalogue = root / "collection", root / "catalogue.csv"
        if not collection.is_dir():
            workers.show_error(self, "Sample collection",
                               f"The sample collection is not installed (expected in {root}). "
                               "Reinstall museum-search or open a collection of your own.")
            return
        out = sample_index_dir()
        if (out / MANIFEST).is_file():
            try:
                index = Index.load(out)
            except MuseumSearchError as exc:
                log.warning("sample index at %s is unusable (%s); rebuilding it", out, exc)
            else:
                self.state.set_index(index)
                self.status_label.setText(f"Sample collection: {len(index)} references.")
                return
        self.set_collection(collection, detect=False)
        self._set_combo(self.rule_combo, "catalogue")
        self.catalogue_edit.setText(str(catalogue))
        self._set_combo(self.backbone_combo, DEFAULT_BACKBONE)
        self._set_combo(self.head_combo, DEFAULT_HEAD)
        self.size_spin.setValue(DEFAULT_SIZE)
        self.index_edit.setText(str(out))
        self._index_dir_auto = False
        self._detect_labels()
        self.start_build()

    def config(self) -> BackboneConfig:
        return BackboneConfig(self.backbone_combo.currentData(), self.head_combo.currentData(), self.size_spin.value())

    def labelling_spec(self) -> LabellingSpec:
        """The labelling chosen in the form (a catalogue found next to the collection is left to
        ``auto`` to find, so that it can fall back to another rule if it lists none of the files)."""
        rule = self.rule_combo.currentData()
        text = self.catalogue_edit.text().strip()
        catalogue = None
        if rule == "catalogue" and text:
            catalogue = text
        elif rule == "auto" and text:
            root = self.collection_edit.text().strip()
            found = find_catalogue(root) if root and Path(root).is_dir() else None
            if found is None or Path(text).resolve() != found.resolve():
                catalogue = text
        regex = (self.regex_edit.text() or None) if rule == "regex" else None
        return LabellingSpec(rule, catalogue, regex)

    def start_build(self) -> None:
        """Build the index of the chosen collection into the index folder (in the background)."""
        if self.running:
            return
        collection = Path(self.collection_edit.text().strip())
        out_text = self.index_edit.text().strip()
        if not self.collection_edit.text().strip() or not collection.is_dir():
            workers.show_error(self, "Cannot build the index",
                               f"Collection folder not found: {collection}. Choose a folder of photos.")
            return
        if not out_text:
            workers.show_error(self, "Cannot build the index", "Choose a folder for the index.")
            return
        out = Path(out_text)
        if out.exists() and not (out / MANIFEST).is_file() and (not out.is_dir() or any(out.iterdir())):
            workers.show_error(
                self, "Cannot build the index",
                f"{out} is not empty and is not an index: choose an empty folder (or an existing index "
                "to replace) so that none of your files get mixed with index files.")
            return
        spec = self.labelling_spec()
        if spec.rule == "regex" and not spec.regex:
            workers.show_error(self, "Cannot build the index",
                               r"Enter a regular expression with a group named 'instance', e.g. obj(?P<instance>\d+)__")
            return
        self._start(_build_job(collection, out, self.config(), spec, self.batch_size), "build", out)

    def start_update(self) -> None:
        """Update the index in the index folder: new and changed files in, deleted files out."""
        if self.running:
            return
        out = Path(self.index_edit.text().strip())
        if not (out / MANIFEST).is_file():
            workers.show_error(self, "Cannot update the index", f"There is no index in {out}; build one first.")
            return
        self._start(_update_job(out, self.batch_size), "update", out)

    def cancel(self) -> None:
        if self._job is not None and not self._job.cancelled:
            self._job.cancel()
            self.status_label.setText("Cancelling…")
            self.cancel_button.setEnabled(False)

    def shutdown(self) -> None:
        """Cancel running work and wait for it (called when the window closes)."""
        for job in (self._job, self._label_job):
            if job is not None and job.running:
                job.cancel()
        if self._job is not None or self._label_job is not None:
            workers.wait_all(30000)
        ThumbnailCache.instance().cancel_pending()

    # ---- running jobs ------------------------------------------------------------------------
    def _start(self, gen, kind: str, out: Path) -> None:
        self._job_kind = kind
        self._job_out = out
        self._stamp_before = _manifest_stamp(out)
        self._last_progress = None
        self.progress_bar.setRange(0, 0)  # busy until the first file is done
        self.progress_label.setText("Starting…")
        verb = "Building" if kind == "build" else "Updating"
        self.status_label.setText(f"{verb} the index in {out}…")
        self.state.status.emit(f"{verb} the index in {out}…")
        try:
            self._job = workers.start(
                gen,
                on_progress=self._on_progress,
                on_result=self._on_result,
                on_error=self._on_error,
                on_finished=self._on_finished,
            )
        except Exception as exc:
            log.debug("could not start the %s job", kind, exc_info=True)
            gen.close()
            self._on_error(exc)
            self._on_finished()
            return
        self._update_buttons()

    def _on_progress(self, p: ExtractProgress) -> None:
        if self._job is None:
            return
        self._last_progress = p
        if p.total <= 0:
            self.progress_bar.setRange(0, 0)
            self.progress_label.setText(f"{p.stage[:1].upper()}{p.stage[1:]}…")
            return
        if self.progress_bar.maximum() != p.total:
            self.progress_bar.setRange(0, p.total)
        self.progress_bar.setValue(p.done)
        current = self._relative(p.current) if p.current else ""
        text = f"{p.done:,} / {p.total:,} — ETA {format_duration(p.eta)}"
        if current:
            text += f" — {current}"
        self.progress_label.setText(text)
        for path, reason in p.skipped:
            self._add_skipped(self._relative(path), reason)

    def _on_result(self, report: BuildReport) -> None:
        self._show_report(report)
        self.state.set_index(report.index)
        verb = "built" if self._job_kind == "build" else "updated"
        msg = f"Index {verb}: {report.summary()}."
        self.status_label.setText(msg)
        self.state.status.emit(msg)
        self._succeeded = True

    def _on_error(self, exc: BaseException) -> None:
        title = "Cannot build the index" if self._job_kind == "build" else "Cannot update the index"
        msg = workers.error_message(exc)
        self.status_label.setText(f"{title}: {msg}")
        self.state.status.emit(f"{title}.")
        workers.show_error(self, title, exc)

    def _on_finished(self) -> None:
        job, self._job = self._job, None
        succeeded = self._succeeded
        self._succeeded = False
        self.progress_bar.setRange(0, max(1, self.progress_bar.maximum()))
        if job is not None and job.cancelled and not succeeded:
            out = self._job_out
            if out is not None and _manifest_stamp(out) != self._stamp_before:
                # The job had already saved when the cancel arrived: the new index is complete.
                try:
                    index = Index.load(out)
                except MuseumSearchError:
                    index = None
                if index is not None:
                    self.state.set_index(index)
                    self.status_label.setText("The index was already complete when you cancelled; it is open.")
                    succeeded = True
            if not succeeded:
                self.progress_bar.setValue(0)
                self.progress_label.setText("")
                msg = ("Cancelled — the previous index is unchanged" if self._stamp_before is not None
                       else "Cancelled — no index was saved")
                self.status_label.setText(msg)
                self.state.status.emit(msg)
        elif not succeeded:
            self.progress_label.setText("")
        self._update_buttons()
        self.job_done.emit(succeeded)

    def _show_report(self, report: BuildReport) -> None:
        self.skipped_tree.clear()
        rows = [(self._relative(p), r) for p, r in report.skipped] + list(report.labelling.ignored)
        self._fill_skipped(rows)
        n = self.progress_bar.maximum()
        self.progress_bar.setValue(n)
        p = self._last_progress
        if p is not None and p.total > 0:
            self.progress_label.setText(f"{p.done:,} / {p.total:,} described in {format_duration(p.elapsed)}")
        elif report.added == 0:
            self.progress_label.setText("Nothing new to describe")

    # ---- label detection (in a worker: a big collection takes a while to list) ---------------
    def _detect_labels(self) -> None:
        folder = Path(self.collection_edit.text().strip())
        self._label_token += 1
        token = self._label_token
        if not self.collection_edit.text().strip() or not folder.is_dir():
            self.detected_label.setText("Choose a collection folder." if not self.collection_edit.text().strip()
                                        else f"Folder not found: {folder}")
            return
        spec = self.labelling_spec()
        if spec.rule == "regex" and not spec.regex:
            self.detected_label.setText("Enter a regular expression.")
            return
        auto = spec.rule == "auto" and spec.catalogue is None
        self.detected_label.setText("Detecting labels…" if auto else "Checking labels…")

        def work():
            return label_collection(folder, spec.rule, catalogue=spec.catalogue, regex=spec.regex)

        def done(lab) -> None:
            if token != self._label_token:
                return
            prefix = "Detected" if auto else "Labels"
            self.detected_label.setText(f"{prefix}: {describe(lab)}")
            self.detected_label.setStyleSheet("")
            if not self.running:
                self.skipped_tree.clear()
                self._fill_skipped(lab.ignored)

        def failed(exc: BaseException) -> None:
            if token != self._label_token:
                return
            self.detected_label.setText(workers.error_message(exc))
            self.detected_label.setStyleSheet("color: #b00020;")

        def finished() -> None:
            if self._label_job is job:
                self._label_job = None

        job = workers.start(work, on_result=done, on_error=failed, on_finished=finished)
        self._label_job = job

    # ---- form events -------------------------------------------------------------------------
    def _collection_edited(self) -> None:
        text = self.collection_edit.text().strip()
        if text and not self._filling and Path(text) != self._last_collection:
            self._last_collection = Path(text)
            self.set_collection(text)

    def _rule_changed(self, *_args) -> None:
        rule = self.rule_combo.currentData()
        self.regex_edit.setEnabled(rule == "regex")
        self.catalogue_edit.setEnabled(rule in ("auto", "catalogue"))
        self.catalogue_button.setEnabled(rule in ("auto", "catalogue"))
        if not self._filling and self.collection_edit.text().strip():
            self._detect_labels()

    def _labelling_inputs_changed(self) -> None:
        if not self._filling and self.collection_edit.text().strip():
            self._detect_labels()

    def _backbone_changed(self, *_args) -> None:
        spec = REGISTRY.get(self.backbone_combo.currentData())
        self.backbone_combo.setToolTip(spec.description if spec else "")

    def _head_changed(self, *_args) -> None:
        logits = self.head_combo.currentData() == "logits"
        self.size_spin.setEnabled(not logits)
        self.size_spin.setToolTip("The logits head always uses 224×224 images" if logits
                                  else "Longest side of the images given to the network")

    def _index_dir_edited(self, _text: str) -> None:
        self._index_dir_auto = False

    def _choose_catalogue(self) -> None:
        start = self.catalogue_edit.text() or self.collection_edit.text()
        path, _ = QFileDialog.getOpenFileName(self, "Choose the catalogue", start, "CSV files (*.csv *.txt);;All files (*)")
        if path:
            self.catalogue_edit.setText(path)
            if self.rule_combo.currentData() == "auto":
                self._set_combo(self.rule_combo, "catalogue")
            else:
                self._labelling_inputs_changed()

    def _choose_index_dir(self) -> None:
        start = self.index_edit.text() or str(paths.data_dir() / INDEX_DIR_NAME)
        folder = QFileDialog.getExistingDirectory(self, "Choose the index folder", start)
        if folder:
            self.index_edit.setText(folder)
            self._index_dir_auto = False

    def _update_buttons(self) -> None:
        running = self._job is not None
        has_index = bool(self.index_edit.text().strip()) and (Path(self.index_edit.text().strip()) / MANIFEST).is_file()
        self.build_button.setEnabled(not running)
        self.update_button.setEnabled(not running and has_index)
        self.cancel_button.setEnabled(running)
        for w in (self.collection_edit, self.browse_button, self.rule_combo, self.catalogue_edit,
                  self.catalogue_button, self.backbone_combo, self.head_combo, self.index_edit, self.index_button):
            w.setEnabled(not running)
        if not running:
            self._rule_changed_enable_only()
            self._head_changed()
        else:
            self.regex_edit.setEnabled(False)
            self.size_spin.setEnabled(False)

    def _rule_changed_enable_only(self) -> None:
        rule = self.rule_combo.currentData()
        self.regex_edit.setEnabled(rule == "regex")
        self.catalogue_edit.setEnabled(rule in ("auto", "catalogue"))
        self.catalogue_button.setEnabled(rule in ("auto", "catalogue"))

    # ---- the open index ----------------------------------------------------------------------
    def _index_changed(self, index: Index | None) -> None:
        self.browser.set_index(index)
        if index is None:
            return
        self._filling = True
        try:
            self.collection_edit.setText(str(index.root))
            self._last_collection = Path(index.root)
            self._set_combo(self.rule_combo, index.labelling.rule)
            catalogue = index.labelling.catalogue
            if not catalogue and index.labelling.rule == "catalogue":
                found = find_catalogue(index.root) if Path(index.root).is_dir() else None
                catalogue = str(found) if found else ""
            self.catalogue_edit.setText(catalogue or "")
            self.regex_edit.setText(index.labelling.regex or "")
            self._set_combo(self.backbone_combo, index.meta.name)
            self._set_combo(self.head_combo, index.meta.head)
            if index.meta.head != "logits":
                self.size_spin.setValue(index.meta.size)
            if index.path is not None:
                self.index_edit.setText(str(index.path))
                self._index_dir_auto = False
            self.detected_label.setStyleSheet("")
            self.detected_label.setText(
                f"Index: {len(index):,} references of {len(index.instances):,} instances "
                f"({index.meta.describe()})")
        finally:
            self._filling = False
        self._update_buttons()

    # ---- skipped files -----------------------------------------------------------------------
    def _relative(self, path: str | os.PathLike) -> str:
        root = self.collection_edit.text().strip()
        try:
            return Path(path).relative_to(root).as_posix() if root else str(path)
        except ValueError:
            return str(path)

    def _add_skipped(self, path: str, reason: str) -> None:
        self._fill_skipped([(path, reason)], clear=False)

    def _fill_skipped(self, rows, clear: bool = False) -> None:
        if clear:
            self.skipped_tree.clear()
        items = []
        for path, reason in rows:
            it = QTreeWidgetItem([str(path), str(reason)])
            it.setToolTip(0, str(path))
            it.setToolTip(1, str(reason))
            items.append(it)
        if items:
            self.skipped_tree.addTopLevelItems(items)
        n = self.skipped_tree.topLevelItemCount()
        self.skipped_box.setTitle(f"Skipped and ignored files ({n:,})" if n else "Skipped and ignored files")


def _row(*widgets: QWidget) -> QWidget:
    w = QWidget()
    lay = QHBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    for i, x in enumerate(widgets):
        lay.addWidget(x, 1 if i == 0 else 0)
    w.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    return w
