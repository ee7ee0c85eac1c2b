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
``histograms["ap" | "mnro"]`` (step curves: ``getData()`` gives bin edges and counts),
``pr_curve``, ``running_overlays[key][metric]``, ``pr_overlays[key]``.

:class:`SweepPlot` plots MAP and MP@1 against an ICFRR parameter (``sweep_curves``).

:class:`VerdictPlot` plots the "in this collection" verdict's figures against its threshold
(``verdict.operating_points``: ``verdict_curves[key]`` for ``VERDICT_CURVES``), with vertical lines
at the threshold in use (``threshold_line``) and at a candidate operating point (``candidate_line``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QWidget

__all__ = [
    "METRICS", "METRIC_LABELS", "METRIC_COLOURS", "RUN_COLOURS", "HIST_BINS",
    "RunningBuffer", "Overlay", "EvaluationPlots", "SweepPlot", "VerdictPlot", "VERDICT_CURVES", "IntegerAxis",
    "run_colour",
]

#: Running means plotted live (keys of ``EvalStep.running``).
METRICS = ("mp@1", "map", "amnro")
METRIC_LABELS = {"mp@1": "MP@1", "map": "MAP", "amnro": "AMNRO"}
METRIC_COLOURS = {"mp@1": "#1f77b4", "map": "#2ca02c", "amnro": "#d62728"}
#: Colours of compared runs (PR curves, list icons), cycled.
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
#: Dash patterns of compared runs' running curves, cycled.
DASHES = (Qt.PenStyle.DashLine, Qt.PenStyle.DotLine, Qt.PenStyle.DashDotLine, Qt.PenStyle.DashDotDotLine)
#: Histogram bin edges of per-query AP and MNRO (both in [0, 1]).
HIST_BINS = np.linspace(0.0, 1.0, 11)
REFRESH_MS = 100


def run_colour(i: int) -> str:
    return RUN_COLOURS[i % len(RUN_COLOURS)]


class RunningBuffer:
    """Running means and per-query AP/MNRO of a run, appended one query at a time.

    Arrays grow by doubling (amortized O(1) append); the properties are views of the filled part.
    """

    def __init__(self, capacity: int = 64):
        self._n = 0
        self._data = np.full((6, max(1, int(capacity))), np.nan)  # x, mp@1, map, amnro, ap, mnro

    def __len__(self) -> int:
        return self._n

    def clear(self, capacity: int | None = None) -> None:
        self._n = 0
        if capacity is not None and capacity > self._data.shape[1]:
            self._data = np.full((6, int(capacity)), np.nan)

    def append(self, x: float, running: dict, ap: float, mnro: float) -> None:
        if self._n >= self._data.shape[1]:
            grown = np.full((6, self._data.shape[1] * 2), np.nan)
            grown[:, : self._n] = self._data
            self._data = grown
        self._data[:, self._n] = (x, running.get("mp@1", np.nan), running.get("map", np.nan),
                                  running.get("amnro", np.nan), ap, mnro)
        self._n += 1

    @property
    def x(self) -> np.ndarray:
        return self._data[0, : self._n]

    def series(self, metric: str) -> np.ndarray:
        return self._data[1 + METRICS.index(metric), : self._n]

    @property
    def ap(self) -> np.ndarray:
        """Per-query AP of the evaluated queries so far (open-set queries dropped)."""
        v = self._data[4, : self._n]
        return v[~np.isnan(v)]

    @property
    def mnro(self) -> np.ndarray:
        v = self._data[5, : self._n]
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

    def tickSpacing(self, minVal, maxVal, size):  # noqa: N802, N803 - pyqtgraph API
        levels = [(spacing, offset) for spacing, offset in super().tickSpacing(minVal, maxVal, size) if spacing >= 1]
        return levels or [(1.0, 0.0)]


def _legend(plot: pg.PlotItem, fg: QColor, bg: QColor, columns: int = 1) -> pg.LegendItem:
    fill = QColor(bg)
    fill.setAlpha(215)
    return plot.addLegend(labelTextColor=fg, verSpacing=-4, colCount=columns, brush=pg.mkBrush(fill),
                          pen=pg.mkPen(QColor(fg).lighter(250)))


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
    """Running MP@1/MAP/AMNRO (wide), AP and MNRO histograms, and the precision–recall curve."""

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

        # running means
        self.running_plot: pg.PlotItem = self.addPlot(row=0, col=0, colspan=3,
                                                      axisItems={"bottom": IntegerAxis("bottom")})
        self.running_plot.setTitle("Running means", color=self._fg, size="10pt")
        self.running_plot.setLabel("bottom", "queries processed", color=self._fg)
        _style_plot(self.running_plot, self._fg)
        self.running_plot.setRange(xRange=(1, 10), yRange=(0.0, 1.0), padding=0.02)
        self.running_plot.enableAutoRange(axis="y", enable=False)
        self.running_plot.setMouseEnabled(x=True, y=False)
        self.running_plot.setDownsampling(mode="peak")
        self.running_plot.setClipToView(True)
        # one row, right, half-way up: running MP@1 and MAP are usually high and AMNRO low
        self.running_legend = _legend(self.running_plot, self._fg, self._bg, columns=4)
        self.running_legend.anchor(itemPos=(1, 0.5), parentPos=(1, 0.5), offset=(-10, 0))
        self.running_curves: dict[str, pg.PlotDataItem] = {}
        for m in METRICS:
            self.running_curves[m] = self.running_plot.plot(
                [], [], name=METRIC_LABELS[m], pen=pg.mkPen(METRIC_COLOURS[m], width=2), connect="finite")
        self.running_overlays: dict[object, dict[str, pg.PlotDataItem]] = {}
        self._legend_samples: list[pg.PlotDataItem] = []

        # precision–recall
        self.pr_plot: pg.PlotItem = self.addPlot(row=1, col=2)
        self.pr_plot.setTitle("Precision–recall (11-point)", color=self._fg, size="10pt")
        self.pr_plot.setLabel("bottom", "recall", color=self._fg)
        self.pr_plot.setLabel("left", "precision", color=self._fg)
        _style_plot(self.pr_plot, self._fg)
        self.pr_plot.setRange(xRange=(0, 1), yRange=(0, 1), padding=0.02)
        self.pr_plot.enableAutoRange(enable=False)
        self.pr_plot.setMouseEnabled(x=False, y=False)
        # bottom left: precision is usually high at low recall
        self.pr_legend = _legend(self.pr_plot, self._fg, self._bg)
        self.pr_legend.anchor(itemPos=(0, 1), parentPos=(0, 1), offset=(10, -10))
        self.pr_curve = self.pr_plot.plot([], [], pen=pg.mkPen(RUN_COLOURS[0], width=2.5), symbol="o",
                                          symbolSize=5, symbolBrush=RUN_COLOURS[0], symbolPen=None)
        self.pr_overlays: dict[object, pg.PlotDataItem] = {}
        self.pr_legend.setVisible(False)

        # histograms
        self.hist_plots: dict[str, pg.PlotItem] = {}
        self.histograms: dict[str, pg.PlotDataItem] = {}
        for col, (key, title, colour) in enumerate((
            ("ap", "Per-query AP (higher is better)", METRIC_COLOURS["map"]),
            ("mnro", "Per-query MNRO (lower is better)", METRIC_COLOURS["amnro"]),
        )):
            p = self.addPlot(row=1, col=col, axisItems={"left": IntegerAxis("left")})
            p.setTitle(title, color=self._fg, size="10pt")
            p.setLabel("left", "queries", color=self._fg)
            _style_plot(p, self._fg)
            p.setXRange(0, 1, padding=0.02)
            p.setYRange(0, 1, padding=0)
            p.enableAutoRange(enable=False)
            p.setMouseEnabled(x=False, y=False)
            c = QColor(colour)
            fill = QColor(c)
            fill.setAlpha(110)
            curve = p.plot(HIST_BINS, np.zeros(len(HIST_BINS) - 1), stepMode="center", fillLevel=0,
                           brush=pg.mkBrush(fill), pen=pg.mkPen(c, width=1.5))
            self.hist_plots[key] = p
            self.histograms[key] = curve
        self.ci.layout.setColumnStretchFactor(0, 1)
        self.ci.layout.setColumnStretchFactor(1, 1)
        self.ci.layout.setColumnStretchFactor(2, 1)
        self.ci.layout.setRowStretchFactor(0, 1)
        self.ci.layout.setRowStretchFactor(1, 1)

        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self.refresh)

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
        self.buffer.append(float(step.done), step.running, rec.metrics.get("ap", np.nan),
                           rec.metrics.get("mnro", np.nan))
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
        self.histograms["ap"].setData(HIST_BINS, _histogram(b.ap), stepMode="center")
        self.histograms["mnro"].setData(HIST_BINS, _histogram(b.mnro), stepMode="center")
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
        if pr is None:
            self.pr_curve.setData([], [])
            return
        recall, precision = pr
        self.pr_curve.setData(np.asarray(recall, float), np.asarray(precision, float))
        c = colour or RUN_COLOURS[0]
        self.pr_curve.setPen(pg.mkPen(c, width=2.5))
        self.pr_curve.setSymbolBrush(c)

    def set_overlays(self, overlays: Iterable[Overlay], main_name: str | None = None) -> None:
        """Draw other runs: dashed running curves (metric colours) and PR curves (run colours)."""
        for items in self.running_overlays.values():
            for c in items.values():
                self.running_plot.removeItem(c)
        for c in self.pr_overlays.values():
            self.pr_plot.removeItem(c)
        self.running_overlays.clear()
        self.pr_overlays.clear()
        self.pr_legend.clear()
        if main_name:
            self.pr_legend.addItem(self.pr_curve, main_name)
        for sample in self._legend_samples:  # the main metrics stay first in the running legend
            self.running_legend.removeItem(sample)
        self._legend_samples = []
        for ov in overlays:
            dash = DASHES[ov.dash % len(DASHES)]
            if ov.buffer is not None and len(ov.buffer):
                items = {}
                for m in METRICS:
                    items[m] = self.running_plot.plot(
                        ov.buffer.x, ov.buffer.series(m), connect="finite",
                        pen=pg.mkPen(METRIC_COLOURS[m], width=1.5, style=dash))
                    items[m].setZValue(-1)
                self.running_overlays[ov.key] = items
                sample = pg.PlotDataItem([], [], pen=pg.mkPen(self._fg, width=1.5, style=dash))
                self.running_legend.addItem(sample, ov.name)
                self._legend_samples.append(sample)
            if ov.pr is not None:
                c = self.pr_plot.plot(np.asarray(ov.pr[0], float), np.asarray(ov.pr[1], float),
                                      pen=pg.mkPen(ov.colour, width=1.5, style=dash))
                c.setZValue(-1)
                self.pr_overlays[ov.key] = c
                self.pr_legend.addItem(c, ov.name)
        self.pr_legend.setVisible(bool(self.pr_legend.items))

    def histogram_counts(self, key: str) -> np.ndarray:
        y = self.histograms[key].yData
        return np.zeros(len(HIST_BINS) - 1) if y is None else np.asarray(y)


class SweepPlot(pg.PlotWidget):
    """MAP and MP@1 against the swept ICFRR parameter (points added as they arrive)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        pal = self.palette()
        fg = pal.color(QPalette.ColorRole.WindowText)
        self.setBackground(pal.color(QPalette.ColorRole.Base))
        plot = self.getPlotItem()
        _style_plot(plot, fg)
        plot.setTitle("ICFRR sweep", color=fg, size="10pt")
        plot.setYRange(0, 1, padding=0.02)
        plot.enableAutoRange(axis="y", enable=False)
        self.legend = plot.addLegend(offset=(-8, 8), labelTextColor=fg)
        self.sweep_curves: dict[str, pg.PlotDataItem] = {}
        for m in ("map", "mp@1"):
            c = METRIC_COLOURS[m]
            self.sweep_curves[m] = plot.plot([], [], name=METRIC_LABELS[m], pen=pg.mkPen(c, width=2),
                                             symbol="o", symbolSize=7, symbolBrush=c, symbolPen=None)
        self.values: list[float] = []
        self.points: dict[str, list[float]] = {"map": [], "mp@1": []}
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
        self.points = {"map": [], "mp@1": []}
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
    """The verdict's figures against its threshold (inliers when verified, else cosine)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        pal = self.palette()
        self._fg = pal.color(QPalette.ColorRole.WindowText)
        self.setBackground(pal.color(QPalette.ColorRole.Base))
        plot = self.getPlotItem()
        _style_plot(plot, self._fg)
        plot.setTitle("Verdict: “in this collection” against its threshold", color=self._fg, size="10pt")
        plot.setLabel("left", "share of queries", color=self._fg)
        plot.setYRange(0, 1.16, padding=0.02)  # a band above 1 for the legend, clear of the curves
        plot.enableAutoRange(axis="y", enable=False)
        plot.setMouseEnabled(x=True, y=False)
        self.legend = _legend(plot, self._fg, pal.color(QPalette.ColorRole.Base), columns=3)
        self.legend.anchor(itemPos=(0.5, 0), parentPos=(0.5, 0), offset=(0, 4))
        self.verdict_curves: dict[str, pg.PlotDataItem] = {
            key: plot.plot([], [], name=label, pen=pg.mkPen(colour, width=2), connect="finite")
            for key, (label, colour) in VERDICT_CURVES.items()}
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
                   verified: bool = True) -> None:
        """Show ``operating_points(...)`` (``None``: clear) and the threshold in use."""
        plot = self.getPlotItem()
        plot.setLabel("bottom", "threshold: matching points (homography inliers)" if verified else
                      "threshold: cosine (not verified)", color=self._fg)
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
            lo, hi = (0.0, min(x[-1], 3 * max(threshold or 0, 10))) if verified else (x[1] - 0.02, x[-1])
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
