"""Thumbnails: a process-wide cache with background decoding, and a browser for a whole collection.

:class:`ThumbnailCache` (``ThumbnailCache.instance()``) is shared by every widget that shows
reference photos::

    cache = ThumbnailCache.instance()
    pixmap = cache.get(path, 128)        # QPixmap, or None: a background load is scheduled
    cache.ready.connect(on_ready)        # on_ready(path, size), on the GUI thread, when it is in

Decoding (``core.images.load_image(path, max_side=size)``) runs on the cache's own thread pool;
the worker turns the RGB array into a ``QImage`` (a copy) and the ``QPixmap`` is made on the GUI
thread. The most recently requested thumbnails are decoded first (what the user looks at now), and
requests that pile up while scrolling fast are dropped (they are asked for again when painted).
Memory is bounded by an LRU on bytes. A file that cannot be decoded gets a drawn "broken image"
placeholder and is never retried (see :meth:`ThumbnailCache.failure` for the reason).

:class:`ThumbnailBrowser` shows an :class:`~museum_search.core.index._store.Index` as a filterable icon
grid (:class:`CollectionModel` + :class:`CollectionFilterModel`). A ``QListView`` asks for
``DecorationRole`` only for the items it paints, so only visible thumbnails are ever loaded. Both
models are lazy (an index of a million references is opened without walking its items: a row is
read from the index's SQLite catalogue when it is painted) and the filter is one full-text query
of that catalogue (``Index.catalogue().match``): words that begin a word of the reference, and
``field:word`` for one catalogue field.
"""

from __future__ import annotations

import html
import logging
import threading
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import (
    QAbstractListModel,
    QAbstractProxyModel,
    QEvent,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QPointF,
    QRect,
    QRunnable,
    QSize,
    Qt,
    QThreadPool,
    QTimer,
    Signal,
)
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QIcon,
    QImage,
    QPainter,
    QPalette,
    QPen,
    QPixmap,
    QPolygonF,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from museum_search.core.errors import ImageError
from museum_search.core.images import load_image

log = logging.getLogger(__name__)

__all__ = [
    "PATH_ROLE",
    "ROW_ROLE",
    "SEARCH_ROLE",
    "THUMB_ROLE",
    "CollectionFilterModel",
    "CollectionModel",
    "ThumbnailBrowser",
    "ThumbnailCache",
    "ThumbnailDelegate",
    "numpy_to_qimage",
]

#: Default memory budget of the cache (decoded pixels, 4 bytes each).
DEFAULT_MAX_BYTES = 200 * 1024 * 1024
#: Queued (not yet started) loads kept; older ones are dropped (they are re-requested when painted).
MAX_PENDING = 512


def numpy_to_qimage(rgb: np.ndarray) -> QImage:
    """An independent ``QImage`` (a copy) of an RGB ``uint8`` (H, W, 3) array.

    Grey (H, W) and RGBA (H, W, 4) ``uint8`` arrays are accepted too. The copy matters: the
    QImage must not point into numpy memory that may be freed or changed.
    """
    a = np.asarray(rgb)
    if a.dtype != np.uint8:
        raise ValueError(f"expected uint8 pixels, got {a.dtype}")
    if a.ndim == 2:
        fmt = QImage.Format.Format_Grayscale8
    elif a.ndim == 3 and a.shape[2] == 3:
        fmt = QImage.Format.Format_RGB888
    elif a.ndim == 3 and a.shape[2] == 4:
        fmt = QImage.Format.Format_RGBA8888
    else:
        raise ValueError(f"expected an (H, W), (H, W, 3) or (H, W, 4) array, got shape {a.shape}")
    a = np.ascontiguousarray(a)
    h, w = a.shape[:2]
    if h == 0 or w == 0:
        raise ValueError("empty image")
    return QImage(a.data, w, h, int(a.strides[0]), fmt).copy()


# --------------------------------------------------------------------------------------------
# Cache


class _Signals(QObject):
    # path, size, QImage (success) or str (reason of the failure)
    loaded = Signal(str, int, object)


class _Runner(QRunnable):
    """Decodes queued thumbnails, newest request first, until the queue is empty."""

    def __init__(self, cache: ThumbnailCache):
        super().__init__()
        self._cache = cache
        self._signals = cache._signals
        self.setAutoDelete(True)

    def run(self) -> None:
        cache = self._cache
        while True:
            key = cache._next_job()
            if key is None:
                return
            path, size = key
            try:
                result: Any = numpy_to_qimage(load_image(path, max_side=size))
            except ImageError as exc:
                result = exc.reason
            except (OSError, ValueError, MemoryError) as exc:
                result = f"cannot be read: {exc}"
            except Exception as exc:
                log.debug("thumbnail of %s failed", path, exc_info=True)
                result = f"cannot be shown ({type(exc).__name__}: {exc})"
            self._signals.loaded.emit(path, size, result)


class ThumbnailCache(QObject):
    """Process-wide thumbnail cache; see the module docstring. Use :meth:`instance`."""

    ready = Signal(str, int)  # path, size: get(path, size) now returns a pixmap

    _instance: ThumbnailCache | None = None

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, threads: int | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.max_bytes = int(max_bytes)
        self._pixmaps: OrderedDict[tuple[str, int], QPixmap] = OrderedDict()
        self._bytes = 0
        self._failed: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()
        self._queue: deque[tuple[str, int]] = deque()  # guarded by _lock
        self._queued: set[tuple[str, int]] = set()  # queued or being decoded; guarded by _lock
        self._runners = 0  # guarded by _lock
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(threads or max(2, min(4, QThreadPool.globalInstance().maxThreadCount() // 2)))
        self._placeholders: dict[tuple[str, int], QPixmap] = {}
        self._signals = _Signals(self)
        self._signals.loaded.connect(self._on_loaded, Qt.ConnectionType.QueuedConnection)

    @classmethod
    def instance(cls) -> ThumbnailCache:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    # ---- public API --------------------------------------------------------------------------
    def get(self, path: str | Path, size: int) -> QPixmap | None:
        """The thumbnail (longest side <= ``size``) if cached, else None and a load is scheduled.

        A file that could not be decoded gives the "broken image" placeholder (never retried).
        """
        key = (str(path), int(size))
        pm = self._pixmaps.get(key)
        if pm is not None:
            self._pixmaps.move_to_end(key)
            return pm
        if key in self._failed:
            return self.broken(key[1])
        self._schedule(key)
        return None

    def peek(self, path: str | Path, size: int) -> QPixmap | None:
        """Like :meth:`get` but never schedules a load."""
        key = (str(path), int(size))
        if key in self._failed:
            return self.broken(key[1])
        return self._pixmaps.get(key)

    def failure(self, path: str | Path, size: int) -> str | None:
        """Why the thumbnail could not be made, or None."""
        return self._failed.get((str(path), int(size)))

    def broken(self, size: int) -> QPixmap:
        """The placeholder shown for an image that cannot be decoded (drawn, size × size)."""
        return self._placeholder("broken", size)

    def loading(self, size: int) -> QPixmap:
        """A neutral placeholder (size × size) to show while a thumbnail loads."""
        return self._placeholder("loading", size)

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._pixmaps)

    def pending(self) -> int:
        """Loads queued or running."""
        with self._lock:
            return len(self._queued)

    def cancel_pending(self) -> None:
        """Drop the queued (not yet started) loads; they are re-requested when painted again."""
        with self._lock:
            for key in self._queue:
                self._queued.discard(key)
            self._queue.clear()

    def wait(self, timeout_ms: int = 30000) -> bool:
        """Block until no load runs (results still arrive through the event loop)."""
        return self._pool.waitForDone(timeout_ms)

    def clear(self) -> None:
        """Forget every thumbnail and failure (e.g. after files were replaced on disk)."""
        self.cancel_pending()
        self._pixmaps.clear()
        self._failed.clear()
        self._bytes = 0

    def set_max_bytes(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._evict()

    # ---- internals ---------------------------------------------------------------------------
    def _schedule(self, key: tuple[str, int]) -> None:
        start = False
        with self._lock:
            if key in self._queued:
                return
            self._queue.append(key)
            self._queued.add(key)
            while len(self._queue) > MAX_PENDING:
                self._queued.discard(self._queue.popleft())
            if self._runners < self._pool.maxThreadCount():
                self._runners += 1
                start = True
        if start:
            self._pool.start(_Runner(self))

    def _next_job(self) -> tuple[str, int] | None:
        """Called by runners: the newest queued key, or None (and the runner ends)."""
        with self._lock:
            if not self._queue:
                self._runners -= 1
                return None
            return self._queue.pop()  # LIFO: what was painted last is what is on screen now

    def _on_loaded(self, path: str, size: int, result: object) -> None:
        key = (path, size)
        with self._lock:
            self._queued.discard(key)
        if isinstance(result, QImage) and not result.isNull():
            pm = QPixmap.fromImage(result)
            old = self._pixmaps.pop(key, None)
            if old is not None:
                self._bytes -= _nbytes(old)
            self._pixmaps[key] = pm
            self._bytes += _nbytes(pm)
            self._evict(keep=key)
        else:
            self._failed[key] = str(result) if result else "cannot be decoded"
        self.ready.emit(path, size)

    def _evict(self, keep: tuple[str, int] | None = None) -> None:
        while self._bytes > self.max_bytes and self._pixmaps:
            key, pm = next(iter(self._pixmaps.items()))
            if key == keep:
                break
            del self._pixmaps[key]
            self._bytes -= _nbytes(pm)

    def _placeholder(self, kind: str, size: int) -> QPixmap:
        key = (kind, int(size))
        pm = self._placeholders.get(key)
        if pm is None:
            pm = _draw_broken(size) if kind == "broken" else _draw_loading(size)
            self._placeholders[key] = pm
        return pm


def _nbytes(pm: QPixmap) -> int:
    return max(1, pm.width() * pm.height() * max(1, pm.depth() // 8))


def _draw_loading(size: int) -> QPixmap:
    size = max(8, int(size))
    pm = QPixmap(size, size)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    m = max(2, size // 16)
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QColor(128, 128, 128, 40))
    p.drawRoundedRect(m, m, size - 2 * m, size - 2 * m, m, m)
    p.end()
    return pm


def _draw_broken(size: int) -> QPixmap:
    """A "broken picture": a frame with a mountain and a sun, torn by a red zig-zag."""
    size = max(16, int(size))
    pm = QPixmap(size, size)
    pm.fill(Qt.GlobalColor.transparent)
    p = QPainter(pm)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    m = size // 8
    frame = QRect(m, m + size // 16, size - 2 * m, size - 2 * m - size // 8)
    p.setBrush(QColor(235, 235, 235))
    p.setPen(QPen(QColor(150, 150, 150), max(1.0, size / 48)))
    p.drawRoundedRect(frame, m / 3, m / 3)
    # the picture: a sun and a hill
    p.setPen(Qt.PenStyle.NoPen)
    p.setBrush(QColor(190, 190, 190))
    r = frame.width() // 10
    p.drawEllipse(frame.left() + frame.width() // 4 - r, frame.top() + frame.height() // 3 - r, 2 * r, 2 * r)
    b = frame.bottom() - 1
    hill = QPolygonF([
        QPointF(frame.left() + 1, b), QPointF(frame.left() + frame.width() * 0.45, frame.top() + frame.height() * 0.45),
        QPointF(frame.left() + frame.width() * 0.65, frame.top() + frame.height() * 0.65),
        QPointF(frame.left() + frame.width() * 0.8, frame.top() + frame.height() * 0.5), QPointF(frame.right() - 1, b),
    ])
    p.drawPolygon(hill)
    # the tear
    pen = QPen(QColor(200, 40, 40), max(1.5, size / 32))
    pen.setJoinStyle(Qt.PenJoinStyle.RoundJoin)
    p.setPen(pen)
    x0, y0, y1 = frame.left() + frame.width() * 0.55, frame.top() - size / 24, frame.bottom() + size / 24
    steps = 5
    pts = [QPointF(x0 + (size / 14) * (1 if i % 2 else -1), y0 + (y1 - y0) * i / steps) for i in range(steps + 1)]
    p.drawPolyline(QPolygonF(pts))
    p.end()
    return pm


# --------------------------------------------------------------------------------------------
# Model / view

#: Lower-cased "instance path metadata…" text of a row (made when asked; the filter is SQL).
SEARCH_ROLE = Qt.ItemDataRole.UserRole + 1
#: Absolute path (str) of the row's image file.
PATH_ROLE = Qt.ItemDataRole.UserRole + 2
#: Row number in the index (int).
ROW_ROLE = Qt.ItemDataRole.UserRole + 3
#: The thumbnail QPixmap, or None while it loads (what :class:`ThumbnailDelegate` paints).
THUMB_ROLE = Qt.ItemDataRole.UserRole + 4
#: (instance, title, artist) of the row: the lines under its thumbnail.
LINES_ROLE = Qt.ItemDataRole.UserRole + 5
#: Catalogue fields (any case) that name who made a work, the first one found shown under the title:
#: a filter word that matches the artist then has a visible reason.
ARTIST_FIELDS = ("artist", "creator", "author", "maker", "painter")

#: Rows whose thumbnail was asked for and is still awaited, remembered (path → row) so that the
#: row can be repainted when it arrives; the oldest are forgotten past this many (far more than
#: the cache keeps queued, :data:`MAX_PENDING`).
_AWAITED_ROWS = 8192
#: What the filter field understands (its tooltip).
FILTER_HELP = (
    "Every word you type must begin a word of the reference: its instance, file name or any catalogue "
    "field (title, artist…); case and accents do not matter.\n"
    "field:word looks in one field only, e.g. artist:monet or title:water."
)


def _field(metadata: dict[str, str], names: tuple[str, ...]) -> str:
    """The value of the first of ``names`` (any case) that ``metadata`` has and fills in, else ""."""
    found = {k.strip().lower(): v for k, v in metadata.items() if v}
    return next((found[n] for n in names if n in found), "")


def _title(metadata: dict[str, str]) -> str:
    return _field(metadata, ("title",))


def _artist(metadata: dict[str, str]) -> str:
    return _field(metadata, ARTIST_FIELDS)


class CollectionModel(QAbstractListModel):
    """The references of an :class:`~museum_search.core.index._store.Index`, one row each.

    Lazy: nothing is walked when an index is set (a saved index of a million references is an
    SQLite catalogue, :class:`~museum_search.core.index._catalogue.ItemStore`); a row's item is read when
    the view asks for it (the store caches the rows just shown).

    DisplayRole: instance (then the title and the artist, each on a line of its own); DecorationRole:
    the thumbnail (an icon, loaded in the background by :class:`ThumbnailCache`); ToolTipRole:
    instance, metadata, file. :attr:`lines`: how many text lines an item has (3 when the catalogue
    has an artist field, :data:`ARTIST_FIELDS`, else 2).
    """

    def __init__(self, index=None, thumb_size: int = 128, cache: ThumbnailCache | None = None,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.thumb_size = int(thumb_size)
        self._cache = cache if cache is not None else ThumbnailCache.instance()  # (an empty cache is falsy)
        self._index = None
        self._root = Path()
        self._count = 0
        self._awaited: OrderedDict[str, int] = OrderedDict()  # path → row of thumbnails being loaded
        self.lines = 2  # text lines under each thumbnail
        self._cache.ready.connect(self._thumbnail_ready)
        if index is not None:
            self.set_index(index)

    # ---- data ------------------------------------------------------------------------------
    @property
    def collection_index(self):
        """The Index shown (``None`` when empty)."""
        return self._index

    def set_index(self, index) -> None:
        self.beginResetModel()
        self._index = index
        self._root = Path(index.root) if index is not None else Path()
        self._count = len(index) if index is not None else 0
        self._awaited.clear()
        self.lines = 2
        if index is not None:
            fields = {f.strip().lower() for f in getattr(index.catalogue(), "fields", [])}
            self.lines = 3 if fields & set(ARTIST_FIELDS) else 2
        self.endResetModel()

    def item(self, row: int):
        """The :class:`~museum_search.core.index._store.Item` of ``row``."""
        return self._index.items[row]

    def path(self, row: int) -> str:
        return str(self._root / self._index.items[row].path)

    def match(self, text: str) -> np.ndarray | None:
        """Rows (ascending) of the references that match ``text``, a full-text query of the index's
        catalogue (``core.index._catalogue.fts_query``: every word begins a word of the reference;
        ``field:word``); None when ``text`` asks for nothing (every row)."""
        if self._index is None:
            return None
        return self._index.catalogue().match(text)

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else self._count

    def _thumbnail(self, row: int) -> tuple[str, QPixmap | None]:
        path = self.path(row)
        pm = self._cache.get(path, self.thumb_size)
        if pm is None:  # being loaded: repaint this row when it arrives
            self._awaited[path] = row
            self._awaited.move_to_end(path)
            if len(self._awaited) > _AWAITED_ROWS:
                self._awaited.popitem(last=False)
        return path, pm

    def data(self, idx: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not idx.isValid() or self._index is None:
            return None
        row = idx.row()
        if role == THUMB_ROLE:
            return self._thumbnail(row)[1]
        if role == Qt.ItemDataRole.DecorationRole:
            pm = self._thumbnail(row)[1]
            return QIcon(pm if pm is not None else self._cache.loading(self.thumb_size))
        if role == ROW_ROLE:
            return row
        item = self._index.items[row]
        if role == LINES_ROLE:
            return item.instance, _title(item.metadata), _artist(item.metadata)
        if role == Qt.ItemDataRole.DisplayRole:
            return "\n".join(line for line in (item.instance, _title(item.metadata), _artist(item.metadata)) if line)
        if role == Qt.ItemDataRole.ToolTipRole:
            lines = [f"<b>{html.escape(item.instance)}</b>"]
            for k, v in item.metadata.items():
                if v:
                    lines.append(f"{html.escape(k)}: {html.escape(v)}")
            lines.append(f"<span style='color:gray'>{html.escape(item.path)}</span>")
            reason = self._cache.failure(str(self._root / item.path), self.thumb_size)
            if reason:
                lines.append(f"<span style='color:#b00'>Cannot be shown: {html.escape(reason)}</span>")
            return "<br>".join(lines)
        if role == SEARCH_ROLE:
            return " ".join([item.instance, item.path, *item.metadata.values()]).lower()
        if role == PATH_ROLE:
            return str(self._root / item.path)
        return None

    def _thumbnail_ready(self, path: str, size: int) -> None:
        if size != self.thumb_size:
            return
        row = self._awaited.pop(path, None)
        if row is not None and row < self._count:
            i = self.index(row, 0)
            self.dataChanged.emit(i, i, [Qt.ItemDataRole.DecorationRole, THUMB_ROLE])


class CollectionFilterModel(QAbstractProxyModel):
    """The rows of a :class:`CollectionModel` that match the filter text, in index order.

    The match is one full-text query of the index's catalogue (:meth:`CollectionModel.match`, SQL):
    every word typed must begin a word of the reference (instance, file, any catalogue field, any
    case, accents ignored), and ``field:word`` looks in one field (``artist:monet``). The view's rows
    map to the matching source rows through one sorted array: no Python call per row, so filtering
    a million references costs the query, not a million ``filterAcceptsRow`` calls."""

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._text = ""
        self._rows: np.ndarray | None = None  # matching source rows (ascending); None: all of them
        self._source_conns: list = []

    # ---- the filter --------------------------------------------------------------------------
    @property
    def text(self) -> str:
        return self._text

    def source_rows(self) -> np.ndarray | None:
        """The source rows shown (ascending), or None when every row is shown."""
        return self._rows

    def set_text(self, text: str) -> None:
        text = " ".join(text.split())
        if text == self._text:
            return
        src = self.sourceModel()
        rows = src.match(text) if isinstance(src, CollectionModel) and text else None
        # One reset, not one removal per range of rows: the view lays out once.
        self.beginResetModel()
        self._text, self._rows = text, rows
        self.endResetModel()

    def setSourceModel(self, model) -> None:
        old = self.sourceModel()
        if old is not None:
            for signal, slot in self._source_conns:
                try:
                    signal.disconnect(slot)
                except (RuntimeError, TypeError):
                    pass
        self._source_conns = []
        self.beginResetModel()
        super().setSourceModel(model)
        self._rows = None
        self._text = ""
        self.endResetModel()
        if model is not None:
            for signal, slot in ((model.modelAboutToBeReset, self._source_about_to_reset),
                                 (model.modelReset, self._source_reset),
                                 (model.dataChanged, self._source_data_changed)):
                signal.connect(slot)
                self._source_conns.append((signal, slot))

    def _source_about_to_reset(self) -> None:
        self.beginResetModel()

    def _source_reset(self) -> None:
        # a new index: the same filter text, matched again in its catalogue
        src = self.sourceModel()
        self._rows = src.match(self._text) if isinstance(src, CollectionModel) and self._text else None
        self.endResetModel()

    def _source_data_changed(self, first: QModelIndex, last: QModelIndex, roles=()) -> None:
        lo, hi = self._view_range(first.row(), last.row())  # the shown rows in that range
        if lo <= hi:
            self.dataChanged.emit(self.index(lo, 0), self.index(hi, 0), roles)

    def _view_range(self, first: int, last: int) -> tuple[int, int]:
        if self._rows is None:
            return first, last
        lo = int(np.searchsorted(self._rows, first, side="left"))
        hi = int(np.searchsorted(self._rows, last, side="right")) - 1
        return lo, hi

    # ---- QAbstractProxyModel -----------------------------------------------------------------
    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        if parent.isValid():
            return 0
        if self._rows is not None:
            return len(self._rows)
        src = self.sourceModel()
        return src.rowCount() if src is not None else 0

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:
        return 0 if parent.isValid() else 1

    def index(self, row: int, column: int = 0,
              parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> QModelIndex:
        if parent.isValid() or column != 0 or not 0 <= row < self.rowCount():
            return QModelIndex()
        return self.createIndex(row, 0)

    def parent(self, child=None):  # a flat list: no item has a parent
        if child is None:  # QObject.parent()
            return super().parent()
        return QModelIndex()

    def sibling(self, row: int, column: int, idx) -> QModelIndex:
        return self.index(row, column)

    def hasChildren(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> bool:
        return not parent.isValid() and self.rowCount() > 0

    def mapToSource(self, proxy: QModelIndex | QPersistentModelIndex) -> QModelIndex:
        src = self.sourceModel()
        if src is None or not proxy.isValid():
            return QModelIndex()
        row = proxy.row()
        if self._rows is not None:
            if not 0 <= row < len(self._rows):
                return QModelIndex()
            row = int(self._rows[row])
        return src.index(row, 0)

    def mapFromSource(self, source: QModelIndex | QPersistentModelIndex) -> QModelIndex:
        if not source.isValid():
            return QModelIndex()
        row = source.row()
        if self._rows is not None:
            i = int(np.searchsorted(self._rows, row))
            if i >= len(self._rows) or int(self._rows[i]) != row:
                return QModelIndex()
            row = i
        return self.index(row, 0)

    def data(self, idx: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        src = self.sourceModel()
        if src is None or not idx.isValid():
            return None
        return src.data(self.mapToSource(idx), role)

    def flags(self, idx: QModelIndex | QPersistentModelIndex) -> Qt.ItemFlag:
        src = self.sourceModel()
        if src is None or not idx.isValid():
            return Qt.ItemFlag.NoItemFlags
        return src.flags(self.mapToSource(idx))


class ThumbnailDelegate(QStyledItemDelegate):
    """Paints a thumbnail (aspect kept, centred in a square) above :attr:`lines` elided lines: the
    instance, the title and (when the catalogue names them) the artist. Every item has the same
    size, so the view never measures items one by one."""

    def __init__(self, thumb_size: int, parent: QObject | None = None):
        super().__init__(parent)
        self.thumb_size = int(thumb_size)
        self.item_width = self.thumb_size + 2 * _PAD  # widened by the browser to fill its rows
        self.lines = 2  # set by the browser from its model

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        return QSize(self.item_width, self.item_height(option.fontMetrics))

    def item_height(self, fm: QFontMetrics) -> int:
        return self.thumb_size + self.lines * fm.lineSpacing() + 3 * _PAD

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        opt = QStyleOptionViewItem(option)  # state, rect, palette: enough for the item panel
        style = opt.widget.style() if opt.widget is not None else QApplication.style()
        style.drawPrimitive(QStyle.PrimitiveElement.PE_PanelItemViewItem, opt, painter, opt.widget)
        r = option.rect
        t = self.thumb_size
        box = QRect(r.left() + (r.width() - t) // 2, r.top() + _PAD, t, t)
        pm = index.data(THUMB_ROLE)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        if isinstance(pm, QPixmap) and not pm.isNull():
            size = pm.size().scaled(box.size(), Qt.AspectRatioMode.KeepAspectRatio) \
                if pm.width() > t or pm.height() > t else pm.size()
            target = QRect(0, 0, size.width(), size.height())
            target.moveCenter(box.center())
            painter.drawPixmap(target, pm)
        else:
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(QColor(128, 128, 128, 40))
            painter.drawRoundedRect(box.adjusted(4, 4, -4, -4), 4, 4)
        lines = index.data(LINES_ROLE) or (str(index.data(Qt.ItemDataRole.DisplayRole) or ""),)
        fm = option.fontMetrics
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        group = QPalette.ColorGroup.Normal if option.state & QStyle.StateFlag.State_Enabled else QPalette.ColorGroup.Disabled
        text_color = option.palette.color(group, QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        y = box.bottom() + _PAD
        width = r.width() - 2 * _PAD
        for i, line in enumerate(lines[: self.lines]):
            if not line:
                continue
            font = QFont(option.font)
            if i == 0:
                font.setBold(True)
            if i == 2:
                font.setItalic(True)
            painter.setFont(font)
            color = QColor(text_color)
            if i >= 1 and not selected:
                color.setAlpha(170)
            painter.setPen(color)
            elided = QFontMetrics(font).elidedText(line, Qt.TextElideMode.ElideRight, width)
            painter.drawText(QRect(r.left() + _PAD, y + i * fm.lineSpacing(), width, fm.lineSpacing()),
                             int(Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignVCenter), elided)
        painter.restore()


_PAD = 4
_GAP = 8  # between items


class ThumbnailBrowser(QWidget):
    """A filter field, a grid of thumbnails of an index and a "12 of 287 references" count."""

    #: Emitted with the row (in the index) of a reference double-clicked (or Enter on it).
    activated = Signal(int)

    def __init__(self, parent: QWidget | None = None, thumb_size: int = 128, cache: ThumbnailCache | None = None):
        super().__init__(parent)
        self.thumb_size = int(thumb_size)
        self.model = CollectionModel(thumb_size=self.thumb_size, cache=cache, parent=self)
        self.proxy = CollectionFilterModel(self)
        self.proxy.setSourceModel(self.model)

        self.filter_edit = QLineEdit()
        # short enough for the browser's width in a 1024-px window; the tooltip says it all
        self.filter_edit.setPlaceholderText("Filter by instance, title, artist, file… (artist:monet)")
        self.filter_edit.setToolTip(FILTER_HELP)
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.setObjectName("collectionFilter")
        self.count_label = QLabel("No index")
        self.count_label.setObjectName("collectionCount")
        self.count_label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

        self.view = QListView()
        self.view.setObjectName("collectionView")
        self.view.setViewMode(QListView.ViewMode.IconMode)
        self.view.setMovement(QListView.Movement.Static)
        self.view.setResizeMode(QListView.ResizeMode.Adjust)
        self.view.setLayoutMode(QListView.LayoutMode.Batched)
        self.view.setBatchSize(256)
        self.view.setUniformItemSizes(True)
        self.view.setIconSize(QSize(self.thumb_size, self.thumb_size))
        self.delegate = ThumbnailDelegate(self.thumb_size, self.view)
        self.view.setItemDelegate(self.delegate)
        self.view.viewport().installEventFilter(self)
        self._fit_columns()
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.view.verticalScrollBar().setSingleStep(24)
        self.view.setModel(self.proxy)
        self.view.activated.connect(self._activated)  # double-click, or Enter

        # Typing in a 10,000-item collection: filter once the user pauses.
        self._filter_timer = QTimer(self, singleShot=True, interval=120)
        self._filter_timer.timeout.connect(self._apply_filter)
        self.filter_edit.textChanged.connect(self._filter_changed)
        self.proxy.rowsInserted.connect(self._update_count)
        self.proxy.rowsRemoved.connect(self._update_count)
        self.proxy.modelReset.connect(self._update_count)
        self.proxy.layoutChanged.connect(self._update_count)

        top = QHBoxLayout()
        top.setContentsMargins(0, 0, 0, 0)
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.count_label)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(top)
        lay.addWidget(self.view, 1)

    def set_index(self, index) -> None:
        self.model.set_index(index)
        if self.delegate.lines != self.model.lines:  # an artist line, or none: the items' height
            self.delegate.lines = self.model.lines
            self._fit_columns()
        self._update_count()

    def eventFilter(self, obj: QObject, event) -> bool:
        if obj is self.view.viewport() and event.type() == QEvent.Type.Resize:
            self._fit_columns()
        return super().eventFilter(obj, event)

    def _fit_columns(self) -> None:
        """Share the row's width between as many columns as fit, so no wide gap is left on the
        right and titles get the room there is."""
        min_w = self.thumb_size + 2 * _PAD + _GAP
        width = max(min_w, self.view.viewport().width() - 1)
        cols = max(1, width // min_w)
        cell_w = width // cols
        cell = QSize(cell_w, self.delegate.item_height(self.view.fontMetrics()) + _GAP)
        if cell != self.view.gridSize():
            self.delegate.item_width = cell_w - _GAP
            self.view.setGridSize(cell)

    def set_filter(self, text: str) -> None:
        """Filter now (without waiting for the typing pause)."""
        if self.filter_edit.text() != text:
            self.filter_edit.blockSignals(True)
            self.filter_edit.setText(text)
            self.filter_edit.blockSignals(False)
        self._apply_filter()

    def visible_count(self) -> int:
        return self.proxy.rowCount()

    def _filter_changed(self, _text: str) -> None:
        if self.model.rowCount() > 2000:
            self._filter_timer.start()
        else:
            self._apply_filter()

    def _apply_filter(self) -> None:
        self._filter_timer.stop()
        self.proxy.set_text(self.filter_edit.text())
        self._update_count()

    def _update_count(self, *_args) -> None:
        total = self.model.rowCount()
        if self.model.collection_index is None:
            self.count_label.setText("No index")
        else:
            shown = self.proxy.rowCount()
            self.count_label.setText(f"{shown:,} of {total:,} reference{'s' if total != 1 else ''}")

    def _activated(self, idx: QModelIndex) -> None:
        row = self.proxy.data(idx, ROW_ROLE)
        if row is not None:
            self.activated.emit(int(row))
