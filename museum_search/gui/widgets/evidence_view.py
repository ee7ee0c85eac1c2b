"""Why a reference matched, drawn as Oxford VGG's VISE does: the query photo and the reference side by
side, the outline of what matched in each (a closed polygon) and the inlier matches as lines between
the two images, with a caption ("57 matching points" or "no geometric match").

The evidence (:class:`museum_search.core.verification._spatial.Matches`) comes from
``QueryPipeline.matches``, computed on a worker; what its inliers cover, and where they lie in it,
from :func:`museum_search.core.verification._shortlist.matched_area`: on the reference, the convex hull of its
inliers; in the photo, that hull carried by the inliers' homography and clipped to the photo. (The
reference's whole outline, ``Matches.outline``, is not drawn: a reference photo shows the wall around
a framed picture, and its corners fall far outside the query.) Coordinates are in the frames of the
images resized for verification (``query_size``, ``reference_size``); core carries them into each
shown image's pixels (:func:`museum_search.core.answer.in_photo`, as for the phone page's outline)
and they are placed here where the images are drawn::

    view = EvidenceView()
    view.set_query(rgb); view.set_reference(rgb); view.set_evidence(evidence)
    where_text(evidence.inliers, view.matched_area())   # where the points lie, in words
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QImage, QPainter, QPalette, QPen, QPolygonF
from PySide6.QtWidgets import QSizePolicy, QWidget

from museum_search.core.answer import in_photo
from museum_search.core.verification import MatchedArea, Matches, matched_area
from museum_search.gui.widgets.thumbnails import numpy_to_qimage

#: At most this many match lines are drawn (evenly chosen among the inliers).
MAX_LINES = 100
NO_MATCH = "no geometric match"
OUTLINE_COLOUR = QColor("#ffd23f")
LINE_COLOURS = [QColor(c) for c in ("#4cc9f0", "#80ed99", "#f72585", "#ff9f1c", "#b8c0ff")]


#: Below this share of the inliers in the middle of the matched area, they lie around its edges only.
EDGES_ONLY = 0.1


def match_caption(evidence: Matches | None) -> str:
    if evidence is None or evidence.outline is None:
        return NO_MATCH
    return f"{evidence.inliers} matching point{'s' if evidence.inliers != 1 else ''}"


def where_text(inliers: int, area: MatchedArea | None) -> str:
    """Where the matching points lie, in words: across the outlined (matched) area, or only at its
    edges, and how many are near the photo's edge. Points only at the edges are what a frame, a
    border or a wall label gives, and also a few clustered details: the words ask to look, they do
    not decide."""
    if area is None or inliers <= 0:
        return ""
    points = f"{inliers} matching point{'s' if inliers != 1 else ''}"
    edges = area.middle < EDGES_ONLY * inliers
    if edges:
        text = f"The {points} lie at the edges of the outlined area ({area.middle or 'none'} in its middle)"
    else:
        text = f"The {points} spread across the outlined area ({area.middle} in its middle)"
    if area.near_border:
        text += f", {area.near_border} of them near the edge of the photo"
    text += "."
    if edges:
        text += " Look whether they sit on a frame, a border or a label rather than on the picture itself."
    return text


class EvidenceView(QWidget):
    """Two images side by side with the verification evidence painted over them."""

    GAP = 24  # px between the two images

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("evidenceView")
        self._images: list[QImage | None] = [None, None]
        self._titles = ["Query", "Reference"]
        self._messages = ["No query image", "Loading…"]
        self._evidence: Matches | None = None
        self._area: MatchedArea | None = None
        self._caption = "Matching…"
        self._emphasis = True
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumSize(480, 260)

    def sizeHint(self) -> QSize:
        return QSize(1000, 560)

    # ---- content ---------------------------------------------------------------------------
    def set_query(self, image: np.ndarray | None) -> None:
        self._set(0, image)

    def set_reference(self, image: np.ndarray | None) -> None:
        self._set(1, image)

    def set_reference_message(self, text: str) -> None:
        """The reference cannot be shown (unreadable): say why in its place."""
        self._images[1], self._messages[1], self._caption = None, text, NO_MATCH
        self._evidence = self._area = None
        self.update()

    def set_titles(self, query: str, reference: str) -> None:
        self._titles = [query, reference]
        self.update()

    def set_evidence(self, evidence: Matches | None, caption: str | None = None, emphasis: bool = True) -> None:
        """Draw ``evidence`` (None or no outline: the images only, "no geometric match");
        ``emphasis``: the caption in bold (not for an answer the verdict rejected)."""
        self._evidence = evidence
        self._area = matched_area(evidence) if evidence is not None else None
        self._caption = caption or match_caption(evidence)
        self._emphasis = emphasis
        self.update()

    def evidence(self) -> Matches | None:
        return self._evidence

    def matched_area(self) -> MatchedArea | None:
        """What the evidence's inliers cover, as drawn (None: no outline is drawn)."""
        return self._area

    def outline_polygons(self) -> tuple[QPolygonF, QPolygonF] | None:
        """The outlines as drawn, in widget coordinates: (in the query, on the reference)."""
        ev, area = self._evidence, self._area
        if ev is None or area is None or not all(self._images):
            return None
        qrect, rrect = self.image_rects()
        return (QPolygonF(self._placed(0, qrect, area.query, ev.query_size)),
                QPolygonF(self._placed(1, rrect, area.reference, ev.reference_size)))

    def caption(self) -> str:
        return self._caption

    def emphasised(self) -> bool:
        """Whether the caption is drawn in bold (not for an answer the verdict rejected)."""
        return self._emphasis

    def _set(self, i: int, image: np.ndarray | None) -> None:
        self._images[i] = numpy_to_qimage(image) if image is not None else None
        self.update()

    # ---- geometry --------------------------------------------------------------------------
    def _band(self) -> int:
        return self.fontMetrics().height() + 10

    def image_rects(self) -> tuple[QRectF, QRectF]:
        """Where the query and the reference are drawn (each fitted into its half, aspect kept)."""
        band = self._band()
        half = (self.width() - self.GAP) / 2
        area_h = max(1.0, self.height() - 2 * band)
        rects = []
        for i, img in enumerate(self._images):
            cell = QRectF(i * (half + self.GAP), band, half, area_h)
            if img is None:
                rects.append(cell)
                continue
            s = min(cell.width() / img.width(), cell.height() / img.height())
            w, h = img.width() * s, img.height() * s
            # the query leans right and the reference left: the lines between them stay short
            x = cell.right() - w if i == 0 else cell.left()
            rects.append(QRectF(x, cell.top() + (cell.height() - h) / 2, w, h))
        return rects[0], rects[1]

    def _placed(self, i: int, rect: QRectF, points: np.ndarray, frame: tuple[float, float]) -> list[QPointF]:
        """``points`` of verification's ``frame`` where they are drawn: in the pixels of image ``i``
        (core's :func:`in_photo`), then in ``rect``, where that image is drawn."""
        img = self._images[i]
        assert img is not None
        px = in_photo(points, frame, (img.width(), img.height()))
        sx, sy = rect.width() / max(1, img.width()), rect.height() / max(1, img.height())
        return [QPointF(rect.left() + float(x) * sx, rect.top() + float(y) * sy) for x, y in px]

    # ---- painting --------------------------------------------------------------------------
    def paintEvent(self, event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform, True)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Window))
        rects = self.image_rects()
        band = self._band()
        text = pal.color(QPalette.ColorRole.WindowText)
        for img, rect, title, msg in zip(self._images, rects, self._titles, self._messages):
            p.setPen(text)
            title_rect = QRectF(rect.left(), rect.top() - band, rect.width(), band)
            p.drawText(title_rect, int(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter),
                       self.fontMetrics().elidedText(title, Qt.TextElideMode.ElideMiddle, int(rect.width())))
            if img is not None:
                p.drawImage(rect, img)
            else:
                p.fillRect(rect, pal.color(QPalette.ColorRole.Dark))
                p.setPen(pal.color(QPalette.ColorRole.BrightText))
                p.drawText(rect.adjusted(12, 12, -12, -12),
                           int(Qt.AlignmentFlag.AlignCenter | Qt.TextFlag.TextWordWrap), msg)
        ev = self._evidence
        if ev is not None and ev.outline is not None and all(self._images):
            self._paint_evidence(p, ev, *rects)
        p.setPen(text)
        font = p.font()
        font.setBold(self._emphasis)
        p.setFont(font)
        p.drawText(QRectF(0, self.height() - band, self.width(), band), int(Qt.AlignmentFlag.AlignCenter),
                   self._caption)
        p.end()

    def _paint_evidence(self, p: QPainter, ev: Matches, qrect: QRectF, rrect: QRectF) -> None:
        n = len(ev.query_points)
        pick = np.linspace(0, n - 1, min(n, MAX_LINES)).round().astype(int) if n else np.empty(0, int)
        ends = zip(self._placed(0, qrect, ev.query_points[pick], ev.query_size),
                   self._placed(1, rrect, ev.reference_points[pick], ev.reference_size))
        for j, (a, b) in enumerate(ends):
            colour = QColor(LINE_COLOURS[j % len(LINE_COLOURS)])
            colour.setAlpha(170)
            p.setPen(QPen(colour, 1.2))
            p.drawLine(a, b)
            p.setBrush(colour)
            p.drawEllipse(a, 2.5, 2.5)
            p.drawEllipse(b, 2.5, 2.5)
        p.setBrush(Qt.BrushStyle.NoBrush)
        outlines = self.outline_polygons()
        if outlines is None:
            return
        for outline, rect in zip(outlines, (qrect, rrect)):
            p.setClipRect(rect)  # the outline lies in the image; its pen stays there too
            p.setPen(QPen(QColor(0, 0, 0, 160), 6, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap,
                          Qt.PenJoinStyle.RoundJoin))
            p.drawPolygon(outline)  # a dark halo: the outline reads on light and dark photos
            p.setPen(QPen(OUTLINE_COLOUR, 3, Qt.PenStyle.SolidLine, Qt.PenCapStyle.RoundCap,
                          Qt.PenJoinStyle.RoundJoin))
            p.drawPolygon(outline)
        p.setClipping(False)
