"""The Evaluation tab's verdict page: the verdict's figures against its threshold on a run's
labelled queries (``verdict.operating_points``), and its re-calibration (``recalibrated``) with
the button that stores it in the evaluated index."""

from __future__ import annotations

import html

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QGroupBox,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from museum_search.gui.widgets.comparison_table import pct
from museum_search.gui.widgets.layout import vertical_scroll, with_legend
from museum_search.gui.widgets.plots import VerdictPlot

NO_RUN = "Run an evaluation to see the verdict's figures."
CANNOT_RECALIBRATE = ("Re-calibrating needs queries of objects in the collection and of objects that are not "
                      "(an empty ground truth).")


class VerdictPage(QSplitter):
    """The plot (``verdictPlot``) beside the figures and the re-calibration controls."""

    #: "Store in index" was clicked
    store_clicked = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self._run = None
        self.plot = VerdictPlot()
        self.plot.setObjectName("verdictPlot")
        self.label = QLabel(NO_RUN)
        self.label.setObjectName("verdictFigures")
        self.label.setWordWrap(True)
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.max_known_spin = QDoubleSpinBox(minimum=0.0, maximum=50.0, singleStep=1.0, decimals=1, suffix=" %")
        self.max_known_spin.setObjectName("maxKnownRejected")
        self.max_known_spin.setValue(3.0)
        self.max_known_spin.setToolTip("The threshold that rejects the most unknown objects while wrongly rejecting "
                                       "at most this share of the known ones (on this run's queries)")
        self.max_known_spin.valueChanged.connect(lambda _v: self.show_candidate())
        self.candidate_label = QLabel("")
        self.candidate_label.setObjectName("verdictCandidate")
        self.candidate_label.setWordWrap(True)
        self.store_button = QPushButton("Store in index")
        self.store_button.setObjectName("storeVerdict")
        self.store_button.setToolTip("Use this operating point: store it in the evaluated index, for the "
                                     "Search tab, the kiosk and the command line")
        self.store_button.clicked.connect(lambda: self.store_clicked.emit())
        side = QGroupBox("The verdict on these labelled queries")
        vl = QVBoxLayout(side)
        self.recalibrate_label = QLabel("<b>Re-calibrate</b>: known objects rejected at most")
        self.recalibrate_label.setObjectName("recalibrateLabel")
        self.recalibrate_label.setWordWrap(True)  # whole at any width (it was cut at 1024 and 1280)
        for item in (self.label, self.recalibrate_label, self.max_known_spin, self.candidate_label,
                     self.store_button):
            vl.addWidget(item)
        vl.addStretch(1)
        # the figures and the re-calibration scroll when the page is short, never cut
        scroll = vertical_scroll(side, "verdictSide")
        # as wide as the figures need beside a scroll bar (nothing cut on the right)
        scroll.setMinimumWidth(max(260, side.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width()
                                   + 2))
        # the plot's legend above it, wrapped to its width
        left = with_legend(self.plot)
        for i, (w, stretch) in enumerate(((left, 3), (scroll, 1))):
            self.addWidget(w)
            self.setStretchFactor(i, stretch)
        self.setSizes([700, 320])

    def max_known_rejected(self) -> float:
        """The share of known objects a re-calibration may reject (0..1)."""
        return self.max_known_spin.value() / 100

    def set_max_known_rejected(self, share: float) -> None:
        self.max_known_spin.setValue(100 * share)

    def set_enabled(self, on: bool) -> None:
        """Re-calibrating and storing possible (a run that can be re-calibrated, no job running)."""
        self.store_button.setEnabled(on)
        self.max_known_spin.setEnabled(on)

    def show_run(self, run) -> None:
        """The verdict's figures of ``run`` (an ``EvalRun``; None: none) against its threshold."""
        self._run = run
        if run is None:
            self.plot.set_points(None)
            self.label.setText(NO_RUN)
            self.candidate_label.setText("")
            return
        v, verdict = run.verdict_figures, run.report.verdict
        # a calibrated verdict's curves are those of its model refitted on these queries
        # (``verdict.operating_points``): the threshold in use is on another scale, so it is not drawn
        self.plot.set_points(run.operating_points, None if run.calibrated else verdict.threshold(run.verified),
                             run.verified, confidence=run.calibrated)
        self.label.setText(
            f"<b>In use</b>: {html.escape(verdict.rule(run.verified))}<br><small>{html.escape(v['calibration'])}"
            f"</small><br>Unknown objects rejected: <b>{pct(v['unknown_rejected'])}</b> of {v['unknown_queries']}"
            f"<br>Known objects wrongly rejected: <b>{pct(v['known_rejected'])}</b> of {v['known_queries']}<br>"
            f"Accuracy: <b>{pct(v['accuracy'])}</b> (right answer or right rejection)")
        self.show_candidate()

    def show_candidate(self) -> None:
        """The operating point a re-calibration would store, on the plot and in words."""
        run = self._run
        if run is None or not run.report.can_recalibrate:
            self.plot.set_candidate(None)
            self.candidate_label.setText("" if run is None else CANNOT_RECALIBRATE)
            return
        new, _ = run.report.recalibrated(self.max_known_rejected())
        t = new.threshold(run.verified)
        pts = run.operating_points
        i = int(np.argmin(np.abs(pts["threshold"] - t)))
        self.plot.set_candidate(t)
        self.candidate_label.setText(
            f"→ {new.rule(run.verified)}: on these queries it rejects {pct(pts['unknown_rejected'][i])} of the "
            f"unknown objects and wrongly {pct(pts['known_rejected'][i])} of the known ones "
            f"(accuracy {pct(pts['accuracy'][i])}).")
