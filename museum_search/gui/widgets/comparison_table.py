"""The Evaluation tab's comparison of runs: a baseline run, and one row per compared run with its
means and 95 % bootstrap intervals, GAP, the verdict's figures and the paired two-sided tests
against the baseline with their direction, better or worse (computed by core: ``reports.paired_tests``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.evaluation import COMPARED, HEADLINE_METRICS, Metric, PairedTestResult, format_p, stars
from museum_search.gui.widgets.layout import row
from museum_search.gui.widgets.run_list import colour_icon, name_lines

#: The verdict's figures (keys of ``summary["verdict"]``) in the comparison table.
VERDICT_FIGURES = {"unknown_rejected": "Unknown\nrejected", "known_rejected": "Known\nrejected",
                   "accuracy": "Accuracy"}
#: Columns: run, queries, core's headline figures (``HEADLINE_METRICS``: the means of :data:`COMPARED`
#: with their intervals, GAP with its value over the known queries), the verdict's figures, then the
#: paired tests of :data:`COMPARED`.
METRIC_COLUMN = 2  # the first headline figure
VERDICT_COLUMN = METRIC_COLUMN + len(HEADLINE_METRICS)  # the first of VERDICT_FIGURES
P_COLUMN = VERDICT_COLUMN + len(VERDICT_FIGURES)  # the first paired test (of COMPARED's first metric)
VALUE_ROLE = Qt.ItemDataRole.UserRole + 1  # numbers behind a cell
#: A significant difference's colour: a drop in the warning colour, a gain in green.
DIRECTION_COLOURS = {"worse": "#c62828", "better": "#2e7d32"}
#: The run column's width bounds (px): the name's longest line (query set; settings and time), wrapped above.
NAME_WIDTH = (140, 320)
NOTE = ("Intervals: 95 % percentile bootstrap over queries. GAP: Global Average Precision over "
        "all queries sorted by confidence (in brackets, over the known queries only). "
        "Verdict (“in this collection”): "
        "unknown objects rejected, known objects wrongly rejected, accuracy (right answer or right "
        "rejection); n/a without such queries. p: the run is better or worse than the baseline (for "
        + " and ".join(m.label for m in COMPARED.values() if not m.higher_is_better)
        + ", lower is better), with the p of the paired two-sided randomization test, exact up "
        "to 20 differing queries; below, the number of queries that differ (the only ones it uses) "
        "and the paired bootstrap test's p, which is too small when few queries differ; "
        "* p ≤ 0.05, ** p ≤ 0.01, *** p ≤ 0.001 (randomization p); a significant drop in red, "
        "a significant gain in green.")
NO_COMMON = "No common evaluated queries with the baseline (at least 2 needed)."


def pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"


def cell(text: str, value: Any) -> QTableWidgetItem:
    """A right-aligned cell with the numbers behind it (:data:`VALUE_ROLE`)."""
    item = QTableWidgetItem(text)
    item.setData(VALUE_ROLE, value)
    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def p_text(metric: str, res: PairedTestResult) -> tuple[str, str]:
    """A paired test in the cell (direction, p, stars; below, differing queries and bootstrap p) and in
    its tooltip, e.g. "worse, p = 0.0005 ***" over "12 differ" over "bootstrap < 0.0001"."""
    p, boot = float(res.p_value), res.bootstrap_p_value
    better = COMPARED[metric].better
    text = (f"{res.direction}, p = {format_p(p)} {stars(p)}".rstrip()
            + f"\n{res.differing_queries} differ\nbootstrap {format_p(boot)}")  # narrow: every column in view
    how = (f"exact, all {res.n_resamples:,} sign assignments" if res.exact
           else f"Monte Carlo, {res.n_resamples:,} random sign assignments")
    tip = (f"{res.direction.capitalize()} than the baseline: {res.run_mean:.3f} vs {res.baseline_mean:.3f}, "
           f"Δ = {res.delta:+.3f} ({better} is better) over {res.n_queries} paired queries, "
           f"{res.differing_queries} of them differing; {res.alternative} p = {p:.4f} (paired "
           f"{res.test} test, {how}); paired bootstrap test p = {format_p(boot)} (studentized, "
           f"{res.alternative}, over all {res.n_queries} queries)")
    return text, tip


class ComparisonPage(QWidget):
    """The baseline choice above the table (``summaryTable``) and its note."""

    #: another baseline was chosen
    baseline_changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.baseline_combo = QComboBox()
        self.baseline_combo.setObjectName("baselineCombo")
        self.baseline_combo.setToolTip("The run every other run is tested against")
        self.baseline_combo.currentIndexChanged.connect(lambda _i: self.baseline_changed.emit())
        self.table = QTableWidget(0, P_COLUMN + len(COMPARED))
        self.table.setObjectName("summaryTable")
        self.table.setHorizontalHeaderLabels(
            ["Run", "Queries",
             *(f"{m.label}\n[{'95% CI' if m.compared else m.companion_label}]" for m in HEADLINE_METRICS.values()),
             *VERDICT_FIGURES.values(), *(f"p {m.label}" for m in COMPARED.values())])
        for c, m in enumerate(HEADLINE_METRICS.values(), start=METRIC_COLUMN):
            if m.tip:
                self.table.horizontalHeaderItem(c).setToolTip(m.tip)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()
        sh = self.table.horizontalHeader()
        sh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # the name is never cut: a column as wide as its longest line (within NAME_WIDTH), wrapped
        # above that, the rows as high as their text; in full in the tooltip
        sh.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.table.setWordWrap(True)
        self.table.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.table.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        note = QLabel(NOTE)
        note.setWordWrap(True)
        lay = QVBoxLayout(self)
        lay.addLayout(row("Baseline:", (self.baseline_combo, 1)))
        lay.addWidget(self.table, 1)
        lay.addWidget(note)

    # ---- baseline -------------------------------------------------------------------------
    def set_runs(self, runs: Sequence) -> None:
        """The runs one can choose as the baseline (the current one is kept, else the first)."""
        current = self.baseline_combo.currentData()
        self.baseline_combo.blockSignals(True)
        self.baseline_combo.clear()
        for run in runs:
            self.baseline_combo.addItem(colour_icon(run.colour), run.name, run.key)
        i = self.baseline_combo.findData(current)
        self.baseline_combo.setCurrentIndex(i if i >= 0 else 0)
        self.baseline_combo.blockSignals(False)

    def baseline_key(self) -> int | None:
        return self.baseline_combo.currentData()

    def set_baseline_key(self, key: int) -> None:
        i = self.baseline_combo.findData(key)
        if i >= 0:
            self.baseline_combo.setCurrentIndex(i)

    # ---- the table ------------------------------------------------------------------------
    def fill(self, runs: Sequence, base, tests: Callable[[Any, Any], dict[str, PairedTestResult | None]]
             ) -> list[dict[str, Any]]:
        """One row per run of ``runs`` (``EvalRun``), tested against ``base`` with ``tests(run, base)``
        (:func:`museum_search.core.evaluation._reports.paired_tests`); returns the rows' figures."""
        self.table.setRowCount(len(runs))
        rows = [self._fill_row(r, run, base, tests) for r, run in enumerate(runs)]
        self._fit_name_column()
        return rows

    def _fit_name_column(self) -> None:
        """The run column as wide as its longest line (icon and margins included), within NAME_WIDTH."""
        fm = self.table.fontMetrics()
        lines = [it.text().split("\n") for it in (self.table.item(r, 0) for r in range(self.table.rowCount()))
                 if it is not None]
        longest = max((fm.horizontalAdvance(line) for name in lines for line in name), default=0)
        heads = max((fm.horizontalAdvance(name[0]) for name in lines), default=0)  # a first line is never wrapped
        header = fm.horizontalAdvance(self.table.horizontalHeaderItem(0).text())
        icon = self.table.iconSize().width() if self.table.iconSize().isValid() else 16
        # no wider than the room the figures leave: every column in view, no horizontal scroll bar
        others = sum(self.table.columnWidth(c) for c in range(1, self.table.columnCount()))
        room = self.table.viewport().width() - others
        self.table.setColumnWidth(0, max(NAME_WIDTH[0], heads + icon + 24,
                                         min(NAME_WIDTH[1], room, max(longest, header) + icon + 24)))
        self.table.resizeRowsToContents()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._fit_name_column()

    def _fill_row(self, r: int, run, base, tests) -> dict[str, Any]:
        s = run.report.summary
        out: dict[str, Any] = {"key": run.key, "name": run.name, "queries": s["queries"],
                               **{k: s[k] for m in HEADLINE_METRICS.values() if not m.compared
                                  for k in (m.key, m.companion) if k},  # GAP and GAP over the known queries
                               "baseline": base is not None and run.key == base.key, "ci": {}, "p": {},
                               "stars": {}, "delta": {}, "verdict": {}, "differing": {}, "bootstrap_p": {},
                               "direction": {}}
        suffix = "  (baseline)" if out["baseline"] else ""
        name_item = QTableWidgetItem(colour_icon(run.colour), name_lines(run.name) + suffix)
        name_item.setData(VALUE_ROLE, run.key)
        name_item.setToolTip(run.name + suffix + f"\n{run.settings.label()}")
        self.table.setItem(r, 0, name_item)
        self.table.setItem(r, 1, cell(f"{out['queries']:,}", out["queries"]))
        for c, m in enumerate(HEADLINE_METRICS.values(), start=METRIC_COLUMN):
            self.table.setItem(r, c, self._metric_cell(out, s, run, m))
        v = run.verdict_figures
        tip = (f"{run.report.verdict.rule(run.verified)} ({v['calibration']}); {v['known_queries']} known "
               f"and {v['unknown_queries']} unknown queries")
        for c, key in enumerate(VERDICT_FIGURES, start=VERDICT_COLUMN):
            out["verdict"][key] = v[key]
            self.table.setItem(r, c, cell(pct(v[key]), v[key]))
            self.table.item(r, c).setToolTip(tip)
        results = tests(run, base) if base is not None and not out["baseline"] else {}
        for c, metric in enumerate(COMPARED, start=P_COLUMN):
            self.table.setItem(r, c, self._p_cell(out, metric, base, results.get(metric)))
        return out

    @staticmethod
    def _metric_cell(out: dict[str, Any], s: dict[str, Any], run, m: Metric) -> QTableWidgetItem:
        """A headline figure: a mean with its interval, or GAP with its companion in brackets."""
        if m.compared:
            mean, lo, hi = out["ci"][m.key] = run.cis.get(m.key, (math.nan, math.nan, math.nan))
            return cell(f"{m.text(mean)}\n[{m.text(lo)}, {m.text(hi)}]", (mean, lo, hi))
        if not m.companion:
            item = cell(m.text(s[m.key]), s[m.key])
        else:
            item = cell(f"{m.text(s[m.key])}\n[{m.text(s[m.companion])}]", (s[m.key], s[m.companion]))
        item.setToolTip(m.tip)
        return item

    def _p_cell(self, out: dict[str, Any], metric: str, base, res: PairedTestResult | None) -> QTableWidgetItem:
        if base is None or out["baseline"]:
            text, p, tip = ("baseline" if out["baseline"] else ""), None, ""
        elif res is None:
            text, p, tip = "—", None, NO_COMMON
        else:
            p = float(res.p_value)
            out["delta"][metric] = float(res.delta)
            out["differing"][metric] = res.differing_queries
            out["bootstrap_p"][metric] = res.bootstrap_p_value
            out["direction"][metric] = res.direction
            text, tip = p_text(metric, res)
        out["p"][metric] = p
        out["stars"][metric] = stars(p)
        item = cell(text, p)
        item.setToolTip(tip)
        if p is not None and stars(p):
            f = item.font()
            f.setBold(True)
            item.setFont(f)
            colour = DIRECTION_COLOURS.get(out["direction"].get(metric, ""))
            if colour:
                item.setForeground(QBrush(QColor(colour)))
        return item
