"""The Evaluation tab: run a labelled query set against an index, watch the metrics, compare runs.

A view over core: the controls make a :class:`~museum_search.core.answer._pipeline.QuerySettings` (re-rankers
and their parameters, geometric verification, query regions), ``runner.evaluate`` answers every
query with the query pipeline (the answers and the "in this collection" verdict a visitor gets),
and the tab shows what comes back.

Left: the settings, which scroll when the window is short (the index, the open one or another
index folder; the query set, folder + layout, with what was detected; the pipeline settings, with
core's warning under them when ICFRR cannot help this collection, ``rerank.icfrr_advice``); then
Run / Cancel, progress and the stage in words (:data:`STATUS_LINES` lines at most, cut with … and
whole in the tooltip, so Run / Cancel and the settings' view never move while a job runs); and
the list of finished runs, their names whole (checked runs are compared; the selected run fills
the plots and the table) with its export buttons (core's ``export``: what runs the run again,
``evaluate --settings``). Right: live plots (:mod:`.widgets.plots`; the legend of the lines drawn
sits above them, outside the data) above four pages: the per-query
table with the selected query's top results, the comparison of runs (95 % bootstrap intervals,
the verdict's figures, paired two-sided tests against a baseline run, better or worse), the verdict's figures
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
from PySide6.QtCore import QEvent, QRect, Qt, QTimer, Signal
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QFileDialog,
    QGroupBox,
    QLabel,
    QPushButton,
    QSizePolicy,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.answer import QuerySettings, Verdict, icfrr_advice, operating_points
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation import (
    DESCRIBING,
    HEADLINE_METRICS,
    LAYOUTS,
    PARAMETER_NAMES,
    PRIMARY,
    EvalReport,
    EvalStep,
    PairedTestResult,
    QuerySet,
    QuerySetSource,
    RunSpec,
    SweepPoint,
    SweepStep,
    confidence_intervals,
    load_queryset,
    paired_tests,
    parse_values,
    run_name,
    run_spec,
    sweep_advice,
    unknown_instances_warning,
    values_by_query,
    write_run_csv,
    write_run_json,
)
from museum_search.core.index import Index
from museum_search.core.memory import compact_reports
from museum_search.core.progress import Progress, time_left, wait
from museum_search.gui import upgrade, workers
from museum_search.gui.collection_tab import format_duration, time_left_text
from museum_search.gui.state import AppState
from museum_search.gui.widgets.comparison_table import ComparisonPage
from museum_search.gui.widgets.comparison_table import pct as _pct
from museum_search.gui.widgets.layout import FitScroll, vertical_scroll, with_legend
from museum_search.gui.widgets.layout import row as _row
from museum_search.gui.widgets.layout import split as _split
from museum_search.gui.widgets.plots import EvaluationPlots, Overlay, RunningBuffer, run_colour
from museum_search.gui.widgets.progress_panel import ProgressPanel
from museum_search.gui.widgets.query_page import QueryPage
from museum_search.gui.widgets.queryset_box import QuerySetBox
from museum_search.gui.widgets.rerank_controls import RerankControls
from museum_search.gui.widgets.run_list import RunList
from museum_search.gui.widgets.sweep_page import SweepPage, warning_label
from museum_search.gui.widgets.verdict_page import VerdictPage

log = logging.getLogger(__name__)

JOB_TITLES = {"evaluation": "Evaluation", "sweep": "ICFRR sweep", "verdict": "Storing the verdict"}
BATCH_SIZE = 8
#: Lines of the status under the progress bar (a longer status is cut with …, whole in its tooltip).
STATUS_LINES = 4
NO_INDEX = "No index. Open or build one in the Collection tab, or browse to an index folder."


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
    #: what an export needs to run it again: the index, the query set, every setting (core's
    #: ``export.run_spec``; None for a run made by hand)
    spec: RunSpec | None = None
    finished: datetime = field(default_factory=datetime.now)

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


#: The query set loaded last (its folder, layout and expression), loaded again at the next start.
QUERYSET_SETTING = "evaluation/queryset_dir"
QUERYSET_LAYOUT_SETTING = "evaluation/queryset_layout"
QUERYSET_REGEX_SETTING = "evaluation/queryset_regex"

#: The stage after the answers (``Progress.stage``).
SUMMARIZING = "computing the confidence intervals"


def _evaluation_job(index: Index, queryset: QuerySet, settings: QuerySettings,
                    batch_size: int = BATCH_SIZE) -> Generator[Any, None, _EvalResult]:
    """Background job: evaluate with the query pipeline, then intervals and PR."""
    from museum_search.core.evaluation import evaluate, precision_recall_curve

    report = yield from evaluate(index, queryset, settings, batch_size=batch_size)
    t0 = time.perf_counter()
    cis, pr = yield from wait(lambda: (confidence_intervals(report, index), precision_recall_curve(report)),
                              lambda: Progress(0, 0, stage=SUMMARIZING, elapsed=time.perf_counter() - t0))
    return _EvalResult(report, cis, pr)


def _sweep_job(index: Index, queryset: QuerySet, parameter: str, values: list[float],
               settings: QuerySettings, batch_size: int = BATCH_SIZE) -> Generator[Any, None, list[SweepPoint]]:
    from museum_search.core.evaluation import sweep

    return (yield from sweep(index, queryset, parameter, values, settings.options, batch_size=batch_size,
                             settings=settings))


def headline(summary: dict, sep: str) -> str:
    """A run's headline figures (core's ``HEADLINE_METRICS``) joined by ``sep``, e.g.
    "MP@1 0.967, MAP 0.975, AMNRO 0.028, GAP 0.997"."""
    return sep.join(f"{m.label} {m.text(summary[key])}" for key, m in HEADLINE_METRICS.items())


def fit_lines(text: str, fm: QFontMetrics, width: int, lines: int) -> str:
    """``text`` as it fits ``lines`` lines of ``width`` px word-wrapped (as a label wraps it): whole
    when it fits, else its longest beginning that fits with "…" after it."""
    flags = int(Qt.TextFlag.TextWordWrap)
    room = lines * fm.lineSpacing()

    def fits(t: str) -> bool:
        return fm.boundingRect(QRect(0, 0, width, 100_000), flags, t).height() <= room

    if fits(text):
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # the longest beginning that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if fits(text[:mid].rstrip() + "…"):
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].rstrip() + "…"


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
    if p.done < p.total and time_left(p) is not None:
        text += f" ({time_left_text(p)})"
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
        self._tests: dict[tuple[int, int], dict[str, PairedTestResult | None]] = {}
        self._run_status: dict[int, str] = {}  # what the status said when each run finished
        self.batch_size = BATCH_SIZE  # queries described at once
        self._build_ui()
        state.index_changed.connect(self.set_index)
        self.set_index(state.index)
        self._restore_queryset()

    def _restore_queryset(self) -> None:
        """The query set of the last session (its folder, layout and expression), if it is still there."""
        settings = self.state.settings
        path = str(settings.value(QUERYSET_SETTING, "") or "")
        if not path or not Path(path).exists():
            return
        layout = str(settings.value(QUERYSET_LAYOUT_SETTING, "") or "") or None
        regex = str(settings.value(QUERYSET_REGEX_SETTING, "") or "") or None
        self.load_queryset_path(path, layout if layout in LAYOUTS else None, regex)

    # ---- UI ------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.queryset_box = QuerySetBox()
        self.queryset_box.browse_button.clicked.connect(self._browse_queryset)
        self.queryset_box.reload_requested.connect(self._reload_queryset)
        self.rerank = RerankControls(single=False)
        self.rerank.choice_changed.connect(self._update_icfrr_warnings)
        self.rerank.params_changed.connect(self._update_icfrr_warnings)
        # core's warning when ICFRR cannot help this collection (shown while ICFRR is ticked, above Run)
        self.icfrr_warning = warning_label("icfrrWarning")
        self.run_button = QPushButton("Run evaluation")
        self.run_button.setObjectName("runEvaluation")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.run_evaluation)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelEvaluation")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.progress_panel = ProgressPanel(_row((self.run_button, 1), self.cancel_button), "evalProgress",
                                            "evalStatus")
        self.progress_panel.bar.setFormat("")  # idle
        # the status keeps its height (STATUS_LINES lines, longer texts cut with … and whole in the
        # tooltip), so Run / Cancel above it and the settings never move while a job runs
        self._status_text = ""
        status = self.progress_panel.status_label
        status.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        status.setFixedHeight(STATUS_LINES * status.fontMetrics().lineSpacing() + 2)
        status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        status.installEventFilter(self)
        self.run_list = RunList()
        self.run_list.current_changed.connect(lambda key: self.select_run(self.run_by_key(key)))
        self.run_list.checked_changed.connect(self._run_checked_changed)
        self.run_list.remove_button.clicked.connect(self.remove_selected_run)
        self.run_list.export_json_button.clicked.connect(lambda: self.export_json())
        self.run_list.export_csv_button.clicked.connect(lambda: self.export_csv())
        self.plots = EvaluationPlots()
        self.plots.setObjectName("evalPlots")
        self.plots.setMinimumHeight(240)
        self.queries = QueryPage(lambda: self.state.settings.top_k)
        self.compare = ComparisonPage()
        self.compare.baseline_changed.connect(self._update_comparison)
        self.verdict_page = VerdictPage()
        self.verdict_page.store_clicked.connect(lambda: self.store_verdict())
        self.sweep = SweepPage()
        self.sweep.parameter_changed.connect(lambda _p: self._update_icfrr_warnings())
        self.sweep.run_button.clicked.connect(lambda: self.run_sweep())
        self.sweep.cancel_button.clicked.connect(self.cancel)
        self.pages = QTabWidget()
        self.pages.setObjectName("evalPages")
        for page, title in ((self.queries, "Queries"), (self.compare, "Compare runs"),
                            (self.verdict_page, "Verdict"), (self.sweep, "ICFRR sweep")):
            self.pages.addTab(page, title)
        left_column = self._left_column()
        plots_box = with_legend(self.plots)
        self.right_splitter = _split(Qt.Orientation.Vertical, (plots_box, 2, 330), (self.pages, 3, 470))
        self.splitter = _split(Qt.Orientation.Horizontal, (left_column, 0, left_column.minimumWidth()),
                               (self.right_splitter, 1, 1200))
        lay = QVBoxLayout(self)
        lay.addWidget(self.splitter)
        self._update_buttons()

    def _index_box(self) -> QGroupBox:
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
        box = QGroupBox("Index")
        il = QVBoxLayout(box)
        il.addWidget(self.index_label)
        il.addLayout(_row(self.use_open_index_button, self.browse_index_button, None))
        return box

    def _left_column(self) -> QWidget:
        """The settings (they scroll), then Run / Cancel, the progress and the runs, always in view."""
        rr_box = QGroupBox("Re-ranking and verification")
        rr_box.setToolTip("Re-rankers in the order they are applied (none when nothing is ticked), then geometric "
                          "verification of the top results")
        QVBoxLayout(rr_box).addWidget(self.rerank)
        left = QWidget()
        left.setObjectName("evalControls")
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 6, 0)
        # the ICFRR warning is one of the settings (under them): showing it never shrinks their view
        for box in (self._index_box(), self.queryset_box, rr_box, self.icfrr_warning):
            ll.addWidget(box)
        ll.addStretch(1)
        scroll = vertical_scroll(left, "evalControlsScroll", FitScroll())
        column = QWidget()
        column.setObjectName("evalLeft")
        lc = QVBoxLayout(column)
        lc.setContentsMargins(0, 0, 0, 0)
        lc.addWidget(scroll, 3)  # the settings take three quarters of what is left, the runs the rest
        lc.addWidget(self.progress_panel)
        lc.addWidget(self.run_list, 1)
        self.controls_scroll = scroll
        column.setMinimumWidth(max(left.sizeHint().width(), self.run_list.sizeHint().width()) + 16)
        return column

    def icfrr_advice(self) -> str | None:
        """Core's warning for the evaluation the controls describe (None: ICFRR not ticked, or it can help)."""
        if self.index is None or "icfrr" not in self.rerank.names():
            return None
        return icfrr_advice(self.index.labels, self.rerank.options())

    def sweep_advice(self) -> str | None:
        """Core's warning for the sweep the controls describe (a sweep always runs ICFRR)."""
        if self.index is None:
            return None
        return sweep_advice(self.index.labels, self.sweep.parameter(), self.rerank.options())

    def _update_icfrr_warnings(self) -> None:
        advice = self.icfrr_advice()
        shown = self.icfrr_warning.isVisibleTo(self)
        self.icfrr_warning.setText(f"⚠ {advice}" if advice else "")
        self.icfrr_warning.setVisible(bool(advice))
        if advice and not shown:  # it just appeared under the settings: scroll it into view
            QTimer.singleShot(0, lambda: self.controls_scroll.ensureWidgetVisible(self.icfrr_warning, 0, 0))
        self.sweep.set_warning(self.sweep_advice())

    # ---- index and query set ----------------------------------------------------------------
    def set_index(self, index: Index | None) -> None:
        """Evaluate ``index`` (the open index follows the application's by default)."""
        self.index = index
        self.rerank.search_mode.set_index(index)
        if index is None:
            self.index_label.setText(NO_INDEX)
            self.index_label.setToolTip("")
        else:
            where = str(index.path) if index.path else str(index.root)
            self.index_label.setText(f"<b>{len(index):,}</b> references of <b>{len(index.instances):,}</b> "
                                     f"instances — {html.escape(index.meta.summary())}")
            self.index_label.setToolTip(f"{index.summary()}\n{where}")
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
        """Load the labelled queries at ``path`` with ``layout`` (default: the box's)."""
        box = self.queryset_box
        if layout is not None and not box.set_layout_name(layout):
            workers.show_error(self, "Query set", f"Unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}.")
            return False
        if regex is not None:
            box.regex_edit.setText(regex)
        layout = box.layout_name()
        path = str(path).strip()
        box.path_edit.setText(path)
        if not path:
            return False
        try:
            rx = box.regex()
            if layout == "regex" and rx is None:
                raise MuseumSearchError("Enter a regular expression with a group named 'instance'.")
            qs = load_queryset(path, layout, regex=rx if layout == "regex" else None)
        except Exception as exc:
            self.queryset = None
            self.queryset_path = None
            box.detected_label.setText("No query set.")
            workers.show_error(self, "Cannot load the query set", exc)
            self._update_buttons()
            return False
        self.queryset = qs
        self.queryset_path = path
        self.state.settings.set_value(QUERYSET_SETTING, path)
        self.state.settings.set_value(QUERYSET_LAYOUT_SETTING, layout)
        self.state.settings.set_value(QUERYSET_REGEX_SETTING, box.regex_edit.text() if layout == "regex" else "")
        self._update_detected()
        self._update_buttons()
        return True

    def _update_detected(self) -> None:
        if self.queryset is None:
            return
        text = f"Detected: {html.escape(self.queryset.summary())}"
        if self.index is not None:
            note = self.queryset.unknown_instances_note(self.index.instances)
            if note:
                text += f"<br><span style='color:#b36b00'>⚠ {html.escape(note)}.</span>"
        self.queryset_box.detected_label.setText(text)

    def _browse_queryset(self) -> None:
        start = (self.queryset_box.path_edit.text()
                 or str(self.state.settings.value(QUERYSET_SETTING, "") or ""))
        path = QFileDialog.getExistingDirectory(self, "Folder of labelled query photos", start)
        if path:
            self.load_queryset_path(path)

    def _reload_queryset(self) -> None:
        if self.queryset_box.path_edit.text().strip():
            self.load_queryset_path(self.queryset_box.path_edit.text())

    def queryset_source(self) -> QuerySetSource:
        """Where the loaded query set comes from (its folder, layout and expression), for exports."""
        box = self.queryset_box
        layout = box.layout_name()
        return QuerySetSource(str(Path(self.queryset_path or "").resolve()), layout,
                              box.regex() if layout == "regex" else None)

    # ---- query pipeline settings ----------------------------------------------------------
    def query_settings(self) -> QuerySettings:
        """The query pipeline's settings the controls describe (the index's own verdict), on the
        session's inference engine."""
        return QuerySettings(regions=self.queryset_box.regions_check.isChecked(), rerank=self.rerank.names(),
                             options=self.rerank.options(), verify=self.rerank.verify(),
                             verify_top=self.rerank.verify_top(), search=self.rerank.search_mode.mode(),
                             engine=self.state.engine)

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
        source = self.queryset_source()
        total = len(queryset.queries)
        self.plots.start_live(total)
        self.plots.set_pr(None, run_colour(self._next_key - 1))  # the colour this run will have
        self.plots.set_overlays(self._overlays(exclude=None), main_name="this run")
        self.progress_panel.set_busy()
        self.progress_panel.bar.setFormat("%v / %m queries")
        self._start("evaluation", _evaluation_job(index, queryset, settings, self.batch_size),
                    lambda res: self._evaluation_done(res, index, settings, total, queryset, source))
        self._set_status(f"Evaluating {total:,} queries: {settings.label()}")
        self._update_icfrr_warnings()  # stays shown while the run goes on
        return True

    def run_sweep(self, parameter: str | None = None, values: Sequence[float] | str | None = None) -> bool:
        """Start an ICFRR sweep of ``parameter`` ("k" or "beta") over ``values`` (default: the controls)."""
        if parameter is not None:
            self.sweep.set_parameter(parameter)
        if values is not None:
            self.sweep.values_edit.setText(values if isinstance(values, str) else ", ".join(f"{v:g}" for v in values))
        if not self._check_inputs("ICFRR sweep"):
            return False
        parameter = self.sweep.parameter()
        try:
            vals = parse_values(self.sweep.values_edit.text(), parameter)
        except MuseumSearchError as exc:
            workers.show_error(self, "ICFRR sweep", exc)
            return False
        label = PARAMETER_NAMES[parameter]
        self._sweep_label = label
        self.sweep_points = []
        self.sweep.start(label, integer=parameter == "k")
        self.pages.setCurrentWidget(self.sweep)
        self.progress_panel.set_busy()
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
            self.sweep.add_row(item.value, item.summary)
        if item.total > 0 and self._job_kind == "sweep":
            self.progress_panel.bar.setFormat("%v / %m queries described" if item.stage == DESCRIBING
                                              else "%v / %m answers")
        # (a step of unknown length leaves the bar as it is: busy from the start)
        self.progress_panel.set_step(item.done, item.total)
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
            done, total = self.progress_panel.bar.value(), max(0, self.progress_panel.bar.maximum())
            last = self._last_progress
            self._set_status(f"{JOB_TITLES[self._job_kind]} cancelled after {done:,} of {total:,}." if total else
                             f"{JOB_TITLES[self._job_kind]} cancelled"
                             + (f" while {last.stage}." if last is not None and last.total <= 0 else "."))
            if self._job_kind == "sweep":
                self.sweep.status.setText(self.status_text())
        run = self.selected_run()
        if self._job_kind == "evaluation" and not self._job_produced and run is not None:
            # back to the selected run's plots (the partial curves are dropped); the table and the
            # other pages still show it
            self.plots.show_buffer(run.buffer, run.total)
            self.plots.set_pr(run.pr, run.colour)
            self._refresh_overlays()
        self.progress_panel.stop_busy()
        self._update_buttons()
        self.job_finished.emit()

    def _evaluation_done(self, res: _EvalResult, index: Index, settings: QuerySettings, total: int,
                         queryset: QuerySet, source: QuerySetSource) -> None:
        self.plots.stop_live()
        key = self._next_key
        self._next_key += 1
        name = run_name(settings, source.name, datetime.now())  # query set · changed settings · time
        spec = run_spec(res.report, index, source, queryset, name=name, batch_size=self.batch_size)
        run = EvalRun(key, name, res.report, index, settings, self.plots.buffer.copy(), res.pr, res.cis,
                      run_colour(key - 1), total, spec)
        s, v = res.report.summary, run.verdict_figures
        took = time.perf_counter() - self._job_started
        skipped = f", {s['skipped_queries']} unreadable" if s.get("skipped_queries") else ""
        open_set = f", {s['open_set_queries']} open-set not averaged" if s.get("open_set_queries") else ""
        warning = unknown_instances_warning(s)
        # (the ICFRR advice is not repeated here: it stays shown under the settings, and on the run)
        warning = f"\n⚠ {warning}." if warning else ""
        self._run_status[key] = (f"Done in {format_duration(took)}: {headline(s, ', ')} over {s['queries']:,} queries"
                                 f"{open_set}{skipped}. Verdict: unknown rejected {_pct(v['unknown_rejected'])}, "
                                 f"known rejected {_pct(v['known_rejected'])}, accuracy {_pct(v['accuracy'])}."
                                 f"{warning}")
        self._set_status(self._run_status[key])
        self.add_run(run)
        self.run_finished.emit(run)

    def _sweep_done(self, points: list[SweepPoint]) -> None:
        self.sweep_points = list(points)
        if points:
            m = PRIMARY  # the sweep's best value: by MAP
            best = max(points, key=lambda p: (p.summary[m.key] if math.isfinite(p.summary[m.key]) else -1))
            text = f"Sweep done: best {m.label} {m.text(best.summary[m.key])} at {self._sweep_label} = {best.value:g}."
            # (core's ICFRR warning is not repeated: the sweep's page shows it above its results)
            self._set_status(text)
            self.sweep.status.setText(text)
        self.sweep_finished.emit(self.sweep_points)

    def _set_status(self, text: str) -> None:
        self._status_text = text
        self._fit_status()
        if self._job_kind == "sweep" and self._job is not None:  # the sweep's own page says it too
            self.sweep.status.setText(text)

    def status_text(self) -> str:
        """The status in full (the line under the progress bar may show it cut, with …)."""
        return self._status_text

    def _fit_status(self) -> None:
        label = self.progress_panel.status_label
        width = label.contentsRect().width()
        label.setText(fit_lines(self._status_text, label.fontMetrics(), width, STATUS_LINES) if width > 20
                      else self._status_text)
        label.setToolTip(self._status_text if label.text() != self._status_text else "")

    def eventFilter(self, obj, event) -> bool:
        if obj is self.progress_panel.status_label and event.type() == QEvent.Type.Resize:
            self._fit_status()
        return super().eventFilter(obj, event)

    def _update_buttons(self) -> None:
        busy = self.is_running()
        ready = self.index is not None and self.queryset is not None
        self.run_button.setEnabled(not busy and ready)
        self.sweep.run_button.setEnabled(not busy and ready)
        self.cancel_button.setEnabled(busy and self._job_kind != "verdict")
        self.sweep.cancel_button.setEnabled(busy and self._job_kind == "sweep")
        run = self.selected_run()
        self.verdict_page.set_enabled(not busy and run is not None and run.report.can_recalibrate)
        for w in (self.use_open_index_button, self.browse_index_button, self.sweep.param_combo,
                  self.sweep.values_edit):
            w.setEnabled(not busy)
        self.queryset_box.set_busy(busy)
        self.run_list.set_actions_enabled(run is not None and not busy)

    # ---- runs ---------------------------------------------------------------------------------
    def add_run(self, run: EvalRun) -> None:
        """Keep ``run`` (ticked for comparison) and select it."""
        self.runs.append(run)
        compact_reports([r.report for r in self.runs])  # older runs keep the top ranks (core.memory)
        s = run.report.summary
        advice = s.get("icfrr_advice")
        warning = unknown_instances_warning(s)
        tooltip = (f"{run.name}\n{run.settings.label()}\n{headline(s, '  ')}\n"
                   f"{run.report.index_description}\n{run.report.queryset_description}"
                   + (f"\n⚠ {warning}" if warning else "") + (f"\n⚠ {advice}" if advice else ""))
        self.run_list.add(run.key, run.colour, ("⚠ " if advice else "") + run.name, tooltip)
        self.compare.set_runs(self.runs)
        self.select_run(run)

    def run_by_key(self, key: int | None) -> EvalRun | None:
        return next((r for r in self.runs if r.key == key), None)

    def selected_run(self) -> EvalRun | None:
        return self.run_by_key(self._selected_key)

    def select_run(self, run: EvalRun | None) -> None:
        """Show ``run`` in the plots, the per-query table and the detail view."""
        if self.run_list.select(run.key if run is not None else None):
            return  # the list's current_changed came back here
        self._selected_key = run.key if run is not None else None
        if not self.plots.live:
            self.plots.show_buffer(run.buffer if run else None, run.total if run else None)
            self.plots.set_pr(run.pr if run else None, run.colour if run else None)
        self.queries.set_run(run)
        self._refresh_overlays()
        self._update_comparison()
        self.verdict_page.show_run(run)
        if not self.is_running():  # the status is the selected run's, never another's
            self._set_status("" if run is None else f"{run.name}: " + self._run_status.get(
                run.key, f"{headline(run.report.summary, ', ')} over {run.report.summary['queries']:,} queries."))
        self._update_buttons()

    def compared_runs(self) -> list[EvalRun]:
        """The ticked runs, in list order."""
        runs = (self.run_by_key(key) for key in self.run_list.checked_keys())
        return [r for r in runs if r is not None]

    def baseline_run(self) -> EvalRun | None:
        return self.run_by_key(self.compare.baseline_key())

    def remove_selected_run(self) -> None:
        run = self.selected_run()
        if run is None:
            return
        self.runs = [r for r in self.runs if r.key != run.key]
        self._tests = {k: v for k, v in self._tests.items() if run.key not in k}
        self.run_list.remove(run.key)
        self.compare.set_runs(self.runs)
        self.select_run(self.runs[-1] if self.runs else None)

    def _run_checked_changed(self) -> None:
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
    def _paired(self, run: EvalRun, base: EvalRun) -> dict[str, PairedTestResult | None]:
        """Core's paired two-sided tests of ``run`` against ``base`` on their common queries (kept)."""
        key = (run.key, base.key)
        if key not in self._tests:
            self._tests[key] = paired_tests(values_by_query(run.report), values_by_query(base.report))
        return self._tests[key]

    def _update_comparison(self) -> None:
        self.comparison = self.compare.fill(self.compared_runs(), self.baseline_run(), self._paired)

    # ---- verdict --------------------------------------------------------------------------------
    def store_verdict(self, max_known_rejected: float | None = None) -> bool:
        """Store the selected run's re-calibrated verdict in its index (in the background).

        ``max_known_rejected``: the share of known objects that may be rejected (default: the spin box).
        """
        run = self.selected_run()
        if max_known_rejected is not None:
            self.verdict_page.set_max_known_rejected(max_known_rejected)
        if self.is_running() or run is None or not run.report.can_recalibrate:
            workers.show_error(self, "Store the verdict", "Select a finished run whose queries show objects in the "
                               "collection and objects that are not (an empty ground truth), with no job running.")
            return False
        index, (new, _) = run.index, run.report.recalibrated(self.verdict_page.max_known_rejected())
        app = self.state.index
        # the application has the same folder open as another object: it loads the stored index again
        reload = app is not None and app is not index and app.path is not None and index.path is not None \
            and Path(app.path).resolve() == Path(index.path).resolve()
        self.progress_panel.set_busy()
        self._start("verdict", lambda: _store_verdict_job(index, new, reload),
                    lambda reloaded: self._verdict_stored(run, new, reloaded))
        self._set_status(f"Storing the verdict ({new.rule(run.verified)}) in {index.path}…")
        return True

    def _verdict_stored(self, run: EvalRun, verdict: Verdict, reloaded: Index | None) -> None:
        candidate = self.verdict_page.candidate_label.text().lstrip("→ ")
        self._set_status(f"Verdict stored in {run.index.path}: {candidate}")
        # The Search tab keeps a pipeline (and its verdict) per index object and settings: setting the
        # index again makes every view build its pipelines with the verdict now stored.
        if reloaded is not None:
            self.state.set_index(reloaded)
        elif self.state.index is run.index:
            self.state.set_index(run.index)
        self.verdict_stored.emit(verdict)

    # ---- export ---------------------------------------------------------------------------------
    def export_json(self, path: str | os.PathLike | None = None) -> Path | None:
        """Write the selected run as JSON, with what runs it again (core's ``export.write_run_json``,
        as ``evaluate --json``); ``None`` asks where."""
        return self._export("Export JSON", ".json", "JSON (*.json)", path, write_run_json)

    def export_csv(self, path: str | os.PathLike | None = None) -> Path | None:
        """Write the selected run's per-query CSV with its settings (``export.write_run_csv``, as
        ``evaluate --csv``); ``None`` asks where."""
        return self._export("Export CSV", ".csv", "CSV (*.csv)", path, write_run_csv)

    def _export(self, title: str, suffix: str, filter_: str, path, writer) -> Path | None:
        run = self.selected_run()
        if run is None:
            workers.show_error(self, title, "Run an evaluation first, then select it in the list of runs.")
            return None
        if path is None:
            start = Path(str(self.state.settings.value("evaluation/export_dir", "") or Path.home()))
            stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run.name.rsplit(" · ", 1)[0])[:60]
            name = f"evaluation-{stem}-{run.finished:%Y%m%d-%H%M%S}{suffix}"
            path, _ = QFileDialog.getSaveFileName(self, title, str(start / name), filter_)
            if not path:
                return None
        path = Path(path)
        if not path.suffix:
            path = path.with_suffix(suffix)
        try:
            if run.spec is None:
                raise MuseumSearchError("this run has no settings to export (it was not made by an evaluation)")
            writer(path, run.report, run.index, run.spec)
        except Exception as exc:
            workers.show_error(self, title, exc)
            return None
        self.state.settings.set_value("evaluation/export_dir", str(path.parent))
        self._set_status(f"Saved {path}")
        return path

    # ---- misc -----------------------------------------------------------------------------------
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
