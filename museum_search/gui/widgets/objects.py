"""Every object in the photo (core's :attr:`museum_search.core.answer.Answer.objects`), as the Search
tab shows it: "2 objects in this photo" and one card per object (thumbnail, title, confidence band,
reason), each in the colour of its outline on the query photo
(:class:`museum_search.gui.widgets.region_view.RegionView`)::

    cards = ObjectCards()
    cards.set_objects(answer.objects, in_box=False)   # shown only when there are several
    cards.activated.connect(lambda result: ...)        # double-click on a card

The texts a person reads are the module's constants (:data:`SEVERAL_OBJECTS`, ...), as the kiosk's
are (:mod:`museum_search.gui.demo_window`): one place to change or translate them, shared by the
Search tab and the kiosk (:func:`objects_heading`). Which band a confidence falls in is core's
(:func:`museum_search.core.answer.confidence_band`); the outlines' places in the shown image are
core's too (:func:`museum_search.core.answer.in_photo`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPixmap
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from museum_search.core.answer import FoundObject, Result, confidence_band, in_photo
from museum_search.gui.widgets.result_grid import result_title
from museum_search.gui.widgets.thumbnails import ThumbnailCache

#: The heading over the cards when a photo shows several collection objects ({n}: how many).
SEVERAL_OBJECTS = "{n} objects in this photo"
#: The same for a region query (only the box drawn on the photo was asked about).
SEVERAL_OBJECTS_IN_BOX = "{n} objects in the box"
#: How a confidence band reads on a card (core's band names: museum_search.core.answer.CONFIDENCE_BANDS).
BAND_WORDS = {"sure": "sure", "likely": "likely", "might": "might be it"}
#: Outline and card colours, object by object (the first is the evidence view's outline colour).
OBJECT_COLOURS = ("#ffd23f", "#4cc9f0", "#f72585", "#80ed99", "#ff9f1c", "#b8c0ff")
#: The side of a card's thumbnail (px).
THUMB_SIDE = 96


def objects_heading(n: int, in_box: bool = False) -> str:
    """"2 objects in this photo" (``in_box``: "… in the box"); "" for fewer than two objects."""
    if n < 2:
        return ""
    return (SEVERAL_OBJECTS_IN_BOX if in_box else SEVERAL_OBJECTS).format(n=n)


def object_colour(i: int) -> QColor:
    """The colour of the ``i``-th object found (0: the top answer), its outline's and its card's."""
    return QColor(OBJECT_COLOURS[i % len(OBJECT_COLOURS)])


def band_text(confidence: float | None) -> str:
    """"likely · confidence 0.91": core's band in words, then the number ("" without one)."""
    band = confidence_band(confidence)
    if band is None or confidence is None:
        return ""
    return f"{BAND_WORDS.get(band, band)} · confidence {confidence:.2f}"


def outlines_in_image(objects: Sequence[FoundObject], photo_size: tuple[int, int],
                      image_size: tuple[int, int]) -> list[np.ndarray | None]:
    """Each object's outline ((n, 2) x, y) carried from the photo's own pixels (``photo_size``, as
    core gives them) into those of the image shown (``image_size``, width and height); None for an
    object without one (accepted without matching points)."""
    return [None if o.region is None else in_photo(o.region, photo_size, image_size) for o in objects]


class ObjectCard(QFrame):
    """One object found: a colour chip with its number, a thumbnail of its reference, its title,
    its confidence band and the verdict's reason. Double-click emits ``activated`` with its result."""

    activated = Signal(object)  # Result

    def __init__(self, number: int, found: FoundObject, parent: QWidget | None = None):
        super().__init__(parent)
        self.found = found
        colour = object_colour(number - 1).name()
        self.setObjectName("objectCard")
        self.setStyleSheet(f"QFrame#objectCard {{ border: 2px solid palette(mid); border-left: 8px solid {colour};"
                           " border-radius: 5px; background: palette(base); }")
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)
        self.thumb = QLabel("…")
        self.thumb.setObjectName("objectThumb")
        self.thumb.setFixedSize(THUMB_SIDE, THUMB_SIDE)
        self.thumb.setAlignment(Qt.AlignmentFlag.AlignCenter)
        title = result_title(found.result) or found.instance
        chip = f"<span style='background:{colour}; color:#000000'>&nbsp;<b>{number}</b>&nbsp;</span>"
        self.title = QLabel(f"{chip}&nbsp; <b>{html.escape(title)}</b>")
        self.title.setObjectName("objectTitle")
        self.band = QLabel(band_text(found.confidence))
        self.band.setObjectName("objectBand")
        self.reason = QLabel(found.reason)
        self.reason.setObjectName("objectReason")
        self.reason.setForegroundRole(self.reason.foregroundRole())
        for lab in (self.title, self.band, self.reason):
            lab.setWordWrap(True)
        self.reason.setTextFormat(Qt.TextFormat.PlainText)
        self.band.setTextFormat(Qt.TextFormat.PlainText)
        self.setToolTip(f"{found.instance}: {found.result.path}")
        text = QVBoxLayout()
        text.setSpacing(2)
        for lab in (self.title, self.band, self.reason):
            text.addWidget(lab)
        text.addStretch(1)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        lay.addWidget(self.thumb, 0, Qt.AlignmentFlag.AlignTop)
        lay.addLayout(text, 1)

    @property
    def result(self) -> Result:
        return self.found.result

    def set_thumbnail(self, pixmap: QPixmap | None) -> None:
        if pixmap is None or pixmap.isNull():
            self.thumb.setText("no preview")
            return
        self.thumb.setPixmap(pixmap.scaled(THUMB_SIDE, THUMB_SIDE, Qt.AspectRatioMode.KeepAspectRatio,
                                           Qt.TransformationMode.SmoothTransformation))

    def has_thumbnail(self) -> bool:
        pm = self.thumb.pixmap()
        return pm is not None and not pm.isNull()

    def mouseDoubleClickEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.activated.emit(self.found.result)
            event.accept()
            return
        super().mouseDoubleClickEvent(event)


class ObjectCards(QWidget):
    """"N objects in this photo" and a card per object, side by side; hidden unless the photo shows
    several (one object: its result is the answer the tab already shows)."""

    activated = Signal(object)  # Result, on a card's double-click

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("objectCards")
        self.heading = QLabel()
        self.heading.setObjectName("objectsHeading")
        font = self.heading.font()
        font.setBold(True)
        font.setPointSizeF(font.pointSizeF() * 1.1)
        self.heading.setFont(font)
        self._row = QHBoxLayout()
        self._row.setSpacing(8)
        self._cards: list[ObjectCard] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 2, 0, 2)
        lay.addWidget(self.heading)
        lay.addLayout(self._row)
        self._cache = ThumbnailCache.instance()
        self._cache.ready.connect(self._thumbnail_ready)
        self.hide()

    def set_objects(self, objects: Sequence[FoundObject], in_box: bool = False) -> None:
        """Show ``objects`` (the answer's, top first) when there are several; else hide."""
        for card in self._cards:
            self._row.removeWidget(card)
            card.hide()
            card.deleteLater()
        self._cards = []
        several = len(objects) >= 2
        self.heading.setText(objects_heading(len(objects), in_box))
        for i, found in enumerate(objects if several else ()):
            card = ObjectCard(i + 1, found, self)
            card.activated.connect(self.activated)
            self._row.addWidget(card, 1)
            self._cards.append(card)
            pm = self._cache.get(str(found.result.abspath), THUMB_SIDE)
            if pm is not None:
                card.set_thumbnail(pm)
        self.setVisible(several)

    def cards(self) -> list[ObjectCard]:
        return list(self._cards)

    def _thumbnail_ready(self, path: str, size: int) -> None:
        if int(size) != THUMB_SIDE:
            return
        for card in self._cards:
            if str(card.result.abspath) == str(path):
                card.set_thumbnail(self._cache.get(str(path), THUMB_SIDE))
