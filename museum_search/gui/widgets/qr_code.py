"""A QR code drawn from ``segno``'s module matrix: crisp at any size, no files.

:func:`qr_image` renders a text (a URL) as a :class:`QImage` with a whole number of pixels per
module and a white quiet zone of ``border`` modules, so a phone reads it at any size.
:class:`QrCode` is a QLabel that shows one at (about) a given side; :class:`QrPanel` puts a
one-line caption under it (the kiosk's phone link, in a corner).
"""

from __future__ import annotations

import logging

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

try:
    import segno
except ImportError:  # a missing segno costs the QR code only (logged), never the window that shows it
    segno = None

log = logging.getLogger(__name__)

#: The quiet zone the QR standard asks for, in modules.
QUIET_ZONE = 4


def qr_modules(data: str, border: int = QUIET_ZONE) -> np.ndarray | None:
    """The QR code of ``data`` as a square bool array (True: dark module), quiet zone included;
    None when ``data`` is empty or segno is missing."""
    if not data:
        return None
    if segno is None:
        log.warning("segno is not installed: no QR code for %r (pip install segno)", data)
        return None
    code = segno.make(data, error="m", micro=False)
    return np.array(list(code.matrix_iter(scale=1, border=border)), dtype=bool)


def qr_image(data: str, module_px: int, border: int = QUIET_ZONE) -> QImage:
    """``data`` as a black-on-white QR code, ``module_px`` pixels a module (a null QImage when
    there is nothing to draw)."""
    modules = qr_modules(data, border)
    if modules is None:
        return QImage()
    scale = max(1, int(module_px))
    grey = np.where(modules, 0, 255).astype(np.uint8)
    grey = np.ascontiguousarray(np.repeat(np.repeat(grey, scale, axis=0), scale, axis=1))
    h, w = grey.shape
    return QImage(grey.data, w, h, w, QImage.Format.Format_Grayscale8).copy()


class QrCode(QLabel):
    """A QR code of :meth:`data`, about :meth:`set_side` pixels wide, quiet zone included
    (a whole number of device pixels a module: sharp edges, never blurred by scaling)."""

    def __init__(self, data: str = "", parent: QWidget | None = None, *, side: int = 160,
                 border: int = QUIET_ZONE):
        super().__init__(parent)
        self.setObjectName("qrCode")
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self._data = ""
        self._side = max(1, int(side))
        self._border = int(border)
        self._count = 0  # modules across, quiet zone included (0: no code)
        self.set_data(data)

    def data(self) -> str:
        return self._data

    def modules(self) -> int:
        """Modules across, quiet zone included (0 when there is no code)."""
        return self._count

    def set_data(self, data: str) -> None:
        self._data = (data or "").strip()
        modules = qr_modules(self._data, self._border)
        self._count = 0 if modules is None else len(modules)
        self._render()

    def set_side(self, side: int) -> None:
        """Show the code about ``side`` pixels wide (the nearest whole number of pixels a module)."""
        self._side = max(1, int(side))
        self._render()

    def image(self) -> QImage:
        """The code as shown (device pixels), or a null QImage."""
        pm = self.pixmap()
        return pm.toImage() if pm is not None and not pm.isNull() else QImage()

    def _render(self) -> None:
        if not self._count:
            self.clear()
            self.setFixedSize(0, 0)
            return
        ratio = self.devicePixelRatioF() or 1.0
        module_px = max(1, round(self._side * ratio / self._count))
        pm = QPixmap.fromImage(qr_image(self._data, module_px, self._border))
        pm.setDevicePixelRatio(ratio)
        self.setPixmap(pm)
        logical = round(pm.width() / ratio)
        self.setFixedSize(logical, logical)


class QrPanel(QWidget):
    """A :class:`QrCode` with a one-line caption under it, both flush right (for a bottom-right
    corner). The caption (``QLabel#qrCaption``) takes its look from the style sheet of the window
    it is in. The panel lets touches through (a touch on it is a touch on what is under it)."""

    def __init__(self, caption: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("qrPanel")
        self.code = QrCode(parent=self)
        self.caption = QLabel(caption, self)
        self.caption.setObjectName("qrCaption")
        self.caption.setTextFormat(Qt.TextFormat.PlainText)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        right = Qt.AlignmentFlag.AlignRight
        lay.addWidget(self.code, 0, right)
        lay.addWidget(self.caption, 0, right)
        for w in (self, self.code, self.caption):
            w.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents, True)
        self.set_data("")

    def data(self) -> str:
        return self.code.data()

    def set_data(self, data: str) -> None:
        """Show the code of ``data``; an empty ``data`` hides the panel."""
        self.code.set_data(data)
        self.setVisible(bool(self.code.modules()))
        self.adjustSize()

    def set_side(self, side: int) -> None:
        """The code about ``side`` pixels wide (quiet zone included)."""
        self.code.set_side(side)
        self.layout().setSpacing(max(4, side // 16))
        self.adjustSize()
