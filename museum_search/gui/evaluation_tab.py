"""The Evaluation tab: run a labelled query set against an index, watch the metrics, compare runs.

A view over core: the controls make a :class:`~museum_search.core.query.QuerySettings` (re-rankers
and their parameters, geometric verification, query regions), ``runner.evaluate`` answers every
query with the query pipeline (the answers and the "in this collection" verdict a visitor gets),
and the tab shows what comes back.

Left (scrolls when the window is short): the index (the open one, or another index folder), the
query set (folder + layout, with what was detected), the pipeline settings (with core's warning
when ICFRR cannot help this collection, ``rerank.icfrr_advice``), Run / Cancel, progress and the
stage in words, and the list of finished runs (checked runs are compared; the selected run fills
the plots and the table) with its export buttons. Right: live plots (:mod:`.widgets.plots`; the
legend of the runs drawn sits above them, outside the data) above four pages: the per-query
table with the selected query's top results, the comparison of runs (95 % bootstrap intervals,
the verdict's figures, paired one-tailed tests against a baseline run), the verdict's figures
against its threshold (``verdict.operating_points``) with its re-calibration from the labelled
queries (``verdict.recalibrated``, stored in the index), and the ICFRR sweep with its own
controls.

All long work runs through :func:`.workers.start` (one job at a time): an evaluation is
``runner.evaluate`` (the network from core's process-wide cache), a sweep is
``core.evaluation.sweep.sweep`` (queries described once), storing a verdict is ``Index.save``.
Both yield records naming their stage at least every 0.1 s, so Cancel takes effect at once in
every phase; the status line shows the stage and a smoothed ETA (``progress.EtaEstimator``).
Progress items arrive on the GUI thread; the plots only append to buffers there and redraw at 10 Hz.
"""

from __future__ import annotations

import html
import logging
import math
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Generator, Sequence

import numpy as np
from PySide6.QtCore import (
    QEvent, QItemSelectionModel, QModelIndex, QSortFilterProxyModel, Qt,
    Signal,
)
from PySide6.QtGui import QColor, QIcon, QPixmap
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QComboBox, QDoubleSpinBox, QFileDialog, QFrame, QGridLayout,
    QGroupBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QListWidget, QListWidgetItem, QProgressBar,
    QPushButton, QScrollArea, QSizePolicy, QSpinBox, QSplitter, QTableView, QTableWidget, QTableWidgetItem,
    QTabWidget, QVBoxLayout, QWidget,
)

from ..core.errors import MuseumSearchError
from ..core.evaluation.querysets import LAYOUTS, QuerySet, load_queryset
from ..core.evaluation.reports import COMPARED, confidence_intervals, unknown_instances_warning
from ..core.evaluation.stats import stars
from ..core.evaluation.runner import DESCRIBING, EvalReport, EvalStep
from ..core.evaluation.sweep import PARAMETER_NAMES, SweepPoint, SweepStep, parse_values, sweep_advice
from ..core.index import Index
from ..core.memory import compact_reports
from ..core.progress import Progress, wait
from ..core.query import QuerySettings
from ..core.rerank import RerankOptions, icfrr_advice
from ..core.search import Result, results_for
from ..core.verdict import Verdict, operating_points
from . import upgrade, workers
from .collection_tab import format_duration
from .state import AppState
from .widgets.query_table import SORT_ROLE, QueryTableModel
from .widgets.query_table import fmt as _fmt
from .widgets.plots import EvaluationPlots, Overlay, RunningBuffer, SweepPlot, VerdictPlot, run_colour
from .widgets.result_grid import ResultGrid
from .widgets.search_mode import SearchModeCombo
from .widgets.thumbnails import ThumbnailCache

log = logging.getLogger(__name__)

LAYOUT_LABELS = {
    "auto": "Auto-detect",
    "clicide": "CLICIDE (test/<label>-<k>)",
    "garofou": "GaRoFou (TEST_I/)",
    "folder": "One folder per instance",
    "csv": "ground_truth.csv",
    "regex": "Regular expression",
}
#: Re-rankers in the order they are applied (expansion first, then diffusion); verification follows.
RERANKER_ORDER = (("aqe", "αQE"), ("dba", "DBA"), ("icfrr", "ICFRR"))
#: The verdict's figures (keys of ``summary["verdict"]``) in the comparison table.
VERDICT_FIGURES = {"unknown_rejected": "Unknown\nrejected", "known_rejected": "Known\nrejected",
                   "accuracy": "Accuracy"}
#: Columns of the comparison table: run, queries, the means with their intervals (:data:`COMPARED`),
#: GAP, the verdict's figures, then the paired tests.
GAP_COLUMN = 5
VERDICT_COLUMN = GAP_COLUMN + 1  # the first of VERDICT_FIGURES
P_COLUMN = VERDICT_COLUMN + len(VERDICT_FIGURES)  # the first paired test (of COMPARED's first metric)
GAP_TIP = ("GAP (Global Average Precision, the Met dataset's open-set metric): every query, known and unknown, "
           "sorted by its answer's confidence; the precision of the right top-1 answers along that order, "
           "averaged over the known queries (1 is perfect: every known query right and surer than every "
           "unknown one). In brackets: over the known queries only.")
JOB_TITLES = {"evaluation": "Evaluation", "sweep": "ICFRR sweep", "verdict": "Storing the verdict"}
QUERY_THUMB = 180
RESULT_THUMB = 104
BATCH_SIZE = 8
VALUE_ROLE = Qt.ItemDataRole.UserRole + 1  # numbers behind a comparison cell
NO_INDEX = "No index. Open or build one in the Collection tab, or browse to an index folder."


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"


def _row(*items: QWidget | str | tuple | None) -> QHBoxLayout:
    """A row of widgets, texts (labels), ``(widget, stretch)`` pairs and stretches (``None``)."""
    row = QHBoxLayout()
    for it in items:
        if it is None:
            row.addStretch(1)
        else:
            row.addWidget(*(it if isinstance(it, tuple) else (QLabel(it) if isinstance(it, str) else it,)))
    return row


def _split(orientation: Qt.Orientation, *parts: tuple[QWidget, int, int]) -> QSplitter:
    """A splitter of ``(widget, stretch factor, initial size)`` parts."""
    sp = QSplitter(orientation)
    for i, (w, stretch, _size) in enumerate(parts):
        sp.addWidget(w)
        sp.setStretchFactor(i, stretch)
    sp.setSizes([size for _w, _s, size in parts])
    return sp


class _FitScroll(QScrollArea):
    """A scroll area as tall as its contents when there is room (Qt caps a scroll area's size
    hint at a few hundred pixels), shorter, with a scroll bar, when there is not."""

    def setWidget(self, widget: QWidget) -> None:  # noqa: N802 - Qt API
        super().setWidget(widget)
        widget.installEventFilter(self)

    def eventFilter(self, obj, event) -> bool:  # noqa: N802 - Qt API
        if obj is self.widget() and event.type() in (QEvent.Type.LayoutRequest, QEvent.Type.Resize):
            self.updateGeometry()  # its contents changed (a label wraps, a box shows): ask again
        return False

    def sizeHint(self):  # noqa: N802 - Qt API
        hint = super().sizeHint()
        w = self.widget()
        if w is not None:
            width = self.viewport().width()
            h = w.heightForWidth(width) if w.hasHeightForWidth() and width > 0 else -1
            hint.setHeight((h if h > 0 else w.sizeHint().height()) + 2 * self.frameWidth())
        return hint


# --------------------------------------------------------------------------------------------
# Runs


@dataclass
class EvalRun:
    """A finished evaluation kept for comparison."""

    key: int
    name: str
    report: EvalReport
    index: Index
    settings: QuerySettings
    buffer: RunningBuffer
    pr: tuple[np.ndarray, np.ndarray]
    cis: dict[str, tuple[float, float, float]]  # metric → (mean, low, high), 95 % bootstrap
    colour: str
    total: int
    finished: datetime = field(default_factory=datetime.now)

    def values_by_query(self, record_key: str) -> dict[str, float]:
        """Per-query values of the evaluated (non open-set) queries, by query path."""
        return {r.query: float(r.metrics[record_key]) for r in self.report.records if not r.open_set}

    @property
    def verified(self) -> bool:
        return self.report.verified

    @property
    def verdict_figures(self) -> dict[str, Any]:
        """``summary["verdict"]``: the verdict's figures on this run's queries."""
        return self.report.summary["verdict"]

    @cached_property
    def operating_points(self) -> dict[str, np.ndarray]:
        """The verdict's figures against its threshold (``verdict.operating_points``: the confidence of
        the verdict's model when it has one)."""
        return operating_points(self.report.evidence, verified=self.verified, verdict=self.report.verdict)

    @property
    def calibrated(self) -> bool:
        """The verdict is a calibrated model: its threshold is a confidence."""
        return self.report.verdict.model(self.verified) is not None


@dataclass
class _EvalResult:
    report: EvalReport
    cis: dict[str, tuple[float, float, float]]
    pr: tuple[np.ndarray, np.ndarray]


#: The stage after the answers (``Progress.stage``).
SUMMARIZING = "computing the confidence intervals"
WARNING_STYLE = "QLabel { color: #8a5300; background: #fff4e0; border: 1px solid #e0b060; border-radius: 3px; padding: 4px; }"


def _evaluation_job(index: Index, queryset: QuerySet, settings: QuerySettings,
                    batch_size: int = BATCH_SIZE) -> Generator[Any, None, _EvalResult]:
    """Background job: evaluate with the query pipeline, then intervals and PR."""
    from ..core.evaluation.runner import evaluate, precision_recall_curve

    report = yield from evaluate(index, queryset, settings, batch_size=batch_size)
    t0 = time.perf_counter()
    cis, pr = yield from wait(lambda: (confidence_intervals(report, index), precision_recall_curve(report)),
                              lambda: Progress(0, 0, stage=SUMMARIZING, elapsed=time.perf_counter() - t0))
    return _EvalResult(report, cis, pr)


def _sweep_job(index: Index, queryset: QuerySet, parameter: str, values: list[float],
               settings: QuerySettings, batch_size: int = BATCH_SIZE) -> Generator[Any, None, list[SweepPoint]]:
    from ..core.evaluation.sweep import sweep

    return (yield from sweep(index, queryset, parameter, values, settings.options, batch_size=batch_size,
                             settings=settings))


def progress_text(p: Progress) -> str:
    """A progress record in words: the stage, the count, the item, the time left."""
    if isinstance(p, EvalStep):
        text = f"{p.done:,} of {p.total:,} queries answered"
    else:
        text = p.stage[:1].upper() + p.stage[1:]
        if p.total <= 0:
            return text + "…"
        text += f": {p.done:,} of {p.total:,}"
    if p.current:
        text += f" — {Path(p.current).name}"
    if p.done < p.total and p.eta is not None:
        text += f" ({format_duration(p.eta)} left)"
    return text


def _store_verdict_job(index: Index, verdict: Verdict, reload: bool) -> Index | None:
    """Background job: ``index.store_verdict``; ``reload``: return the index loaded again from its
    folder (for the application, which has another object of the same folder open), else None."""
    index.store_verdict(verdict)
    return Index.load(index.path) if reload else None


# --------------------------------------------------------------------------------------------
# The tab


class EvaluationTab(QWidget):
    """See the module docstring. Public methods drive everything the controls do (and the tests)."""

    run_finished = Signal(object)  # EvalRun
    sweep_finished = Signal(object)  # list[SweepPoint]
    job_finished = Signal()  # any job ended (finished, cancelled or failed)
    verdict_stored = Signal(object)  # the Verdict stored in the evaluated index

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.index: Index | None = None
        self.queryset: QuerySet | None = None
        self.queryset_path: str | None = None
        self.runs: list[EvalRun] = []
        self.sweep_points: list[SweepPoint] = []
        self.comparison: list[dict[str, Any]] = []
        self._job: workers.Job | None = None
        self._job_kind = ""
        self._job_token = 0
        self._job_started = 0.0
        self._job_produced = False
        self._last_progress: Progress | None = None
        self._sweep_label = ""
        self._next_key = 1
        self._selected_key: int | None = None
        self._tests: dict[tuple[int, int, str], Any] = {}
        self._query_path: str | None = None
        self.batch_size = BATCH_SIZE  # queries described at once
        self._build_ui()
        state.index_changed.connect(self.set_index)
        self.set_index(state.index)

    # ---- UI ------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        # index
        self.index_label = QLabel(NO_INDEX)
        self.index_label.setObjectName("evalIndexLabel")
        self.index_label.setWordWrap(True)
        self.index_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.use_open_index_button = QPushButton("Use open index")
        self.use_open_index_button.setToolTip("Evaluate the index open in the application")
        self.use_open_index_button.clicked.connect(lambda: self.set_index(self.state.index))
        self.browse_index_button = QPushButton("Other index…")
        self.browse_index_button.setToolTip("Evaluate another index folder (it is not opened in the other tabs)")
        self.browse_index_button.clicked.connect(self._browse_index)
        index_box = QGroupBox("Index")
        il = QVBoxLayout(index_box)
        il.addWidget(self.index_label)
        il.addLayout(_row(self.use_open_index_button, self.browse_index_button, None))

        # query set
        self.queryset_edit = QLineEdit()
        self.queryset_edit.setObjectName("querysetPath")
        self.queryset_edit.setPlaceholderText("Folder of labelled query photos")
        self.queryset_edit.returnPressed.connect(lambda: self.load_queryset_path(self.queryset_edit.text()))
        self.browse_queryset_button = QPushButton("Browse…")
        self.browse_queryset_button.clicked.connect(self._browse_queryset)
        self.layout_combo = QComboBox()
        self.layout_combo.setObjectName("layoutCombo")
        for key in LAYOUTS:
            self.layout_combo.addItem(LAYOUT_LABELS.get(key, key), key)
        self.layout_combo.setToolTip("How query photos are labelled; auto-detect recognises CLICIDE, GaRoFou, "
                                     "one folder per instance and a ground_truth.csv")
        self.layout_combo.currentIndexChanged.connect(self._layout_changed)
        self.regex_edit = QLineEdit()
        self.regex_edit.setPlaceholderText(r"e.g. (?P<instance>[^/]+)/[^/]+$")
        self.regex_edit.setToolTip("A regular expression with a group named 'instance', searched in the relative path")
        self.regex_edit.returnPressed.connect(self._reload_queryset)
        self.regex_edit.hide()
        self.regions_check = QCheckBox("Describe query regions (best of 5 crops)")
        self.regions_check.setObjectName("queryRegions")
        self.regions_check.setChecked(True)
        self.regions_check.setToolTip("As the Search tab does: a reference's score is its best over the whole "
                                      "photo and four large crops. Untick for the papers' protocol (whole image).")
        self.detected_label = QLabel("No query set.")
        self.detected_label.setObjectName("detectedLabel")
        self.detected_label.setWordWrap(True)
        qs_box = QGroupBox("Labelled queries")
        ql = QGridLayout(qs_box)
        ql.addWidget(self.queryset_edit, 0, 0, 1, 2)
        ql.addWidget(self.browse_queryset_button, 0, 2)
        ql.addWidget(QLabel("Layout:"), 1, 0)
        ql.addWidget(self.layout_combo, 1, 1, 1, 2)
        ql.addWidget(self.regex_edit, 2, 0, 1, 3)
        ql.addWidget(self.detected_label, 3, 0, 1, 3)
        ql.addWidget(self.regions_check, 4, 0, 1, 3)
        ql.setColumnStretch(1, 1)

        # re-ranking
        d = RerankOptions()
        self.rerank_checks: dict[str, QCheckBox] = {}
        rr_box = QGroupBox("Re-ranking and verification")
        rr_box.setToolTip("Re-rankers in the order they are applied (none when nothing is ticked), then geometric "
                          "verification of the top results")
        rl = QGridLayout(rr_box)
        for name, label in RERANKER_ORDER:
            cb = QCheckBox(label)
            cb.setObjectName(f"rerank_{name}")
            cb.toggled.connect(self._update_param_enabled)
            self.rerank_checks[name] = cb
        self.rerank_checks["icfrr"].setToolTip("Iterative cluster-free re-ranking: diffusion over the collection")
        self.rerank_checks["aqe"].setToolTip("α-weighted query expansion")
        self.rerank_checks["dba"].setToolTip("Database-side augmentation")
        self.verify_check = QCheckBox("Verify")
        self.verify_check.setObjectName("verify")
        self.verify_check.setChecked(True)
        self.verify_check.setToolTip("As the Search tab does: match the top references with the photo (homography "
                                     "inliers); the verdict then counts matching points instead of the cosine")
        self.verify_check.toggled.connect(self._update_param_enabled)
        self.kq_spin = self._spin(0, 10000, 0, "K_q: how many current top references vote (auto = suggested)")
        self.kg_spin = self._spin(0, 10000, 0, "K_g: gallery-gallery rank cut-off (auto = suggested)")
        for s in (self.kq_spin, self.kg_spin):
            s.setSpecialValueText("auto")
        self.beta_spin = QDoubleSpinBox(minimum=0.0, maximum=10.0, singleStep=0.05, decimals=2)
        self.beta_spin.setValue(d.beta)
        self.beta_spin.setToolTip("β: weight of each update")
        self.iter_spin = self._spin(1, 100, d.iterations, "Maximum number of updates")
        self.mode_combo = QComboBox()
        self.mode_combo.addItem("paper (Eq. 3)", "paper")
        self.mode_combo.addItem("reference code", "reference")
        self.mode_combo.setToolTip("paper: scores accumulate (Eq. 3); reference: the public code's update")
        self.qe_n_spin = self._spin(1, 100, d.qe_n, "n: top references used for expansion")
        self.qe_alpha_spin = QDoubleSpinBox(minimum=0.0, maximum=20.0, singleStep=0.5, decimals=1)
        self.qe_alpha_spin.setValue(d.qe_alpha)
        self.qe_alpha_spin.setToolTip("α: weighting power of the neighbours")
        self.verify_top_spin = self._spin(1, 1000, QuerySettings().verify_top, "Top results verified geometrically")
        # compact rows: the panel stays narrow enough for the plots at 1024 px
        rl.addWidget(self.rerank_checks["icfrr"], 0, 0)
        rl.addLayout(_row("K_q", self.kq_spin, "K_g", self.kg_spin, None), 0, 1)
        rl.addLayout(_row("β", self.beta_spin, "iterations", self.iter_spin, None), 1, 1)
        rl.addWidget(self.mode_combo, 2, 1)
        rl.addWidget(self.rerank_checks["aqe"], 3, 0)
        rl.addLayout(_row(self.rerank_checks["dba"], "n", self.qe_n_spin, "α", self.qe_alpha_spin, None), 3, 1)
        rl.addWidget(self.verify_check, 4, 0)
        rl.addLayout(_row("top", self.verify_top_spin, None), 4, 1)
        # exact or approximate (ANN) search, as in the Search tab (Approximate needs the index's ANN index)
        self.search_mode = SearchModeCombo()
        rl.addWidget(QLabel("Search"), 5, 0)
        rl.addLayout(_row(self.search_mode, None), 5, 1)
        rl.setColumnStretch(1, 1)
        # core's warning when ICFRR cannot help this collection (shown while ICFRR is ticked, above Run)
        self.icfrr_warning = QLabel("")
        self.icfrr_warning.setObjectName("icfrrWarning")
        self.icfrr_warning.setWordWrap(True)
        self.icfrr_warning.setStyleSheet(WARNING_STYLE)
        self.icfrr_warning.hide()
        for spin in (self.kq_spin, self.kg_spin):
            spin.valueChanged.connect(lambda _v: self._update_icfrr_warnings())

        # run
        self.run_button = QPushButton("Run evaluation")
        self.run_button.setObjectName("runEvaluation")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.run_evaluation)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelEvaluation")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setObjectName("evalProgress")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("")  # idle
        self.status_label = QLabel("")
        self.status_label.setObjectName("evalStatus")
        self.status_label.setWordWrap(True)
        run_row = _row((self.run_button, 1), self.cancel_button)

        # runs
        self.runs_list = QListWidget()
        self.runs_list.setObjectName("runsList")
        self.runs_list.setToolTip("Ticked runs are compared; the selected run fills the plots and the table")
        self.runs_list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.runs_list.currentItemChanged.connect(self._run_item_changed)
        self.runs_list.itemChanged.connect(self._run_checked_changed)
        self.runs_list.setMinimumHeight(70)
        # the settings above take their height first; the list gets the rest (at least 70 px)
        self.runs_list.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.remove_run_button = QPushButton("Remove")
        self.remove_run_button.clicked.connect(self.remove_selected_run)
        self.export_json_button = QPushButton("Export JSON…")
        self.export_json_button.setToolTip("Summary, 95 % intervals and per-query results of the selected run")
        self.export_json_button.clicked.connect(lambda: self.export_json())
        self.export_csv_button = QPushButton("Export CSV…")
        self.export_csv_button.setToolTip("One line per query of the selected run")
        self.export_csv_button.clicked.connect(lambda: self.export_csv())
        runs_box = QGroupBox("Runs")
        rbl = QVBoxLayout(runs_box)
        rbl.addWidget(self.runs_list, 1)
        rbl.addLayout(_row(self.remove_run_button, None, self.export_json_button, self.export_csv_button))

        left = QWidget()
        left.setObjectName("evalControls")
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 6, 0)
        ll.addWidget(index_box)
        ll.addWidget(qs_box)
        ll.addWidget(rr_box)
        ll.addStretch(1)
        scroll = _FitScroll()
        scroll.setObjectName("evalControlsScroll")
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(left)
        # the settings scroll; Run / Cancel, the progress, the status and the runs with their export
        # buttons stay in view below them
        left_column = QWidget()
        left_column.setObjectName("evalLeft")
        lc = QVBoxLayout(left_column)
        lc.setContentsMargins(0, 0, 0, 0)
        lc.addWidget(scroll)
        lc.addWidget(self.icfrr_warning)
        lc.addLayout(run_row)
        lc.addWidget(self.progress)
        lc.addWidget(self.status_label)
        lc.addWidget(runs_box, 1)
        left_column.setMinimumWidth(max(left.sizeHint().width(), runs_box.sizeHint().width()) + 16)

        # plots
        self.plots = EvaluationPlots()
        self.plots.setObjectName("evalPlots")
        self.plots.setMinimumHeight(240)

        # per-query page
        self.table_model = QueryTableModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.table_model)
        self.proxy.setSortRole(SORT_ROLE)
        self.table = QTableView()
        self.table.setObjectName("queryTable")
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.sortByColumn(-1, Qt.SortOrder.AscendingOrder)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(True)
        self.table.selectionModel().currentRowChanged.connect(self._current_row_changed)
        self.query_image = QLabel("Select a query in the table.")
        self.query_image.setObjectName("evalQueryImage")
        self.query_image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.query_image.setFixedSize(QUERY_THUMB, QUERY_THUMB)
        self.query_image.setFrameShape(QFrame.Shape.StyledPanel)
        self.query_info = QLabel("")
        self.query_info.setObjectName("evalQueryInfo")
        self.query_info.setWordWrap(True)
        self.query_info.setTextFormat(Qt.TextFormat.RichText)
        self.query_info.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.query_info.setFixedWidth(QUERY_THUMB)
        self.result_grid = ResultGrid(thumb_size=RESULT_THUMB, placeholder="The top results of the selected query.")
        self.result_grid.setObjectName("evalResultGrid")
        qcol = QVBoxLayout()
        qcol.addWidget(self.query_image)
        qcol.addWidget(self.query_info, 1)
        detail = QWidget()
        dl = QHBoxLayout(detail)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addLayout(qcol)
        dl.addWidget(self.result_grid, 1)
        self.queries_splitter = _split(Qt.Orientation.Horizontal, (self.table, 1, 480), (detail, 1, 560))

        # compare page
        self.baseline_combo = QComboBox()
        self.baseline_combo.setObjectName("baselineCombo")
        self.baseline_combo.setToolTip("The run every other run is tested against")
        self.baseline_combo.currentIndexChanged.connect(lambda _i: self._update_comparison())
        self.summary_table = QTableWidget(0, 12)
        self.summary_table.setObjectName("summaryTable")
        self.summary_table.setHorizontalHeaderLabels(
            ["Run", "Queries", "MP@1 [95% CI]", "MAP [95% CI]", "AMNRO [95% CI]", "GAP [known]",
             *VERDICT_FIGURES.values(), "p MP@1", "p MAP", "p AMNRO"])
        self.summary_table.horizontalHeaderItem(GAP_COLUMN).setToolTip(GAP_TIP)
        self.summary_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.summary_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.summary_table.verticalHeader().hide()
        sh = self.summary_table.horizontalHeader()
        sh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        sh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        note = QLabel("Intervals: 95 % percentile bootstrap over queries. GAP: Global Average Precision over "
                      "all queries sorted by confidence (in brackets, over the known queries only). "
                      "Verdict (“in this collection”): "
                      "unknown objects rejected, known objects wrongly rejected, accuracy (right answer or right "
                      "rejection); n/a without such queries. p: paired one-tailed randomization test that the run "
                      "is better than the baseline (for AMNRO, lower is better), exact up to 20 differing queries; "
                      "in brackets the number of queries that differ (the only ones it uses) and the paired "
                      "bootstrap test's p, which is too small when few queries differ; "
                      "* p ≤ 0.05, ** p ≤ 0.01, *** p ≤ 0.001 (randomization p).")
        note.setWordWrap(True)
        compare_page = QWidget()
        cl = QVBoxLayout(compare_page)
        cl.addLayout(_row("Baseline:", (self.baseline_combo, 1)))
        cl.addWidget(self.summary_table, 1)
        cl.addWidget(note)

        # sweep page: its controls, core's ICFRR warning, the plot and the table
        self.sweep_param_combo = QComboBox()
        self.sweep_param_combo.setObjectName("sweepParameter")
        self.sweep_param_combo.addItem("K_q = K_g", "k")
        self.sweep_param_combo.addItem("β", "beta")
        self.sweep_param_combo.currentIndexChanged.connect(self._sweep_param_changed)
        self.sweep_values_edit = QLineEdit("1:5")
        self.sweep_values_edit.setObjectName("sweepValues")
        self.sweep_values_edit.setToolTip("Values: 1,2,5 or a range start:stop:step (stop included)")
        self.sweep_button = QPushButton("Run sweep")
        self.sweep_button.setObjectName("runSweep")
        self.sweep_button.setToolTip("Evaluate ICFRR at each value; the other ICFRR settings, query regions and "
                                     "verification come from the controls on the left. The queries are described once.")
        self.sweep_button.clicked.connect(lambda: self.run_sweep())
        self.sweep_cancel_button = QPushButton("Cancel")
        self.sweep_cancel_button.setObjectName("cancelSweep")
        self.sweep_cancel_button.setEnabled(False)
        self.sweep_cancel_button.clicked.connect(self.cancel)
        self.sweep_warning = QLabel("")
        self.sweep_warning.setObjectName("sweepWarning")
        self.sweep_warning.setWordWrap(True)
        self.sweep_warning.setStyleSheet(WARNING_STYLE)
        self.sweep_warning.hide()
        self.sweep_status = QLabel("Other ICFRR settings, query regions and verification: the controls on the left.")
        self.sweep_status.setObjectName("sweepStatus")
        self.sweep_status.setWordWrap(True)
        self.sweep_plot = SweepPlot()
        self.sweep_plot.setObjectName("sweepPlot")
        self.sweep_table = QTableWidget(0, 5)
        self.sweep_table.setObjectName("sweepTable")
        self.sweep_table.setHorizontalHeaderLabels(["Value", "MP@1", "MAP", "AMNRO", "GAP"])
        self.sweep_table.horizontalHeaderItem(4).setToolTip(GAP_TIP)
        self.sweep_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.sweep_table.verticalHeader().hide()
        self.sweep_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.sweep_table.setMinimumWidth(260)
        self.sweep_table.setMaximumWidth(360)
        sweep_split = _split(Qt.Orientation.Horizontal, (self.sweep_plot, 3, 700), (self.sweep_table, 1, 300))
        self.sweep_page = QWidget()
        self.sweep_page.setObjectName("sweepPage")
        spl = QVBoxLayout(self.sweep_page)
        spl.addLayout(_row("Sweep", self.sweep_param_combo, "over", (self.sweep_values_edit, 1), self.sweep_button,
                           self.sweep_cancel_button))
        spl.addWidget(self.sweep_warning)
        spl.addWidget(self.sweep_status)
        spl.addWidget(sweep_split, 1)

        # verdict page
        self.verdict_plot = VerdictPlot()
        self.verdict_plot.setObjectName("verdictPlot")
        self.verdict_label = QLabel("Run an evaluation to see the verdict's figures.")
        self.verdict_label.setObjectName("verdictFigures")
        self.verdict_label.setWordWrap(True)
        self.verdict_label.setTextFormat(Qt.TextFormat.RichText)
        self.max_known_spin = QDoubleSpinBox(minimum=0.0, maximum=50.0, singleStep=1.0, decimals=1, suffix=" %")
        self.max_known_spin.setObjectName("maxKnownRejected")
        self.max_known_spin.setValue(3.0)
        self.max_known_spin.setToolTip("The threshold that rejects the most unknown objects while wrongly rejecting "
                                       "at most this share of the known ones (on this run's queries)")
        self.max_known_spin.valueChanged.connect(lambda _v: self._show_candidate())
        self.candidate_label = QLabel("")
        self.candidate_label.setObjectName("verdictCandidate")
        self.candidate_label.setWordWrap(True)
        self.store_verdict_button = QPushButton("Store in index")
        self.store_verdict_button.setObjectName("storeVerdict")
        self.store_verdict_button.setToolTip("Use this operating point: store it in the evaluated index, for the "
                                             "Search tab, the kiosk and the command line")
        self.store_verdict_button.clicked.connect(lambda: self.store_verdict())
        side = QGroupBox("The verdict on these labelled queries")
        vl = QVBoxLayout(side)
        for item in (self.verdict_label, QLabel("<b>Re-calibrate</b>: known objects rejected at most"),
                     self.max_known_spin, self.candidate_label, self.store_verdict_button):
            vl.addWidget(item)
        vl.addStretch(1)
        side.setMinimumWidth(260)
        verdict_page = _split(Qt.Orientation.Horizontal, (self.verdict_plot, 3, 700), (side, 1, 320))

        self.pages = QTabWidget()
        self.pages.setObjectName("evalPages")
        self.pages.addTab(self.queries_splitter, "Queries")
        self.pages.addTab(compare_page, "Compare runs")
        self.pages.addTab(verdict_page, "Verdict")
        self.pages.addTab(self.sweep_page, "ICFRR sweep")

        plots_box = QWidget()
        pbl = QVBoxLayout(plots_box)
        pbl.setContentsMargins(0, 0, 0, 0)
        pbl.setSpacing(2)
        pbl.addWidget(self.plots.legend)
        pbl.addWidget(self.plots, 1)
        self.right_splitter = _split(Qt.Orientation.Vertical, (plots_box, 2, 330), (self.pages, 3, 470))
        self.splitter = _split(Qt.Orientation.Horizontal, (left_column, 0, left_column.minimumWidth()),
                               (self.right_splitter, 1, 1200))
        lay = QVBoxLayout(self)
        lay.addWidget(self.splitter)

        ThumbnailCache.instance().ready.connect(self._thumbnail_ready)
        self._update_param_enabled()
        self._update_buttons()

    def _spin(self, lo: int, hi: int, value: int, tip: str) -> QSpinBox:
        s = QSpinBox(minimum=lo, maximum=hi)
        s.setValue(value)
        s.setToolTip(tip)
        return s

    def _update_param_enabled(self, *_args) -> None:
        on = {n: cb.isChecked() for n, cb in self.rerank_checks.items()}
        for w in (self.kq_spin, self.kg_spin, self.beta_spin, self.iter_spin, self.mode_combo):
            w.setEnabled(on["icfrr"])
        for w in (self.qe_n_spin, self.qe_alpha_spin):
            w.setEnabled(on["aqe"] or on["dba"])
        self.verify_top_spin.setEnabled(self.verify_check.isChecked())
        self._update_icfrr_warnings()

    def icfrr_advice(self) -> str | None:
        """Core's warning for the evaluation the controls describe (None: ICFRR not ticked, or it can help)."""
        if self.index is None or not self.rerank_checks["icfrr"].isChecked():
            return None
        return icfrr_advice(self.index.labels, self.rerank_options())

    def sweep_advice(self) -> str | None:
        """Core's warning for the sweep the controls describe (a sweep always runs ICFRR)."""
        if self.index is None:
            return None
        return sweep_advice(self.index.labels, self.sweep_param_combo.currentData(), self.rerank_options())

    def _update_icfrr_warnings(self) -> None:
        for label, advice in ((self.icfrr_warning, self.icfrr_advice()), (self.sweep_warning, self.sweep_advice())):
            label.setText(f"⚠ {advice}" if advice else "")
            label.setVisible(bool(advice))

    # ---- index and query set ----------------------------------------------------------------
    def set_index(self, index: Index | None) -> None:
        """Evaluate ``index`` (the open index follows the application's by default)."""
        self.index = index
        self.search_mode.set_index(index)
        if index is None:
            self.index_label.setText(NO_INDEX)
            self.index_label.setToolTip("")
        else:
            where = str(index.path) if index.path else str(index.root)
            self.index_label.setText(f"<b>{len(index):,}</b> references of <b>{len(index.instances):,}</b> "
                                     f"instances — {html.escape(index.meta.describe())}")
            self.index_label.setToolTip(f"{index.describe()}\n{where}")
        self._update_detected()
        self._update_icfrr_warnings()
        self._update_buttons()

    def open_index(self, path: str | os.PathLike) -> bool:
        """Load the index folder ``path`` and evaluate it (errors go to a dialog; an index of an
        older format is offered for conversion and evaluated once converted: False until then)."""

        def opened(index: Index) -> None:
            self.state.settings.set_value("evaluation/index_dir", str(Path(path).parent))
            self.set_index(index)

        return upgrade.open_index(self, path, opened)

    def _browse_index(self) -> None:
        start = str(self.state.settings.value("evaluation/index_dir", "") or "")
        path = QFileDialog.getExistingDirectory(self, "Index folder to evaluate", start)
        if path:
            self.open_index(path)

    def load_queryset_path(self, path: str | os.PathLike, layout: str | None = None,
                           regex: str | None = None) -> bool:
        """Load the labelled queries at ``path`` with ``layout`` (default: the combo's)."""
        if layout is not None:
            i = self.layout_combo.findData(layout)
            if i < 0:
                workers.show_error(self, "Query set", f"Unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}.")
                return False
            self.layout_combo.blockSignals(True)
            self.layout_combo.setCurrentIndex(i)
            self.layout_combo.blockSignals(False)
            self.regex_edit.setVisible(layout == "regex")
        if regex is not None:
            self.regex_edit.setText(regex)
        layout = self.layout_combo.currentData()
        path = str(path).strip()
        self.queryset_edit.setText(path)
        if not path:
            return False
        try:
            rx = self.regex_edit.text().strip() or None
            if layout == "regex" and rx is None:
                raise MuseumSearchError("Enter a regular expression with a group named 'instance'.")
            qs = load_queryset(path, layout, regex=rx if layout == "regex" else None)
        except Exception as exc:  # noqa: BLE001 - any failure is shown, the previous set is dropped
            self.queryset = None
            self.queryset_path = None
            self.detected_label.setText("No query set.")
            workers.show_error(self, "Cannot load the query set", exc)
            self._update_buttons()
            return False
        self.queryset = qs
        self.queryset_path = path
        self.state.settings.set_value("evaluation/queryset_dir", path)
        self._update_detected()
        self._update_buttons()
        return True

    def _update_detected(self) -> None:
        if self.queryset is None:
            return
        text = f"Detected: {html.escape(self.queryset.describe())}"
        if self.index is not None:
            note = self.queryset.unknown_instances_note(self.index.instances)
            if note:
                text += f"<br><span style='color:#b36b00'>⚠ {html.escape(note)}.</span>"
        self.detected_label.setText(text)

    def _browse_queryset(self) -> None:
        start = self.queryset_edit.text() or str(self.state.settings.value("evaluation/queryset_dir", "") or "")
        path = QFileDialog.getExistingDirectory(self, "Folder of labelled query photos", start)
        if path:
            self.load_queryset_path(path)

    def _layout_changed(self, _i: int) -> None:
        self.regex_edit.setVisible(self.layout_combo.currentData() == "regex")
        if self.layout_combo.currentData() != "regex" or self.regex_edit.text().strip():
            self._reload_queryset()

    def _reload_queryset(self) -> None:
        if self.queryset_edit.text().strip():
            self.load_queryset_path(self.queryset_edit.text())

    # ---- query pipeline settings ----------------------------------------------------------
    def rerank_names(self) -> list[str]:
        """Ticked re-rankers, in the order they are applied."""
        return [n for n, _ in RERANKER_ORDER if self.rerank_checks[n].isChecked()]

    def rerank_options(self) -> RerankOptions:
        return RerankOptions(
            k_q=self.kq_spin.value() or None, k_g=self.kg_spin.value() or None, beta=self.beta_spin.value(),
            iterations=self.iter_spin.value(), icfrr_mode=self.mode_combo.currentData(),
            qe_n=self.qe_n_spin.value(), qe_alpha=self.qe_alpha_spin.value(),
        )

    def query_settings(self) -> QuerySettings:
        """The query pipeline's settings the controls describe (the index's own verdict)."""
        return QuerySettings(regions=self.regions_check.isChecked(), rerank=",".join(self.rerank_names()),
                             options=self.rerank_options(), verify=self.verify_check.isChecked(),
                             verify_top=self.verify_top_spin.value(), search=self.search_mode.mode())

    def set_rerank(self, names: Sequence[str], options: RerankOptions | None = None,
                   verify: bool | None = None) -> None:
        """Tick ``names`` (others unticked) and show ``options`` (and ``verify``) in the controls."""
        names = [n.lower() for n in names]
        for n, cb in self.rerank_checks.items():
            cb.setChecked(n in names)
        if verify is not None:
            self.verify_check.setChecked(verify)
        if options is not None:
            self.kq_spin.setValue(options.k_q or 0)
            self.kg_spin.setValue(options.k_g or 0)
            self.beta_spin.setValue(options.beta)
            self.iter_spin.setValue(options.iterations)
            self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(options.icfrr_mode)))
            self.qe_n_spin.setValue(options.qe_n)
            self.qe_alpha_spin.setValue(options.qe_alpha)

    # ---- running ------------------------------------------------------------------------------
    def is_running(self) -> bool:
        return self._job is not None and self._job.running

    def _check_inputs(self, title: str) -> bool:
        if self.is_running():
            workers.show_error(self, title, "An evaluation is already running; wait for it or cancel it.")
            return False
        if self.index is None:
            workers.show_error(self, title, NO_INDEX)
            return False
        if self.queryset is None:
            workers.show_error(self, title, "Choose a folder of labelled query photos first (Browse…).")
            return False
        return True

    def run_evaluation(self) -> bool:
        """Start evaluating the query set with the pipeline the controls describe (in the background)."""
        if not self._check_inputs("Evaluation"):
            return False
        index, queryset, settings = self.index, self.queryset, self.query_settings()
        total = len(queryset.queries)
        self.plots.start_live(total)
        self.plots.set_overlays(self._overlays(exclude=None), main_name="this run")
        self.progress.setRange(0, 0)
        self.progress.setFormat("%v / %m queries")
        self._start("evaluation", _evaluation_job(index, queryset, settings, self.batch_size),
                    lambda res: self._evaluation_done(res, index, settings, total))
        self._set_status(f"Evaluating {total:,} queries: {settings.label()}")
        self._update_icfrr_warnings()  # stays shown while the run goes on
        return True

    def run_sweep(self, parameter: str | None = None, values: Sequence[float] | str | None = None) -> bool:
        """Start an ICFRR sweep of ``parameter`` ("k" or "beta") over ``values`` (default: the controls)."""
        if parameter is not None:
            self.sweep_param_combo.setCurrentIndex(max(0, self.sweep_param_combo.findData(parameter)))
        if values is not None:
            self.sweep_values_edit.setText(values if isinstance(values, str) else ", ".join(f"{v:g}" for v in values))
        if not self._check_inputs("ICFRR sweep"):
            return False
        parameter = self.sweep_param_combo.currentData()
        try:
            vals = parse_values(self.sweep_values_edit.text(), parameter)
        except MuseumSearchError as exc:
            workers.show_error(self, "ICFRR sweep", exc)
            return False
        label = PARAMETER_NAMES[parameter]
        self._sweep_label = label
        self.sweep_points = []
        self.sweep_plot.start(label, integer=parameter == "k")
        self.sweep_table.setRowCount(0)
        self.sweep_table.setHorizontalHeaderLabels([label, "MP@1", "MAP", "AMNRO", "GAP"])
        self.pages.setCurrentWidget(self.sweep_page)
        self.progress.setRange(0, 0)
        self._start("sweep", _sweep_job(self.index, self.queryset, parameter, vals, self.query_settings(),
                                        self.batch_size), self._sweep_done)
        self._set_status(f"ICFRR sweep of {label} over {len(vals)} value{'s' if len(vals) != 1 else ''}")
        self._update_icfrr_warnings()
        return True

    def _start(self, kind: str, gen, on_result) -> None:
        self._job_token += 1
        token = self._job_token
        self._job_kind = kind
        self._job_produced = False
        self._last_progress = None
        self._job_started = time.perf_counter()
        self._job = workers.start(
            gen,
            on_progress=lambda item: self._on_progress(token, item),
            on_result=lambda res: self._on_result(token, on_result, res),
            on_error=lambda exc: self._on_error(token, exc),
            on_finished=lambda: self._on_finished(token),
        )
        self._update_buttons()

    def cancel(self) -> None:
        """Stop the running evaluation or sweep (its partial results are dropped)."""
        if self._job is not None and self._job.running and self._job_kind != "verdict":
            self._job.cancel()
            self._set_status("Cancelling…")

    def _on_progress(self, token: int, item: Any) -> None:
        if token != self._job_token:
            return
        if isinstance(item, str):
            self._set_status(item)
            return
        if not isinstance(item, Progress):
            return
        self._last_progress = item
        if isinstance(item, EvalStep):
            self.plots.add_step(item)
        elif isinstance(item, SweepStep) and item.summary is not None:
            self._add_sweep_row(item.value, item.summary)
        if item.total > 0:  # (a step of unknown length leaves the bar as it is: busy from the start)
            if self._job_kind == "sweep":
                self.progress.setFormat("%v / %m queries described" if item.stage == DESCRIBING else "%v / %m answers")
            if self.progress.maximum() != item.total:
                self.progress.setRange(0, item.total)
            self.progress.setValue(item.done)
        self._set_status(progress_text(item))

    def _on_result(self, token: int, handler, result: Any) -> None:
        if token == self._job_token:
            self._job_produced = True
            handler(result)

    def _on_error(self, token: int, exc: BaseException) -> None:
        if token != self._job_token:
            return
        title = f"{JOB_TITLES[self._job_kind]} failed"
        self._set_status(f"{title}: {workers.error_message(exc)}")
        workers.show_error(self, title, exc)

    def _on_finished(self, token: int) -> None:
        if token != self._job_token:
            return
        job = self._job
        self._job = None
        if self.plots.live:
            self.plots.stop_live()
        if job is not None and job.cancelled:
            done, total = self.progress.value(), max(0, self.progress.maximum())
            last = self._last_progress
            self._set_status(f"{JOB_TITLES[self._job_kind]} cancelled after {done:,} of {total:,}." if total else
                             f"{JOB_TITLES[self._job_kind]} cancelled"
                             + (f" while {last.stage}." if last is not None and last.total <= 0 else "."))
            if self._job_kind == "sweep":
                self.sweep_status.setText(self.status_label.text())
        run = self.selected_run()
        if self._job_kind == "evaluation" and not self._job_produced and run is not None:
            # back to the selected run's plots (the partial curves are dropped); the table and the
            # other pages still show it
            self.plots.show_buffer(run.buffer, run.total)
            self.plots.set_pr(run.pr, run.colour)
            self._refresh_overlays()
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
        self._update_buttons()
        self.job_finished.emit()

    def _evaluation_done(self, res: _EvalResult, index: Index, settings: QuerySettings, total: int) -> None:
        self.plots.stop_live()
        key = self._next_key
        self._next_key += 1
        name = f"{settings.label()} · {datetime.now():%H:%M:%S}"
        run = EvalRun(key, name, res.report, index, settings, self.plots.buffer.copy(), res.pr, res.cis,
                      run_colour(key - 1), total)
        s, v = res.report.summary, run.verdict_figures
        took = time.perf_counter() - self._job_started
        skipped = f", {s['skipped_queries']} unreadable" if s.get("skipped_queries") else ""
        open_set = f", {s['open_set_queries']} open-set not averaged" if s.get("open_set_queries") else ""
        warning = unknown_instances_warning(s)
        warning = f"\n⚠ {warning}." if warning else ""
        if s.get("icfrr_advice"):
            warning += f"\n⚠ {s['icfrr_advice']}"
        self._set_status(f"Done in {format_duration(took)}: MP@1 {_fmt(s['mp@1'])}, MAP {_fmt(s['map'])}, "
                         f"AMNRO {_fmt(s['amnro'])}, GAP {_fmt(s['gap'])} over {s['queries']:,} queries"
                         f"{open_set}{skipped}. Verdict: "
                         f"unknown rejected {_pct(v['unknown_rejected'])}, known rejected {_pct(v['known_rejected'])}"
                         f", accuracy {_pct(v['accuracy'])}.{warning}")
        self.add_run(run)
        self.run_finished.emit(run)

    def _sweep_done(self, points: list[SweepPoint]) -> None:
        self.sweep_points = list(points)
        if points:
            best = max(points, key=lambda p: (p.summary["map"] if math.isfinite(p.summary["map"]) else -1))
            advice = points[0].summary.get("icfrr_advice")
            text = f"Sweep done: best MAP {_fmt(best.summary['map'])} at {self._sweep_label} = {best.value:g}."
            self._set_status(text + (f"\n⚠ {advice}" if advice else ""))
            self.sweep_status.setText(text)  # the sweep's page shows the warning above it already
        self.sweep_finished.emit(self.sweep_points)

    def _add_sweep_row(self, value: float, summary: dict) -> None:
        self.sweep_plot.add_point(value, summary)
        r = self.sweep_table.rowCount()
        self.sweep_table.insertRow(r)
        for c, text in enumerate((f"{value:g}", _fmt(summary["mp@1"]), _fmt(summary["map"]), _fmt(summary["amnro"]),
                                  _fmt(summary["gap"]))):
            item = QTableWidgetItem(text)
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.sweep_table.setItem(r, c, item)

    def _set_status(self, text: str) -> None:
        self.status_label.setText(text)
        if self._job_kind == "sweep" and self._job is not None:  # the sweep's own page says it too
            self.sweep_status.setText(text)

    def _update_buttons(self) -> None:
        busy = self.is_running()
        ready = self.index is not None and self.queryset is not None
        self.run_button.setEnabled(not busy and ready)
        self.sweep_button.setEnabled(not busy and ready)
        self.cancel_button.setEnabled(busy and self._job_kind != "verdict")
        self.sweep_cancel_button.setEnabled(busy and self._job_kind == "sweep")
        run = self.selected_run()
        self.store_verdict_button.setEnabled(not busy and run is not None and run.report.can_recalibrate)
        self.max_known_spin.setEnabled(not busy and run is not None and run.report.can_recalibrate)
        for w in (self.use_open_index_button, self.browse_index_button, self.browse_queryset_button,
                  self.layout_combo, self.queryset_edit, self.regions_check, self.sweep_param_combo,
                  self.sweep_values_edit, self.regex_edit):
            w.setEnabled(not busy)
        has = self.selected_run() is not None
        for w in (self.export_json_button, self.export_csv_button, self.remove_run_button):
            w.setEnabled(has and not busy)

    # ---- runs ---------------------------------------------------------------------------------
    def add_run(self, run: EvalRun) -> None:
        """Keep ``run`` (ticked for comparison) and select it."""
        self.runs.append(run)
        compact_reports([r.report for r in self.runs])  # older runs keep the top ranks (core.memory)
        s = run.report.summary
        advice = s.get("icfrr_advice")
        item = QListWidgetItem(self._colour_icon(run.colour), ("⚠ " if advice else "") + run.name)
        item.setData(Qt.ItemDataRole.UserRole, run.key)
        item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
        warning = unknown_instances_warning(s)
        item.setToolTip(f"{run.name}\nMP@1 {_fmt(s['mp@1'])}  MAP {_fmt(s['map'])}  AMNRO {_fmt(s['amnro'])}  "
                        f"GAP {_fmt(s['gap'])}\n"
                        f"{run.report.index_description}\n{run.report.queryset_description}"
                        + (f"\n⚠ {warning}" if warning else "") + (f"\n⚠ {advice}" if advice else ""))
        self.runs_list.blockSignals(True)
        item.setCheckState(Qt.CheckState.Checked)
        self.runs_list.addItem(item)
        self.runs_list.blockSignals(False)
        self._refill_baselines()
        self.select_run(run)

    def run_by_key(self, key: int | None) -> EvalRun | None:
        return next((r for r in self.runs if r.key == key), None)

    def selected_run(self) -> EvalRun | None:
        return self.run_by_key(self._selected_key)

    def _list_row(self, run: EvalRun | None) -> int:
        """The row of ``run`` in the list of runs (-1: none)."""
        items = (self.runs_list.item(i).data(Qt.ItemDataRole.UserRole) for i in range(self.runs_list.count()))
        return next((i for i, key in enumerate(items) if run is not None and key == run.key), -1)

    def select_run(self, run: EvalRun | None) -> None:
        """Show ``run`` in the plots, the per-query table and the detail view."""
        i = self._list_row(run)
        if i >= 0 and self.runs_list.currentRow() != i:
            self.runs_list.setCurrentRow(i)  # comes back here through _run_item_changed
            return
        self._selected_key = run.key if run is not None else None
        if not self.plots.live:
            self.plots.show_buffer(run.buffer if run else None, run.total if run else None)
            self.plots.set_pr(run.pr if run else None, run.colour if run else None)
        self.table_model.set_run(run.report.records if run else [], run.index if run else None)
        self.table.resizeColumnsToContents()
        self.result_grid.clear("Select a query in the table to see its top results.")
        self.query_image.clear()
        self.query_image.setText("Select a query in the table.")
        self.query_info.setText("")
        self._query_path = None
        self._refresh_overlays()
        self._update_comparison()
        self._show_verdict(run)
        self._update_buttons()

    def compared_runs(self) -> list[EvalRun]:
        """The ticked runs, in list order."""
        items = (self.runs_list.item(i) for i in range(self.runs_list.count()))
        runs = (self.run_by_key(it.data(Qt.ItemDataRole.UserRole)) for it in items
                if it.checkState() == Qt.CheckState.Checked)
        return [r for r in runs if r is not None]

    def set_run_checked(self, run: EvalRun, checked: bool) -> None:
        item = self.runs_list.item(self._list_row(run))
        if item is not None:
            item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)

    def baseline_run(self) -> EvalRun | None:
        return self.run_by_key(self.baseline_combo.currentData())

    def set_baseline(self, run: EvalRun) -> None:
        i = self.baseline_combo.findData(run.key)
        if i >= 0:
            self.baseline_combo.setCurrentIndex(i)

    def remove_selected_run(self) -> None:
        run = self.selected_run()
        if run is None:
            return
        self.runs = [r for r in self.runs if r.key != run.key]
        self._tests = {k: v for k, v in self._tests.items() if run.key not in k[:2]}
        self.runs_list.blockSignals(True)
        self.runs_list.takeItem(self._list_row(run))
        self.runs_list.blockSignals(False)
        self._refill_baselines()
        self.select_run(self.runs[-1] if self.runs else None)

    def _refill_baselines(self) -> None:
        current = self.baseline_combo.currentData()
        self.baseline_combo.blockSignals(True)
        self.baseline_combo.clear()
        for run in self.runs:
            self.baseline_combo.addItem(self._colour_icon(run.colour), run.name, run.key)
        i = self.baseline_combo.findData(current)
        self.baseline_combo.setCurrentIndex(i if i >= 0 else 0)  # the first run by default
        self.baseline_combo.blockSignals(False)

    def _colour_icon(self, colour: str) -> QIcon:
        pm = QPixmap(12, 12)
        pm.fill(QColor(colour))
        return QIcon(pm)

    def _run_item_changed(self, current: QListWidgetItem | None, _previous=None) -> None:
        self.select_run(self.run_by_key(current.data(Qt.ItemDataRole.UserRole)) if current else None)

    def _run_checked_changed(self, _item: QListWidgetItem) -> None:
        self._refresh_overlays()
        self._update_comparison()

    def _overlays(self, exclude: int | None) -> list[Overlay]:
        runs = [r for r in self.compared_runs() if r.key != exclude]
        return [Overlay(r.key, r.name, r.buffer, r.pr, r.colour, dash=n) for n, r in enumerate(runs)]

    def _refresh_overlays(self) -> None:
        if self.plots.live:
            return
        run = self.selected_run()
        self.plots.set_overlays(self._overlays(exclude=run.key if run else None),
                                main_name=run.name if run is not None else None)

    # ---- comparison -------------------------------------------------------------------------
    def _paired(self, run: EvalRun, base: EvalRun, metric: str):
        """Paired one-tailed randomization test (bootstrap p alongside) of ``run`` against ``base`` on their
        common queries."""
        from ..core.evaluation.stats import paired_test_by_query

        key = (run.key, base.key, metric)
        if key not in self._tests:
            record_key, higher = COMPARED[metric]
            self._tests[key] = paired_test_by_query(run.values_by_query(record_key), base.values_by_query(record_key),
                                                    higher)
        return self._tests[key]

    def _update_comparison(self) -> None:
        runs = self.compared_runs()
        base = self.baseline_run()
        self.comparison = []
        self.summary_table.setRowCount(len(runs))
        for r, run in enumerate(runs):
            s = run.report.summary
            row: dict[str, Any] = {"key": run.key, "name": run.name, "queries": s["queries"],
                                   "gap": s["gap"], "gap_known": s["gap_known"],
                                   "baseline": base is not None and run.key == base.key, "ci": {}, "p": {},
                                   "stars": {}, "delta": {}, "verdict": {}, "differing": {}, "bootstrap_p": {}}
            label = run.name + ("  (baseline)" if row["baseline"] else "")
            name_item = QTableWidgetItem(self._colour_icon(run.colour), label)
            name_item.setData(VALUE_ROLE, run.key)
            name_item.setToolTip(label)
            self.summary_table.setItem(r, 0, name_item)
            self.summary_table.setItem(r, 1, self._cell(f"{row['queries']:,}", row["queries"]))
            for c, metric in enumerate(COMPARED, start=2):
                mean, lo, hi = run.cis.get(metric, (math.nan, math.nan, math.nan))
                row["ci"][metric] = (mean, lo, hi)
                self.summary_table.setItem(r, c, self._cell(f"{_fmt(mean)} [{_fmt(lo)}, {_fmt(hi)}]", (mean, lo, hi)))
            gap = self._cell(f"{_fmt(s['gap'])} [{_fmt(s['gap_known'])}]", (s["gap"], s["gap_known"]))
            gap.setToolTip(GAP_TIP)
            self.summary_table.setItem(r, GAP_COLUMN, gap)
            v = run.verdict_figures
            tip = (f"{run.report.verdict.rule(run.verified)} ({v['calibration']}); {v['known_queries']} known "
                   f"and {v['unknown_queries']} unknown queries")
            for c, key in enumerate(VERDICT_FIGURES, start=VERDICT_COLUMN):
                row["verdict"][key] = v[key]
                self.summary_table.setItem(r, c, self._cell(_pct(v[key]), v[key]))
                self.summary_table.item(r, c).setToolTip(tip)
            for c, metric in enumerate(COMPARED, start=P_COLUMN):
                if base is None or row["baseline"]:
                    text, p, tip = ("baseline" if row["baseline"] else ""), None, ""
                else:
                    res = self._paired(run, base, metric)
                    if res is None:
                        text, p, tip = "—", None, "No common evaluated queries with the baseline (at least 2 needed)."
                    else:
                        p = float(res.p_value)
                        row["delta"][metric] = float(res.delta)
                        row["differing"][metric] = res.differing_queries
                        row["bootstrap_p"][metric] = res.bootstrap_p_value
                        better = "lower" if not COMPARED[metric][1] else "higher"
                        boot = res.bootstrap_p_value
                        p_text, boot_text = ((f"{x:.3f}" if x >= 0.001 else "<0.001") for x in (p, boot))
                        text = (f"{p_text} {stars(p)}".rstrip()
                                + f" ({res.differing_queries} differing; bootstrap {boot_text})")
                        how = (f"exact, all {res.n_resamples:,} sign assignments" if res.exact
                               else f"Monte Carlo, {res.n_resamples:,} random sign assignments")
                        tip = (f"Δ = {res.delta:+.3f} ({better} is better) over {res.n_queries} paired queries, "
                               f"{res.differing_queries} of them differing; one-tailed p = {p:.4f} (paired "
                               f"{res.test} test, {how}); paired bootstrap test p = {boot:.4f} (studentized, "
                               f"over all {res.n_queries} queries)")
                row["p"][metric] = p
                row["stars"][metric] = stars(p)
                item = self._cell(text, p)
                item.setToolTip(tip)
                if p is not None and stars(p):
                    f = item.font()
                    f.setBold(True)
                    item.setFont(f)
                self.summary_table.setItem(r, c, item)
            self.comparison.append(row)

    # ---- verdict --------------------------------------------------------------------------------
    def _show_verdict(self, run: EvalRun | None) -> None:
        """The verdict's figures of ``run`` against its threshold, and the re-calibration controls."""
        if run is None:
            self.verdict_plot.set_points(None)
            self.verdict_label.setText("Run an evaluation to see the verdict's figures.")
            self.candidate_label.setText("")
            return
        v, verdict = run.verdict_figures, run.report.verdict
        # a calibrated verdict's curves are those of its model refitted on these queries
        # (``verdict.operating_points``): the threshold in use is on another scale, so it is not drawn
        self.verdict_plot.set_points(run.operating_points, None if run.calibrated else verdict.threshold(run.verified),
                                     run.verified, confidence=run.calibrated)
        self.verdict_label.setText(
            f"<b>In use</b>: {html.escape(verdict.rule(run.verified))}<br><small>{html.escape(v['calibration'])}"
            f"</small><br>Unknown objects rejected: <b>{_pct(v['unknown_rejected'])}</b> of {v['unknown_queries']}"
            f"<br>Known objects wrongly rejected: <b>{_pct(v['known_rejected'])}</b> of {v['known_queries']}<br>"
            f"Accuracy: <b>{_pct(v['accuracy'])}</b> (right answer or right rejection)")
        self._show_candidate()

    def _show_candidate(self) -> None:
        """The operating point a re-calibration would store, on the plot and in words."""
        run = self.selected_run()
        if run is None or not run.report.can_recalibrate:
            self.verdict_plot.set_candidate(None)
            self.candidate_label.setText("" if run is None else "Re-calibrating needs queries of objects in the "
                                         "collection and of objects that are not (an empty ground truth).")
            return
        new, _ = run.report.recalibrated(self.max_known_spin.value() / 100)
        t = new.threshold(run.verified)
        pts = run.operating_points
        i = int(np.argmin(np.abs(pts["threshold"] - t)))
        self.verdict_plot.set_candidate(t)
        self.candidate_label.setText(
            f"→ {new.rule(run.verified)}: on these queries it rejects {_pct(pts['unknown_rejected'][i])} of the "
            f"unknown objects and wrongly {_pct(pts['known_rejected'][i])} of the known ones "
            f"(accuracy {_pct(pts['accuracy'][i])}).")

    def store_verdict(self, max_known_rejected: float | None = None) -> bool:
        """Store the selected run's re-calibrated verdict in its index (in the background).

        ``max_known_rejected``: the share of known objects that may be rejected (default: the spin box).
        """
        run = self.selected_run()
        if max_known_rejected is not None:
            self.max_known_spin.setValue(100 * max_known_rejected)
        if self.is_running() or run is None or not run.report.can_recalibrate:
            workers.show_error(self, "Store the verdict", "Select a finished run whose queries show objects in the "
                               "collection and objects that are not (an empty ground truth), with no job running.")
            return False
        index, (new, _) = run.index, run.report.recalibrated(self.max_known_spin.value() / 100)
        app = self.state.index
        # the application has the same folder open as another object: it loads the stored index again
        reload = app is not None and app is not index and app.path is not None and index.path is not None \
            and Path(app.path).resolve() == Path(index.path).resolve()
        self.progress.setRange(0, 0)
        self._start("verdict", lambda: _store_verdict_job(index, new, reload),
                    lambda reloaded: self._verdict_stored(run, new, reloaded))
        self._set_status(f"Storing the verdict ({new.rule(run.verified)}) in {index.path}…")
        return True

    def _verdict_stored(self, run: EvalRun, verdict: Verdict, reloaded: Index | None) -> None:
        self._set_status(f"Verdict stored in {run.index.path}: {self.candidate_label.text().lstrip('→ ')}")
        # The Search tab keeps a pipeline (and its verdict) per index object and settings: setting the
        # index again makes every view build its pipelines with the verdict now stored.
        if reloaded is not None:
            self.state.set_index(reloaded)
        elif self.state.index is run.index:
            self.state.set_index(run.index)
        self.verdict_stored.emit(verdict)

    def _cell(self, text: str, value: Any) -> QTableWidgetItem:
        item = QTableWidgetItem(text)
        item.setData(VALUE_ROLE, value)
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return item

    # ---- per-query detail ---------------------------------------------------------------------
    def _current_row_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if not current.isValid():
            return
        self.show_query(self.proxy.mapToSource(current).row())

    def select_query_row(self, view_row: int) -> None:
        """Select row ``view_row`` of the (sorted) table, as a click would."""
        idx = self.proxy.index(view_row, 0)
        self.table.selectionModel().setCurrentIndex(
            idx, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)

    def show_query(self, source_row: int) -> None:
        """Show the query of row ``source_row`` (model order) and its top results, marked."""
        run = self.selected_run()
        if run is None:
            return
        rec = self.table_model.record(source_row)
        k = max(1, min(self.state.settings.top_k, len(rec.ranking)))
        scores = np.zeros(len(run.index), np.float32)
        scores[rec.ranking] = rec.scores
        rows = rec.ranking[:k]
        results: list[Result] = results_for(run.index, rows, scores)
        self.result_grid.set_results(results, correct=[bool(c) for c in rec.relevance[:k]])
        self._query_path = rec.query
        self._show_query_image()
        hits = np.flatnonzero(rec.relevance)
        first = f"first correct at rank {hits[0] + 1}" if len(hits) else "no correct reference"
        rel = ", ".join(html.escape(i) for i in rec.relevant) if rec.relevant else (
            "" if rec.unknown else "(open set: not in the collection)")
        if rec.unknown:
            rel += ("; " if rel else "") + (
                f"<span style='color:#b36b00'>not in this index: {', '.join(html.escape(i) for i in rec.unknown)}"
                " (check the ground truth or the index)</span>")
        m = rec.metrics
        confidence = "" if rec.confidence is None else f"confidence {rec.confidence:.2f}; "
        excluded = ("Not averaged (no instance of its ground truth is in this index)." if rec.unknown_only else
                    "Not averaged (open-set query).")
        self.query_info.setText(
            f"<b>{html.escape(Path(rec.query).name)}</b><br>Relevant: {rel}<br>"
            + (f"{rec.n_relevant} relevant reference{'s' if rec.n_relevant != 1 else ''}, {first}<br>"
               f"P@1 {_fmt(m['p@1'])} · AP {_fmt(m['ap'])} · MNRO {_fmt(m['mnro'])}" if not rec.open_set else
               excluded)
            + f"<br>Verdict: <b>{'in' if rec.in_collection else 'not in'} the collection</b> "
              f"({confidence}{html.escape(rec.reason)})")

    def _show_query_image(self) -> None:
        if not self._query_path:
            return
        pm = ThumbnailCache.instance().get(self._query_path, QUERY_THUMB)
        if pm is None:
            self.query_image.setText("…")
        else:
            self.query_image.setPixmap(pm)

    def _thumbnail_ready(self, path: str, size: int) -> None:
        if path == self._query_path and size == QUERY_THUMB:
            self._show_query_image()

    # ---- export ---------------------------------------------------------------------------------
    def export_json(self, path: str | os.PathLike | None = None) -> Path | None:
        """Write the selected run as JSON (reports.write_json); ``None`` asks where."""
        from ..core.evaluation.reports import write_json

        return self._export("Export JSON", ".json", "JSON (*.json)", path, write_json)

    def export_csv(self, path: str | os.PathLike | None = None) -> Path | None:
        """Write the selected run's per-query CSV (reports.write_csv); ``None`` asks where."""
        from ..core.evaluation.reports import write_csv

        return self._export("Export CSV", ".csv", "CSV (*.csv)", path, write_csv)

    def _export(self, title: str, suffix: str, filter_: str, path, writer) -> Path | None:
        run = self.selected_run()
        if run is None:
            workers.show_error(self, title, "Run an evaluation first, then select it in the list of runs.")
            return None
        if path is None:
            start = Path(str(self.state.settings.value("evaluation/export_dir", "") or Path.home()))
            stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run.name.split(" · ")[0])[:60]
            name = f"evaluation-{stem}-{run.finished:%Y%m%d-%H%M%S}{suffix}"
            path, _ = QFileDialog.getSaveFileName(self, title, str(start / name), filter_)
            if not path:
                return None
        path = Path(path)
        if not path.suffix:
            path = path.with_suffix(suffix)
        try:
            writer(run.report, run.index, path)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            workers.show_error(self, title, exc)
            return None
        self.state.settings.set_value("evaluation/export_dir", str(path.parent))
        self._set_status(f"Saved {path}")
        return path

    # ---- misc -----------------------------------------------------------------------------------
    def _sweep_param_changed(self, _i: int) -> None:
        defaults = {"k": "1:5", "beta": "0:1:0.25"}
        text = self.sweep_values_edit.text().strip()
        if not text or text in defaults.values():
            self.sweep_values_edit.setText(defaults[self.sweep_param_combo.currentData()])
        self._update_icfrr_warnings()

    def shutdown(self, timeout_ms: int = 15000) -> None:
        """Cancel the running job and wait (bounded) for its thread to stop (the window is closing)."""
        self.plots.timer.stop()
        job = self._job
        if job is None or not job.running:
            return
        job.cancel()
        deadline = time.monotonic() + timeout_ms / 1000
        while job.worker.is_running and time.monotonic() < deadline:
            time.sleep(0.01)  # (PySide6 6.12's QThread.msleep drops a reference to None per call)


__all__ = ["EvaluationTab", "EvalRun"]
