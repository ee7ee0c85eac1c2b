"""Reading photos safely: every supported file becomes an RGB ``uint8`` array, every bad one an
:class:`~museum_search.core.errors.ImageError` with a reason a museum technician can act on.

JPEGs are decoded by libjpeg-turbo through ``simplejpeg`` in strict mode, so damaged compressed
data (which libjpeg otherwise only reports as a warning on stderr, naming no file) is refused;
the other formats, and JPEGs TurboJPEG cannot read (12-bit, lossless), by OpenCV
(``cv2.imdecode`` on the file's bytes, so Unicode paths work on every OS). Only regular files
are opened (:func:`open_regular`): a FIFO, socket or device named like a photo is refused, never
waited on. The image header is parsed first, in Python, which makes it cheap to

* refuse files that are empty, not images, of an unsupported format, or absurdly large
  (more than :data:`MAX_PIXELS`), *before* anything is decoded;
* know how much memory decoding will take, and hold it from the process-wide
  :class:`DecodeBudget` (see :data:`DECODE_BUDGET_BYTES`) while decoding, so that parallel
  decoders (indexing, thumbnails) never together exceed it; an image that alone needs more is
  refused with the size it needs;
* honour the EXIF orientation consistently (:func:`image_size` and :func:`load_image` agree);
* decode big JPEGs at 1/2, 1/4 or 1/8 scale (libjpeg DCT scaling), so a 20,000-px photo asked
  for at ``max_side=1024`` never exists in memory at full size.

Alpha is composited onto white (an entirely transparent alpha channel is treated as unused and
dropped), 16-bit samples are scaled to 8 bits, greyscale is expanded to RGB, CMYK JPEGs and TIFFs
are converted to RGB. Pure Python + NumPy + OpenCV + simplejpeg (+ Pillow for TIFF headers); no Qt.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import io
import logging
import math
import operator
import os
import re
import stat
import struct
import threading
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import cv2
import numpy as np

from museum_search.core.errors import ImageError

try:  # libjpeg-turbo with strict error handling; without it, OpenCV decodes JPEGs (see _decode_jpeg)
    import simplejpeg as _simplejpeg
except ImportError:  # pragma: no cover - simplejpeg is a dependency
    _simplejpeg = None

__all__ = [
    "DECODE_BUDGET_BYTES",
    "DECODE_BUDGET_ENV",
    "MAX_PIXELS",
    "SUPPORTED_EXTENSIONS",
    "DecodeBudget",
    "decode_budget",
    "decode_cost",
    "decode_image",
    "encoded_image_size",
    "image_size",
    "NotRegularFileError",
    "file_kind",
    "is_image_file",
    "load_image",
    "not_regular_reason",
    "open_regular",
    "set_decode_budget",
]

log = logging.getLogger(__name__)

if _simplejpeg is None:  # pragma: no cover
    log.warning("simplejpeg is not installed: damaged JPEG data will not be detected")

SUPPORTED_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".webp", ".bmp"}
)

#: Images with more pixels than this (width x height, before any reduction) are refused.
MAX_PIXELS = 400_000_000

#: Environment variable that sets the decode budget, in MiB (0: no budget).
DECODE_BUDGET_ENV = "MUSEUM_SEARCH_DECODE_BUDGET_MB"

_MIB = 1 << 20
_DEFAULT_DECODE_BUDGET = 1 << 30


def _budget_from_env() -> int:
    value = os.environ.get(DECODE_BUDGET_ENV, "").strip()
    if not value:
        return _DEFAULT_DECODE_BUDGET
    try:
        mb = float(value)
        if not math.isfinite(mb) or mb < 0:
            raise ValueError(value)
    except ValueError:
        log.warning("%s=%r is not a number of MiB >= 0; using %d MiB",
                    DECODE_BUDGET_ENV, value, _DEFAULT_DECODE_BUDGET // _MIB)
        return _DEFAULT_DECODE_BUDGET
    return int(mb * _MIB)


#: Memory (bytes) that all image decodes of this process may use together (1 GiB unless
#: ``MUSEUM_SEARCH_DECODE_BUDGET_MB`` says otherwise; 0 means no limit). Each decode holds its
#: estimated peak (:func:`decode_cost`) from the budget until its RGB ``uint8`` result exists;
#: others wait. Change it at run time with :func:`set_decode_budget`.
DECODE_BUDGET_BYTES: int = _budget_from_env()

_RECOPY = "copy the file again from the original, or re-export it"
_FORMAT_NAMES = {"jpeg": "JPEG", "png": "PNG", "tiff": "TIFF", "webp": "WebP", "bmp": "BMP"}


# --------------------------------------------------------------------------------------------
# Decode memory budget
# --------------------------------------------------------------------------------------------


class DecodeBudget:
    """Bytes of memory shared by concurrent decodes: each holds its estimated peak while decoding.

    :meth:`hold` blocks while the others hold too much for the request to fit; requests are
    served first come, first served, so a big image is not starved by a stream of small ones.
    A request larger than the whole budget is refused at once (the ``refuse`` exception), never
    waited for, and a request that fits always proceeds once nothing else is held: no
    deadlock is possible as long as no thread holds two requests at once (decodes never do).
    ``total=None`` means no limit (requests are still counted).
    """

    def __init__(self, total: int | None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._total = self._check_total(total)
        self._in_use = 0
        self._high_water = 0
        self._queue: collections.deque[object] = collections.deque()

    @staticmethod
    def _check_total(total: int | None) -> int | None:
        if total is None:
            return None
        total = operator.index(total)
        if total < 0:
            raise ValueError(f"the decode budget must be >= 0 bytes, got {total}")
        return total or None

    @property
    def total(self) -> int | None:
        """The budget in bytes (None: unlimited)."""
        return self._total

    @property
    def in_use(self) -> int:
        """Bytes held by the decodes running now."""
        return self._in_use

    @property
    def high_water(self) -> int:
        """The most bytes held at once since creation or :meth:`reset_high_water`."""
        return self._high_water

    def reset_high_water(self) -> None:
        with self._cond:
            self._high_water = self._in_use

    def set_total(self, total: int | None) -> None:
        """Change the budget (None or 0: unlimited); waiting decodes re-check at once."""
        total = self._check_total(total)
        with self._cond:
            self._total = total
            self._cond.notify_all()

    def _fits(self, nbytes: int) -> bool:
        return self._total is None or self._in_use + nbytes <= self._total

    def acquire(self, nbytes: int, refuse: Callable[[int], Exception] | None = None) -> None:
        """Take ``nbytes``, waiting for them; raise ``refuse(total)`` if they can never fit.

        The default ``refuse`` raises :class:`ValueError`.
        """
        if refuse is None:
            refuse = _over_budget_value_error(nbytes)
        with self._cond:
            if self._total is not None and nbytes > self._total:
                raise refuse(self._total)
            if not self._queue and self._fits(nbytes):
                self._take(nbytes)
                return
            ticket = object()
            self._queue.append(ticket)
            try:
                while not (self._queue[0] is ticket and self._fits(nbytes)):
                    if self._total is not None and nbytes > self._total:  # budget lowered
                        raise refuse(self._total)
                    self._cond.wait()
                self._take(nbytes)
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()  # the next in line may fit now

    def _take(self, nbytes: int) -> None:
        self._in_use += nbytes
        self._high_water = max(self._high_water, self._in_use)

    def release(self, nbytes: int) -> None:
        with self._cond:
            self._in_use -= nbytes
            self._cond.notify_all()

    @contextlib.contextmanager
    def hold(self, nbytes: int, refuse: Callable[[int], Exception] | None = None) -> Iterator[None]:
        """Context manager: :meth:`acquire` on entry, :meth:`release` on exit."""
        self.acquire(nbytes, refuse)
        try:
            yield
        finally:
            self.release(nbytes)


def _over_budget_value_error(nbytes: int) -> Callable[[int], Exception]:
    return lambda total: ValueError(f"{nbytes} bytes requested from a budget of {total} bytes")


_BUDGET = DecodeBudget(DECODE_BUDGET_BYTES)


def decode_budget() -> DecodeBudget:
    """The process-wide budget shared by every :func:`load_image` and :func:`decode_image`."""
    return _BUDGET


def set_decode_budget(nbytes: int | None) -> None:
    """Set the process-wide decode budget in bytes (None or 0: no limit)."""
    _BUDGET.set_total(nbytes)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def is_image_file(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` has a supported image extension (case-insensitive).

    macOS "AppleDouble" companions (``._photo.jpg``, left on shared drives and USB sticks) are
    not images and are excluded. Only the name is looked at (it is often called with a bare file
    name): whether it is a regular file is checked when it is opened (:func:`open_regular`, used
    by every reader here) and, for collections, by :func:`museum_search.core.index._labels.file_problem`.
    """
    name = os.path.basename(os.fspath(path))
    if name.startswith("._"):
        return False
    return os.path.splitext(name)[1].lower() in SUPPORTED_EXTENSIONS


def load_image(path: str | os.PathLike[str], max_side: int | None = None) -> np.ndarray:
    """The photo at ``path`` as a contiguous RGB ``uint8`` array of shape (H, W, 3).

    The image is turned upright according to its EXIF orientation. With ``max_side``, the longest
    side is at most ``max_side`` pixels (never enlarged). Raises :class:`ImageError` for every file
    that cannot be used, with the reason. Decoding holds its memory from the
    :func:`decode_budget` (and waits for it when other decodes hold too much).
    """
    max_side = _check_max_side(max_side)
    try:
        with _open(path) as fp:
            header = _read_header(fp, path)
            _check_pixel_limit(header, path)
            cost = _decode_cost(header, max_side, os.fstat(fp.fileno()).st_size)
            with _BUDGET.hold(cost.peak, functools.partial(_over_budget, path, header, cost)):
                fp.seek(0)
                data = fp.read()
                return _decode(data, header, path, max_side, cost)
    except OSError as exc:  # I/O error while reading (failing disk, network share gone...)
        raise ImageError(path, _os_reason(exc)) from exc


def decode_image(data: bytes, name: str = "<memory>", max_side: int | None = None) -> np.ndarray:
    """Like :func:`load_image` but from the encoded bytes of a file (clipboard, drag-and-drop).

    ``name`` is only used in error messages.
    """
    max_side = _check_max_side(max_side)
    if not isinstance(data, bytes):
        data = bytes(data)
    header = _read_header(io.BytesIO(data), name)
    _check_pixel_limit(header, name)
    cost = _decode_cost(header, max_side, len(data))
    with _BUDGET.hold(cost.peak, functools.partial(_over_budget, name, header, cost)):
        return _decode(data, header, name, max_side, cost)


def decode_cost(path: str | os.PathLike[str], max_side: int | None = None) -> int:
    """Estimated peak memory (bytes) of ``load_image(path, max_side)``, from the header alone.

    This is what the decode holds from the :func:`decode_budget`.
    """
    max_side = _check_max_side(max_side)
    try:
        with _open(path) as fp:
            header = _read_header(fp, path)
            return _decode_cost(header, max_side, os.fstat(fp.fileno()).st_size).peak
    except OSError as exc:
        raise ImageError(path, _os_reason(exc)) from exc


def image_size(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(width, height) of the upright image (after EXIF orientation), read from the header only."""
    try:
        with _open(path) as fp:
            header = _read_header(fp, path)
    except OSError as exc:
        raise ImageError(path, _os_reason(exc)) from exc
    return header.upright_size


def encoded_image_size(data: bytes, name: str = "<memory>") -> tuple[int, int]:
    """(width, height) of the upright image encoded in ``data`` (as :func:`image_size`, from the
    header only); raises :class:`ImageError`."""
    return _read_header(io.BytesIO(bytes(data)), name).upright_size


# --------------------------------------------------------------------------------------------
# Regular files only
# --------------------------------------------------------------------------------------------

_FOLDER = "a folder"


class NotRegularFileError(OSError):
    """``path`` is not a regular file (a FIFO, a socket, a device, a folder): it is never read.

    ``kind`` says what it is (see :func:`file_kind`). An :class:`OSError`, so callers that report
    unreadable files report it too.
    """

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", os.fspath(path))
        self.kind = kind


def file_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is when it is not a regular file (``"a FIFO"``,
    ``"a socket"``...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return _FOLDER
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a special file"


def not_regular_reason(kind: str) -> str:
    """The reason given for a file that is not a regular file (``kind`` from :func:`file_kind`)."""
    return f"not a regular file ({kind}); only image files are indexed"


def open_regular(path: str | os.PathLike[str]) -> int:
    """A read-only file descriptor of ``path``, which must be a regular file (symbolic links followed).

    Reading a FIFO, a socket or a device (``/dev/zero``) named like a photo would block forever or
    never end: they are refused with :class:`NotRegularFileError` (an :class:`OSError`) before
    they are opened, and the file is opened with ``O_NONBLOCK`` (so that one swapped in meanwhile
    cannot block the ``open`` either) and checked again on the descriptor. The descriptor is then
    put back in blocking mode. Other errors are the :class:`OSError` of ``os.stat`` / ``os.open``.
    """
    p = os.fspath(path)
    kind = file_kind(os.stat(p).st_mode)
    if kind is not None:
        raise NotRegularFileError(p, kind)
    nonblock = getattr(os, "O_NONBLOCK", 0)
    fd = os.open(p, os.O_RDONLY | nonblock | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegularFileError(p, kind)
        if nonblock:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --------------------------------------------------------------------------------------------
# Files and headers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Header:
    fmt: str  # "jpeg", "png", "tiff", "webp", "bmp"
    width: int  # as stored, before orientation
    height: int
    orientation: int = 1  # EXIF orientation, 1..8
    scan_offset: int = 0  # JPEG only: offset of the first entropy-coded byte
    tiff_alpha: int | None = None  # TIFF only: ExtraSamples (1 associated, 2 unassociated alpha)
    # What decoding produces, for the memory estimate (conservative where the header is silent):
    channels: int = 4  # samples per pixel (palettes expanded, alpha included)
    bits: int = 8  # bits per sample (1..8 bits decode to 8)
    # JPEG: (H, V) sampling factors of each component, and whether libjpeg must buffer the
    # coefficients of the whole image (progressive, or components in separate scans).
    sampling: tuple[tuple[int, int], ...] = ()
    multi_scan: bool = False
    # TIFF: the strip or tile OpenCV reads at a time (width, height).
    tile: tuple[int, int] | None = None

    @property
    def upright_size(self) -> tuple[int, int]:
        if self.orientation in (5, 6, 7, 8):
            return self.height, self.width
        return self.width, self.height


class _Truncated(Exception):
    """The header ended before it was complete (internal)."""


def _check_max_side(max_side: int | None) -> int | None:
    if max_side is None:
        return None
    if isinstance(max_side, bool):
        raise TypeError("max_side must be an int or None")
    max_side = operator.index(max_side)
    if max_side < 1:
        raise ValueError(f"max_side must be >= 1, got {max_side}")
    return max_side


def _open(path: str | os.PathLike[str]) -> BinaryIO:
    p = os.fspath(path)
    try:
        return os.fdopen(open_regular(p), "rb")
    except NotRegularFileError as exc:
        if exc.kind == _FOLDER:
            raise ImageError(path, "this is a folder, not an image file") from None
        raise ImageError(path, not_regular_reason(exc.kind)) from None
    except FileNotFoundError as exc:
        raise ImageError(path, "file not found (it may have been moved, renamed or deleted)") from exc
    except IsADirectoryError as exc:
        raise ImageError(path, "this is a folder, not an image file") from exc
    except PermissionError as exc:
        if os.path.isdir(p):  # Windows reports folders as "permission denied"
            raise ImageError(path, "this is a folder, not an image file") from exc
        raise ImageError(
            path, "permission denied: the file cannot be read (check its access rights)"
        ) from exc
    except OSError as exc:
        raise ImageError(path, _os_reason(exc)) from exc


def _os_reason(exc: OSError) -> str:
    return f"the file cannot be read ({exc.strerror or exc}); check the disk or network share"


def _read_exact(fp: BinaryIO, n: int) -> bytes:
    b = fp.read(n)
    if len(b) != n:
        raise _Truncated
    return b


def _check_pixel_limit(header: _Header, path) -> None:
    w, h = header.upright_size
    if w * h > MAX_PIXELS:
        raise ImageError(
            path,
            f"image too large: {w}x{h} px exceeds the {MAX_PIXELS // 1_000_000}-megapixel limit; "
            "save a smaller copy (e.g. 10,000 px on the longest side) and use that",
        )


def _read_header(fp: BinaryIO, path) -> _Header:
    head = fp.read(64)
    if not head:
        raise ImageError(path, "file is empty (0 bytes); " + _RECOPY)
    fmt = _sniff(head, path)
    fp.seek(0)
    parse = {
        "jpeg": _jpeg_header,
        "png": _png_header,
        "tiff": _tiff_header,
        "webp": _webp_header,
        "bmp": _bmp_header,
    }[fmt]
    try:
        header = parse(fp)
    except _Truncated:
        raise ImageError(
            path, f"truncated or corrupt {_FORMAT_NAMES[fmt]} data: the file ends inside its "
            f"header; {_RECOPY}"
        ) from None
    except _CorruptHeader as exc:
        raise ImageError(
            path, f"corrupt {_FORMAT_NAMES[fmt]} header ({exc}); {_RECOPY}"
        ) from None
    if header.width <= 0 or header.height <= 0:
        raise ImageError(
            path, f"corrupt {_FORMAT_NAMES[fmt]} header (size {header.width}x{header.height}); "
            + _RECOPY
        )
    return header


class _CorruptHeader(Exception):
    """The header is malformed (internal); the message says how."""


# Signatures of files that are often mistaken for, or renamed as, supported images.
_OTHER_FORMATS = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"\xff\x4f\xff\x51", "JPEG 2000"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (b"8BPS", "Photoshop (PSD)"),
    (b"%PDF", "PDF document"),
    (b"PK\x03\x04", "ZIP archive or office document"),
    (b"\x00\x00\x01\x00", "Windows icon (ICO)"),
)


# Sizes of the BMP info headers (OS/2 1.x and 2.x, Windows 3.x to 5, Adobe variants).
_BMP_DIB_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})


def _sniff(head: bytes, path) -> str:
    """The format of a file from its first bytes, or an ImageError saying what it is instead."""
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM" and len(head) >= 18 and struct.unpack_from("<I", head, 14)[0] in _BMP_DIB_SIZES:
        return "bmp"

    if head.startswith(b"\x00\x05\x16\x07"):
        raise ImageError(
            path, "not an image: this is a macOS resource-fork file ('._' file); it can be deleted"
        )
    kind = next((k for sig, k in _OTHER_FORMATS if head.startswith(sig)), None)
    if kind is None and head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1"):
            kind = "HEIC"
        elif brand in (b"avif", b"avis"):
            kind = "AVIF"
        else:
            raise ImageError(path, "not an image: this looks like a video file")
    if kind is not None:
        raise ImageError(
            path, f"unsupported image format ({kind}); convert it to JPEG, PNG or TIFF"
        )
    text = _as_text(head)
    if text is not None:
        lowered = text.lstrip("\ufeff \t\r\n").lower()
        if lowered.startswith(("<!doctype html", "<html")):
            raise ImageError(
                path, "not an image: this is a web page (often a failed download); "
                "download the photo again"
            )
        if "<svg" in lowered:
            raise ImageError(
                path, "unsupported image format (SVG vector drawing); export it as PNG or JPEG"
            )
        raise ImageError(path, "not an image: the file contains text")
    raise ImageError(path, "not an image (unrecognised format)")


def _as_text(head: bytes) -> str | None:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        # The 64-byte sample may end inside a multi-byte character.
        try:
            text = head[:-3].decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not text or any(not (c.isprintable() or c in "\t\r\n\ufeff") for c in text):
        return None
    return text


# -- JPEG --------------------------------------------------------------------------------------

# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic).
_JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
_JPEG_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
# Markers allowed between two scans: DHT, DAC, SOS, DQT, DNL, DRI, COM, APPn.
_JPEG_BETWEEN_SCANS = frozenset({0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)})
# The end of an entropy-coded segment: 0xFF followed by anything but a stuffed 0x00, a restart
# marker or another 0xFF fill byte.
_JPEG_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _jpeg_header(fp: BinaryIO) -> _Header:
    _read_exact(fp, 2)  # SOI, already checked by _sniff
    size: tuple[int, int] | None = None
    sampling: tuple[tuple[int, int], ...] = ()
    precision, progressive = 8, False
    orientation = 1
    exif_seen = False
    while True:
        byte = _read_exact(fp, 1)[0]
        while byte != 0xFF:  # stray bytes between segments: libjpeg skips them, so do we
            byte = _read_exact(fp, 1)[0]
        while byte == 0xFF:  # fill bytes
            byte = _read_exact(fp, 1)[0]
        marker = byte
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # stand-alone markers
            continue
        if marker == 0xD8:
            raise _CorruptHeader("a second start-of-image marker")
        if marker == 0xD9:
            raise _CorruptHeader("it ends before any image data")
        length = struct.unpack(">H", _read_exact(fp, 2))[0]
        if length < 2:
            raise _CorruptHeader(f"bad segment length {length}")
        if marker in _JPEG_SOF or marker == 0xDA or (marker == 0xE1 and not exif_seen):
            payload = _read_exact(fp, length - 2)
        else:
            fp.seek(length - 2, os.SEEK_CUR)
            continue
        if marker in _JPEG_SOF:
            if len(payload) < 6:
                raise _CorruptHeader("short frame header")
            if size is None:
                precision, height, width, n = struct.unpack(">BHHB", payload[:6])
                if height == 0:
                    raise _CorruptHeader("image height is not in the header (DNL), not supported")
                if n == 0 or len(payload) < 6 + 3 * n:
                    raise _CorruptHeader("short frame header")
                size = (width, height)
                sampling = tuple(
                    (max(1, b >> 4), max(1, b & 15)) for b in payload[7 : 6 + 3 * n : 3]
                )
                progressive = marker in _JPEG_PROGRESSIVE
        elif marker == 0xE1:
            if payload.startswith(b"Exif\x00\x00"):
                orientation = _exif_orientation(payload)
                exif_seen = True
        else:  # SOS: the image data starts right after this segment
            if size is None:
                raise _CorruptHeader("image data before the frame header")
            in_first_scan = payload[0] if payload else 0
            return _Header(
                "jpeg", size[0], size[1], orientation, fp.tell(),
                channels=len(sampling), bits=precision, sampling=sampling,
                multi_scan=progressive or in_first_scan < len(sampling),
            )


def _check_jpeg_data(data: bytes, header: _Header) -> str | None:
    """Why the JPEG image data is incomplete or damaged, or None when its structure is sound.

    JPEG has no checksum, so damage *inside* the compressed data cannot be found without
    decoding (libjpeg only prints warnings); this finds what decoders silently paper over:
    missing end (truncated copy, zero-filled tail) and foreign markers inside the image data.
    """
    pos, n = header.scan_offset, len(data)
    while True:
        m = _JPEG_SCAN_END.search(data, pos)
        if m is None:
            return "the end of the image data is missing (incomplete copy or download?)"
        marker, pos = data[m.end() - 1], m.end()
        if marker == 0xD9:  # EOI: anything after it (camera trailers, MPF previews) is ignored
            return None
        if marker not in _JPEG_BETWEEN_SCANS:
            return f"unexpected marker 0x{marker:02X} inside the image data"
        if pos + 2 > n:
            return "the end of the image data is missing (incomplete copy or download?)"
        length = int.from_bytes(data[pos : pos + 2], "big")
        if length < 2:
            return f"bad segment length {length} inside the image data"
        pos += length
        if pos > n:
            return "the end of the image data is missing (incomplete copy or download?)"


def _check_png_chunks(data: bytes) -> str | None:
    """Why a PNG's chunk structure is broken, or None: every chunk's length must fit in the file up
    to IEND. OpenCV's reader believes a chunk's length: a 3.5 KB file whose image-data chunk claims
    4 GB took it 2-8 s of CPU (the fuzzer's finding; a phone could send one per request)."""
    pos, n = 8, len(data)
    while pos + 8 <= n:
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if length > 0x7FFFFFFF or pos + 12 + length > n:
            return f"a {kind.decode('latin-1')!r} chunk claims {length:,} bytes, more than the file holds"
        if kind == b"IEND":
            return None
        pos += 12 + length
    return "the end of the image (IEND) is missing (incomplete copy or download?)"


def _exif_orientation(blob: bytes) -> int:
    """The Orientation tag (1..8) of an EXIF block (TIFF structure); 1 when absent or unreadable."""
    if blob.startswith(b"Exif\x00\x00"):
        blob = blob[6:]
    if len(blob) < 8:
        return 1
    order = {b"II": "<", b"MM": ">"}.get(blob[:2])
    if order is None or struct.unpack_from(order + "H", blob, 2)[0] != 42:
        return 1
    ifd = struct.unpack_from(order + "I", blob, 4)[0]
    if ifd + 2 > len(blob):
        return 1
    for i in range(struct.unpack_from(order + "H", blob, ifd)[0]):
        entry = ifd + 2 + 12 * i
        if entry + 12 > len(blob):
            break
        tag, kind = struct.unpack_from(order + "HH", blob, entry)
        if tag == 0x0112:
            if kind == 3:  # SHORT
                value = struct.unpack_from(order + "H", blob, entry + 8)[0]
            elif kind == 4:  # LONG (non-standard, seen in the wild)
                value = struct.unpack_from(order + "I", blob, entry + 8)[0]
            else:
                return 1
            return value if 1 <= value <= 8 else 1
    return 1


# -- PNG ---------------------------------------------------------------------------------------


def _png_header(fp: BinaryIO) -> _Header:
    _read_exact(fp, 8)  # signature
    length, kind = struct.unpack(">I4s", _read_exact(fp, 8))
    if kind != b"IHDR" or length != 13:
        raise _CorruptHeader("the first chunk is not IHDR")
    width, height, depth, colour_type = struct.unpack(">IIBB", _read_exact(fp, 10))
    fp.seek(3 + 4, os.SEEK_CUR)  # rest of IHDR, CRC
    orientation = 1
    exif_seen = idat_seen = transparency = False
    # EXIF (eXIf chunk) may come before or after the image data; skipping chunks is cheap.
    while not (exif_seen and idat_seen):
        chunk = fp.read(8)
        if len(chunk) < 8:
            break
        length, kind = struct.unpack(">I4s", chunk)
        if length >= 2**31 or kind == b"IEND":
            break
        if kind == b"eXIf" and not exif_seen:
            orientation = _exif_orientation(fp.read(length))
            exif_seen = True
            fp.seek(4, os.SEEK_CUR)
            continue
        if kind == b"IDAT":
            idat_seen = True
        elif kind == b"tRNS" and not idat_seen:
            transparency = True
        fp.seek(length + 4, os.SEEK_CUR)
    # Decoded samples per pixel: grey 1, RGB and palette 3, + alpha (grey+alpha comes out as
    # BGRA); unknown colour types are taken at the worst.
    channels = {0: 1, 2: 3, 3: 3, 4: 4, 6: 4}.get(colour_type, 4)
    if transparency and channels in (1, 3):
        channels = 4
    return _Header(
        "png", width, height, orientation, channels=channels, bits=16 if depth > 8 else 8
    )


# -- WebP --------------------------------------------------------------------------------------


def _webp_header(fp: BinaryIO) -> _Header:
    _read_exact(fp, 12)  # RIFF, size, WEBP
    size: tuple[int, int] | None = None
    orientation = 1
    extended = False
    alpha = True  # until the header says otherwise
    while True:
        chunk = fp.read(8)
        if len(chunk) < 8:
            break
        kind, length = chunk[:4], struct.unpack("<I", chunk[4:])[0]
        start = fp.tell()
        if kind == b"VP8X":
            p = _read_exact(fp, 10)
            extended = True
            size = (1 + int.from_bytes(p[4:7], "little"), 1 + int.from_bytes(p[7:10], "little"))
            alpha = bool(p[0] & 0x10)
            if not p[0] & 0x08:  # no EXIF flag
                break
        elif kind == b"VP8 ":
            p = _read_exact(fp, 10)
            if p[3:6] != b"\x9d\x01\x2a":
                raise _CorruptHeader("bad VP8 frame header")
            if size is None:
                w, h = struct.unpack("<HH", p[6:10])
                size = (w & 0x3FFF, h & 0x3FFF)
                alpha = False  # simple lossy format: no alpha
            if not extended:
                break
        elif kind == b"VP8L":
            p = _read_exact(fp, 5)
            if p[0] != 0x2F:
                raise _CorruptHeader("bad lossless header")
            if size is None:
                bits = struct.unpack("<I", p[1:5])[0]
                size = ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
                alpha = bool(bits >> 28 & 1)
            if not extended:
                break
        elif kind == b"EXIF":
            orientation = _exif_orientation(fp.read(length))
            break
        fp.seek(start + length + (length & 1))
    if size is None:
        raise _CorruptHeader("no image data")
    return _Header("webp", size[0], size[1], orientation, channels=4 if alpha else 3)


# -- BMP ---------------------------------------------------------------------------------------


def _bmp_header(fp: BinaryIO) -> _Header:
    head = _read_exact(fp, 18)
    dib = struct.unpack_from("<I", head, 14)[0]
    if dib == 12:  # OS/2 BITMAPCOREHEADER
        width, height, _, bpp = struct.unpack("<HHHH", _read_exact(fp, 8))
    elif dib in _BMP_DIB_SIZES:
        width, height, _, bpp = struct.unpack("<iiHH", _read_exact(fp, 12))
        height = abs(height)  # negative: rows stored top-down
    else:
        raise _CorruptHeader(f"unknown bitmap header size {dib}")
    return _Header("bmp", width, height, channels=4 if bpp == 32 else 3)


# -- TIFF --------------------------------------------------------------------------------------


def _tiff_header(fp: BinaryIO) -> _Header:
    # TIFF headers are IFD graphs that may sit anywhere in the file: let Pillow parse them.
    # The plugin class is used directly (not Image.open) so Pillow's decompression-bomb
    # check, whose limit differs from ours, does not apply; nothing is decoded here.
    from PIL import TiffImagePlugin  # lazy: Pillow is loaded only for the TIFF files that need it

    try:
        im = TiffImagePlugin.TiffImageFile(fp)
        # The stored size: recent Pillow reports .size already turned by the Orientation tag.
        width, height = im.tag_v2.get(256, im.size[0]), im.tag_v2.get(257, im.size[1])
        orientation = im.tag_v2.get(0x0112, 1)
        extra = im.tag_v2.get(338)
        spp = _tiff_int(im.tag_v2.get(277), 1)
        bits = _tiff_int(im.tag_v2.get(258), 8, max)
        photometric = _tiff_int(im.tag_v2.get(262), 2)
        if 322 in im.tag_v2 and 323 in im.tag_v2:
            tile = (_tiff_int(im.tag_v2[322], width), _tiff_int(im.tag_v2[323], height))
        else:
            tile = (width, _tiff_int(im.tag_v2.get(278), height))  # RowsPerStrip
    except EOFError:
        raise _Truncated from None
    except (SyntaxError, OSError, ValueError, struct.error, IndexError, KeyError, TypeError) as exc:
        raise _CorruptHeader(str(exc) or type(exc).__name__) from None
    if not isinstance(orientation, int) or not 1 <= orientation <= 8:
        orientation = 1
    if isinstance(extra, tuple):
        extra = extra[0] if extra else None
    # OpenCV reads most 8-bit TIFFs through libtiff's RGBA interface: 4 samples per pixel,
    # except plain greyscale; deeper ones keep their samples (bits: 16, 32 or 64 float).
    grey = spp == 1 and photometric in (0, 1)
    channels = spp if grey or spp > 4 else 4
    tile = (max(1, min(width, tile[0])), max(1, min(height, tile[1])))
    return _Header(
        "tiff", width, height, orientation, tiff_alpha=extra if extra in (1, 2) else None,
        channels=channels, bits=8 if bits <= 8 else 8 * -(-bits // 8), tile=tile,
    )


def _tiff_int(value, default: int, pick=min) -> int:
    """A TIFF tag value as one int (Pillow gives tuples for per-sample tags)."""
    if isinstance(value, tuple):
        value = pick(value) if value else None
    return value if isinstance(value, int) and value > 0 else default


@dataclass(frozen=True)
class _TiffQuirks:
    orients: bool  # cv2.imdecode applies the TIFF Orientation tag itself, even IMREAD_UNCHANGED
    premultiplies: bool  # 8-bit unassociated alpha comes out premultiplied (libtiff RGBA reader)


@functools.cache
def _opencv_tiff_quirks() -> _TiffQuirks:
    """How this OpenCV build decodes TIFFs, measured once on two tiny files.

    OpenCV 5.0 turns TIFFs upright itself (IMREAD_UNCHANGED ignores EXIF orientation for every
    other format) and reads 8-bit RGBA TIFFs through libtiff's RGBA interface, which
    premultiplies unassociated alpha. Measuring keeps both right on other OpenCV versions.
    """
    from PIL import Image  # lazy: Pillow is loaded only for the TIFF files that need it

    def decode(im: Image.Image, **kw) -> np.ndarray | None:
        buf = io.BytesIO()
        im.save(buf, "TIFF", **kw)
        return cv2.imdecode(np.frombuffer(buf.getvalue(), np.uint8), cv2.IMREAD_UNCHANGED)

    grey = Image.new("L", (2, 1))
    grey.putpixel((1, 0), 255)
    turned = decode(grey, tiffinfo={0x0112: 3})  # rotate 180: the white pixel moves to the left
    rgba = decode(Image.new("RGBA", (1, 1), (0, 0, 255, 128)))  # Pillow writes ExtraSamples=2
    return _TiffQuirks(
        orients=turned is not None and int(turned.reshape(-1)[0]) == 255,
        premultiplies=rgba is not None and rgba.shape[-1] == 4 and int(rgba[0, 0, 0]) < 192,
    )


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

_JPEG_REDUCED = {
    1: cv2.IMREAD_COLOR,
    2: cv2.IMREAD_REDUCED_COLOR_2,
    4: cv2.IMREAD_REDUCED_COLOR_4,
    8: cv2.IMREAD_REDUCED_COLOR_8,
}


def _jpeg_reduction(long_side: int, max_side: int | None) -> int:
    """The largest libjpeg scale-down (8, 4, 2) that keeps the longest side >= max_side."""
    if max_side is not None:
        for k in (8, 4, 2):
            if -(-long_side // k) >= max_side:  # libjpeg rounds scaled sizes up
                return k
    return 1


# -- Memory -------------------------------------------------------------------------------------

#: Safety margin on the estimated peak (allocator rounding, decoder row buffers).
_DECODE_SLACK = 1.1
#: Alpha is composited in float32 strips of about 4 M samples (see _flatten_alpha).
_ALPHA_STRIPS = 48 * _MIB


@dataclass(frozen=True)
class _Cost:
    """What decoding an image takes: the decoded array and the estimated peak, in bytes."""

    width: int  # the size the decoder produces (JPEG: after DCT scaling)
    height: int
    channels: int  # samples per pixel of the decoder's output
    sample_bytes: int
    peak: int

    @property
    def decoded(self) -> int:
        return self.width * self.height * self.channels * self.sample_bytes


def _decode_cost(header: _Header, max_side: int | None, encoded: int) -> _Cost:
    """The peak memory of :func:`_decode` for this header, estimated before decoding.

    With ``raw`` = w x h x channels x bytes per sample, the decoder's output at the size it
    decodes to (JPEG: after DCT scaling; every other format: full size), and ``rgb`` = w x h x 3
    (the uint8 RGB array made from it)::

        peak = 1.1 x (encoded + max(raw + internal, raw + max(raw, rgb), 2 rgb) [+ alpha strips])

    * ``raw + internal``: while decoding, the output and what the decoder holds besides it:
      JPEG: with a progressive (or multi-scan) file, libjpeg keeps the DCT coefficients of the
      whole image, at full size even when decoding at 1/8 (128 bytes per 8x8 block per
      component); a baseline file needs row buffers only. PNG: OpenCV decodes into a
      temporary of the output's size and copies it (measured: 2 x raw). WebP: libwebp's
      4-byte ARGB buffer (lossless). TIFF: the strip or tile read at a time (a single-strip
      file: the whole image). BMP: rows only.
    * ``raw + max(raw, rgb)``: the decoded array and its first converted copy (alpha
      flattened: at most raw; 16 -> 8 bit: less; grey -> RGB: rgb);
    * ``2 rgb``: the RGB array and its upright contiguous copy;
    * alpha strips: float32 working strips of the compositing onto white;
    * 1.1: allocator and row-buffer slack. After a resize to ``max_side`` everything is small.

    Measured against ru_maxrss (bench/bench_decode_memory.py), the estimate bounds the real
    peak: e.g. a 20000 x 20000 16-bit RGBA PNG: estimated 6.6 GiB, measured 6.0 GiB unbudgeted.
    """
    w, h = header.width, header.height
    internal = 0
    if header.fmt == "jpeg":
        k = _jpeg_reduction(max(w, h), max_side)
        w, h = -(-w // k), -(-h // k)
        channels, sample_bytes = (4 if header.channels == 4 else 3), 1
        if header.multi_scan:
            internal = _jpeg_coefficient_bytes(header)
    else:
        channels, sample_bytes = header.channels, header.bits // 8
    raw = w * h * channels * sample_bytes
    rgb = w * h * 3
    if header.fmt == "png":
        internal = raw
    elif header.fmt == "webp":
        internal = 4 * w * h
    elif header.fmt == "tiff" and header.tile is not None:
        internal = header.tile[0] * header.tile[1] * max(channels, 4) * sample_bytes
    strips = min(4 * raw, _ALPHA_STRIPS) if channels in (2, 4) else 0
    peak = encoded + max(raw + internal, raw + max(raw, rgb), 2 * rgb) + strips
    return _Cost(w, h, channels, sample_bytes, math.ceil(peak * _DECODE_SLACK))


def _jpeg_coefficient_bytes(header: _Header) -> int:
    """Bytes of libjpeg's whole-image coefficient buffer (progressive / multi-scan JPEGs)."""
    hmax = max(hv[0] for hv in header.sampling)
    vmax = max(hv[1] for hv in header.sampling)
    blocks = 0
    for hi, vi in header.sampling:
        bw = -(-header.width * hi // (8 * hmax))
        bh = -(-header.height * vi // (8 * vmax))
        blocks += (-(-bw // hi) * hi) * (-(-bh // vi) * vi)  # padded to whole MCUs
    return blocks * 128  # 64 coefficients x 2 bytes


def _format_bytes(n: int) -> str:
    if n >= 1000 * _MIB:
        return f"{n / (1 << 30):.1f} GB"
    return f"{max(1, round(n / _MIB))} MB"


def _over_budget(path, header: _Header, cost: _Cost, total: int) -> ImageError:
    w, h = header.upright_size
    kind = ", progressive" if header.fmt == "jpeg" and header.multi_scan else ""
    plural = "s" if header.channels != 1 else ""
    deeper = " 8-bit" if header.bits > 8 else ""
    return ImageError(
        path,
        f"decoding needs {_format_bytes(cost.peak)} of memory ({w}x{h} px, {header.channels} "
        f"channel{plural}, {header.bits} bit{kind}), over the {_format_bytes(total)} decode "
        f"budget; save a smaller{deeper} copy (e.g. 10,000 px on the longest side) and use "
        f"that, or raise {DECODE_BUDGET_ENV}",
    )


def _no_memory(cost: _Cost) -> str:
    return (
        f"not enough memory to decode this image (about {_format_bytes(cost.peak)} needed); "
        "close other programs, or save a smaller copy and use that"
    )


# -- Decoders -----------------------------------------------------------------------------------

# libjpeg warnings that mean the compressed data is damaged (JWRN_* in libjpeg's jerror.h; a
# fatal "premature end of input" too). Others (an unknown JFIF version...) are harmless.
_JPEG_DAMAGE = re.compile(
    r"corrupt|premature end|inconsistent progression|invalid sos parameters|bad huffman|"
    r"bad arithmetic",
    re.IGNORECASE,
)
# A few stray bytes before the end-of-image marker are padding some encoders add: the image is
# whole. Damaged data desynchronises the decoder and leaves many more (>= 12 measured on 300
# damaged photos).
_JPEG_PADDING = re.compile(r"(\d+) extraneous bytes before marker 0xd9", re.IGNORECASE)
_JPEG_PADDING_MAX = 4


def _decode(data: bytes, header: _Header, path, max_side: int | None, cost: _Cost) -> np.ndarray:
    fmt = _FORMAT_NAMES[header.fmt]
    try:
        rgb = None
        if header.fmt == "jpeg":
            problem = _check_jpeg_data(data, header)
            if problem is not None:
                raise ImageError(path, f"truncated or corrupt JPEG data: {problem}; {_RECOPY}")
            k = _jpeg_reduction(max(header.width, header.height), max_side)
            rgb = _decode_jpeg(data, header, path, k)
            # Orientation is applied below, the same way for every format.
            flags = _JPEG_REDUCED[k] | cv2.IMREAD_IGNORE_ORIENTATION
        else:
            if header.fmt == "png" and (problem := _check_png_chunks(data)) is not None:
                raise ImageError(path, f"truncated or corrupt PNG data: {problem}; {_RECOPY}")
            # Keeps alpha and 16-bit samples; ignores EXIF orientation (except TIFF, see below).
            flags = cv2.IMREAD_UNCHANGED
        if rgb is None:
            img = _imdecode(data, flags, fmt, path)
            premultiplied = header.fmt == "tiff" and (
                header.tiff_alpha == 1  # associated alpha: stored premultiplied
                or (header.tiff_alpha == 2 and img.dtype == np.uint8
                    and _opencv_tiff_quirks().premultiplies)
            )
            img = _to_colour_or_grey(img, path, premultiplied)
            img = _to_uint8(_shrink(img, max_side))
            rgb = cv2.cvtColor(img, cv2.COLOR_GRAY2RGB if img.ndim == 2 else cv2.COLOR_BGR2RGB)
            del img
        else:
            rgb = _shrink(rgb, max_side)
        if not (header.fmt == "tiff" and _opencv_tiff_quirks().orients):
            rgb = _orient(rgb, header.orientation)
        return np.ascontiguousarray(rgb)
    except MemoryError:
        raise ImageError(path, _no_memory(cost)) from None
    except cv2.error as exc:  # raised by the conversions; imdecode's own errors are caught below
        if "memory" in str(exc).lower() or "allocate" in str(exc).lower():
            raise ImageError(path, _no_memory(cost)) from None
        log.warning("OpenCV failed on %s", path, exc_info=True)
        raise ImageError(
            path, f"unsupported or corrupt {fmt} data ({exc.err or exc}); {_RECOPY}"
        ) from None


def _imdecode(data: bytes, flags: int, fmt: str, path) -> np.ndarray:
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as exc:
        log.debug("cv2.imdecode failed on %s: %s", path, exc)
        img = None
    if img is None or img.size == 0:
        raise ImageError(
            path, f"truncated or corrupt {fmt} data: the image could not be decoded; {_RECOPY}"
        )
    return img


def _decode_jpeg(data: bytes, header: _Header, path, k: int) -> np.ndarray | None:
    """RGB of a JPEG decoded at 1/k by libjpeg-turbo, refusing damaged data; None: use OpenCV.

    libjpeg decodes damaged entropy-coded data with only a warning (at most printed on stderr,
    naming no file), which OpenCV does not report. In strict mode simplejpeg turns the first
    warning into an error, per call, so thread-safely (libjpeg still prints that warning on
    stderr; nothing here redirects it). JPEG has no checksum: damage that happens to leave the
    bit stream in sync (often a single flipped byte) cannot be seen.
    """
    if _simplejpeg is None:  # pragma: no cover
        return None
    size = {} if k == 1 else {"min_height": -(-header.height // k), "min_width": -(-header.width // k)}
    try:
        return _simplejpeg.decode_jpeg(data, "RGB", strict=True, **size)
    except ValueError as exc:
        warning = re.sub(r"^\w+\(\):\s*", "", str(exc)).strip() or "unknown error"
    padding = _JPEG_PADDING.search(warning)
    if _JPEG_DAMAGE.search(warning) and not (padding and int(padding[1]) <= _JPEG_PADDING_MAX):
        raise ImageError(
            path, f"JPEG data is damaged ({warning[0].lower()}{warning[1:]}); "
            "copy the file again from the original"
        )
    try:
        img = _simplejpeg.decode_jpeg(data, "RGB", strict=False, **size)
    except ValueError:  # not for TurboJPEG's 8-bit API (12-bit, lossless...): OpenCV tries
        log.debug("simplejpeg cannot decode %s (%s); trying OpenCV", path, warning)
        return None
    log.debug("%s: harmless libjpeg warning: %s", path, warning)
    return img


def _shrink(img: np.ndarray, max_side: int | None) -> np.ndarray:
    if max_side is not None and max(img.shape[:2]) > max_side:
        h, w = img.shape[:2]
        scale = max_side / max(h, w)
        size = (max(1, min(max_side, round(w * scale))), max(1, min(max_side, round(h * scale))))
        img = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    return img


def _to_colour_or_grey(img: np.ndarray, path, premultiplied: bool = False) -> np.ndarray:
    """BGR (H, W, 3) or grey (H, W) in the decoder's sample type, alpha flattened onto white."""
    if img.dtype not in (np.uint8, np.uint16, np.float32, np.float64):
        raise ImageError(
            path, f"unsupported pixel format ({img.dtype} samples); save it as 8- or 16-bit RGB"
        )
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 3 and img.shape[2] in (2, 4):
        img = _flatten_alpha(img, premultiplied)
    if not (img.ndim == 2 or (img.ndim == 3 and img.shape[2] == 3)):
        raise ImageError(
            path, f"unsupported pixel format ({img.shape[2]} channels); save it as RGB"
        )
    return img


def _flatten_alpha(img: np.ndarray, premultiplied: bool) -> np.ndarray:
    """Composite grey+alpha or BGRA onto white; an unused alpha (all 0 or all opaque) is dropped."""
    top = 1.0 if img.dtype.kind == "f" else float(np.iinfo(img.dtype).max)
    colour, alpha = img[..., :-1], img[..., -1]
    amin, amax = alpha.min(), alpha.max()
    if amin >= top or amax <= 0:
        if amax <= 0:
            log.debug("alpha channel is entirely transparent: treated as unused and dropped")
        out = np.ascontiguousarray(colour)
    else:
        # out = colour * a + white * (1 - a) (colour already * a when premultiplied), in strips
        # so that a huge image never needs a full-size float copy.
        out = np.empty(colour.shape, img.dtype)
        rows = max(1, (1 << 22) // max(1, colour.shape[1] * colour.shape[2]))
        for y in range(0, img.shape[0], rows):
            a = alpha[y : y + rows, :, None].astype(np.float32) / np.float32(top)
            res = colour[y : y + rows].astype(np.float32)
            if not premultiplied:
                res *= a
            res += np.float32(top) * (1 - a)
            if img.dtype.kind != "f":
                np.rint(res, out=res)
            out[y : y + rows] = res
    return out[..., 0] if out.shape[2] == 1 else out


def _to_uint8(img: np.ndarray) -> np.ndarray:
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:
        return cv2.convertScaleAbs(img, alpha=255.0 / 65535.0)
    # Floating-point samples (some scientific TIFFs) are taken to be in 0..1.
    return cv2.convertScaleAbs(np.clip(img, 0.0, 1.0), alpha=255.0)


def _orient(img: np.ndarray, orientation: int) -> np.ndarray:
    """Turn an image stored with EXIF ``orientation`` upright."""
    if orientation == 2:
        return img[:, ::-1]
    if orientation == 3:
        return img[::-1, ::-1]
    if orientation == 4:
        return img[::-1]
    if orientation == 5:
        return img.transpose(1, 0, 2)
    if orientation == 6:
        return np.rot90(img, -1)  # 90 degrees clockwise
    if orientation == 7:
        return img.transpose(1, 0, 2)[::-1, ::-1]
    if orientation == 8:
        return np.rot90(img, 1)  # 90 degrees counter-clockwise
    return img

