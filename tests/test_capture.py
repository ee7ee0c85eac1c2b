"""Camera sources (core.capture): replayed files, missing webcams, steady-frame detection."""

from __future__ import annotations

import logging
import time
import uuid

import cv2
import numpy as np
import pytest

from museum_search.core.capture import (
    CameraError,
    CameraSource,
    FileSequenceCamera,
    OpenCVCamera,
    frame_difference,
    is_steady,
    list_cameras,
    log_camera_problem,
    no_camera_message,
)
from museum_search.core.errors import MuseumSearchError


def _write(path, rgb: np.ndarray) -> str:
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return str(path)


@pytest.fixture
def three_frames(tmp_path):
    """Three PNGs, each a different solid colour plus a per-file marker pixel row."""
    colours = [(200, 30, 30), (30, 200, 30), (30, 30, 200)]
    paths = []
    for i, c in enumerate(colours):
        img = np.zeros((24, 32, 3), np.uint8)
        img[:] = c
        paths.append(_write(tmp_path / f"f{i}.png", img))
    return paths, colours


def test_file_sequence_replays_in_order_and_loops(three_frames):
    paths, colours = three_frames
    cam = FileSequenceCamera(paths, fps=0, loop=True)
    assert isinstance(cam, CameraSource)
    cam.open()
    try:
        seen = [cam.read() for _ in range(7)]
    finally:
        cam.close()
    for frame in seen:
        assert frame is not None and frame.dtype == np.uint8 and frame.shape == (24, 32, 3)
    got = [tuple(int(v) for v in f[0, 0]) for f in seen]
    assert got == [colours[i % 3] for i in range(7)]  # RGB order, in file order, wrapping around


def test_file_sequence_without_loop_ends(three_frames):
    paths, _ = three_frames
    cam = FileSequenceCamera(paths, fps=0, loop=False)
    cam.open()
    frames = [cam.read() for _ in range(5)]
    assert [f is not None for f in frames] == [True, True, True, False, False]
    assert cam.finished


def test_file_sequence_paces_frames(three_frames):
    paths, _ = three_frames
    cam = FileSequenceCamera(paths, fps=20)
    cam.open()
    assert cam.read() is not None
    assert cam.read() is None  # the next frame is not due yet (50 ms later)
    time.sleep(0.06)
    assert cam.read() is not None


def test_file_sequence_errors(tmp_path):
    with pytest.raises(CameraError):
        FileSequenceCamera([]).open()
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image at all")
    cam = FileSequenceCamera([bad], fps=0)
    cam.open()
    with pytest.raises(CameraError, match="bad.jpg"):
        cam.read()
    with pytest.raises(CameraError):  # not opened
        FileSequenceCamera([bad]).read()


def test_missing_webcam_fails_fast_with_clear_message():
    t0 = time.perf_counter()
    cam = OpenCVCamera(0) if not list_cameras(1) else OpenCVCamera(63)
    with pytest.raises(CameraError) as info:
        cam.open()
    assert time.perf_counter() - t0 < 3.0
    assert isinstance(info.value, MuseumSearchError)
    assert "No camera found at number" in str(info.value)
    assert "choose another camera" in str(info.value) and "Settings" not in str(info.value)
    cam.close()  # harmless after a failed open


def test_list_cameras_is_empty_and_fast_without_camera():
    t0 = time.perf_counter()
    cams = list_cameras()
    assert time.perf_counter() - t0 < 3.0
    assert all(isinstance(i, int) for i in cams)
    import glob

    if not glob.glob("/dev/video*"):
        assert cams == []


def test_is_steady():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    noisy = np.clip(a.astype(np.int16) + rng.integers(-2, 3, a.shape), 0, 255).astype(np.uint8)
    other = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    assert is_steady(a, a.copy(), threshold=4.0)
    assert frame_difference(a, a) == 0.0
    assert is_steady(a, noisy, threshold=4.0)  # sensor noise is still "steady"
    assert not is_steady(a, other, threshold=4.0)
    shifted = np.roll(a, 40, axis=1)
    assert not is_steady(a, shifted, threshold=4.0)  # the camera moved
    assert not is_steady(None, a)
    # frames of different resolutions are compared at one size
    assert is_steady(a, cv2.resize(a, (320, 240), interpolation=cv2.INTER_LINEAR), threshold=10.0)


def test_a_camera_problem_is_logged_once_per_process(caplog):
    """A kiosk retrying a missing camera, or a camera started again, does not repeat the line on
    stderr: the first time at the level asked, then at debug level only."""
    log = logging.getLogger("museum_search.test_capture")
    caplog.set_level(logging.DEBUG, logger=log.name)
    number = 40 + uuid.uuid4().int % 20  # a message no other test of this process logs
    message = f"kiosk: camera {number} cannot be used: {no_camera_message(number)} ({uuid.uuid4().hex[:6]})"
    assert log_camera_problem(log, message) is True
    assert [log_camera_problem(log, message) for _ in range(3)] == [False] * 3
    levels = [r.levelno for r in caplog.records if r.getMessage() == message]
    assert levels == [logging.ERROR] + [logging.DEBUG] * 3
    other = message + " (another problem)"
    assert log_camera_problem(log, other, logging.WARNING) is True  # a different problem is said
    assert [r.levelno for r in caplog.records if r.getMessage() == other] == [logging.WARNING]
