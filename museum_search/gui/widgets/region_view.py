"""The Search tab's query photo: the outline of every object found, each in its card's colour, and
a box the user draws to ask about a part of the photo only (a region query).

:class:`RegionView` paints the whole photo (an :class:`ImageView`), the objects' outlines over it
and the box asked about (the rest of the photo dimmed). A mouse drag draws a box and emits
``region_drawn`` with it in the photo's own pixels (x, y, width, height, as ``query --region``
takes them); Escape emits ``region_cleared``. The view never cuts the photo: the tab asks core for
the region's query (:func:`region_query`: :func:`museum_search.core.answer.load_query` with the
region for a file, :meth:`museum_search.core.answer.QueryImage.cropped` for a pasted photo or a
camera frame), and core reports what it finds in the whole photo's pixels, which is what is drawn.
Points are carried between the photo's pixels and the shown image's by core's
:func:`museum_search.core.answer.in_photo`.

:class:`RegionBar` says whether a box is asked about, and its "Whole photo" button clears it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPen, QPolygonF
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from museum_search.core.answer import FoundObject, QueryImage, check_region, in_photo, load_query
from museum_search.gui.widgets.camera_view import ImageView
from museum_search.gui.widgets.objects import object_colour, outlines_in_image

#: A drag shorter than this (screen px, either side) is a click, not a box.
MIN_DRAG = 8
#: What the bar under the photo says without a box, and with one ({w}, {h}, {x}, {y}: the box in
#: the photo's pixels).
DRAW_HINT = "Drag a box on the photo to ask about that part only."
ASKED_BOX = "Asked about the box only: {w}×{h} px at ({x}, {y}). Esc or “Whole photo” asks about all of it."
WHOLE_PHOTO = "Whole photo"
#: The verdict banner's first words for a region query's answer.
FOR_THE_BOX = "For the box drawn on the photo: "
REGION_COLOUR = QColor("#ffffff")

Region = tuple[float, float, float, float]


def region_query(whole: QueryImage, path: str | None, region: Region | None) -> QueryImage:
    """The query of ``region`` (x, y, w, h in the photo's pixels; None: all of it) of the photo
    ``whole`` (decoded from the file ``path``, if any), through core: a file is decoded again for
    the part (``load_query(path, region)``, as ``query --region``), a pasted photo or a camera frame
    is cut from its decoded image (``whole.cropped(region)``). Raises core's ``RegionError`` for a
    box outside the photo or empty."""
    if region is None:
        return whole
    if path is not None:
        return load_query(path, region)
    return whole.cropped(region)


class RegionView(ImageView):
    """The query photo with the objects' outlines and the box asked about; see the module docstring."""

    region_drawn = Signal(tuple)  # (x, y, w, h) in the photo's pixels
    region_cleared = Signal()

    def __init__(self, placeholder: str = "", parent: QWidget | None = None, **kwargs):
        super().__init__(placeholder, parent, **kwargs)
        self._photo_size: tuple[int, int] | None = None  # the photo's own size (width, height)
        self._outlines: list[tuple[np.ndarray, QColor]] = []  # in the shown image's pixels
        self._region: Region | None = None  # in the photo's pixels
        self._drag: tuple[QPointF, QPointF] | None = None  # widget coordinates
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # Escape reaches it once the user drew
        self.setCursor(Qt.CursorShape.CrossCursor)
        self.setToolTip(DRAW_HINT)

    # ---- content -------------------------------------------------------------------------
    def set_query(self, whole: QueryImage, region: Region | None = None) -> None:
        """Show the photo ``whole`` (its decoded image), no outline, and ``region`` asked about (None: all)."""
        self.set_image(whole.image)
        self._photo_size = whole.photo_size
        self._outlines = []
        self._region = None if region is None else tuple(float(v) for v in region)  # type: ignore[assignment]
        self._drag = None
        self.update()

    def set_objects(self, objects: Sequence[FoundObject]) -> None:
        """Outline each of ``objects`` (core's, top first) in its colour (:func:`object_colour`)."""
        self._outlines = []
        image = self.image()
        if image is not None and self._photo_size is not None:
            size = (image.width(), image.height())
            for i, pts in enumerate(outlines_in_image(objects, self._photo_size, size)):
                if pts is not None:
                    self._outlines.append((pts, object_colour(i)))
        self.update()

    def region(self) -> Region | None:
        """The box asked about, in the photo's pixels (None: the whole photo)."""
        return self._region

    def photo_size(self) -> tuple[int, int] | None:
        return self._photo_size

    def outline_polygons(self) -> list[QPolygonF]:
        """The outlines as drawn, in this widget's coordinates (top answer first)."""
        return [self._polygon(pts) for pts, _ in self._outlines]

    def outline_colours(self) -> list[QColor]:
        return [c for _, c in self._outlines]

    def region_rect(self) -> QRectF:
        """The box asked about as drawn, in this widget's coordinates (empty: none)."""
        if self._region is None or self._photo_size is None:
            return QRectF()
        x, y, w, h = self._region
        return QRectF(self.to_widget((x, y)), self.to_widget((x + w, y + h)))

    # ---- coordinates ---------------------------------------------------------------------
    def _image_size(self) -> tuple[int, int]:
        image = self.image()
        assert image is not None
        return image.width(), image.height()

    def to_widget(self, point: tuple[float, float]) -> QPointF:
        """A point in the photo's pixels, where it is drawn in this widget."""
        assert self._photo_size is not None
        (x, y), = in_photo([point], self._photo_size, self._image_size())
        return self._image_to_widget(x, y)

    def to_photo(self, pos: QPointF) -> tuple[float, float]:
        """A point of this widget, in the photo's pixels (outside the picture: beyond its edges)."""
        assert self._photo_size is not None
        r = self.image_rect()
        iw, ih = self._image_size()
        image_point = ((pos.x() - r.left()) * iw / r.width(), (pos.y() - r.top()) * ih / r.height())
        (x, y), = in_photo([image_point], (iw, ih), self._photo_size)
        return float(x), float(y)

    def _image_to_widget(self, x: float, y: float) -> QPointF:
        r = self.image_rect()
        iw, ih = self._image_size()
        return QPointF(r.left() + x * r.width() / iw, r.top() + y * r.height() / ih)

    def _polygon(self, pts: np.ndarray) -> QPolygonF:
        return QPolygonF([self._image_to_widget(float(x), float(y)) for x, y in pts])

    def box_of(self, a: QPointF, b: QPointF) -> Region | None:
        """The box between two points of this widget, in whole photo pixels and inside the photo
        (core's :func:`check_region` says it is a part of it); None when it is too small or off the photo."""
        if self._photo_size is None or not self.has_image():
            return None
        if abs(a.x() - b.x()) < MIN_DRAG or abs(a.y() - b.y()) < MIN_DRAG:
            return None
        W, H = self._photo_size
        (x0, y0), (x1, y1) = self.to_photo(a), self.to_photo(b)
        left, right = max(0, int(np.floor(min(x0, x1)))), min(W, int(np.ceil(max(x0, x1))))
        top, bottom = max(0, int(np.floor(min(y0, y1)))), min(H, int(np.ceil(max(y0, y1))))
        if right - left < 1 or bottom - top < 1:
            return None
        return check_region((left, top, right - left, bottom - top), (W, H))

    # ---- mouse and keys ------------------------------------------------------------------
    def mousePressEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton and self.has_image():
            self._drag = (event.position(), event.position())
            event.accept()
            return
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event) -> None:
        if self._drag is not None:
            self._drag = (self._drag[0], event.position())
            self.update()
            event.accept()
            return
        super().mouseMoveEvent(event)

    def mouseReleaseEvent(self, event) -> None:
        if self._drag is not None and event.button() == Qt.MouseButton.LeftButton:
            start, _ = self._drag
            self._drag = None
            box = self.box_of(start, event.position())
            self.update()
            if box is not None:  # shown once the tab asks about it (set_query): never a box not asked
                self.region_drawn.emit(box)
            event.accept()
            return
        super().mouseReleaseEvent(event)

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Escape and (self._region is not None or self._drag is not None):
            self._drag = None
            self._region = None
            self.update()
            self.region_cleared.emit()
            event.accept()
            return
        super().keyPressEvent(event)

    # ---- painting ------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        super().paintEvent(event)
        if not self.has_image() or self._photo_size is None:
            return
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        box = self.region_rect()
        if self._drag is not None:
            box = QRectF(self._drag[0], self._drag[1]).normalized()
        if not box.isEmpty():
            self._paint_box(p, box)
        for i, (pts, colour) in enumerate(self._outlines):
            self._paint_outline(p, self._polygon(pts), colour, i + 1)
        p.end()

    def _paint_box(self, p: QPainter, box: QRectF) -> None:
        """The rest of the picture dimmed, the box in a dashed white line."""
        shade = QPainterPath()
        shade.addRect(self.image_rect())
        inner = QPainterPath()
        inner.addRect(box)
        p.fillPath(shade.subtracted(inner), QBrush(QColor(0, 0, 0, 110)))
        p.setPen(QPen(QColor(0, 0, 0, 200), 4))
        p.drawRect(box)
        pen = QPen(REGION_COLOUR, 2, Qt.PenStyle.DashLine)
        p.setPen(pen)
        p.drawRect(box)

    def _paint_outline(self, p: QPainter, poly: QPolygonF, colour: QColor, number: int) -> None:
        """An object's outline in its colour (on a dark line, so it shows on any photo), numbered
        like its card."""
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.setPen(QPen(QColor(0, 0, 0, 170), 6))
        p.drawPolygon(poly)
        p.setPen(QPen(colour, 3))
        p.drawPolygon(poly)
        # the number in a disc at the outline's top-left corner (kept inside the widget)
        corner = min((poly.at(i) for i in range(poly.size())), key=lambda q: q.x() + q.y())
        r = 11.0
        c = QPointF(min(max(corner.x(), r + 1), self.width() - r - 1), min(max(corner.y(), r + 1), self.height() - r - 1))
        p.setPen(QPen(QColor(0, 0, 0, 200), 1.5))
        p.setBrush(colour)
        p.drawEllipse(c, r, r)
        p.setPen(QColor("#000000"))
        font = p.font()
        font.setBold(True)
        p.setFont(font)
        p.drawText(QRectF(c.x() - r, c.y() - r, 2 * r, 2 * r), int(Qt.AlignmentFlag.AlignCenter), str(number))


class RegionBar(QWidget):
    """Under the query photo: what is asked (the whole photo, or the box) and "Whole photo"."""

    whole_photo = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("regionBar")
        self.label = QLabel(DRAW_HINT)
        self.label.setObjectName("regionLabel")
        self.label.setWordWrap(True)
        self.label.setForegroundRole(self.label.foregroundRole())
        self.button = QPushButton(WHOLE_PHOTO)
        self.button.setObjectName("wholePhotoButton")
        self.button.setToolTip("Ask about the whole photo again (Esc)")
        self.button.clicked.connect(self.whole_photo)
        self.button.setEnabled(False)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 2, 0, 0)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.button)

    def set_region(self, region: Region | None) -> None:
        """Say what is asked: ``region`` (photo pixels) or, with None, how to draw a box."""
        if region is None:
            self.label.setText(DRAW_HINT)
        else:
            x, y, w, h = (round(v) for v in region)
            self.label.setText(ASKED_BOX.format(x=x, y=y, w=w, h=h))
        self.button.setEnabled(region is not None)
