"""The Evaluation tab's per-query page: the sortable table of a run's queries beside the selected
query's photo, its figures and verdict, and its top results marked right or wrong."""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
from PySide6.QtCore import QItemSelectionModel, QModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QScrollArea,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.answer import Result
from museum_search.core.evaluation import COMPARED
from museum_search.gui.widgets.query_table import SORT_ROLE, QueryTableModel
from museum_search.gui.widgets.result_grid import ResultGrid
from museum_search.gui.widgets.thumbnails import ThumbnailCache

QUERY_THUMB = 180
#: The least side of the query's photo when the page is short (the text below it keeps its lines).
MIN_THUMB = 96
RESULT_THUMB = 104
PICK = "Select a query in the table."


def ranked_results(index, rows: np.ndarray, scores: np.ndarray) -> list[Result]:
    """The references of ``rows`` (best first) as results ranked by ``scores`` (by row): a bare
    ranking, with no cosine (NaN) and no verification."""
    out = []
    for rank, r in enumerate(rows, start=1):
        it = index.items[int(r)]
        out.append(Result(rank, int(r), float(scores[r]), math.nan, None, it.path, str(index.root / it.path),
                          it.instance, dict(it.metadata)))
    return out


def query_text(rec) -> str:
    """A query record (``runner.QueryRecord``) in words: relevant instances, figures, verdict."""
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
    return (f"<b>{html.escape(Path(rec.query).name)}</b><br>Relevant: {rel}<br>"
            + (f"{rec.n_relevant} relevant reference{'s' if rec.n_relevant != 1 else ''}, {first}<br>"
               + " · ".join(f"{c.query_label} {c.text(m[key])}" for key, c in COMPARED.items())
               if not rec.open_set else excluded)
            + f"<br>Verdict: <b>{'in' if rec.in_collection else 'not in'} the collection</b> "
              f"({confidence}{html.escape(rec.reason)})")


class _QueryColumn(QScrollArea):
    """The selected query's photo above its text, never on top of it: the photo gives up height
    (down to :data:`MIN_THUMB`) so that the text shows whole; where even that is too little, the
    column scrolls (the text is never cut)."""

    def __init__(self, image: QLabel, info: QLabel, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("evalQueryColumn")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.image, self.info = image, info
        body = QWidget()
        lay = QVBoxLayout(body)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(image, 0, Qt.AlignmentFlag.AlignHCenter)
        lay.addWidget(info)
        lay.addStretch(1)
        self.setWidget(body)
        self.setFixedWidth(QUERY_THUMB + self.verticalScrollBar().sizeHint().width() + 2)

    def side(self) -> int:
        """The photo's side that leaves the text its whole height."""
        spacing = self.widget().layout().spacing()
        room = self.viewport().height() - self.info.heightForWidth(QUERY_THUMB) - spacing
        return max(MIN_THUMB, min(QUERY_THUMB, room))

    def fit(self) -> None:
        side = self.side()
        if self.image.width() != side:
            self.image.setFixedSize(side, side)
            pm = self.image.pixmap()
            if pm is not None and not pm.isNull() and self.image.property("source") is not None:
                self.image.setPixmap(self.image.property("source").scaled(
                    side, side, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.fit()


class QueryPage(QSplitter):
    """Table (``queryTable``) | photo (``evalQueryImage``), text (``evalQueryInfo``) and results
    (``evalResultGrid``). ``top_k()`` says how many results to show."""

    def __init__(self, top_k, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.top_k = top_k
        self.run = None
        self._query_path: str | None = None
        self.model = QueryTableModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setSortRole(SORT_ROLE)
        self.table = self._make_table()
        self.query_image = QLabel(PICK)
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
        self.query_column = _QueryColumn(self.query_image, self.query_info)
        detail = QWidget()
        dl = QHBoxLayout(detail)
        dl.setContentsMargins(0, 0, 0, 0)
        dl.addWidget(self.query_column)
        dl.addWidget(self.result_grid, 1)
        for i, w in enumerate((self.table, detail)):
            self.addWidget(w)
            self.setStretchFactor(i, 1)
        self.setSizes([480, 560])
        ThumbnailCache.instance().ready.connect(self._thumbnail_ready)

    def _make_table(self) -> QTableView:
        table = QTableView()
        table.setObjectName("queryTable")
        table.setModel(self.proxy)
        table.setSortingEnabled(True)
        table.sortByColumn(-1, Qt.SortOrder.AscendingOrder)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.setAlternatingRowColors(True)
        table.verticalHeader().hide()
        table.verticalHeader().setDefaultSectionSize(table.fontMetrics().height() + 6)
        hh = table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        hh.setStretchLastSection(True)
        table.selectionModel().currentRowChanged.connect(self._current_row_changed)
        return table

    def set_run(self, run) -> None:
        """Show the queries of ``run`` (an ``EvalRun``; None: none), no query selected."""
        self.run = run
        self.model.set_run(run.report.records if run else [], run.index if run else None)
        self.table.resizeColumnsToContents()
        self.result_grid.clear("Select a query in the table to see its top results.")
        self.query_image.clear()
        self.query_image.setProperty("source", None)
        self.query_image.setText(PICK)
        self.query_info.setText("")
        self._query_path = None

    def select_row(self, view_row: int) -> None:
        """Select row ``view_row`` of the (sorted) table, as a click would."""
        idx = self.proxy.index(view_row, 0)
        self.table.selectionModel().setCurrentIndex(
            idx, QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows)

    def show_query(self, source_row: int) -> None:
        """Show the query of row ``source_row`` (model order) and its top results, marked."""
        run = self.run
        if run is None:
            return
        rec = self.model.record(source_row)
        k = max(1, min(self.top_k(), len(rec.ranking)))
        scores = np.zeros(len(run.index), np.float32)
        scores[rec.ranking] = rec.scores
        self.result_grid.set_results(ranked_results(run.index, rec.ranking[:k], scores),
                                     correct=[bool(c) for c in rec.relevance[:k]])
        self._query_path = rec.query
        self.query_info.setText(query_text(rec))
        self.query_column.fit()
        self._show_query_image()

    def _current_row_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid():
            self.show_query(self.proxy.mapToSource(current).row())

    def _show_query_image(self) -> None:
        if not self._query_path:
            return
        pm = ThumbnailCache.instance().get(self._query_path, QUERY_THUMB)
        if pm is None:
            self.query_image.setText("…")
        else:
            self.query_image.setProperty("source", pm)
            side = self.query_image.width()
            self.query_image.setPixmap(pm if side >= QUERY_THUMB else pm.scaled(
                side, side, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation))

    def _thumbnail_ready(self, path: str, size: int) -> None:
        if path == self._query_path and size == QUERY_THUMB:
            self._show_query_image()
