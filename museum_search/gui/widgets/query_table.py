"""The per-query table of an evaluation run (the Evaluation tab's first page)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

from museum_search.core.evaluation import COMPARED, QueryRecord
from museum_search.core.index import Index

SORT_ROLE = Qt.ItemDataRole.UserRole + 2  # what the table sorts by (numbers, lower-case text)


def fmt(v: float) -> str:
    return "—" if v is None or not math.isfinite(v) else f"{v:.3f}"


def _relevant_text(r: QueryRecord) -> str:
    """The relevant instances of a query for the table, with those missing from the index."""
    text = ", ".join(r.relevant) if r.relevant else ("" if r.unknown else "(open set)")
    if r.unknown:
        text += ("; " if text else "") + f"not in index: {', '.join(r.unknown)}"
    return text


class QueryTableModel(QAbstractTableModel):
    """One row per evaluated query of a run: query, relevant, its values of core's compared metrics
    (P@1, AP, MNRO), top-1 instance, verdict, the answer's confidence."""

    METRIC_COLUMNS = {2 + i: key for i, key in enumerate(COMPARED)}  # column → metric key
    TOP1_COLUMN = 2 + len(COMPARED)
    VERDICT_COLUMN = TOP1_COLUMN + 1
    CONFIDENCE_COLUMN = VERDICT_COLUMN + 1
    COLUMNS = ("Query", "Relevant", *(m.query_label for m in COMPARED.values()), "Top-1 instance", "Verdict",
               "Confidence")
    #: coloured by whether the top-1 reference is relevant: the 0/1 metric (P@1) and the top-1 instance
    TOP1_COLOURED = (*(c for c, key in METRIC_COLUMNS.items() if COMPARED[key].binary), TOP1_COLUMN)
    TOOLTIPS = {**{c: COMPARED[key].description for c, key in METRIC_COLUMNS.items()},
                VERDICT_COLUMN: "The pipeline's verdict on the top result (hover a cell for the reason)",
                CONFIDENCE_COLUMN: "The answer's confidence: the probability that the top result is right and the "
                                   "object is in the collection (GAP sorts the queries by it)"}

    def __init__(self, parent=None):
        super().__init__(parent)
        self._records: list[QueryRecord] = []
        self._index: Index | None = None
        self._root = ""

    def set_run(self, records: list[QueryRecord], index: Index | None) -> None:
        self.beginResetModel()
        self._records = list(records)
        self._index = index
        self._root = os.path.commonpath([r.query for r in self._records]) if len(self._records) > 1 else ""
        self.endResetModel()

    def record(self, row: int) -> QueryRecord:
        return self._records[row]

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._records)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section: int, orientation, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return self.TOOLTIPS.get(section)
        return None

    def _name(self, r: QueryRecord) -> str:
        if self._root:
            try:
                return os.path.relpath(r.query, self._root)
            except ValueError:
                pass
        return Path(r.query).name

    def _top1(self, r: QueryRecord) -> str:
        return self._index.items[int(r.ranking[0])].instance if self._index is not None and len(r.ranking) else ""

    def data(self, idx: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not idx.isValid():
            return None
        r = self._records[idx.row()]
        col = idx.column()
        if role in (Qt.ItemDataRole.DisplayRole, SORT_ROLE):
            if col == 0:
                return self._name(r) if role == Qt.ItemDataRole.DisplayRole else self._name(r).lower()
            if col == 1:
                text = _relevant_text(r)
                return text if role == Qt.ItemDataRole.DisplayRole else text.lower()
            if col in self.METRIC_COLUMNS:
                key = self.METRIC_COLUMNS[col]
                v = r.metrics.get(key, math.nan)
                if role == SORT_ROLE:
                    return -1.0 if not math.isfinite(v) else float(v)  # open-set rows sort first
                return COMPARED[key].text(v)
            if col == self.TOP1_COLUMN:
                return self._top1(r) if role == Qt.ItemDataRole.DisplayRole else self._top1(r).lower()
            if col == self.VERDICT_COLUMN:
                return "in the collection" if r.in_collection else "not in the collection"
            if col == self.CONFIDENCE_COLUMN:
                if role == SORT_ROLE:
                    return -1.0 if r.confidence is None else float(r.confidence)
                return "" if r.confidence is None else f"{r.confidence:.2f}"
        if role == Qt.ItemDataRole.ToolTipRole:
            if col == 0:
                return r.query
            if col == 1 and r.unknown:
                return (f"The ground truth names {', '.join(r.unknown)}, not in this index: check the ground "
                        "truth or the index." + (" Not averaged." if r.open_set else ""))
            if col == self.TOP1_COLUMN and self._index is not None and len(r.ranking):
                return f"{self._index.items[int(r.ranking[0])].path}  (score {float(r.scores[0]):.4f})"
            if col == self.VERDICT_COLUMN:
                return r.reason
        if role == Qt.ItemDataRole.ForegroundRole and col in self.TOP1_COLOURED and not r.open_set:
            return QColor("#2e9d4c") if r.relevance[0] else QColor("#d0342c")
        if role == Qt.ItemDataRole.ForegroundRole and col == 1 and r.unknown:
            return QColor("#b36b00")
        if role == Qt.ItemDataRole.TextAlignmentRole and (col in self.METRIC_COLUMNS or col == self.CONFIDENCE_COLUMN):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


__all__ = ["QueryTableModel", "SORT_ROLE", "fmt"]
