"""Camera sources for live queries, behind one small interface (no Qt).

A :class:`CameraSource` is opened, read repeatedly and closed, all on one thread (the GUI runs it
on a worker thread)::

    cam = OpenCVCamera(0)
    cam.open()                 # CameraError with a message the user can act on
    frame = cam.read()         # RGB uint8 (H, W, 3), or None when no new frame is ready
    cam.close()

:class:`OpenCVCamera` reads a webcam through ``cv2.VideoCapture``; :class:`FileSequenceCamera`
replays image files (tests, demos, a kiosk without a camera). :func:`list_cameras` probes which
camera numbers work, quickly. :func:`is_steady` tells whether two frames show the same still
scene (the kiosk demo uses it to capture a query once the visitor holds the camera still).
:func:`log_camera_problem` logs a camera's problem once per process, however often it is retried.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import cv2
import numpy as np

from museum_search.core.errors import ImageError, MuseumSearchError
from museum_search.core.images import load_image

log = logging.getLogger(__name__)

__all__ = [
    "CameraError",
    "CameraSource",
    "FileSequenceCamera",
    "OpenCVCamera",
    "frame_difference",
    "is_steady",
    "list_cameras",
    "log_camera_problem",
]

#: Seconds without a frame after which an open webcam is reported as lost.
LOST_AFTER = 3.0
#: Default ``is_steady`` threshold: mean absolute grey-level difference (0..255) of two frames.
STEADY_THRESHOLD = 4.0


class CameraError(MuseumSearchError):
    """A camera could not be opened or stopped sending images."""


_logged: set[str] = set()
_logged_lock = threading.Lock()


def log_camera_problem(logger: logging.Logger, message: str, level: int = logging.ERROR) -> bool:
    """Log ``message`` (a camera that cannot be used) at ``level`` the first time this process
    meets it, at debug level after: a kiosk that retries, or a camera started again and again,
    does not repeat the same line on stderr. True when it was logged at ``level``."""
    with _logged_lock:
        first = message not in _logged
        _logged.add(message)
    logger.log(level if first else logging.DEBUG, "%s", message)
    return first


def no_camera_message(index: int) -> str:
    """Where the camera is chosen differs (the Search tab's Camera list, ``--camera N``): views add that."""
    return f"No camera found at number {index}. Connect a webcam or choose another camera."


@runtime_checkable
class CameraSource(Protocol):
    """Where live query frames come from. All methods are called from one (worker) thread."""

    name: str

    def open(self) -> None:
        """Start the camera; raises :class:`CameraError` when it cannot be used."""

    def read(self) -> np.ndarray | None:
        """The newest frame as RGB uint8 (H, W, 3), or None when there is no new frame yet."""

    def close(self) -> None:
        """Release the camera (safe to call twice, or without ``open``)."""


# --------------------------------------------------------------------------------------------
# OpenCV webcams


def _backend() -> int:
    if sys.platform.startswith("linux"):
        return cv2.CAP_V4L2
    if sys.platform == "win32":
        return cv2.CAP_DSHOW  # opens much faster than MSMF
    if sys.platform == "darwin":
        return cv2.CAP_AVFOUNDATION
    return cv2.CAP_ANY


def _device_missing(index: int) -> bool:
    """True when we can tell without opening anything that there is no camera ``index``."""
    if sys.platform.startswith("linux"):
        return not os.path.exists(f"/dev/video{index}")
    return False


def _open_capture(index: int, timeout_ms: int = 3000) -> cv2.VideoCapture | None:
    """An opened ``cv2.VideoCapture`` for camera ``index``, or None."""
    if index < 0 or _device_missing(index):
        return None
    params = []
    for name in ("CAP_PROP_OPEN_TIMEOUT_MSEC", "CAP_PROP_READ_TIMEOUT_MSEC"):
        prop = getattr(cv2, name, None)
        if prop is not None:
            params += [prop, int(timeout_ms)]
    try:
        cap = cv2.VideoCapture(index, _backend(), params) if params else cv2.VideoCapture(index, _backend())
    except (cv2.error, TypeError):
        cap = cv2.VideoCapture(index, _backend())
    if not cap.isOpened():
        cap.release()
        return None
    return cap


class OpenCVCamera:
    """Webcam number ``index`` through OpenCV, asking for ``width`` × ``height`` frames."""

    def __init__(self, index: int = 0, width: int = 1280, height: int = 720):
        self.index = int(index)
        self.width = int(width)
        self.height = int(height)
        self.name = f"Camera {self.index}"
        self._cap: cv2.VideoCapture | None = None
        self._last_frame = 0.0

    def open(self) -> None:
        if self._cap is not None:
            return
        cap = _open_capture(self.index)
        if cap is None:
            raise CameraError(no_camera_message(self.index))
        if self.width > 0 and self.height > 0:
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, self.width)
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, self.height)
        self._cap = cap
        self._last_frame = time.monotonic()

    def read(self) -> np.ndarray | None:
        if self._cap is None:
            raise CameraError(f"{self.name} is not open; start the camera first.")
        ok, frame = self._cap.read()
        now = time.monotonic()
        if not ok or frame is None or frame.size == 0:
            if now - self._last_frame > LOST_AFTER:
                raise CameraError(
                    f"{self.name} stopped sending images. Check that it is still connected and not "
                    f"used by another program, then start it again."
                )
            return None
        self._last_frame = now
        if frame.ndim == 2:
            return cv2.cvtColor(frame, cv2.COLOR_GRAY2RGB)
        if frame.shape[2] == 4:
            return cv2.cvtColor(frame, cv2.COLOR_BGRA2RGB)
        return cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)

    def close(self) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            cap.release()

    def __repr__(self) -> str:
        return f"OpenCVCamera({self.index})"


def list_cameras(max_index: int = 4, timeout: float = 1.5) -> list[int]:
    """Numbers (0..``max_index``-1) of the cameras that open, probed within about ``timeout`` s.

    Where the operating system lists video devices (Linux: ``/dev/video*``), absent numbers are
    skipped without touching OpenCV, so a machine without a camera answers at once. Each probe
    runs on a daemon thread; a driver that hangs is abandoned after the deadline.
    """
    candidates = [i for i in range(max(0, int(max_index))) if not _device_missing(i)]
    if not candidates:
        return []
    found: list[int] = []
    lock = threading.Lock()

    def probe(i: int) -> None:
        try:
            cap = _open_capture(i, timeout_ms=int(timeout * 1000))
        except cv2.error as exc:  # a broken driver: that number does not work
            log.debug("probing camera %d failed: %s", i, exc)
            return
        if cap is not None:
            cap.release()
            with lock:
                found.append(i)

    deadline = time.monotonic() + timeout
    for i in candidates:  # one at a time: several drivers dislike concurrent opens
        t = threading.Thread(target=probe, args=(i,), name=f"camera-probe-{i}", daemon=True)
        t.start()
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            log.info("camera %d did not answer within %.1f s; skipped", i, timeout)
            break
    with lock:
        return sorted(found)


# --------------------------------------------------------------------------------------------
# Replayed image files


class FileSequenceCamera:
    """Replays image files as a camera at ``fps`` frames per second (``fps <= 0``: a new frame at
    every ``read``), looping when ``loop``. Used by tests, demos and kiosks without a camera."""

    def __init__(self, paths: Sequence[str | os.PathLike], fps: float = 15, loop: bool = True,
                 max_side: int | None = 1280, name: str | None = None):
        self.paths = [Path(p) for p in paths]
        self.fps = float(fps)
        self.loop = bool(loop)
        self.max_side = max_side
        self.name = name or (f"Replay of {len(self.paths)} image(s)" if len(self.paths) != 1
                             else f"Replay of {self.paths[0].name}")
        self._frames: list[np.ndarray | None] = []
        self._pos = 0
        self._next_time = 0.0
        self._open = False

    @property
    def position(self) -> int:
        """Index (in ``paths``) of the frame the next ``read`` returns."""
        return self._pos

    @property
    def finished(self) -> bool:
        """True once a non-looping replay has returned its last frame."""
        return not self.loop and self._pos >= len(self.paths)

    def open(self) -> None:
        if not self.paths:
            raise CameraError("The replay camera has no images to show; choose some image files.")
        self._frames = [None] * len(self.paths)
        self._pos = 0
        self._next_time = 0.0
        self._open = True

    def _frame(self, i: int) -> np.ndarray:
        frame = self._frames[i]
        if frame is None:
            try:
                frame = load_image(self.paths[i], max_side=self.max_side)
            except ImageError as exc:
                raise CameraError(f"The replay camera cannot show {self.paths[i]}: {exc.reason}") from None
            self._frames[i] = frame
        return frame

    def read(self) -> np.ndarray | None:
        if not self._open:
            raise CameraError(f"{self.name} is not open; start the camera first.")
        if self._pos >= len(self.paths):
            if not self.loop:
                return None
            self._pos = 0
        if self.fps > 0:
            now = time.monotonic()
            if now < self._next_time:
                return None
            period = 1.0 / self.fps
            # keep a steady rhythm, but do not rush to catch up after a pause
            if not self._next_time or now - self._next_time > period:
                self._next_time = now + period
            else:
                self._next_time += period
        frame = self._frame(self._pos)
        self._pos += 1
        return frame.copy()

    def close(self) -> None:
        self._open = False
        self._frames = []

    def __repr__(self) -> str:
        return f"FileSequenceCamera({len(self.paths)} paths, fps={self.fps:g}, loop={self.loop})"


# --------------------------------------------------------------------------------------------
# Steady-frame detection

_STEADY_SIZE = (64, 48)  # (width, height) the frames are compared at


def _small_grey(frame: np.ndarray) -> np.ndarray:
    a = np.asarray(frame)
    if a.ndim == 3 and a.shape[2] >= 3:
        a = cv2.cvtColor(np.ascontiguousarray(a[:, :, :3]), cv2.COLOR_RGB2GRAY)
    elif a.ndim == 3:
        a = a[:, :, 0]
    if a.dtype != np.uint8:
        a = np.clip(a, 0, 255).astype(np.uint8)
    return cv2.resize(a, _STEADY_SIZE, interpolation=cv2.INTER_AREA).astype(np.float32)


def frame_difference(prev: np.ndarray, cur: np.ndarray) -> float:
    """Mean absolute difference (grey levels, 0..255) of two frames shrunk to 64×48 grey."""
    return float(np.mean(np.abs(_small_grey(prev) - _small_grey(cur))))


def is_steady(prev: np.ndarray | None, cur: np.ndarray | None, threshold: float = STEADY_THRESHOLD) -> bool:
    """True when ``cur`` hardly differs from ``prev`` (mean absolute grey difference of the
    downscaled frames below ``threshold``); False when either frame is missing."""
    if prev is None or cur is None:
        return False
    return frame_difference(prev, cur) < threshold
