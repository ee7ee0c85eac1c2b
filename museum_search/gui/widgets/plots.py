"""Evaluation plots (pyqtgraph): running means, per-query histograms, precision–recall, sweeps.

Live plotting follows pyqtgraph's ``scrollingPlots`` example: the progress callback only appends
to growable numpy buffers (:class:`RunningBuffer`, capacity doubled when full) and marks the plot
dirty; a GUI-thread ``QTimer`` (10 Hz) calls ``curve.setData`` on views of the filled part.
Nothing is redrawn per query, so thousands of queries per second cost nothing on screen.

:class:`EvaluationPlots` (one ``GraphicsLayoutWidget``)::

    plots.start_live(total)            # clear, x range 1..total, start the timer
    plots.add_step(step)               # from the progress callback (EvalStep)
    plots.stop_live()                  # last refresh, stop the timer
    plots.show_buffer(buf)             # show a finished run (its RunningBuffer)
    plots.set_pr(recall, precision)    # the precision–recall curve of the shown run
    plots.set_overlays([...])          # other runs to compare (dashed running curves, PR curves)

Items exposed for tests and callers: ``running_curves[metric]`` (metric in ``METRICS``),
``histograms[metric]`` (metric in ``HISTOGRAMS``: per-query AP and MNRO under ``"map"`` and
``"amnro"``; step curves: ``getData()`` gives bin edges and counts),
``pr_curve``, ``running_overlays[key][metric]``, ``pr_overlays[key]``.

No legend is drawn over the data. The lines of the running means have one colour per metric and
one line style per run (solid: the run shown; :data:`DASHES`: the others); ``plots.legend`` (a
:class:`RunLegend`, a plain widget the caller places above the plots) says both with the pens the
lines are drawn with: a line per metric in its colour, then per run a line in its style after a
square of its colour (its precision–recall curve, drawn in that colour and style, and its icon in
the run list), names elided to the space there is (full names in the tooltips). The running means
have no title or axis label (the legend's first line says what they are), so the plot keeps its
height for the data; its y axis is labelled at every quarter with a margin above 1 and below 0.
Titles may be narrower than their text, so a narrow window shrinks the plots instead of pushing
one off-screen.

:class:`SweepPlot` plots MAP and MP@1 (``SWEEP_METRICS``) against an ICFRR parameter
(``sweep_curves``), its legend in the title.

The metrics and their labels come from core's metric table
(:data:`museum_search.core.evaluation.METRICS`); only the colours are chosen here.

:class:`VerdictPlot` plots the "in this collection" verdict's figures against its threshold
(``verdict.operating_points``: ``verdict_curves[key]`` for ``VERDICT_CURVES``), with vertical lines
at the threshold in use (``threshold_line``) and at a candidate operating point (``candidate_line``);
its legend is a word-wrapped label (``legend``) the caller places above it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QColor, QPainter, QPalette, QPen, QPixmap
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QSizePolicy, QWidget

from museum_search.core.evaluation import COMPARED, PRIMARY

__all__ = [
    "METRICS", "METRIC_LABELS", "METRIC_COLOURS", "HISTOGRAMS", "SWEEP_METRICS", "RUN_COLOURS", "HIST_BINS",
    "RunningBuffer", "Overlay", "EvaluationPlots", "RunLegend", "SweepPlot", "VerdictPlot", "VERDICT_CURVES",
    "IntegerAxis", "run_colour",
]

#: Running means plotted live (keys of ``EvalStep.running``): core's compared metrics.
METRICS = tuple(COMPARED)
METRIC_LABELS = {key: m.label for key, m in COMPARED.items()}
#: Colours of the metrics, in order (cycled).
METRIC_PALETTE = ("#1f77b4", "#2ca02c", "#d62728", "#ff7f0e", "#9467bd", "#8c564b")
METRIC_COLOURS = {key: METRIC_PALETTE[i % len(METRIC_PALETTE)] for i, key in enumerate(METRICS)}
#: Per-query values drawn as histograms: the compared metrics whose values are not just 0 or 1.
HISTOGRAMS = tuple(key for key, m in COMPARED.items() if not m.binary)
#: Plotted against a swept parameter: the primary metric, then the other compared ones where higher is better.
SWEEP_METRICS = (PRIMARY.key, *(key for key, m in COMPARED.items() if m.higher_is_better and m is not PRIMARY))
#: Colours of compared runs (PR curves, list icons), cycled.
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
#: Dash patterns of compared runs' running curves, cycled.
DASHES = (Qt.PenStyle.DashLine, Qt.PenStyle.DotLine, Qt.PenStyle.DashDotLine, Qt.PenStyle.DashDotDotLine)
#: Histogram bin edges of the per-query values (AP and MNRO: in [0, 1]).
HIST_BINS = np.linspace(0.0, 1.0, 11)
REFRESH_MS = 100


def run_colour(i: int) -> str:
    return RUN_COLOURS[i % len(RUN_COLOURS)]


class RunningBuffer:
    """Running means (:data:`METRICS`) and per-query values (:data:`HISTOGRAMS`) of a run, appended
    one query at a time.

    Arrays grow by doubling (amortized O(1) append); the properties are views of the filled part.
    """

    ROWS = 1 + len(METRICS) + len(HISTOGRAMS)  # x, the running means, the per-query values

    def __init__(self, capacity: int = 64):
        self._n = 0
        self._data = np.full((self.ROWS, max(1, int(capacity))), np.nan)

    def __len__(self) -> int:
        return self._n

    def clear(self, capacity: int | None = None) -> None:
        self._n = 0
        if capacity is not None and capacity > self._data.shape[1]:
            self._data = np.full((self.ROWS, int(capacity)), np.nan)

    def append(self, x: float, running: dict, values: dict) -> None:
        """One query: ``running`` the running means so far, ``values`` its own (``QueryRecord.metrics``)."""
        if self._n >= self._data.shape[1]:
            grown = np.full((self.ROWS, self._data.shape[1] * 2), np.nan)
            grown[:, : self._n] = self._data
            self._data = grown
        self._data[:, self._n] = (x, *(running.get(m, np.nan) for m in METRICS),
                                  *(values.get(m, np.nan) for m in HISTOGRAMS))
        self._n += 1

    @property
    def x(self) -> np.ndarray:
        return self._data[0, : self._n]

    def series(self, metric: str) -> np.ndarray:
        return self._data[1 + METRICS.index(metric), : self._n]

    def per_query(self, metric: str) -> np.ndarray:
        """Per-query values of ``metric`` (in :data:`HISTOGRAMS`, e.g. "map": AP) of the evaluated
        queries so far (open-set queries dropped)."""
        v = self._data[1 + len(METRICS) + HISTOGRAMS.index(metric), : self._n]
        return v[~np.isnan(v)]

    def copy(self) -> "RunningBuffer":
        out = RunningBuffer(max(1, self._n))
        out._data[:, : self._n] = self._data[:, : self._n]
        out._n = self._n
        return out


@dataclass
class Overlay:
    """Another run drawn for comparison."""

    key: object
    name: str
    buffer: RunningBuffer | None
    pr: tuple[np.ndarray, np.ndarray] | None
    colour: str
    dash: int = 0  # index into DASHES


class IntegerAxis(pg.AxisItem):
    """An axis with ticks on whole numbers only (query counts)."""

    def tickSpacing(self, minVal, maxVal, size):
        levels = [(spacing, offset) for spacing, offset in super().tickSpacing(minVal, maxVal, size) if spacing >= 1]
        return levels or [(1.0, 0.0)]


def _title(plot: pg.PlotItem, text: str, fg: QColor) -> None:
    """Set ``plot``'s title without making its text width the plot's minimum width."""
    plot.setTitle(text, color=fg, size="10pt")
    plot.titleLabel.setMinimumWidth(0)


#: Ticks of an axis over [0, 1]: labels at 0, 0.5 and 1 only, so narrow plots stay legible.
UNIT_TICKS = [[(0.0, "0"), (0.5, "0.5"), (1.0, "1")], [(0.25, ""), (0.75, "")]]
#: The running means' y axis: every quarter labelled, and its range, with a margin above 1 and below 0.
QUARTER_TICKS = [[(0.0, "0"), (0.25, "0.25"), (0.5, "0.5"), (0.75, "0.75"), (1.0, "1")]]
RUNNING_Y_RANGE = (-0.1, 1.1)


def _coloured(label: str, colour: str) -> str:
    return f"<span style='color:{colour}; font-weight:bold'>{label}</span>"


def _line_pixmap(pen: QPen, width: int = 30, height: int = 12, square: str | None = None) -> QPixmap:
    """A line sample drawn with ``pen`` (for the legend), after a square of ``square`` when given."""
    left = height + 4 if square else 0
    pm = QPixmap(left + width, height)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    if square:
        p.fillRect(1, 1, height - 2, height - 2, QColor(square))
    p.setPen(pen)
    p.drawLine(left + 1, height // 2, left + width - 1, height // 2)
    p.end()
    return pm


def run_pen(colour: QColor | str, style: Qt.PenStyle, width: float = 1.5) -> QPen:
    """The pen of a run's curves: ``colour`` (a metric's in the running means, the run's in the
    precision–recall plot) in the run's ``style`` (solid for the run shown, :data:`DASHES` for the others)."""
    pen = pg.mkPen(colour, width=width)
    pen.setStyle(style)
    return pen


class _ElidedLabel(QLabel):
    """A one-line label that elides its text to its width (the full text in its tooltip)."""

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self._full = text
        self.setToolTip(text)
        self.setMinimumWidth(40)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self._elide()

    def full_text(self) -> str:
        return self._full

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + 4, super().sizeHint().height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideMiddle, max(10, self.width())))


@dataclass
class LegendEntry:
    """A line of the legend: ``name`` and the ``pen`` its sample is drawn with; for a run, ``colour``
    (its square: the colour of its precision–recall curve and of its icon in the run list)."""

    name: str
    pen: QPen
    colour: str | None = None


class RunLegend(QWidget):
    """What the lines of :class:`EvaluationPlots` are, outside the plots (see the module doc): the
    metrics (a line in each metric's colour), then the runs drawn (a line in the run's style, after
    its colour)."""

    COLUMNS = 2

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("runLegend")
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(6, 0, 6, 0)
        self._grid.setHorizontalSpacing(6)
        self._grid.setVerticalSpacing(0)
        self._entries: list[LegendEntry] = []
        self._metrics: list[LegendEntry] = []
        self.setVisible(False)

    def entries(self) -> list[tuple[str, str, Qt.PenStyle]]:
        """(name, colour, line style) of each run named, in order."""
        return [(e.name, e.colour or "", e.pen.style()) for e in self._entries]

    def run_entries(self) -> list[LegendEntry]:
        return list(self._entries)

    def metric_entries(self) -> list[LegendEntry]:
        return list(self._metrics)

    def labels(self) -> list[_ElidedLabel]:
        return [w for w in self.findChildren(_ElidedLabel)]

    def set_entries(self, runs: Sequence[tuple[str, str, Qt.PenStyle]],
                    metrics: Sequence[tuple[str, QPen]] = (), line: QColor | str = "#808080") -> None:
        """Name ``metrics`` (label, pen) and ``runs`` (name, colour, line style; ``line``: the
        colour their samples are drawn in, as a run has no colour of its own in the running means)."""
        while self._grid.count():
            w = self._grid.takeAt(0).widget()
            if w is not None:
                w.setParent(None)  # gone at once (deleteLater alone leaves it drawn until the event loop runs)
                w.deleteLater()
        self._metrics = [LegendEntry(label, QPen(pen)) for label, pen in metrics]
        self._entries = [LegendEntry(name, run_pen(line, style, 2.0), colour) for name, colour, style in runs]
        if self._metrics:
            row = QWidget()
            lay = QHBoxLayout(row)
            lay.setContentsMargins(0, 0, 0, 0)
            title = QLabel("<b>Running means</b> by queries done:")
            title.setToolTip(f"{_joined(METRIC_LABELS[m] for m in METRICS)} over the queries processed so far "
                             "(the x axis)")
            lay.addWidget(title)
            for e in self._metrics:
                sample = QLabel()
                sample.setPixmap(_line_pixmap(e.pen))
                lay.addWidget(sample)
                lay.addWidget(QLabel(e.name))
            if len(self._entries) > 1:
                lay.addWidget(QLabel("· runs by line style:"))
            lay.addStretch(1)
            self._grid.addWidget(row, 0, 0, 1, 2 * self.COLUMNS)
        runs = self._entries if len(self._entries) > 1 else []  # one run: the one shown, not named
        for i, e in enumerate(runs):
            r, c = divmod(i, self.COLUMNS)
            sample = QLabel()
            sample.setPixmap(_line_pixmap(e.pen, square=e.colour))
            sample.setToolTip(e.name)
            self._grid.addWidget(sample, r + 1, 2 * c)
            self._grid.addWidget(_ElidedLabel(e.name), r + 1, 2 * c + 1)
        for c in range(self.COLUMNS):
            self._grid.setColumnStretch(2 * c + 1, 1 if len(self._entries) > c else 0)
        self.setVisible(bool(self._metrics or self._entries))


def _joined(words: Iterable[str]) -> str:
    """"a, b and c"."""
    w = list(words)
    return " and ".join([", ".join(w[:-1]), w[-1]]) if len(w) > 1 else "".join(w)


def _histogram(values: np.ndarray) -> np.ndarray:
    counts, _ = np.histogram(np.clip(values, 0.0, 1.0), bins=HIST_BINS)
    return counts.astype(float)


def _style_plot(plot: pg.PlotItem, fg: QColor) -> None:
    for name in ("left", "bottom"):
        ax = plot.getAxis(name)
        ax.setPen(pg.mkPen(fg))
        ax.setTextPen(pg.mkPen(fg))
    plot.showGrid(x=True, y=True, alpha=0.15)
    plot.setMenuEnabled(False)


class EvaluationPlots(pg.GraphicsLayoutWidget):
    """Running means of :data:`METRICS` (MP@1/MAP/AMNRO, wide), histograms of :data:`HISTOGRAMS`
    (per-query AP and MNRO), and the precision–recall curve."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        pal = self.palette()
        self._fg = pal.color(QPalette.ColorRole.WindowText)
        self._bg = pal.color(QPalette.ColorRole.Base)
        self.setBackground(self._bg)
        self.ci.setContentsMargins(4, 4, 4, 4)
        self.buffer = RunningBuffer()
        self.total = 0
        self._dirty = False
        self._live = False
        self._add_running_plot()
        self._add_pr_plot()
        self._add_histograms()
        self.ci.layout.setColumnStretchFactor(0, 1)
        self.ci.layout.setColumnStretchFactor(1, 1)
        self.ci.layout.setColumnStretchFactor(2, 1)
        self.ci.layout.setRowStretchFactor(0, 1)
        self.ci.layout.setRowStretchFactor(1, 1)
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh)

    def _add_running_plot(self) -> None:
        """The running means (wide, first row), with the legend of the runs drawn."""
        self.running_plot: pg.PlotItem = self.addPlot(row=0, col=0, colspan=3,
                                                      axisItems={"bottom": IntegerAxis("bottom")})
        # no title and no axis label: the legend above the plots says what the lines are (the
        # plot keeps its height for the data, even in a 1024×700 window)
        _style_plot(self.running_plot, self._fg)
        # every quarter labelled, with room above 1 and below 0: a line at 1.0 (a perfect run) sits
        # clear of the frame, and the labels 0 and 1 are inside the axis (drawn)
        self.running_plot.setRange(xRange=(1, 10), yRange=RUNNING_Y_RANGE, padding=0)
        self.running_plot.getAxis("left").setTicks(QUARTER_TICKS)
        self.running_plot.enableAutoRange(axis="y", enable=False)
        self.running_plot.setMouseEnabled(x=True, y=False)
        self.running_plot.setDownsampling(mode="peak")
        self.running_plot.setClipToView(True)
        self.legend = RunLegend()  # the lines drawn, outside the data (the caller places it)
        self.running_curves: dict[str, pg.PlotDataItem] = {}
        for m in METRICS:
            self.running_curves[m] = self.running_plot.plot(
                [], [], name=METRIC_LABELS[m], pen=pg.mkPen(METRIC_COLOURS[m], width=2), connect="finite")
        self.legend.set_entries([], self._metric_pens(), self._fg)
        self.running_overlays: dict[object, dict[str, pg.PlotDataItem]] = {}
        self._main_colour = RUN_COLOURS[0]

    def _add_pr_plot(self) -> None:
        self.pr_plot: pg.PlotItem = self.addPlot(row=1, col=2)
        _title(self.pr_plot, "Precision–recall (11-point)", self._fg)
        self.pr_plot.setLabel("bottom", "recall", color=self._fg)
        self.pr_plot.setLabel("left", "precision", color=self._fg)
        self.pr_plot.getAxis("bottom").setTicks(UNIT_TICKS)
        self.pr_plot.getAxis("left").setTicks(UNIT_TICKS)
        _style_plot(self.pr_plot, self._fg)
        self.pr_plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0.02)
        self.pr_plot.enableAutoRange(enable=False)
        self.pr_plot.setMouseEnabled(x=False, y=False)
        self.pr_curve = self.pr_plot.plot([], [], pen=pg.mkPen(RUN_COLOURS[0], width=2.5), symbol="o",
                                          symbolSize=5, symbolBrush=RUN_COLOURS[0], symbolPen=None)
        self.pr_overlays: dict[object, pg.PlotDataItem] = {}

    def _add_histograms(self) -> None:
        """Per-query histograms of :data:`HISTOGRAMS`, AP and MNRO (second row)."""
        self.hist_plots: dict[str, pg.PlotItem] = {}
        self.histograms: dict[str, pg.PlotDataItem] = {}
        for col, key in enumerate(HISTOGRAMS):
            m = COMPARED[key]
            p = self.addPlot(row=1, col=col, axisItems={"left": IntegerAxis("left")})
            _title(p, f"Per-query {m.query_label}", self._fg)
            p.setLabel("left", "queries", color=self._fg)
            p.setLabel("bottom", f"{m.query_label} ({m.better} is better)", color=self._fg)
            p.getAxis("bottom").setTicks(UNIT_TICKS)
            _style_plot(p, self._fg)
            p.setXRange(0, 1, padding=0.02)
            p.setYRange(0, 1, padding=0)
            p.enableAutoRange(enable=False)
            p.setMouseEnabled(x=False, y=False)
            c = QColor(METRIC_COLOURS[key])
            fill = QColor(c)
            fill.setAlpha(110)
            curve = p.plot(HIST_BINS, np.zeros(len(HIST_BINS) - 1), stepMode="center", fillLevel=0,
                           brush=pg.mkBrush(fill), pen=pg.mkPen(c, width=1.5))
            self.hist_plots[key] = p
            self.histograms[key] = curve

    # ---- live -----------------------------------------------------------------------------
    def start_live(self, total: int) -> None:
        """Clear the running curves and histograms and start refreshing at 10 Hz."""
        self.total = int(total)
        self.buffer = RunningBuffer(max(16, self.total))
        self.set_pr(None)
        self._dirty = True
        self._live = True
        self.running_plot.setXRange(1, max(2, self.total), padding=0.01)
        self.refresh()
        self.timer.start()

    def add_step(self, step) -> None:
        """Append an ``EvalStep`` (called from the progress callback; no drawing here)."""
        rec = step.record
        if rec is None:
            return
        self.buffer.append(float(step.done), step.running, rec.metrics)
        self._dirty = True

    def stop_live(self) -> None:
        self._live = False
        self.timer.stop()
        self.refresh()

    @property
    def live(self) -> bool:
        return self._live

    def refresh(self) -> None:
        """Push the buffers to the curves (the timer's slot; cheap when nothing changed)."""
        if not self._dirty:
            return
        self._dirty = False
        b = self.buffer
        x = b.x
        for m, curve in self.running_curves.items():
            curve.setData(x, b.series(m), connect="finite")
        for key, hist in self.histograms.items():
            hist.setData(HIST_BINS, _histogram(b.per_query(key)), stepMode="center")
        for key, p in self.hist_plots.items():
            top = max(1.0, float(np.max(self.histograms[key].yData)) if len(b) else 1.0)
            p.setYRange(0, top * 1.08, padding=0)

    # ---- finished runs ----------------------------------------------------------------------
    def show_buffer(self, buffer: RunningBuffer | None, total: int | None = None) -> None:
        """Show a finished run's running means and histograms (``None``: clear)."""
        self.timer.stop()
        self._live = False
        self.buffer = buffer.copy() if buffer is not None else RunningBuffer()
        self.total = int(total) if total is not None else (int(self.buffer.x.max()) if len(self.buffer) else 0)
        self.running_plot.setXRange(1, max(2, self.total), padding=0.01)
        self._dirty = True
        self.refresh()

    def set_pr(self, pr: tuple[np.ndarray, np.ndarray] | None, colour: str | None = None) -> None:
        """The precision–recall curve of the run shown (None: none yet) in ``colour``, the run's."""
        c = colour or RUN_COLOURS[0]
        self._main_colour = c
        if pr is None:
            self.pr_curve.setData([], [])
            return
        recall, precision = pr
        self.pr_curve.setData(np.asarray(recall, float), np.asarray(precision, float))
        self.pr_curve.setPen(pg.mkPen(c, width=2.5))
        self.pr_curve.setSymbolBrush(c)

    def set_overlays(self, overlays: Iterable[Overlay], main_name: str | None = None) -> None:
        """Draw other runs: dashed running curves (metric colours) and PR curves (run colours);
        the legend names the run shown (``main_name``) and the others. Curves of runs already
        drawn are updated, not made again (creating plot items is what costs here: a cancel
        restores the plots at once)."""
        overlays = list(overlays)
        entries: list[tuple[str, str, Qt.PenStyle]] = []
        if main_name:
            entries.append((main_name, self._main_colour, Qt.PenStyle.SolidLine))
        metrics = self._metric_pens()
        wanted_running = {ov.key for ov in overlays if ov.buffer is not None and len(ov.buffer)}
        wanted_pr = {ov.key for ov in overlays if ov.pr is not None}
        for key in [k for k in self.running_overlays if k not in wanted_running]:
            for c in self.running_overlays.pop(key).values():
                self.running_plot.removeItem(c)
        for key in [k for k in self.pr_overlays if k not in wanted_pr]:
            self.pr_plot.removeItem(self.pr_overlays.pop(key))
        for ov in overlays:
            dash = DASHES[ov.dash % len(DASHES)]
            if ov.key in wanted_running:
                items = self.running_overlays.get(ov.key)
                for m in METRICS:
                    pen = run_pen(METRIC_COLOURS[m], dash)
                    if items is None or m not in items:
                        items = items if items is not None else {}
                        items[m] = self.running_plot.plot(ov.buffer.x, ov.buffer.series(m), connect="finite", pen=pen)
                        items[m].setZValue(-1)
                    else:
                        items[m].setData(ov.buffer.x, ov.buffer.series(m), connect="finite")
                        items[m].setPen(pen)
                self.running_overlays[ov.key] = items
            if ov.key in wanted_pr:
                x, y = np.asarray(ov.pr[0], float), np.asarray(ov.pr[1], float)
                pen = run_pen(ov.colour, dash)
                c = self.pr_overlays.get(ov.key)
                if c is None:
                    c = self.pr_plot.plot(x, y, pen=pen)
                    c.setZValue(-1)
                    self.pr_overlays[ov.key] = c
                else:
                    c.setData(x, y)
                    c.setPen(pen)
            if ov.key in wanted_running or ov.key in wanted_pr:
                entries.append((ov.name, ov.colour, dash))
        self.legend.set_entries(entries, metrics, self._fg)

    def _metric_pens(self) -> list[tuple[str, QPen]]:
        """(label, pen) of the running means of the run shown (the legend's first line)."""
        return [(METRIC_LABELS[m], self.running_curves[m].opts["pen"]) for m in METRICS]

    def histogram_counts(self, key: str) -> np.ndarray:
        y = self.histograms[key].yData
        return np.zeros(len(HIST_BINS) - 1) if y is None else np.asarray(y)


class SweepPlot(pg.PlotWidget):
    """:data:`SWEEP_METRICS` (MAP and MP@1) against the swept ICFRR parameter (points added as they arrive)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        pal = self.palette()
        fg = pal.color(QPalette.ColorRole.WindowText)
        self.setBackground(pal.color(QPalette.ColorRole.Base))
        plot = self.getPlotItem()
        _style_plot(plot, fg)
        _title(plot, "ICFRR sweep: " + " · ".join(_coloured(METRIC_LABELS[m], METRIC_COLOURS[m])
                                                  for m in SWEEP_METRICS), fg)
        plot.setYRange(0, 1, padding=0.02)
        plot.enableAutoRange(axis="y", enable=False)
        self.sweep_curves: dict[str, pg.PlotDataItem] = {}
        for m in SWEEP_METRICS:
            c = METRIC_COLOURS[m]
            self.sweep_curves[m] = plot.plot([], [], pen=pg.mkPen(c, width=2),
                                             symbol="o", symbolSize=7, symbolBrush=c, symbolPen=None)
        self.values: list[float] = []
        self.points: dict[str, list[float]] = {m: [] for m in SWEEP_METRICS}
        self._fg = fg

    def start(self, parameter_label: str, integer: bool = False) -> None:
        """Clear; ``integer``: the parameter takes whole values (ticks on whole numbers only)."""
        plot = self.getPlotItem()
        if isinstance(plot.getAxis("bottom"), IntegerAxis) != integer:
            plot.setAxisItems({"bottom": IntegerAxis("bottom") if integer else pg.AxisItem("bottom")})
            ax = plot.getAxis("bottom")
            ax.setPen(pg.mkPen(self._fg))
            ax.setTextPen(pg.mkPen(self._fg))
        plot.setLabel("bottom", parameter_label, color=self._fg)
        self.values = []
        self.points = {m: [] for m in SWEEP_METRICS}
        for c in self.sweep_curves.values():
            c.setData([], [])

    def add_point(self, value: float, summary: dict) -> None:
        self.values.append(float(value))
        for m in self.points:
            self.points[m].append(float(summary.get(m, np.nan)))
        order = np.argsort(self.values, kind="stable")
        x = np.asarray(self.values)[order]
        for m, c in self.sweep_curves.items():
            c.setData(x, np.asarray(self.points[m])[order], connect="finite")
        if len(x):
            lo, hi = float(x[0]), float(x[-1])
            self.getPlotItem().setXRange(lo - 0.5 if lo == hi else lo, hi + 0.5 if lo == hi else hi, padding=0.05)

    def set_points(self, parameter_label: str, values: Sequence[float], summaries: Sequence[dict],
                   integer: bool = False) -> None:
        self.start(parameter_label, integer)
        for v, s in zip(values, summaries):
            self.add_point(v, s)


#: The verdict's figures (keys of ``verdict.operating_points``) → (legend label, colour).
VERDICT_CURVES = {
    "unknown_rejected": ("unknown objects rejected", "#2ca02c"),
    "known_rejected": ("known objects wrongly rejected", "#d62728"),
    "accuracy": ("accuracy", "#1f77b4"),
}


class VerdictPlot(pg.PlotWidget):
    """The verdict's figures against its threshold: the confidence of a calibrated verdict, else
    inliers when verified, the cosine when not."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        pal = self.palette()
        self._fg = pal.color(QPalette.ColorRole.WindowText)
        self.setBackground(pal.color(QPalette.ColorRole.Base))
        plot = self.getPlotItem()
        _style_plot(plot, self._fg)
        _title(plot, "Verdict: “in this collection” against its threshold", self._fg)
        plot.setLabel("left", "share of queries", color=self._fg)
        plot.setYRange(-0.02, 1.06, padding=0)  # a line at 1 clear of the frame
        plot.enableAutoRange(axis="y", enable=False)
        plot.setMouseEnabled(x=True, y=False)
        self.verdict_curves: dict[str, pg.PlotDataItem] = {
            key: plot.plot([], [], name=label, pen=pg.mkPen(colour, width=2), connect="finite")
            for key, (label, colour) in VERDICT_CURVES.items()}
        #: the curves named outside the plot, wrapped to the width there is (the caller places it):
        #: a legend in the plot was cut at 1024 and 1280 px ("wn objects rejected")
        self.legend = QLabel("&nbsp;&nbsp; ".join(
            f"<span style='color:{colour}'>━━</span>&nbsp;{label.replace(' ', '&nbsp;')}"
            for label, colour in VERDICT_CURVES.values()))
        self.legend.setObjectName("verdictLegend")
        self.legend.setWordWrap(True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        label_opts = {"position": 0.8, "color": self._fg, "fill": pg.mkBrush(pal.color(QPalette.ColorRole.Base)),
                      "movable": False}
        self.threshold_line = pg.InfiniteLine(angle=90, pen=pg.mkPen(self._fg, width=1.5), label="in use: {value:g}",
                                              labelOpts=label_opts)
        self.candidate_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#ff7f0e", width=1.5, style=Qt.PenStyle.DashLine),
                                              label="chosen: {value:g}", labelOpts={**label_opts, "position": 0.7})
        for line in (self.threshold_line, self.candidate_line):
            plot.addItem(line, ignoreBounds=True)
            line.setVisible(False)

    def set_points(self, points: dict[str, np.ndarray] | None, threshold: float | None = None,
                   verified: bool = True, confidence: bool = False) -> None:
        """Show ``operating_points(...)`` (``None``: clear) and the threshold in use.

        ``confidence``: the threshold is the calibrated verdict's confidence (0..1), not a count of
        matching points or a cosine."""
        plot = self.getPlotItem()
        plot.setLabel("bottom", "threshold: confidence (model refitted here)" if confidence else
                      "threshold: matching points" if verified else "threshold: cosine (not verified)",
                      color=self._fg)
        x = np.asarray(points["threshold"] if points is not None else [], float)
        for key, curve in self.verdict_curves.items():
            # steps: the figure at threshold t holds for every threshold in (the one before t, t]
            curve.setData(x, np.asarray(points[key] if points is not None else [], float), connect="finite",
                          stepMode="left")
        self.set_line(self.threshold_line, threshold if points is not None else None)
        self.set_candidate(None)
        if len(x) > 2:
            # where the decision is made: inliers up to a few times the threshold (pan or zoom for
            # the rest); cosines from the lowest one seen (the curves are flat below it)
            if confidence:
                lo, hi = 0.0, 1.0
            elif verified:
                lo, hi = 0.0, min(x[-1], 3 * max(threshold or 0, 10))
            else:
                lo, hi = x[1] - 0.02, x[-1]
            plot.setXRange(float(lo), float(hi), padding=0.02)

    def set_candidate(self, value: float | None) -> None:
        """The operating point a re-calibration would store (``None``: hide); shown in the view."""
        self.set_line(self.candidate_line, value)
        (lo, hi), _ = self.getPlotItem().viewRange()
        if value is not None and not lo <= value <= hi:
            self.getPlotItem().setXRange(min(lo, value), max(hi, value + 0.1 * (hi - lo)), padding=0.02)

    @staticmethod
    def set_line(line: pg.InfiniteLine, value: float | None) -> None:
        line.setVisible(value is not None)
        if value is not None:
            line.setValue(float(value))
