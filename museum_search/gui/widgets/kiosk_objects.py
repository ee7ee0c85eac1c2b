"""The kiosk's card when the camera's photo shows several collection objects (core's
:attr:`museum_search.core.answer.Answer.objects`): "2 objects in this photo" and a card for each,
side by side (the reference photo, title, artist, year and how sure, in plain words), each edged in
its outline's colour (:func:`museum_search.gui.widgets.objects.object_colour`, as in the Search tab).

The kiosk (:mod:`museum_search.gui.demo_window`) fills it from its recognition (on a worker:
:func:`load_object_photos`) with one :class:`KioskObject` per object; the texts visitors read are
the shared constants of :mod:`museum_search.gui.widgets.objects` and the kiosk's own. Type sizes
follow the kiosk's (:meth:`KioskObjects.restyle` with its size function).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from museum_search.core.answer import FoundObject
from museum_search.core.errors import ImageError
from museum_search.core.images import load_image
from museum_search.gui.widgets.camera_view import ImageView
from museum_search.gui.widgets.objects import object_colour, objects_heading

log = logging.getLogger(__name__)

#: The longest side of each object's reference photo on the card.
OBJECT_PHOTO_SIDE = 960


@dataclass
class KioskObject:
    """What a visitor reads about one object found (the kiosk's catalogue words) and its photo."""

    title: str
    artist: str
    year: str
    words: str  # how sure, in plain words (the kiosk's confidence_words)
    photo: np.ndarray | None  # its reference photo (None: not readable)


def load_object_photos(objects: Sequence[FoundObject], side: int = OBJECT_PHOTO_SIDE) -> list[np.ndarray | None]:
    """The reference photo shown for each object (None where it cannot be read: logged for the
    technician); on a worker thread."""
    photos: list[np.ndarray | None] = []
    for found in objects:
        try:
            photos.append(load_image(found.result.abspath, max_side=side))
        except (ImageError, OSError) as exc:
            log.warning("kiosk: the photo %s of %s cannot be shown: %s", found.result.abspath, found.instance, exc)
            photos.append(None)
    return photos


class _ObjectCard(QFrame):
    """One object: its photo above, its catalogue words below, edged in its outline's colour."""

    def __init__(self, number: int, entry: KioskObject, missing: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("demoObjectCard")
        self.setProperty("colour", object_colour(number - 1).name())
        self.photo = ImageView("", dark=True)
        self.photo.setObjectName("demoObjectPhoto")
        pal = self.photo.palette()
        pal.setColor(QPalette.ColorRole.Dark, QColor("#1c1d22"))
        self.photo.setPalette(pal)
        self.photo.setMinimumSize(QSize(120, 120))
        self.photo.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        if entry.photo is not None:
            self.photo.set_image(entry.photo)
        else:
            self.photo.set_message(missing)
        self.title = QLabel(entry.title)
        self.title.setObjectName("demoObjectTitle")
        self.artist = QLabel(entry.artist)
        self.artist.setObjectName("demoObjectArtist")
        self.year = QLabel(entry.year)
        self.year.setObjectName("demoObjectYear")
        self.confidence = QLabel(entry.words)
        self.confidence.setObjectName("demoObjectConfidence")
        lay = QVBoxLayout(self)
        lay.addWidget(self.photo, 1)
        for lab in (self.title, self.artist, self.year, self.confidence):
            lab.setWordWrap(True)
            lab.setTextFormat(Qt.TextFormat.PlainText)
            lab.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
            lab.setVisible(bool(lab.text()))
            lay.addWidget(lab)


class KioskObjects(QWidget):
    """"N objects in this photo", a card per object side by side, and the footer."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("demoObjects")
        self.heading = QLabel("")
        self.heading.setObjectName("demoObjectsHeading")
        self.footer = QLabel("")
        self.footer.setObjectName("demoObjectsFooter")
        for lab in (self.heading, self.footer):
            lab.setWordWrap(True)
            lab.setTextFormat(Qt.TextFormat.PlainText)
            lab.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self._row = QHBoxLayout()
        self._cards: list[_ObjectCard] = []
        self._radius = 12  # the cards' corners (px; restyle sets it by the kiosk's unit)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.heading)
        lay.addLayout(self._row, 1)
        lay.addWidget(self.footer)

    def show_objects(self, entries: Sequence[KioskObject], footer: str, missing: str) -> None:
        """A card per entry (the answer's objects, top first); ``footer``: what to do next;
        ``missing``: what a card says when its photo cannot be shown."""
        for card in self._cards:
            self._row.removeWidget(card)
            card.hide()
            card.deleteLater()
        self._cards = [_ObjectCard(i + 1, e, missing, self) for i, e in enumerate(entries)]
        for card in self._cards:
            self._row.addWidget(card, 1)
            card.setStyleSheet(self._card_style(card))
        self.heading.setText(objects_heading(len(entries)))
        self.footer.setText(footer)

    def cards(self) -> list[_ObjectCard]:
        return list(self._cards)

    def restyle(self, px: Callable[[float], int]) -> None:
        """Type sizes and spacing by the kiosk's unit (``px(n)``: n px on a 1080-px-high screen)."""
        self._row.setSpacing(px(40))
        self.setStyleSheet(f"""
            QLabel#demoObjectsHeading {{ font-size: {px(56)}px; font-weight: 700; color: #7fd39b; }}
            QLabel#demoObjectsFooter {{ font-size: {px(28)}px; color: #b9b6ae; }}
            QLabel#demoObjectTitle {{ font-size: {px(48)}px; font-weight: 700; }}
            QLabel#demoObjectArtist {{ font-size: {px(34)}px; color: #e8b45a; }}
            QLabel#demoObjectYear {{ font-size: {px(28)}px; color: #b9b6ae; }}
            QLabel#demoObjectConfidence {{ font-size: {px(26)}px; color: #7fd39b; }}
        """)
        self._radius = px(18)
        for card in self._cards:
            card.setStyleSheet(self._card_style(card))

    def _card_style(self, card: _ObjectCard) -> str:
        return (f"QFrame#demoObjectCard {{ border: 3px solid {card.property('colour')}; "
                f"border-radius: {self._radius}px; }}")
