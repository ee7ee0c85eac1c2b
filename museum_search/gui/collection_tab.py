"""The Collection tab: choose a folder of reference photos, how to label them and which descriptor
to use, build (or update) its index in the background, and browse what is indexed.

All long work runs through :mod:`museum_search.gui.workers` on core generators
(``core.jobs._indexing.build_index`` / ``update_index``); the network itself is built inside the worker so
a missing-weights error is reported like any other (a dialog, no traceback). Cancelling stops the
generator before it saves: the index on disk is replaced atomically only at the very end, so the
previous index stays as it was.

Where the index goes: a new collection gets a new folder of its own,
``core.index._store.default_index_folder`` (``<collection>-index`` beside it), never the folder of the
index that happens to be open. The field under *Index* says what is in the folder chosen (new,
empty, this collection's index, another collection's index, or a folder that cannot be used),
*Build* refuses what ``core.index._store.check_output_folder`` refuses and asks before replacing the index
of another collection. The core takes the index's writer lock before any work, so a second writer
gets a clear message instead of a half-written index. *Choose…* opens a :class:`FolderChooser`,
which also makes new folders: its New Folder button, or a typed path that does not exist yet
(created, after a confirmation, and nothing else).

Double-clicking a thumbnail (or Enter on it) opens the reference large, with its catalogue entry
(:class:`ReferenceDialog`).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractButton,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from museum_search.core import paths
from museum_search.core.answer import Verdict
from museum_search.core.errors import MuseumSearchError, OutputFolderError
from museum_search.core.images import load_image
from museum_search.core.index import (
    MANIFEST,
    RULES,
    Index,
    LabellingSpec,
    check_output_folder,
    default_index_folder,
    find_catalogue,
    indexed_collection,
    is_index_folder,
    label_collection,
    labelling_summary,
)
from museum_search.core.inference import (
    DEFAULT_BACKBONE,
    DEFAULT_HEAD,
    DEFAULT_SIZE,
    HEADS,
    REGISTRY,
    BackboneConfig,
)
from museum_search.core.jobs import BuildReport, build_job, update_job
from museum_search.core.progress import Progress, time_left
from museum_search.gui import upgrade, workers
from museum_search.gui.state import AppState
from museum_search.gui.widgets.camera_view import ImageView
from museum_search.gui.widgets.progress_panel import FittingLine, ProgressPanel
from museum_search.gui.widgets.result_grid import catalogue_form
from museum_search.gui.widgets.thumbnails import ThumbnailBrowser, ThumbnailCache

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
#: How long the status bar shows the news of a job that ended ("Index updated: …"), in ms; it is
#: also cleared when another tab is chosen (the index itself stays described under it).
STATUS_MESSAGE_MS = 10_000
INDEX_DIR_NAME = "indexes"
SAMPLE_INDEX_NAME = "sample"
#: Longest side of the photo in the large view of a reference.
REFERENCE_SIDE = 1600


def sample_index_dir() -> Path:
    """``<user data>/indexes/sample``: the index of the bundled sample collection (our own folder)."""
    return paths.data_dir() / INDEX_DIR_NAME / SAMPLE_INDEX_NAME


def index_collection(folder: str | Path) -> Path | None:
    """The (resolved) collection folder of the index in ``folder``, or None if it cannot be read.

    The manifest's recorded root first (cheap, works for an index of an older format too); when
    that folder is gone, the root ``Index.load`` finds (an index moved along with its collection).
    """
    folder = Path(folder)
    root = indexed_collection(folder)
    if root is not None and root.is_dir():
        return root
    try:
        return Index.load(folder, verify=False).root.resolve()
    except (MuseumSearchError, OSError):
        return root


def _same_folder(a: str | Path | None, b: str | Path | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False


@dataclass(frozen=True)
class FolderCheck:
    """What building into an index folder would do (no Qt; computed from the file system).

    ``kind`` is one of ``none`` (no folder given), ``new`` (will be created), ``empty``, ``same``
    (an index of this collection: replaced by Build), ``other`` (an index of another collection, or
    one whose collection cannot be read: Build asks first), ``index`` (an index, no collection
    chosen) and ``refused`` (``check_output_folder`` refuses it; ``message`` says what to do).
    """

    kind: str
    message: str
    owner: Path | None = None


def check_index_folder(out: str | Path | None, collection: str | Path | None) -> FolderCheck:
    if out is None or not str(out).strip():
        return FolderCheck("none", "Choose where the index is saved.")
    out = Path(str(out).strip())
    coll = Path(str(collection).strip()) if collection is not None and str(collection).strip() else None
    try:
        check_output_folder(out, coll)
    except OutputFolderError as exc:
        return FolderCheck("refused", _sentence(str(exc)))
    except OSError as exc:
        return FolderCheck("refused", f"The folder {out} cannot be used ({exc.strerror or exc}).")
    if not out.exists():
        return FolderCheck("new", "A new folder will be created for the index.")
    if not is_index_folder(out):
        return FolderCheck("empty", "Empty folder: the index will be saved in it.")
    owner = index_collection(out)
    if coll is None:
        return FolderCheck("index", f"Holds the index of {owner}." if owner else "Holds an index.", owner)
    if owner is not None and _same_folder(owner, coll):
        return FolderCheck("same", "Holds the index of this collection: Build replaces it, Update adds "
                                   "new and changed photos.", owner)
    if owner is None:
        return FolderCheck("other", "Holds an index whose collection cannot be read: Build would replace it.")
    return FolderCheck("other", f"Holds the index of another collection ({owner}): Build would replace it.", owner)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def _new_folder_inside(parent: Path, collection: Path) -> Path | None:
    """``<parent>/<collection name>-index`` (``-2``, ``-3``...): a new folder inside a folder the user
    chose that cannot hold the index itself (e.g. their "Indexes" folder, already full of others)."""
    name = f"{collection.resolve().name or 'collection'}-index"
    for n in range(1, 100):
        cand = parent / (name if n == 1 else f"{name}-{n}")
        check = check_index_folder(cand, collection)
        if check.kind in ("new", "empty", "same"):
            return cand
    return None


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.is_dir():
            return p
    return Path.home()


class FolderChooser(QFileDialog):
    """Choose a folder, or make a new one: Qt's own folder dialog (the same on every platform, with
    its New Folder button) that also takes a typed path that does not exist yet. Such a path is
    created (with its missing parents) only after the user confirmed it in ``confirm_box``; nothing
    that exists is ever touched. Show it with ``open()``; ``fileSelected`` gives the folder."""

    def __init__(self, parent: QWidget | None, title: str, start: str | Path):
        start = Path(start)
        super().__init__(parent, title, str(_nearest_existing(start)))
        self.setObjectName("folderChooser")
        self.setFileMode(QFileDialog.FileMode.Directory)
        self.setOption(QFileDialog.Option.ShowDirsOnly, True)
        self.setOption(QFileDialog.Option.DontUseNativeDialog, True)
        self.setLabelText(QFileDialog.DialogLabel.FileName, "Folder:")
        self.created: list[Path] = []  # folders this dialog made, outermost first
        self.confirm_box: QMessageBox | None = None
        if not start.exists():
            self.selectFile(str(start))  # the suggestion, typed in: Enter creates it
        self.name_edit = self.findChild(QLineEdit, "fileNameEdit")
        if self.name_edit is not None:  # Qt disables Choose for a folder that does not exist: not here
            self.name_edit.textChanged.connect(self._enable_choose)
            self._enable_choose()

    def new_folder(self) -> Path | None:
        """The typed folder when it does not exist yet and could be made (else None)."""
        if self.name_edit is not None and not self.name_edit.text().strip():
            return None
        files = self.selectedFiles()
        if len(files) != 1:
            return None
        target = Path(files[0])
        if not target.is_absolute() or target.exists() or target.is_symlink():
            return None  # an existing folder (or file, or dangling link): Qt's own checks
        parent = next(p for p in target.parents if p.exists())
        return target if parent.is_dir() else None

    def _enable_choose(self, *_args) -> None:
        box = self.findChild(QDialogButtonBox)
        button = box.button(QDialogButtonBox.StandardButton.Open) if box is not None else None
        if button is not None and self.new_folder() is not None:
            button.setEnabled(True)

    def accept(self) -> None:
        target = self.new_folder()
        if target is None:
            super().accept()  # an existing folder (Qt's own checks)
            return
        missing = [p for p in (target, *target.parents) if not p.exists()][::-1]
        box = QMessageBox(QMessageBox.Icon.Question, self.windowTitle(), f"Create the new folder {target}?",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel, self)
        box.setObjectName("createFolderDialog")
        box.setInformativeText("It does not exist yet." if len(missing) == 1 else
                               "It does not exist yet; " + ", ".join(str(p) for p in missing[:-1])
                               + " will be created too.")
        box.button(QMessageBox.StandardButton.Yes).setText("Create")
        box.setDefaultButton(QMessageBox.StandardButton.Yes)
        box.finished.connect(lambda _r, box=box: self._confirmed(box, missing))
        self.confirm_box = box
        box.open()

    def _confirmed(self, box: QMessageBox, missing: list[Path]) -> None:
        self.confirm_box = None
        if box.clickedButton() is not box.button(QMessageBox.StandardButton.Yes):
            return  # the dialog stays open, nothing made
        try:
            for folder in missing:
                folder.mkdir()  # one level at a time: each one made here is recorded
                self.created.append(folder)
        except OSError as exc:
            workers.show_error(self, "Cannot create the folder", exc)
            return
        super().accept()


class ReferenceDialog(QDialog):
    """One reference of the collection, large: its photo (decoded on a worker) and its catalogue
    entry (instance, metadata, file)."""

    def __init__(self, index: Index, row: int, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("referenceDialog")
        item = index.items[row]
        self.row = row
        self.path = Path(index.root) / item.path
        title = next((v for k, v in item.metadata.items() if k.strip().lower() == "title" and v), "")
        self.setWindowTitle(f"{title} ({item.instance})" if title else item.instance)
        self.photo = ImageView("Loading…", dark=False)
        self.photo.setObjectName("referencePhoto")
        self.photo.setMinimumSize(320, 240)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(self.photo, 1)
        lay.addLayout(catalogue_form(item.instance, item.metadata, str(self.path)))
        lay.addWidget(buttons)
        screen = (parent.screen() if parent is not None else None) or self.screen()
        room = screen.availableGeometry().size() if screen is not None else None
        self.resize(min(1000, int(room.width() * 0.9)) if room else 1000,
                    min(780, int(room.height() * 0.9)) if room else 780)
        path = self.path
        self._job = workers.start(lambda: load_image(path, max_side=REFERENCE_SIDE),
                                  on_result=self.photo.set_image, on_error=self._failed)
        self.finished.connect(lambda _r: self.shutdown())

    def is_busy(self) -> bool:
        return self._job.running

    def shutdown(self) -> None:
        if self._job.running:
            self._job.cancel()

    def _failed(self, exc: BaseException) -> None:
        self.photo.set_message(workers.error_message(exc), error=True)


def format_duration(seconds: float | None) -> str:
    """``0:42``, ``12:05``, ``1:02:03``; ``…`` when unknown."""
    if seconds is None:
        return "…"
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def time_left_text(p: Progress) -> str:
    """The time left after ``p`` as core says to show it (:func:`.core.progress.time_left`): one
    figure when the estimate is precise ("1:05 left"), the range it is in while it is not
    ("1:00–2:30 left"), "time left: …" while it is unknown."""
    shown = time_left(p)
    if shown is None:
        return "time left: …"
    low, high = shown
    return f"{format_duration(low)} left" if low == high else f"{format_duration(low)}–{format_duration(high)} left"


def progress_line(p: Progress, current: str = "", job: str = "build") -> tuple[list[str], str]:
    """The progress line of a build or update: its wordings, longest first (:class:`FittingLine`
    shows the longest that fits), and its tooltip. Every wording has the step, the count and the
    time left in the whole ``job`` (core's ``Progress.job_eta``: the steps to come at their planned
    cost ratios, :class:`.core.progress.JobEta`); the longer ones name the step; the file being
    processed (``current``) is only in the tooltip."""
    whole = p.steps > 0
    left = p.job_eta if whole else p.eta
    count = f"{p.done:,} / {p.total:,}"
    eta = time_left_text(p)
    stage = f"{p.stage[:1].upper()}{p.stage[1:]}"
    if whole and p.step:
        step = f"Step {p.step} of {p.steps}"
        texts = [f"{step}, {p.stage}: {count} · {eta}", f"{step}: {count} · {eta}",
                 f"{p.step}/{p.steps}: {count} · {eta}", f"{count} · {eta}"]
        tip = [f"{step}: {p.stage}"]
    else:
        texts = [f"{stage}: {count} · {eta}", f"{count} · {eta}"]
        tip = [stage]
    tip.append(f"{count} done")
    if whole:
        band = f" ± {format_duration(p.job_eta_band)}" if left is not None and p.job_eta_band else ""
        tip.append(f"Time left in the whole {job}: {format_duration(left)}{band} "
                   f"(this step: {format_duration(p.eta)})")
    else:
        tip.append(f"Time left in this step: {format_duration(p.eta)}")
    if current:
        tip.append(f"File: {current}")
    return texts, "\n".join(tip)


def report_line(report: BuildReport, kind: str, seconds: float, described: Progress | None) -> list[str]:
    """What the progress line says when a build or update ended, longest first: what changed, as
    core counts it (:meth:`.core.indexing.BuildReport.summary` is the tooltip), and the time taken."""
    took = format_duration(seconds)
    if kind == "update":
        counts = f"{report.added:,} added/changed, {report.removed:,} removed, {report.unchanged:,} unchanged"
        return [f"Updated in {took}: {counts}", counts, f"Updated in {took}"]
    n = len(report.index)
    if described is not None and described.total > 0:
        done = f"{described.done:,} / {described.total:,} described in {format_duration(described.elapsed)}"
        return [f"{done}; built in {took}", done, f"Built in {took}: {n:,} references"]
    return [f"Built in {took}: {n:,} references", f"Built in {took}"]


def index_summary(index: Index) -> str:
    """What the Collection tab says about an open index: its size and descriptor, how many
    neighbours of each reference are stored (ICFRR reads its gallery ranks from them) and whether it
    has an approximate-search index (and so how a query is searched)."""
    from museum_search.gui.widgets.search_mode import resolved_mode

    stored = index.neighbours_stored
    neighbours = (f"{stored} nearest neighbours stored per reference (ICFRR with K_g up to {stored})" if stored
                  else "no neighbour lists stored (ICFRR computes them when first used)")
    if index.ann is not None:
        ann = "an approximate-search index" + (" (used by Automatic search)" if resolved_mode(index) == "ann"
                                               else " (Automatic search is exact at this size)")
    else:
        ann = "no approximate-search index (exact search)"
    return (f"Index: {len(index):,} references of {len(index.instances):,} instances "
            f"({index.meta.summary()}); {neighbours}; {ann}. {Verdict.of_index(index).plain_summary()}.")


def verdict_warning(index: Index | None) -> str | None:
    """The warning the Collection tab shows when the verdict's operating point, as its calibration
    measured it, is weak (:meth:`museum_search.core.answer._verdict.Verdict.warning`), else None."""
    return None if index is None else Verdict.of_index(index).warning()


def index_details(index: Index) -> str:
    """The summary's tooltip: the approximate index's parameters, where the index is."""
    lines = [f"Verdict: {Verdict.of_index(index).summary()}"]  # the technical detail of the summary's last words
    if index.ann is not None:
        summary = getattr(index.ann, "summary", None)
        lines.append(f"Approximate search: {summary() if callable(summary) else index.ann}")
    if index.path is not None:
        lines.append(f"Index folder: {index.path}")
    return "\n".join(lines)


def _manifest_stamp(folder: Path) -> int | None:
    try:
        return (folder / MANIFEST).stat().st_mtime_ns
    except OSError:
        return None


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
        self._folder_check = FolderCheck("none", "")
        self._replace_box: QMessageBox | None = None
        self._filling = False
        self._succeeded = False
        self._last_progress: Progress | None = None
        self._described: Progress | None = None  # the last progress of the describing stage
        self._started = 0.0  # time.monotonic() when the job started
        self._status_message = ""  # what this tab shows in the window's status bar for a while
        self._ignored: list[tuple[str, str]] = []  # the files the labelling rule leaves out, as last read
        self._shown_skipped: set[str] = set()  # the paths the skipped list shows (each once)
        self._last_collection: Path | None = None
        self.index_chooser: FolderChooser | None = None
        self.reference_dialog: ReferenceDialog | None = None
        self._build_ui()
        self.state.index_changed.connect(self._index_changed)
        if self.state.index is not None:
            self._index_changed(self.state.index)
        self._update_buttons()

    # ---- UI ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        for box in (self._collection_box(), self._descriptor_box(), self._index_box()):
            ll.addWidget(box)
        ll.addWidget(self._skipped_box(), 1)
        left.setMinimumWidth(360)
        # on a small screen (1024×700) the controls scroll instead of squeezing wrapped texts
        self.controls = QScrollArea()
        self.controls.setObjectName("collectionControls")
        self.controls.setWidgetResizable(True)
        self.controls.setFrameShape(QFrame.Shape.NoFrame)
        self.controls.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.controls.setWidget(left)
        self.controls.setMinimumWidth(360 + self.controls.verticalScrollBar().sizeHint().width())
        self.browser = ThumbnailBrowser(self)
        self.browser.setObjectName("collectionBrowser")
        self.browser.activated.connect(self.show_reference)
        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(self.controls)
        splitter.addWidget(self.browser)
        splitter.setStretchFactor(0, 0)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([420, 860])
        splitter.setChildrenCollapsible(False)
        self.splitter = splitter
        lay = QVBoxLayout(self)
        lay.addWidget(splitter)
        self._rule_changed()

    def _collection_box(self) -> QGroupBox:
        """The collection folder, how its photos are labelled (rule, catalogue, expression), what was found."""
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
        return coll_box

    def _descriptor_box(self) -> QGroupBox:
        """The network: backbone, head and image size."""
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
        return desc_box

    def _index_box(self) -> QGroupBox:
        """The index folder, Build / Update / Cancel, the progress and the verdict's warning."""
        self.index_edit = QLineEdit()
        self.index_edit.setObjectName("indexFolder")
        self.index_edit.setPlaceholderText("Where the index is saved (a new folder for a new collection)")
        self.index_edit.textChanged.connect(lambda _t: self._update_buttons())
        self.index_edit.textChanged.connect(self.index_edit.setToolTip)
        self.index_edit.textChanged.connect(lambda _t: self._folder_check_timer.start())
        idx_button = QPushButton("Choose…")
        idx_button.setObjectName("chooseIndexFolder")
        idx_button.setToolTip("Choose or create the folder the index is saved in")
        idx_button.clicked.connect(self._choose_index_dir)
        self.index_button = idx_button
        self.index_hint = QLabel("")
        self.index_hint.setObjectName("indexFolderHint")
        self.index_hint.setWordWrap(True)
        self.index_hint.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # typing: look at the folder once the user pauses (a network folder may be slow to list)
        self._folder_check_timer = QTimer(self, singleShot=True, interval=250)
        self._folder_check_timer.timeout.connect(self._refresh_folder_check)
        self._make_progress()
        # a weak operating point of the verdict: said here, before a visitor meets it in the kiosk
        self.verdict_warning = QLabel("")
        self.verdict_warning.setObjectName("verdictWarning")
        self.verdict_warning.setWordWrap(True)
        self.verdict_warning.setTextFormat(Qt.TextFormat.PlainText)
        self.verdict_warning.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.verdict_warning.setStyleSheet("QLabel { background:#fff4e0; color:#6b3d00; border:1px solid #e0a030; "
                                           "padding:6px; border-radius:4px; }")
        self.verdict_warning.hide()
        index_box = QGroupBox("Index")
        iform = QVBoxLayout(index_box)
        folder_form = QFormLayout()
        folder_form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        folder_form.setContentsMargins(0, 0, 0, 0)
        folder_form.addRow("Folder:", _row(self.index_edit, idx_button))
        iform.addLayout(folder_form)
        iform.addWidget(self.index_hint)
        iform.addWidget(self.progress)
        iform.addWidget(self.verdict_warning)
        return index_box

    def _make_progress(self) -> None:
        """Build / Update / Cancel above the progress bar, the file being described and the status."""
        self.build_button = QPushButton("Build index")
        self.build_button.setObjectName("buildButton")
        self.build_button.setToolTip("Describe every labelled photo of the collection and save the index")
        self.build_button.clicked.connect(lambda _checked=False: self.start_build())
        self.update_button = QPushButton("Update")
        self.update_button.setObjectName("updateButton")
        self.update_button.setToolTip("Describe only new and changed photos, drop deleted ones")
        self.update_button.clicked.connect(self.start_update)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelButton")
        self.cancel_button.clicked.connect(self.cancel)
        # one line: step, count and the whole job's time left always; the step's name when it fits;
        # the file being processed in the tooltip (progress_line)
        item_label = FittingLine("")
        item_label.setObjectName("progressLabel")
        buttons = QHBoxLayout()
        buttons.addWidget(self.build_button)
        buttons.addWidget(self.update_button)
        buttons.addStretch(1)
        buttons.addWidget(self.cancel_button)
        self.progress = ProgressPanel(buttons, "buildProgress", "collectionStatus", item_label, selectable=True)
        self.progress.bar.setTextVisible(False)

    def _skipped_box(self) -> QGroupBox:
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
        return self.skipped_box

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
        self._follow_collection(folder)
        cat = find_catalogue(folder) if folder.is_dir() else None
        self.catalogue_edit.setText(str(cat) if cat else "")
        # a new folder: let "auto" find its layout again (without a second detection run)
        self.rule_combo.blockSignals(True)
        self._set_combo(self.rule_combo, "auto")
        self.rule_combo.blockSignals(False)
        self._rule_changed_enable_only()
        self._ignored = []
        self._fill_skipped([], clear=True)
        if not self.running:  # e.g. "Sample collection: 42 references." was about another folder
            self.progress.set_status("")
            self.progress.item_label.setText("")
            self.progress.item_label.setToolTip("")
        if detect:
            self._detect_labels()

    def open_sample_collection(self) -> None:
        """Open the index of the bundled sample collection, building it first if needed."""
        if self.running:
            self.progress.status_label.setText("Wait for the current job to finish (or cancel it) first.")
            return
        root = paths.sample_collection()
        collection, catalogue = root / "collection", root / "catalogue.csv"
        if not collection.is_dir():
            workers.show_error(self, "Sample collection",
                               f"The sample collection is not installed (expected in {root}). "
                               "Reinstall museum-search or open a collection of your own.")
            return
        out = self._sample_index_folder(collection)
        why = "is being indexed for the first time"
        if (out / MANIFEST).is_file():
            try:
                index = Index.load(out)
            except MuseumSearchError as exc:
                # An index of an older format (or a damaged one): this is our own folder, so it is
                # rebuilt in place, never reported as an error the user has to deal with.
                log.warning("sample index at %s is unusable (%s); rebuilding it", out, exc)
                why = "was indexed by an older version of museum-search (or is damaged); it is indexed again"
            else:
                if _same_folder(index.root, collection):
                    self.state.set_index(index)
                    self.progress.status_label.setText(f"Sample collection: {len(index)} references.")
                    return
                log.warning("sample index at %s is of %s, not %s; rebuilding it", out, index.root, collection)
                why = "was indexed from another installation; it is indexed again"
        self.set_collection(collection, detect=False)
        self._set_combo(self.rule_combo, "catalogue")
        self.catalogue_edit.setText(str(catalogue))
        self._set_combo(self.backbone_combo, DEFAULT_BACKBONE)
        self._set_combo(self.head_combo, DEFAULT_HEAD)
        self.size_spin.setValue(DEFAULT_SIZE)
        self._set_index_dir(out)
        self._detect_labels()
        # our own per-user folder: replacing whatever index is there needs no question
        if self.start_build(own_folder=True):
            self.progress.status_label.setText(f"The sample collection {why} in {out}…")

    @staticmethod
    def _sample_index_folder(collection: Path) -> Path:
        """The per-user sample index folder; ``sample-2``... only if someone put other files in it
        (never touched: they are not ours)."""
        base = sample_index_dir()
        for n in range(1, 100):
            cand = base if n == 1 else base.with_name(f"{base.name}-{n}")
            if check_index_folder(cand, collection).kind != "refused":
                return cand
        return base  # Build will then say what is wrong with it

    def config(self) -> BackboneConfig:
        return BackboneConfig(self.backbone_combo.currentData(), self.head_combo.currentData(), self.size_spin.value())

    def _build_job(self, collection, out, spec: LabellingSpec):
        """The build job of the form, with the session's inference engine and the stored matcher and
        whitening of new indexes."""
        return build_job(collection, out, self.config(), spec, batch_size=self.batch_size,
                         engine=self.state.engine, matcher=self.state.settings.matcher,
                         whitening=self.state.settings.whitening)

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

    def start_build(self, own_folder: bool = False) -> bool:
        """Build the index of the chosen collection into the index folder (in the background).

        Refuses a folder ``check_output_folder`` refuses (nothing is written), and asks before
        replacing the index of another collection (unless ``own_folder``: the sample's per-user
        folder). Returns True when the build started.
        """
        if self.running or self._replace_box is not None:
            return False
        collection = Path(self.collection_edit.text().strip())
        out_text = self.index_edit.text().strip()
        if not self.collection_edit.text().strip() or not collection.is_dir():
            workers.show_error(self, "Cannot build the index",
                               f"Collection folder not found: {collection}. Choose a folder of photos.")
            return False
        if not out_text:
            workers.show_error(self, "Cannot build the index", "Choose a folder for the index.")
            return False
        spec = self.labelling_spec()
        if spec.rule == "regex" and not spec.regex:
            workers.show_error(self, "Cannot build the index",
                               r"Enter a regular expression with a group named 'instance', e.g. obj(?P<instance>\d+)__")
            return False
        out = Path(out_text)
        check = check_index_folder(out, collection)
        self._refresh_folder_check(check)
        if check.kind == "refused":
            self._refuse(check.message)
            return False
        if check.kind == "other" and not own_folder:
            self._ask_replace(collection, out, check)
            return False
        self._start(self._build_job(collection, out, spec), "build", out)
        return True

    def _refuse(self, message: str) -> None:
        self.progress.status_label.setText(f"Cannot build the index: {message}")
        self.show_status_message("Cannot build the index.")
        workers.show_error(self, "Cannot build the index", message)

    def _ask_replace(self, collection: Path, out: Path, check: FolderCheck) -> None:
        """The folder holds the index of another collection: ask, offering a new folder first.

        Asked rather than refused: a technician may keep one fixed index folder on purpose (a kiosk
        set up to open it) and really mean to replace it, e.g. after moving the photos. But the
        default button, and Esc, never replace anything: *Build in a new folder* (the default
        folder of this collection, never another collection's index) or *Cancel*.
        """
        try:
            new = default_index_folder(collection)
        except (OutputFolderError, OSError):
            new = None
        other = f"the collection {check.owner}" if check.owner else "a collection that cannot be read"
        box = QMessageBox(QMessageBox.Icon.Warning, "Replace the index of another collection?",
                          f"Replace the index of {other}?", QMessageBox.StandardButton.NoButton, self)
        box.setObjectName("replaceIndexDialog")
        box.setInformativeText(
            f"The folder {out} holds the index of {other}. Building the index of {collection} there "
            "replaces it: that collection could no longer be searched until it is indexed again."
            + (f"\n\nBuild in a new folder instead: {new}" if new else ""))
        new_button = box.addButton("Build in a new folder", QMessageBox.ButtonRole.AcceptRole) if new else None
        replace_button = box.addButton("Replace that index", QMessageBox.ButtonRole.DestructiveRole)
        cancel_button = box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(new_button or cancel_button)
        box.setEscapeButton(cancel_button)
        box.new_folder_button, box.replace_button = new_button, replace_button  # for tests and automation

        def answered(_result: int) -> None:
            clicked: QAbstractButton | None = box.clickedButton()
            self._replace_box = None
            box.deleteLater()
            if clicked is None or clicked is cancel_button:
                self.progress.status_label.setText(f"Nothing was built: {out} still holds the index of {other}.")
            elif clicked is new_button and new is not None:
                self._set_index_dir(new)
                self.start_build()
            elif clicked is replace_button and not self.running:
                self._start(self._build_job(collection, out, self.labelling_spec()), "build", out)

        box.finished.connect(answered)
        self._replace_box = box
        self.progress.status_label.setText(f"{out} holds the index of {other}: replace it or build in a new folder?")
        box.open()

    def start_update(self) -> None:
        """Update the index in the index folder: new and changed files in, deleted files out."""
        if self.running:
            return
        out = Path(self.index_edit.text().strip())
        if not (out / MANIFEST).is_file():
            workers.show_error(self, "Cannot update the index", f"There is no index in {out}; build one first.")
            return
        check = check_index_folder(out, self.collection_edit.text())
        self._refresh_folder_check(check)
        if check.kind == "other":
            workers.show_error(self, "Cannot update the index",
                               f"{out} holds the index of another collection ({check.owner or 'unknown'}), not "
                               f"of {self.collection_edit.text().strip()}. To update that index, open it "
                               "(File → Open index…); to index this collection, use Build.")
            return
        if upgrade.upgradable(out):  # written by an older museum-search: convert it (asked), then update it
            self.progress.status_label.setText(f"{out} holds an index of an older format: convert it first.")

            def converted(index: Index) -> None:
                self.state.set_index(index)
                self.progress.status_label.setText(f"Index converted: {len(index):,} references. Updating it…")
                self.start_update()

            def declined() -> None:
                self.progress.status_label.setText(f"Nothing was updated: {out} holds an index of an older format. "
                                          "Convert it, or build the index again.")

            upgrade.open_index(self, out, converted, "Cannot update the index", on_failed=declined)
            return
        self._start(update_job(out, batch_size=self.batch_size, engine=self.state.engine), "update", out)

    def cancel(self) -> None:
        if self._job is not None and not self._job.cancelled:
            self._job.cancel()
            self.progress.status_label.setText("Cancelling…")
            self.cancel_button.setEnabled(False)

    def show_reference(self, row: int) -> ReferenceDialog | None:
        """Open the reference at ``row`` of the open index large (a double-click on its thumbnail)."""
        index = self.browser.model.collection_index
        if index is None or not 0 <= row < len(index):
            return None
        if self.reference_dialog is not None:
            self.reference_dialog.close()
            self.reference_dialog.deleteLater()
        self.reference_dialog = ReferenceDialog(index, row, self)
        self.reference_dialog.open()
        return self.reference_dialog

    def shutdown(self) -> None:
        """Cancel running work and wait for it (called when the window closes)."""
        if self.reference_dialog is not None:
            self.reference_dialog.shutdown()
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
        self._described = None
        self._started = time.monotonic()
        # the list is this job's from now on: the files the labelling rule leaves out, then the
        # files it skips as they come (not added to those of the last job: each file is listed once)
        self._fill_skipped(self._ignored, clear=True)
        self.progress.bar.setRange(0, 0)  # busy until the first file is done
        self.progress.item_label.setText("Starting…")
        self.progress.item_label.setToolTip("")
        verb = "Building" if kind == "build" else "Updating"
        self.progress.status_label.setText(f"{verb} the index in {out}…")
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

    def _on_progress(self, p: Progress) -> None:
        if self._job is None:
            return
        self._last_progress = p
        if p.total <= 0:
            self.progress.bar.setRange(0, 0)
            self.progress.item_label.setText(f"{p.stage[:1].upper()}{p.stage[1:]}…")
            self.progress.item_label.setToolTip(f"{p.stage[:1].upper()}{p.stage[1:]}…")  # whole where the line is cut
            return
        if self.progress.bar.maximum() != p.total:
            self.progress.bar.setRange(0, p.total)
        self.progress.bar.setValue(p.done)
        if p.stage == "describing":
            self._described = p
        texts, tip = progress_line(p, self._relative(p.current) if p.current else "", self._job_kind)
        self.progress.item_label.set_texts(texts)
        self.progress.item_label.setToolTip(tip)
        for path, reason in p.skipped:
            self._add_skipped(self._relative(path), reason)

    def _on_result(self, report: BuildReport) -> None:
        self._show_report(report)
        self.state.set_index(report.index)  # the status bar describes the open index
        verb = "built" if self._job_kind == "build" else "updated"
        msg = f"Index {verb}: {report.summary()}."
        self.progress.status_label.setText(msg)
        self.show_status_message(msg)
        self._succeeded = True

    def _on_error(self, exc: BaseException) -> None:
        title = "Cannot build the index" if self._job_kind == "build" else "Cannot update the index"
        msg = workers.error_message(exc)
        self.progress.status_label.setText(f"{title}: {msg}")
        self._steady_status()
        self.show_status_message(f"{title}.")
        workers.show_error(self, title, exc)

    # ---- the window's status bar: news of a job for a while, then the open index ------------
    def _status_bar(self):
        window = self.window()
        return window.statusBar() if isinstance(window, QMainWindow) else None

    def show_status_message(self, text: str) -> None:
        """``text`` in the window's status bar for :data:`STATUS_MESSAGE_MS` (or until another tab
        is chosen); the steady line under it (the open index) shows again after."""
        bar = self._status_bar()
        if bar is not None:
            bar.showMessage(text, STATUS_MESSAGE_MS)
            self._status_message = text

    def _steady_status(self) -> None:
        """The status bar's steady line after a job: the open index (no longer "Building…")."""
        index = self.state.index
        self.state.status.emit(f"Index: {index.summary()}" if index is not None else
                               "No index open. Open an index or build one in the Collection tab.")

    def hideEvent(self, event) -> None:
        """Another tab was chosen: the news of this tab's last job leaves the status bar."""
        bar = self._status_bar()
        if bar is not None and self._status_message and bar.currentMessage() == self._status_message:
            bar.clearMessage()
        self._status_message = ""
        super().hideEvent(event)

    def _on_finished(self) -> None:
        job, self._job = self._job, None
        succeeded = self._succeeded
        self._succeeded = False
        self.progress.bar.setRange(0, max(1, self.progress.bar.maximum()))
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
                    self.progress.status_label.setText("The index was already complete when you cancelled; it is open.")
                    succeeded = True
            if not succeeded:
                self.progress.bar.setValue(0)
                self.progress.item_label.setText("")
                msg = ("Cancelled — the previous index is unchanged" if self._stamp_before is not None
                       else "Cancelled — no index was saved")
                self.progress.status_label.setText(msg)
                self._steady_status()
                self.show_status_message(msg)
        elif not succeeded:
            self.progress.bar.setValue(0)
            self.progress.item_label.setText("")
        self._refresh_folder_check()
        self._update_buttons()
        self.job_done.emit(succeeded)

    def _show_report(self, report: BuildReport) -> None:
        self._ignored = list(report.labelling.ignored)
        self._fill_skipped([(self._relative(p), r) for p, r in report.skipped] + self._ignored, clear=True)
        n = self.progress.bar.maximum()
        self.progress.bar.setValue(n)
        self.progress.item_label.set_texts(report_line(report, self._job_kind, time.monotonic() - self._started,
                                                       self._described))
        self.progress.item_label.setToolTip(report.summary())

    # ---- label detection (in a worker: a big collection takes a while to list) ---------------
    def _detect_labels(self) -> None:
        folder = Path(self.collection_edit.text().strip())
        self._label_token += 1
        token = self._label_token
        self.detected_label.setToolTip("")  # the open index's details, if any, no longer apply
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
            self.detected_label.setText(f"{prefix}: {labelling_summary(lab)}")
            self.detected_label.setStyleSheet("")
            self._ignored = list(lab.ignored)
            if not self.running:
                self._fill_skipped(self._ignored, clear=True)

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

    def _choose_catalogue(self) -> None:
        start = self.catalogue_edit.text() or self.collection_edit.text()
        path, _ = QFileDialog.getOpenFileName(self, "Choose the catalogue", start, "CSV files (*.csv *.txt);;All files (*)")
        if path:
            self.catalogue_edit.setText(path)
            if self.rule_combo.currentData() == "auto":
                self._set_combo(self.rule_combo, "catalogue")
            else:
                self._labelling_inputs_changed()

    def _choose_index_dir(self) -> FolderChooser:
        """Choose or create where the index is saved (:class:`FolderChooser`, opened on the
        folder in the field; a folder that does not exist yet is typed in, ready to be made).

        A folder that cannot hold the index itself but may hold folders (a non-empty folder such as
        "Indexes", or the folder that contains the collection) gets a new sub-folder named after
        the collection: that is what "save it there" means to most people.
        """
        text = self.index_edit.text().strip()
        collection_text = self.collection_edit.text().strip()
        if text:
            start = Path(text)
        elif collection_text:
            start = _nearest_existing(Path(collection_text).parent)
        else:
            start = Path.home()
        if self.index_chooser is not None:
            self.index_chooser.close()
            self.index_chooser.deleteLater()
        self.index_chooser = FolderChooser(self, "Choose or create the folder for the index", start)
        self.index_chooser.fileSelected.connect(self._index_dir_chosen)
        self.index_chooser.open()
        return self.index_chooser

    def _index_dir_chosen(self, folder: str) -> None:
        collection_text = self.collection_edit.text().strip()
        collection = Path(collection_text) if collection_text else None
        chosen = Path(folder)
        check = check_index_folder(chosen, collection)
        if (check.kind == "refused" and collection is not None and chosen.is_dir()
                and not _same_folder(chosen, collection) and not is_index_folder(chosen)):
            inside = _new_folder_inside(chosen, collection)
            if inside is not None:
                self._set_index_dir(inside)
                self.progress.status_label.setText(f"{chosen} already holds other files: the index goes in a new "
                                          f"folder inside it, {inside.name}.")
                return
        self._set_index_dir(chosen)
        if self.index_chooser is not None and chosen in self.index_chooser.created:
            self.progress.status_label.setText(f"New folder {chosen} created for the index.")

    def _set_index_dir(self, folder: str | Path) -> None:
        self.index_edit.setText(str(folder))
        self._refresh_folder_check()

    def _follow_collection(self, collection: Path) -> None:
        """A collection was chosen: the index goes to its own folder. The field keeps its folder
        only if that holds the index of this very collection (e.g. the open one); otherwise it is
        set to ``default_index_folder`` -- never left on the open index of another collection."""
        text = self.index_edit.text().strip()
        if text and check_index_folder(text, collection).kind == "same":
            self._refresh_folder_check()
            return
        try:
            default = default_index_folder(collection)
        except (OutputFolderError, OSError) as exc:
            self.index_edit.clear()
            self._refresh_folder_check(FolderCheck("refused", _sentence(str(exc))))
            return
        self._set_index_dir(default)

    def _refresh_folder_check(self, check: FolderCheck | None = None) -> None:
        """Say under the field what Build would do with the folder."""
        self._folder_check_timer.stop()
        if check is None:
            check = check_index_folder(self.index_edit.text(), self.collection_edit.text())
        self._folder_check = check
        colour = {"refused": "#b00020", "other": "#a15c00"}.get(check.kind, "")
        self.index_hint.setStyleSheet(f"color: {colour};" if colour else "")
        prefix = "⚠ " if check.kind in ("refused", "other") else ""
        self.index_hint.setText(prefix + check.message if check.message else "")
        self._update_buttons()

    def _update_buttons(self) -> None:
        running = self._job is not None
        has_index = bool(self.index_edit.text().strip()) and (Path(self.index_edit.text().strip()) / MANIFEST).is_file()
        has_index = has_index and self._folder_check.kind != "other"  # Update works on this collection's index
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
        if not self.running:  # what the status said was of the index open before (a job's own result follows)
            self.progress.status_label.setText("")
            self.progress.item_label.setText("")
        self.browser.set_index(index)
        warning = verdict_warning(index)
        self.verdict_warning.setText(f"⚠ {warning[:1].upper()}{warning[1:]}" if warning else "")
        self.verdict_warning.setVisible(warning is not None)
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
            self.detected_label.setStyleSheet("")
            self.detected_label.setText(index_summary(index))
            self.detected_label.setToolTip(index_details(index))
        finally:
            self._filling = False
        self._refresh_folder_check()
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
        """Add ``rows`` (path, reason) to the skipped list (``clear``: instead of what it shows); a
        file already listed is not listed again."""
        if clear:
            self.skipped_tree.clear()
            self._shown_skipped = set()
        items = []
        for path, reason in rows:
            if str(path) in self._shown_skipped:
                continue
            self._shown_skipped.add(str(path))
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
