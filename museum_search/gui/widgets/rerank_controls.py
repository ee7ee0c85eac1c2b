"""The query pipeline's re-ranking and verification controls, shared by the Search and the
Evaluation tab: one set of limits for every parameter.

:class:`RerankControls` makes :class:`~museum_search.core.answer._rerank.RerankOptions`, the re-rankers'
names (``QuerySettings.rerank``), the verification switch and its shortlist, and holds the
:class:`.search_mode.SearchModeCombo`. Two arrangements of the same controls:

* ``single=True`` (the Search tab): one re-ranker from a list (*None*, ICFRR, αQE, DBA) and the
  chosen one's parameters beside it, in two rows (:attr:`first_row` takes the tab's own controls
  in front of *Verify*);
* ``single=False`` (the Evaluation tab): re-rankers ticked in the order they are applied, every
  parameter in a compact grid, the ICFRR update rule too.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QGridLayout,
    QLabel,
    QSizePolicy,
    QSpinBox,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.answer import QuerySettings, RerankOptions
from museum_search.gui.widgets.layout import row
from museum_search.gui.widgets.search_mode import SearchModeCombo, wrapped_tip

#: The limits of the parameters, in both tabs.
K_MAX = 10_000
BETA_MAX = 10.0
ITERATIONS_MAX = 100
QE_N_MAX = 100
QE_ALPHA_MAX = 20.0
VERIFY_TOP_MAX = 1_000
#: Re-rankers in the order they are applied (expansion first, then diffusion); verification follows.
RERANKER_ORDER = (("aqe", "αQE"), ("dba", "DBA"), ("icfrr", "ICFRR"))
#: The choices of the single re-ranker list (label, name; "" is none).
SINGLE_CHOICES = (("None", ""), ("ICFRR", "icfrr"), ("αQE", "aqe"), ("DBA", "dba"))
RERANK_TIPS = {"icfrr": "Iterative cluster-free re-ranking: diffusion over the collection",
               "aqe": "α-weighted query expansion", "dba": "Database-side augmentation"}
SINGLE_TIP = ("ICFRR: diffusion over the collection (helps when objects have several photos); "
              "αQE / DBA: query expansion / database-side augmentation")
VERIFY_TIPS = {
    True: "Geometric verification: the top references are matched point by point with the photo. "
          "Slower, but answers are checked, and “not in this collection” is reliable.",
    False: "As the Search tab does: match the top references with the photo (homography inliers); the "
           "verdict then counts matching points instead of the cosine",
}


def _spin(lo: int, hi: int, value: int, tip: str) -> QSpinBox:
    s = QSpinBox(minimum=lo, maximum=hi)
    s.setValue(value)
    s.setToolTip(tip)
    return s


def _dspin(hi: float, step: float, decimals: int, value: float, tip: str) -> QDoubleSpinBox:
    s = QDoubleSpinBox(minimum=0.0, maximum=hi, singleStep=step, decimals=decimals)
    s.setValue(value)
    s.setToolTip(tip)
    return s


class RerankControls(QWidget):
    """Re-rankers, their parameters, verification and the search mode; see the module docstring."""

    #: the re-rankers chosen changed
    choice_changed = Signal()
    #: a parameter (K, β, iterations, n, α, the verified shortlist) changed
    params_changed = Signal()
    #: verification turned on or off
    verify_changed = Signal(bool)

    def __init__(self, single: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.single = single
        self._make_params()
        self.verify_check = QCheckBox("Verify (geometric)" if single else "Verify")
        self.verify_check.setObjectName("verifyCheck" if single else "verify")
        self.verify_check.setChecked(True)
        self.verify_check.setToolTip(wrapped_tip(VERIFY_TIPS[single]))
        self.verify_check.toggled.connect(self._verify_toggled)
        self.search_mode = SearchModeCombo()
        if single:
            self._build_single()
        else:
            self._build_grid()
        self._update_enabled()

    def _make_params(self) -> None:
        d = RerankOptions()
        self.kq_spin = _spin(0, K_MAX, 0, "K_q: how many current top references vote (auto = suggested)")
        self.kg_spin = _spin(0, K_MAX, 0, "K_g: gallery-gallery rank cut-off (auto = suggested)")
        for s in (self.kq_spin, self.kg_spin):
            s.setSpecialValueText("auto")
        self.beta_spin = _dspin(BETA_MAX, 0.05, 2, d.beta, "β: weight of each update")
        self.iter_spin = _spin(1, ITERATIONS_MAX, d.iterations, "Maximum number of updates")
        self.mode_combo = QComboBox()
        self.mode_combo.addItem("paper (Eq. 3)", "paper")
        self.mode_combo.addItem("reference code", "reference")
        self.mode_combo.setToolTip("paper: scores accumulate (Eq. 3); reference: the public code's update")
        self.qe_n_spin = _spin(1, QE_N_MAX, d.qe_n, "n: top references used for expansion")
        self.qe_alpha_spin = _dspin(QE_ALPHA_MAX, 0.5, 1, d.qe_alpha, "α: weighting power of the neighbours")
        self.verify_top_spin = _spin(1, VERIFY_TOP_MAX, QuerySettings().verify_top,
                                     "Top results verified geometrically")
        for s in (self.kq_spin, self.kg_spin, self.beta_spin, self.iter_spin, self.qe_n_spin, self.qe_alpha_spin,
                  self.verify_top_spin):
            s.valueChanged.connect(lambda _v: self.params_changed.emit())
        self.mode_combo.currentIndexChanged.connect(lambda _i: self.params_changed.emit())

    def _build_single(self) -> None:
        """The Search tab's two rows: [… Verify top N] and [Re-ranking: list, its parameters … Search: mode]."""
        self.rerank_combo = QComboBox()
        self.rerank_combo.setObjectName("rerankCombo")
        for label, name in SINGLE_CHOICES:
            self.rerank_combo.addItem(label, name)
        self.rerank_combo.setToolTip(wrapped_tip(SINGLE_TIP))
        self.rerank_combo.currentIndexChanged.connect(self._choice_changed)
        self.param_stack = QStackedWidget()
        self.param_stack.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self._pages = {"": row(), "icfrr": row("K_q", self.kq_spin, "K_g", self.kg_spin, "β", self.beta_spin,
                                                "iterations", self.iter_spin, None),
                       "qe": row("n", self.qe_n_spin, "α", self.qe_alpha_spin, None)}
        for key, layout in self._pages.items():
            page = QWidget()
            layout.setContentsMargins(0, 0, 0, 0)
            page.setLayout(layout)
            self._pages[key] = page
            self.param_stack.addWidget(page)
        self.mode_combo.setParent(self)  # the update rule is the paper's here (not shown)
        self.mode_combo.hide()
        self.first_row = row(self.verify_check, "top", self.verify_top_spin, None)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(self.first_row)
        lay.addLayout(row("Re-ranking:", self.rerank_combo, self.param_stack, None, "Search:", self.search_mode))

    def _build_grid(self) -> None:
        """The Evaluation tab's grid: compact rows, so its panel stays narrow enough for the plots."""
        self.rerank_checks: dict[str, QCheckBox] = {}
        for name, label in RERANKER_ORDER:
            cb = QCheckBox(label)
            cb.setObjectName(f"rerank_{name}")
            cb.setToolTip(RERANK_TIPS[name])
            cb.toggled.connect(self._choice_changed)
            self.rerank_checks[name] = cb
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(self.rerank_checks["icfrr"], 0, 0)
        grid.addLayout(row("K_q", self.kq_spin, "K_g", self.kg_spin, None), 0, 1)
        grid.addLayout(row("β", self.beta_spin, "iterations", self.iter_spin, None), 1, 1)
        grid.addWidget(self.mode_combo, 2, 1)
        grid.addWidget(self.rerank_checks["aqe"], 3, 0)
        grid.addLayout(row(self.rerank_checks["dba"], "n", self.qe_n_spin, "α", self.qe_alpha_spin, None), 3, 1)
        grid.addWidget(self.verify_check, 4, 0)
        grid.addLayout(row("top", self.verify_top_spin, None), 4, 1)
        # exact or approximate (ANN) search (Approximate needs the index's ANN index)
        grid.addWidget(QLabel("Search"), 5, 0)
        grid.addLayout(row(self.search_mode, None), 5, 1)
        grid.setColumnStretch(1, 1)

    # ---- values ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The re-rankers chosen, in the order they are applied."""
        if self.single:
            name = str(self.rerank_combo.currentData() or "")
            return [name] if name else []
        return [n for n, _ in RERANKER_ORDER if self.rerank_checks[n].isChecked()]

    def set_names(self, names: Sequence[str]) -> None:
        """Choose ``names`` (the others not); ValueError for an unknown one (or, in the single list,
        more than one)."""
        names = [n.lower() for n in names if n]
        known = {n for _, n in SINGLE_CHOICES if n}
        if any(n not in known for n in names) or (self.single and len(names) > 1):
            raise ValueError(f"unknown re-ranker choice {names!r}")
        if self.single:
            self.rerank_combo.setCurrentIndex(self.rerank_combo.findData(names[0] if names else ""))
            return
        for n, cb in self.rerank_checks.items():
            cb.setChecked(n in names)

    def options(self) -> RerankOptions:
        return RerankOptions(
            k_q=self.kq_spin.value() or None, k_g=self.kg_spin.value() or None, beta=float(self.beta_spin.value()),
            iterations=int(self.iter_spin.value()), icfrr_mode=self.mode_combo.currentData(),
            qe_n=int(self.qe_n_spin.value()), qe_alpha=float(self.qe_alpha_spin.value()),
        )

    def set_options(self, options: RerankOptions, quiet: bool = False) -> None:
        """Show ``options``; ``quiet``: without :attr:`params_changed` (a suggestion, not a change)."""
        values = ((self.kq_spin, options.k_q or 0), (self.kg_spin, options.k_g or 0),
                  (self.beta_spin, options.beta), (self.iter_spin, options.iterations),
                  (self.qe_n_spin, options.qe_n), (self.qe_alpha_spin, options.qe_alpha))
        for spin, value in values:
            spin.blockSignals(quiet)
            spin.setValue(value)
            spin.blockSignals(False)
        self.mode_combo.blockSignals(quiet)
        self.mode_combo.setCurrentIndex(max(0, self.mode_combo.findData(options.icfrr_mode)))
        self.mode_combo.blockSignals(False)
        if not quiet:
            self.params_changed.emit()

    def verify(self) -> bool:
        return self.verify_check.isChecked()

    def set_verify(self, on: bool) -> None:
        self.verify_check.setChecked(on)

    def verify_top(self) -> int:
        return int(self.verify_top_spin.value())

    # ---- internals ------------------------------------------------------------------------
    def _choice_changed(self, *_args) -> None:
        self._update_enabled()
        self.choice_changed.emit()

    def _verify_toggled(self, on: bool) -> None:
        self._update_enabled()
        self.verify_changed.emit(on)

    def _update_enabled(self) -> None:
        names = self.names()
        if self.single:
            self.param_stack.setCurrentWidget(self._pages["qe" if names and names[0] in ("aqe", "dba")
                                                          else (names[0] if names else "")])
        else:
            for w in (self.kq_spin, self.kg_spin, self.beta_spin, self.iter_spin, self.mode_combo):
                w.setEnabled("icfrr" in names)
            for w in (self.qe_n_spin, self.qe_alpha_spin):
                w.setEnabled("aqe" in names or "dba" in names)
        self.verify_top_spin.setEnabled(self.verify_check.isChecked())
