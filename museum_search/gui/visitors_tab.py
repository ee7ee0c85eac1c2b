"""The Visitors tab (issue 34): what visitors ask about, and the staff's review queue of kept photos.

A thin view over :mod:`museum_search.core.visitors`. The open index's visitor log is opened on a
worker (``VisitorLog.open``, with the policy and folder of Settings), and every figure shown is its
``VisitorStats`` for the period chosen:

* **What visitors ask**: pyqtgraph plots (the style of :mod:`.widgets.plots`) of the questions per
  hour and per day (the not-recognised ones in red over each day's bar), the share not recognised
  per day, and the confidence bands of the answers; beside them, the most asked objects with their
  thumbnails (the shared :class:`ThumbnailCache`). *Export CSV…* writes ``VisitorStats.to_csv``
  where the save dialog says (it asks before replacing a file). With nothing to show, a plain
  sentence says why: no index, counting off, or nothing asked yet.
* **Review kept photos** (:class:`.widgets.review_queue.ReviewQueue`): the photos the kiosk or the
  phone page kept, for staff to add as views of an object, keep as "not in our collection", or
  discard. Its page title counts them.
"""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QCursor, QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QStackedWidget,
    QTabWidget,
    QToolTip,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.answer import CONFIDENCE_BANDS
from museum_search.core.errors import MuseumSearchError
from museum_search.gui import workers
from museum_search.gui.state import AppState
from museum_search.gui.widgets.layout import split
from museum_search.gui.widgets.plots import IntegerAxis, _style_plot, _title
from museum_search.gui.widgets.review_queue import ReviewQueue, button, object_photo, square_icon
from museum_search.gui.widgets.thumbnails import ThumbnailCache

log = logging.getLogger(__name__)

#: The periods offered: (words, days; None: everything kept).
PERIODS = (("Last 7 days", 7), ("Last 30 days", 30), ("Last 365 days", 365), ("Everything", None))
#: The confidence bands in their order (core's, then "none": answers without a confidence).
BANDS = (*(name for name, _floor in CONFIDENCE_BANDS), "none")
BAND_WORDS = {"sure": "sure", "likely": "likely", "might": "might be", "none": "no confidence"}
QUESTIONS_COLOUR = "#1f77b4"
NOT_RECOGNISED_COLOUR = "#d62728"
BAND_COLOURS = {"sure": "#2ca02c", "likely": "#98c46b", "might": "#ff7f0e", "none": "#9e9e9e"}
TOP_THUMB = 56
INSTANCE_ROLE = Qt.ItemDataRole.UserRole + 1
NO_INDEX = "Open an index to see what visitors ask about it."
COUNTING_OFF = ("Counting is off: visitors' questions are not counted. Turn it on in File → Settings… "
                "(“Counting”).")
NOTHING_YET = ("Nothing was asked yet. Each question asked at the kiosk or on the phone page is counted here, "
               "anonymously, by the hour.")
NOTHING_IN_PERIOD = "Nothing was asked in the {period}. “Everything” (above) shows all the questions counted."
COUNTING_OFF_NOW = "Counting is off: these are the questions counted before it was turned off."


#: The share plot's y axis: every quarter, in per cent.
SHARE_TICKS = [[(q, f"{round(100 * q)} %") for q in (0.0, 0.25, 0.5, 0.75, 1.0)]]


def _stamp(text: str) -> float:
    """Seconds since the epoch of a local hour or day ("2026-11-28T14:00", "2026-11-28")."""
    return datetime.fromisoformat(text).timestamp()


class _Bands(pg.AxisItem):
    """The bands' names under their bars."""

    def tickStrings(self, values, scale, spacing):
        return [BAND_WORDS.get(BANDS[int(round(v))], "") if 0 <= round(v) < len(BANDS) else "" for v in values]

    def tickSpacing(self, minVal, maxVal, size):
        return [(1.0, 0.0)]


class VisitorPlots(pg.GraphicsLayoutWidget):
    """Questions per hour (wide, first row); per day with the not-recognised ones; the share not
    recognised per day; the confidence bands. :meth:`set_stats` shows a ``VisitorStats``."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        pal = self.palette()
        self._fg = pal.color(QPalette.ColorRole.WindowText)
        self.setBackground(pal.color(QPalette.ColorRole.Base))
        self.ci.setContentsMargins(4, 4, 4, 4)
        self.hour_plot = self._plot(0, 0, "Questions per hour", colspan=2, date=True)
        self.day_plot = self._plot(1, 0, f"Questions per day (<span style='color:{NOT_RECOGNISED_COLOUR}'>"
                                   "not recognised</span>)", date=True)
        self.share_plot = self._plot(1, 1, "Share not recognised, per day", date=True)
        self.band_plot = self._plot(2, 0, "How sure the answers were", colspan=2, bands=True)
        self.share_plot.setAxisItems({"left": pg.AxisItem("left")})
        self.share_plot.getAxis("left").setTicks(SHARE_TICKS)
        _style_plot(self.share_plot, self._fg)
        self.share_plot.setYRange(0, 1, padding=0.04)
        self.share_plot.enableAutoRange(axis="y", enable=False)
        self.hour_bars = self._bars(self.hour_plot, QUESTIONS_COLOUR)
        self.day_bars = self._bars(self.day_plot, QUESTIONS_COLOUR)
        self.not_recognised_bars = self._bars(self.day_plot, NOT_RECOGNISED_COLOUR)
        self.share_curve = self.share_plot.plot([], [], pen=pg.mkPen(NOT_RECOGNISED_COLOUR, width=2), symbol="o",
                                                symbolSize=6, symbolBrush=NOT_RECOGNISED_COLOUR, symbolPen=None)
        self.band_bars = pg.BarGraphItem(x=[], height=[], width=0.7)
        self.band_plot.addItem(self.band_bars)
        for row, stretch in ((0, 3), (1, 3), (2, 2)):
            self.ci.layout.setRowStretchFactor(row, stretch)
        self._stats = None
        self.scene().sigMouseMoved.connect(self._hover)

    def _plot(self, row: int, col: int, title: str, colspan: int = 1, date: bool = False,
              bands: bool = False) -> pg.PlotItem:
        axes = {"left": IntegerAxis("left")}
        if date:
            axes["bottom"] = pg.DateAxisItem("bottom")
        if bands:
            axes["bottom"] = _Bands("bottom")
        plot = self.addPlot(row=row, col=col, colspan=colspan, axisItems=axes)
        _style_plot(plot, self._fg)
        _title(plot, title, self._fg)
        plot.setMouseEnabled(x=True, y=False)
        return plot

    @staticmethod
    def _bars(plot: pg.PlotItem, colour: str) -> pg.BarGraphItem:
        bars = pg.BarGraphItem(x=[], height=[], width=1.0, brush=colour, pen=None)
        plot.addItem(bars)
        return bars

    def value_text(self, plot: pg.PlotItem, x: float) -> str:
        """What the bar (or point) of ``plot`` at ``x`` (its view coordinate) stands for, in words
        ("" where there is none): the figures of the stats shown."""
        stats = self._stats
        if stats is None:
            return ""
        if plot is self.band_plot:
            i = int(round(x))
            return f"{BAND_WORDS[BANDS[i]]}: {stats.bands.get(BANDS[i], 0):,} answers" if 0 <= i < len(BANDS) else ""
        if plot is self.hour_plot:
            hits = [(h, n) for h, n in stats.per_hour if abs(_stamp(h) - x) <= 1800]  # bars centred on the hour
            return f"{hits[0][0].replace('T', ' ')}: {hits[0][1]:,} questions" if hits else ""
        hits = [(d, q, nr) for d, q, nr in stats.per_day if abs(_stamp(d) + 43200 - x) <= 43200]
        return f"{hits[0][0]}: {hits[0][1]:,} questions, {hits[0][2]:,} not recognised" if hits else ""

    def _hover(self, pos) -> None:
        for plot in (self.hour_plot, self.day_plot, self.share_plot, self.band_plot):
            if plot.sceneBoundingRect().contains(pos):
                text = self.value_text(plot, plot.vb.mapSceneToView(pos).x())
                if text:
                    QToolTip.showText(QCursor.pos(), text, self)
                else:
                    QToolTip.hideText()
                return

    def set_stats(self, stats) -> None:
        self._stats = stats
        hours = [(_stamp(h), n) for h, n in stats.per_hour]
        days = [(_stamp(d) + 43200, q, nr) for d, q, nr in stats.per_day]  # bars centred on midday
        self._set_bars(self.hour_bars, [t for t, _ in hours], [n for _, n in hours], 3600 * 0.85)
        self._set_bars(self.day_bars, [t for t, *_ in days], [q for _, q, _ in days], 86400 * 0.8)
        self._set_bars(self.not_recognised_bars, [t for t, *_ in days], [nr for *_, nr in days], 86400 * 0.8)
        share = share_not_recognised(stats)
        self.share_curve.setData([t for t, *_ in days], share)
        counts = [stats.bands.get(b, 0) for b in BANDS]
        self.band_bars.setOpts(x=list(range(len(BANDS))), height=counts, width=0.7,
                               brushes=[pg.mkBrush(BAND_COLOURS[b]) for b in BANDS], pens=[None] * len(BANDS))
        self.band_plot.setXRange(-0.6, len(BANDS) - 0.4, padding=0)
        for plot, xs, pad in ((self.hour_plot, [t for t, _ in hours], 3600), (self.day_plot, [t for t, *_ in days],
                                                                              86400),
                              (self.share_plot, [t for t, *_ in days], 86400)):
            if xs:
                plot.setXRange(min(xs) - pad, max(xs) + pad, padding=0.02)
            plot.enableAutoRange(axis="y", enable=plot is not self.share_plot)

    @staticmethod
    def _set_bars(bars: pg.BarGraphItem, x: list[float], height: list[int], width: float) -> None:
        bars.setOpts(x=np.asarray(x, float), height=np.asarray(height, float), width=width)

    def bar_data(self, name: str) -> tuple[list[float], list[float]]:
        """(x, heights) of the bars ``name`` ("hour_bars", "day_bars", "not_recognised_bars", "band_bars")."""
        opts = getattr(self, name).opts
        return list(np.asarray(opts["x"], float)), list(np.asarray(opts["height"], float))


def share_not_recognised(stats) -> list[float]:
    """The share of each day's questions not recognised (core's ``VisitorStats``), by day."""
    return [share for _d, share in stats.share_not_recognised_per_day]


class TopObjects(QTreeWidget):
    """The most asked objects: thumbnail, instance and title, and how many times each was recognised."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("topObjects")
        self.setHeaderLabels(["Most asked objects", "Times"])
        self.setRootIsDecorated(False)
        self.setIconSize(QSize(TOP_THUMB, TOP_THUMB))
        self.setUniformRowHeights(True)
        self.setWordWrap(True)
        header = self.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(0, header.ResizeMode.Stretch)
        header.setSectionResizeMode(1, header.ResizeMode.ResizeToContents)
        self._cache = ThumbnailCache.instance()
        self._cache.ready.connect(self._thumbnail_ready)

    def set_objects(self, rows: list[tuple[str, int, Path | None, str]]) -> None:
        """``rows``: (instance, times recognised, its photo or None, its title)."""
        self.clear()
        for instance, n, path, title in rows:
            item = QTreeWidgetItem([title or instance, f"{n:,}"])
            item.setTextAlignment(1, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            item.setToolTip(0, f"{title} ({instance})" if title else instance)
            item.setData(0, Qt.ItemDataRole.UserRole, str(path) if path else "")
            item.setData(0, INSTANCE_ROLE, instance)
            item.setIcon(0, square_icon(self._cache.get(path, TOP_THUMB) if path else None, TOP_THUMB))
            self.addTopLevelItem(item)

    def rows(self) -> list[tuple[str, int]]:
        """(instance, times recognised) of the objects listed, in their order."""
        return [(self.topLevelItem(i).data(0, INSTANCE_ROLE), int(self.topLevelItem(i).text(1).replace(",", "")))
                for i in range(self.topLevelItemCount())]

    def _thumbnail_ready(self, path: str, size: int) -> None:
        if size != TOP_THUMB:
            return
        for i in range(self.topLevelItemCount()):
            item = self.topLevelItem(i)
            if item.data(0, Qt.ItemDataRole.UserRole) == path:
                pm = self._cache.peek(path, size)
                if pm is not None:
                    item.setIcon(0, square_icon(pm, size))


def _read(visitor_log, index, days: int | None) -> dict[str, Any]:
    """On a worker: the log's statistics over ``days``, the most asked objects' photos and titles,
    and the kept photos to review."""
    stats = visitor_log.stats(days)
    top = [(inst, n, *object_photo(index, inst)) for inst, n in stats.top_objects[:TOP_OBJECTS]]
    return {"stats": stats, "top": top, "kept": visitor_log.kept("new")}


#: The most asked objects listed.
TOP_OBJECTS = 20


def _open_log(index_path: Path, policy, folder: str):
    """On a worker: the visitor log of the index at ``index_path`` (None when nothing is counted or
    kept and its folder was never made: nothing to show, and no folder is made for it)."""
    from museum_search.core.visitors import VisitorLog, visitors_folder

    where = Path(folder) if folder else visitors_folder(index_path)
    if policy.keep == "none" and not policy.counting and not where.exists():
        return None
    return VisitorLog.open(index_path, policy, folder=Path(folder) if folder else None)


class VisitorsTab(QWidget):
    """See the module docstring."""

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.visitor_log = None  # the open VisitorLog (None: none)
        self.stats = None  # the VisitorStats shown
        self._key: tuple | None = None  # (index path, policy, folder) of the log open
        self._job: workers.Job | None = None
        self._stale = True  # read again when next shown
        self.pages = QTabWidget()
        self.pages.setObjectName("visitorPages")
        self.pages.setDocumentMode(True)
        self.pages.addTab(self._questions_page(), "What visitors ask")
        self.queue = ReviewQueue(state)
        self.queue.changed.connect(self.refresh)
        self.pages.addTab(self.queue, "Review kept photos")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.pages)
        state.index_changed.connect(self._index_changed)
        self._show_message(NO_INDEX)

    def _questions_page(self) -> QWidget:
        self.period = QComboBox()
        self.period.setObjectName("visitorPeriod")
        for words, days in PERIODS:
            self.period.addItem(words, days)
        self.period.setCurrentIndex(1)
        self.period.currentIndexChanged.connect(lambda _i: self.refresh())
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(lambda _checked=False: self.refresh())
        self.export_button = button("Export CSV…", "exportCsv", "Save these counts as a CSV file: one row per "
                                    "hour, object, verdict, confidence band, language and source, with the number "
                                    "of questions", self.choose_csv)
        self.summary = QLabel("")
        self.summary.setObjectName("visitorSummary")
        self.summary.setWordWrap(True)
        head = QHBoxLayout()
        head.addWidget(self.period)
        head.addWidget(self.refresh_button)
        head.addWidget(self.summary, 1)
        head.addWidget(self.export_button)
        self.plots = VisitorPlots()
        self.top = TopObjects()
        plots_and_top = split(Qt.Orientation.Horizontal, (self.plots, 3, 760), (self.top, 1, 300))
        self.empty = QLabel("")
        self.empty.setObjectName("visitorsEmpty")
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(plots_and_top)
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.setContentsMargins(0, 6, 0, 0)
        lay.addLayout(head)
        lay.addWidget(self.stack, 1)
        return page

    # ---- what is shown -------------------------------------------------------------------------
    def message(self) -> str:
        """The sentence shown in place of the plots ("" while they show)."""
        return self.empty.text() if self.stack.currentIndex() == 0 else ""

    def _show_message(self, text: str) -> None:
        self.empty.setText(text)
        self.stack.setCurrentIndex(0)
        self.export_button.setEnabled(False)
        self.summary.setText("")

    def _show(self, value: dict[str, Any]) -> None:
        stats, policy = value["stats"], self.state.settings.visitor_policy
        self.stats = stats
        self.queue.set_source(self.visitor_log, self.state.index)
        self.queue.set_photos(value["kept"])
        n = len(value["kept"])
        self.pages.setTabText(1, f"Review kept photos ({n:,})" if n else "Review kept photos")
        if stats.total == 0:
            days = self.period.currentData()
            self._show_message(COUNTING_OFF if not policy.counting else NOTHING_YET if days is None else
                               NOTHING_IN_PERIOD.format(period=self.period.currentText().lower()))
            return
        self.plots.set_stats(stats)
        self.top.set_objects(value["top"])
        self.stack.setCurrentIndex(1)
        self.export_button.setEnabled(True)
        sources = ", ".join(f"{SOURCE_WORDS.get(s, s)} {k:,}" for s, k in sorted(stats.sources.items()))
        text = (f"{stats.total:,} question{'s' if stats.total != 1 else ''}, {stats.not_recognised:,} not "
                f"recognised ({sources})")
        self.summary.setText(text + (f". {COUNTING_OFF_NOW}" if not policy.counting else "."))

    # ---- reading the log -----------------------------------------------------------------------
    def showEvent(self, event) -> None:
        """Read again each time the tab shows: the kiosk (or serve, another process) may have counted since."""
        super().showEvent(event)
        self.refresh()

    def _index_changed(self, _index) -> None:
        self._stale = True
        if self.isVisible():
            self.refresh()

    def _wanted_key(self) -> tuple | None:
        index = self.state.index
        if index is None or index.path is None:
            return None
        return (Path(index.path), self.state.settings.visitor_policy, self.state.settings.visitors_folder)

    def refresh(self) -> None:
        """Open the log again if the index or Settings changed, and read it (on a worker)."""
        if (self._job is not None and self._job.running) or self.queue.running:
            self._stale = True  # read again once this read (or the review's action) is done
            return
        self._stale = False
        key = self._wanted_key()
        if key is None:
            self._close_log()
            self.queue.set_source(None, None)
            self.queue.set_photos([])
            self._show_message(NO_INDEX)
            return
        days, index = self.period.currentData(), self.state.index
        if key != self._key:
            self._close_log()
            path, policy, folder = key

            def work():
                visitor_log = _open_log(path, policy, folder)
                return visitor_log, (_read(visitor_log, index, days) if visitor_log is not None else None)
        else:
            visitor_log = self.visitor_log

            def work():
                return visitor_log, _read(visitor_log, index, days)
        self._job = workers.start(work, on_result=lambda value: self._read_done(key, value),
                                  on_error=self._read_failed, on_finished=self._read_finished)

    def _read_done(self, key: tuple, value) -> None:
        visitor_log, read = value
        if visitor_log is not self.visitor_log:
            self._close_log()
            self.visitor_log, self._key = visitor_log, key
        if read is None:
            self.queue.set_source(None, self.state.index)
            self.queue.set_photos([])
            self._show_message(COUNTING_OFF)
            return
        self._show(read)

    def _read_failed(self, exc: BaseException) -> None:
        self._key = None
        self._show_message(f"The visitors' counts cannot be read: {workers.error_message(exc)}")

    def _read_finished(self) -> None:
        self._job = None
        if self._stale and self.isVisible():
            self.refresh()

    def _close_log(self) -> None:
        visitor_log, self.visitor_log, self._key = self.visitor_log, None, None
        if visitor_log is not None:
            self.queue.set_source(None, self.queue.index)  # nothing acts on a closed log
            visitor_log.close()

    def is_busy(self) -> bool:
        return (self._job is not None and self._job.running) or self.queue.running or self.queue.evidence_busy()

    def busy_text(self) -> str | None:
        """What quitting now would cancel, or None (MainWindow asks before it quits)."""
        return "Photos are being added to the index" if self.queue.running else None

    # ---- export --------------------------------------------------------------------------------
    def choose_csv(self) -> None:
        """Ask where to save the counts as CSV (the dialog asks before it replaces a file), then save."""
        if self.stats is None:
            return
        path, _filter = QFileDialog.getSaveFileName(self, "Export the visitors' counts", str(Path.home() /
                                                    "visitors.csv"), "CSV files (*.csv)")
        if path:  # the dialog asked before it chose a file that exists: it is replaced
            self.export_csv(path, overwrite=True)

    def export_csv(self, path: str | Path, overwrite: bool = False) -> bool:
        """Write the counts shown to ``path`` (core's ``VisitorStats.to_csv``; a file that exists is
        refused unless ``overwrite``: the save dialog's confirmation); True when written."""
        try:
            self.stats.to_csv(path, overwrite=overwrite)
        except (OSError, ValueError, MuseumSearchError) as exc:
            workers.show_error(self, "Export CSV", exc)
            return False
        self.summary.setText(f"{self.summary.text()} Saved to {path}.")
        return True

    def shutdown(self) -> None:
        """Cancel what runs, wait for it, and close the log (the window closes)."""
        busy = self.is_busy()
        self.queue.shutdown()
        if self._job is not None and self._job.running:
            self._job.cancel()
        if busy:
            workers.wait_all(30000)
        self._close_log()


SOURCE_WORDS = {"kiosk": "kiosk", "phone": "phones", "app": "app"}
