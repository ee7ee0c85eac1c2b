"""How the global scores are computed: ``QuerySettings.search`` ("auto", "exact" or "ann").

:class:`SearchModeCombo` offers *Automatic*, *Exact* and *Approximate (large collections)*. The
approximate choice needs the index's approximate-search index (``index.ann``, built by core for
large collections): without one it is disabled, and its tooltip says why, in plain words, and what
(not) to do. What *Automatic* does for the open index is ``core.index.resolve_mode("auto", …)``, said
in its tooltip. The tooltips are rich text at most :data:`TIP_WIDTH` px wide (:func:`wrapped_tip`).
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QComboBox, QWidget

#: (label, QuerySettings.search)
SEARCH_MODES = (
    ("Automatic", "auto"),
    ("Exact", "exact"),
    ("Approximate (large collections)", "ann"),
)
EXACT_TIP = "Exact: the query is compared with every reference (the reference result; slower on a large collection)."
#: Width (px) a tooltip's lines wrap at.
TIP_WIDTH = 400


def wrapped_tip(*paragraphs: str) -> str:
    """Plain-text ``paragraphs`` as a rich-text tooltip that wraps at :data:`TIP_WIDTH` px (a plain
    tooltip is one line, however long)."""
    body = "".join(f"<p>{html.escape(p)}</p>" for p in paragraphs if p)
    return f"<table width={TIP_WIDTH}><tr><td>{body}</td></tr></table>"


def _auto_min() -> int | None:
    try:
        from museum_search.core.index import AUTO_MIN_REFERENCES
    except ImportError:  # faiss or the module missing: no approximate search at all
        return None
    return int(AUTO_MIN_REFERENCES)


def resolved_mode(index) -> str:
    """What *Automatic* does for ``index``: "exact" or "ann" (core's rule)."""
    if index is None:
        return "exact"
    try:
        from museum_search.core.index import resolve_mode

        return resolve_mode("auto", len(index), getattr(index, "ann", None))
    except Exception:
        return "exact"


def no_ann_reason(index) -> str | None:
    """Why *Approximate* cannot be chosen for ``index``, and what to do, in plain words (paragraphs
    separated by blank lines); None: it can."""
    if index is None:
        return "Open an index first."
    if getattr(index, "ann", None) is not None:
        return None
    auto_min = _auto_min()
    if auto_min is None:
        return ("Approximate search is not part of this installation, so every search is exact.\n\n"
                "Nothing needs doing: exact search gives the best results. Large collections are "
                "searched faster once approximate search is installed (the faiss-cpu package).")
    return (f"Not available: this collection has no approximate-search index. One is made only for "
            f"collections of {auto_min:,} references or more, and this one has {len(index):,}.\n\n"
            "Nothing needs doing: at this size exact search is fast, and it is what is used.\n\n"
            "To have one anyway, build the index again from the command line with the "
            "“--ann yes” option.")


class SearchModeCombo(QComboBox):
    """Automatic / Exact / Approximate (large collections); :meth:`mode` is ``QuerySettings.search``."""

    #: the mode chosen ("auto", "exact" or "ann")
    mode_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("searchMode")
        for label, mode in SEARCH_MODES:
            self.addItem(label, mode)
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.setMinimumContentsLength(11)  # "Automatic" fits; the list shows the long labels
        self._index = None
        self._wanted = "auto"  # what the user chose (kept if an index without ANN comes and goes)
        self._tips: dict[str, str] = {}  # mode → its tooltip as plain text (paragraphs split by blank lines)
        self.currentIndexChanged.connect(self._changed)
        self.set_index(None)

    def mode(self) -> str:
        return str(self.currentData() or "auto")

    def set_mode(self, mode: str) -> None:
        """Choose ``mode`` (ValueError if unknown; an unavailable "ann" falls back to "auto")."""
        i = self.findData(mode)
        if i < 0:
            raise ValueError(f"unknown search mode {mode!r}")
        self._wanted = mode
        self._select(mode)

    def is_available(self, mode: str) -> bool:
        i = self.findData(mode)
        item = self._item(i)
        return i >= 0 and (item is None or item.isEnabled())

    def set_index(self, index) -> None:
        """Enable the choices ``index`` allows and say in the tooltips what they do for it."""
        self._index = index
        reason = no_ann_reason(index)
        ann = self.findData("ann")
        item = self._item(ann)
        if item is not None:
            item.setEnabled(reason is None)
        ann_tip = reason or ("Approximate: the approximate-search index proposes candidates, scored exactly "
                             f"({index.ann.summary() if hasattr(index.ann, 'summary') else 'faiss'}). "
                             "Much faster on a large collection; the top results may rarely differ from Exact.")
        self._tips = {"ann": ann_tip, "exact": EXACT_TIP}
        self.setItemData(ann, wrapped_tip(*ann_tip.split("\n\n")), Qt.ItemDataRole.ToolTipRole)
        self.setItemData(self.findData("exact"), wrapped_tip(EXACT_TIP), Qt.ItemDataRole.ToolTipRole)
        auto_min = _auto_min()
        rule = ("approximate when the index's approximate-search index was measured at build time both faster "
                "than exact search and finding at least 95% of its top 10 (an index built before that "
                f"measurement: from {auto_min:,} references), else exact" if auto_min is not None
                else "exact (approximate search is not installed)")
        now = ""
        if index is not None:
            now = f" For this index: {'approximate' if resolved_mode(index) == 'ann' else 'exact'}."
            tuning = getattr(getattr(getattr(index, "ann", None), "params", None), "tuning", None)
            if tuning is not None:
                now += f" Measured at build time: {tuning.summary()}."
        self._tips["auto"] = f"Automatic: {rule}.{now}"
        self.setItemData(self.findData("auto"), wrapped_tip(self._tips["auto"]), Qt.ItemDataRole.ToolTipRole)
        self._select(self._wanted)
        self._update_tooltip()

    # ---- internals ---------------------------------------------------------------------------
    def _item(self, i: int):
        model = self.model()
        return model.item(i) if isinstance(model, QStandardItemModel) and i >= 0 else None

    def _select(self, mode: str) -> None:
        if not self.is_available(mode):
            mode = "auto"
        i = self.findData(mode)
        if i != self.currentIndex():
            self.blockSignals(True)
            self.setCurrentIndex(i)
            self.blockSignals(False)
            self._update_tooltip()
            self.mode_changed.emit(self.mode())

    def _changed(self, _i: int) -> None:
        self._wanted = self.mode()
        self._update_tooltip()
        self.mode_changed.emit(self.mode())

    def _update_tooltip(self) -> None:
        tips = [self._tips.get(mode, "") for _label, mode in SEARCH_MODES]
        paragraphs = [p for t in tips for p in t.split("\n\n")]
        self.setToolTip(wrapped_tip("How the query is compared with the references.", *paragraphs))
