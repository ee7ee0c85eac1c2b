"""Photos as a visitor's phone takes them: deterministic degradations of a clean RGB ``uint8`` photo
(issue 36), for the visitor-photo protocol (``bench/bench_visitors.py``) and, later, the verdict's
calibration views.

Every condition is a function ``f(image, rng, **parameters) -> image``: ``image`` an (H, W, 3) RGB
``uint8`` array (left untouched), ``rng`` a seeded :class:`numpy.random.Generator` that draws
whatever is random (a direction, a position, the noise), so the same photo, parameters and seed
always give the same result. Lengths are in **pixels at a longest side of 1000 px** and scaled to
the photo's own size (a 2 px blur is 2 px on a 1000-px photo, 0.26 px on a 128-px one), angles in
degrees, exposure a factor of the light. Light is handled where it is physical, in linear light:
the photo is decoded from sRGB (:func:`to_linear`), darkened, blurred or glared, and encoded back
(:func:`to_srgb`). The sensor model (:func:`sensor`) counts photons: a white pixel collects
``photons`` photons at exposure 1, the count is Poisson (drawn as its Gaussian approximation) with
a read noise of :data:`READ_NOISE` photons, independently per channel; so a dim photo is noisier
in relative terms, as a real dim sensor is. ``photons`` too is stated for a pixel of a 1000-px
photo: a pixel of a 128-px photo gathers the light of (1000 / 128)² of them, so its noise is
about 8 times weaker (the photo as a phone took it, then shrunk).

:data:`CONDITIONS` maps a condition's name (e.g. ``"dim-0.3"``, ``"phone"``) to a :class:`Condition`
with fixed parameters; :func:`degrade` applies one by name with a seed. Pure NumPy + OpenCV.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import cv2
import numpy as np

from museum_search.core.errors import MuseumSearchError

__all__ = [
    "CONDITIONS",
    "READ_NOISE",
    "REFERENCE_SIDE",
    "Condition",
    "combine",
    "defocus",
    "degrade",
    "dim",
    "far",
    "glare",
    "jpeg",
    "luminance",
    "motion",
    "noise",
    "perspective",
    "perspective_homography",
    "photo_seed",
    "sensor",
    "tilt",
    "to_linear",
    "to_srgb",
    "wall",
    "webcam",
]

#: The longest side (px) at which the conditions' lengths are stated.
REFERENCE_SIDE = 1000
#: Read noise of the sensor model, in photons (electrons) per pixel and channel.
READ_NOISE = 3.0

Image = np.ndarray
ConditionFn = Callable[..., Image]
#: The steps of a combination: each condition's function and its parameters, in order.
Steps = tuple[tuple[ConditionFn, dict[str, Any]], ...]


def _check(image: Image) -> np.ndarray:
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8 or img.size == 0:
        raise MuseumSearchError(f"a condition applies to an RGB uint8 photo, not an array of shape {img.shape}, "
                                f"{img.dtype}")
    return img


def _scale(image: Image) -> float:
    """Pixels of this photo per pixel of a :data:`REFERENCE_SIDE` photo."""
    return max(image.shape[:2]) / REFERENCE_SIDE


def to_linear(image: Image) -> np.ndarray:
    """sRGB ``uint8`` → linear light, float32 in [0, 1] (the exact sRGB curve)."""
    x = np.asarray(image, np.float32) / 255.0
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4).astype(np.float32)


def to_srgb(linear: np.ndarray) -> Image:
    """Linear light (clipped to [0, 1]) → sRGB ``uint8``."""
    x = np.clip(linear, 0.0, 1.0)
    y = np.where(x <= 0.0031308, x * 12.92, 1.055 * np.power(x, 1 / 2.4) - 0.055)
    return np.clip(np.rint(y * 255.0), 0, 255).astype(np.uint8)


def luminance(image: Image) -> np.ndarray:
    """Relative luminance (linear light, Rec. 709 weights) of an sRGB photo, (H, W) float32."""
    lin = to_linear(image)
    return (lin @ np.array([0.2126, 0.7152, 0.0722], np.float32)).astype(np.float32)


def sensor(linear: np.ndarray, rng: np.random.Generator, photons: float, exposure: float = 1.0) -> np.ndarray:
    """Linear light as a sensor records it at ``exposure`` (a factor of the light): a white pixel
    collects ``photons * exposure`` photons; shot noise (Poisson, as its Gaussian approximation) and
    :data:`READ_NOISE` photons of read noise per pixel and channel. Returns linear light (not re-gained:
    a photo at exposure 0.5 stays half as bright)."""
    counts = np.clip(linear, 0.0, None) * (photons * exposure)
    noisy = counts + rng.standard_normal(counts.shape, dtype=np.float32) * np.sqrt(counts + READ_NOISE ** 2)
    return (noisy / photons).astype(np.float32)


def _photons(photons: float, image: Image, sensor_side: float = REFERENCE_SIDE) -> float:
    """Photons per pixel of ``image`` when a pixel of a sensor ``sensor_side`` px across collects
    ``photons``: a smaller photo's pixel sums the light of (``sensor_side`` / its side)² of them."""
    return photons * (sensor_side / max(image.shape[:2])) ** 2


def dim(image: Image, rng: np.random.Generator, exposure: float = 0.45, photons: float = 1000.0) -> Image:
    """A dim room: the light times ``exposure`` (0.3–0.6 in a museum room against the light the photo
    was taken in), darkened in linear light (so the mean *luminance* falls by about ``exposure``; the
    mean sRGB value by about ``exposure ** (1 / 2.2)``), with the noise of a sensor whose white pixel
    collects ``photons`` photons at exposure 1 (at 1000 px, :func:`sensor`)."""
    img = _check(image)
    return to_srgb(sensor(to_linear(img), rng, _photons(photons, img), exposure))


def noise(image: Image, rng: np.random.Generator, photons: float = 250.0) -> Image:
    """Sensor noise at the light the photo was taken in: a small phone sensor at a high gain, whose
    white pixel collects ``photons`` photons at 1000 px (250: about 9 grey levels of noise at mid-grey; shot
    and read noise, independent per channel: luminance and colour noise)."""
    img = _check(image)
    return to_srgb(sensor(to_linear(img), rng, _photons(photons, img)))


def _disc(radius: float, supersample: int = 8) -> np.ndarray:
    """A normalised disc (pillbox) kernel of ``radius`` px, antialiased by supersampling; the
    identity for a radius well below a pixel."""
    half = max(0, math.ceil(radius - 0.5))
    n = 2 * half + 1
    offsets = (np.arange(n * supersample) + 0.5) / supersample - n / 2
    yy, xx = np.meshgrid(offsets, offsets, indexing="ij")
    inside = (xx ** 2 + yy ** 2 <= max(radius, 1e-6) ** 2).astype(np.float32)
    k = inside.reshape(n, supersample, n, supersample).sum(axis=(1, 3))
    if k.sum() == 0:  # a radius so small that no sample falls inside: no blur
        k[half, half] = 1.0
    return (k / k.sum()).astype(np.float32)


def _blur(image: Image, kernel: np.ndarray) -> Image:
    out = cv2.filter2D(to_linear(image), -1, kernel, borderType=cv2.BORDER_REFLECT101)
    return to_srgb(out)


def defocus(image: Image, rng: np.random.Generator, radius: float = 3.0) -> Image:
    """Out of focus: a disc (the lens's circle of confusion) of ``radius`` px at 1000 px (2–5: a
    phone that focused on the wall or the frame), in linear light. ``rng`` is not used."""
    img = _check(image)
    return _blur(img, _disc(radius * _scale(img)))


def _line(length: float, angle: float, supersample: int = 8) -> np.ndarray:
    """A normalised straight motion-blur kernel ``length`` px long at ``angle`` radians."""
    half = max(0, math.ceil(length / 2))
    n = 2 * half + 1
    k = np.zeros((n * supersample, n * supersample), np.float32)
    c = n * supersample / 2
    dx, dy = math.cos(angle) * length * supersample / 2, math.sin(angle) * length * supersample / 2
    cv2.line(k, (round(c - dx), round(c - dy)), (round(c + dx), round(c + dy)), 1.0, 1, cv2.LINE_AA)
    k = k.reshape(n, supersample, n, supersample).sum(axis=(1, 3))
    if k.sum() == 0:
        k[half, half] = 1.0
    return (k / k.sum()).astype(np.float32)


def motion(image: Image, rng: np.random.Generator, length: float = 4.0) -> Image:
    """Camera shake: a straight streak ``length`` px long at 1000 px (2–5: a hand-held phone at a
    dim room's shutter time), in a direction drawn from ``rng``, in linear light."""
    img = _check(image)
    return _blur(img, _line(length * _scale(img), float(rng.uniform(0, math.pi))))


def _warp_on_wall(image: Image, matrix: np.ndarray, rng: np.random.Generator) -> Image:
    """``image`` warped by the 3×3 ``matrix`` into a frame of its own size, over a :func:`wall`
    (drawn from ``rng``) wherever the warped photo does not reach (antialiased edges)."""
    h, w = image.shape[:2]
    m = np.asarray(matrix, np.float64)
    warped = cv2.warpPerspective(image, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    cover = cv2.warpPerspective(np.ones((h, w), np.float32), m, (w, h), flags=cv2.INTER_LINEAR,
                                borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)[..., None]
    out = warped.astype(np.float32) * cover + wall((h, w), rng).astype(np.float32) * (1.0 - cover)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def tilt(image: Image, rng: np.random.Generator, degrees: float = 25.0) -> Image:
    """The phone held askew: the photo turned in its plane by ``degrees`` (up to 25°; the sign drawn
    from ``rng``) about its centre, on a frame of the same size; the corners the turn uncovers
    show a gallery wall (:func:`wall`)."""
    img = _check(image)
    h, w = img.shape[:2]
    angle = float(degrees) * (1 if rng.random() < 0.5 else -1)
    m = cv2.getRotationMatrix2D(((w - 1) / 2, (h - 1) / 2), angle, 1.0)
    return _warp_on_wall(img, np.vstack([m, [0.0, 0.0, 1.0]]), rng)


def perspective_homography(shape: tuple[int, ...], degrees: float, direction: float,
                           fov: float = 67.0) -> np.ndarray:
    """The homography that turns a photo of shape ``shape`` (seen square-on) by ``degrees`` out of
    its plane about an axis in the plane at ``direction`` radians (0: a vertical axis, the visitor
    standing to the side), seen by a pinhole camera of horizontal field of view ``fov`` degrees (a
    phone's main camera, about 67°) that the photo fills; scaled so that the turned photo fits in
    the same frame, centred."""
    h, w = shape[:2]
    f = (max(h, w) / 2) / math.tan(math.radians(fov) / 2)
    corners = np.array([[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]], np.float64)
    xy = corners - [(w - 1) / 2, (h - 1) / 2]
    axis = np.array([math.sin(direction), math.cos(direction), 0.0])  # in the photo's plane
    rot, _ = cv2.Rodrigues(axis * math.radians(degrees))
    pts = np.c_[xy, np.zeros(4)] @ rot.T + [0.0, 0.0, f]
    proj = pts[:, :2] * (f / pts[:, 2:3])
    span = proj.max(axis=0) - proj.min(axis=0)
    s = min((w - 1) / span[0], (h - 1) / span[1])
    dst = (proj - (proj.max(axis=0) + proj.min(axis=0)) / 2) * s + [(w - 1) / 2, (h - 1) / 2]
    return cv2.getPerspectiveTransform(corners.astype(np.float32), dst.astype(np.float32))


def perspective(image: Image, rng: np.random.Generator, degrees: float = 30.0, fov: float = 67.0) -> Image:
    """Seen at an angle: the photo turned ``degrees`` out of its plane (up to 30°; about an axis in
    the plane at a direction drawn from ``rng``, mostly the visitor standing to the side), by a
    phone camera of field of view ``fov`` degrees (:func:`perspective_homography`), on a frame of
    the same size; the rest of the frame shows a gallery wall (:func:`wall`)."""
    img = _check(image)
    # mostly about a vertical axis (to the side), sometimes about a horizontal one (from below)
    direction = float(rng.normal(0.0, 0.35)) + (math.pi / 2 if rng.random() < 0.25 else 0.0)
    sign = 1 if rng.random() < 0.5 else -1
    hmat = perspective_homography(img.shape, sign * float(degrees), direction, fov)
    return _warp_on_wall(img, hmat, rng)


def glare(image: Image, rng: np.random.Generator, radius: float = 60.0, strength: float = 1.5) -> Image:
    """A specular reflection of a spotlight on varnish or glass: a bright spot with a saturated core
    (a Gaussian of ``radius`` px at 1000 px, peak ``strength`` times white in linear light) and a
    halo three times wider, slightly warm, at a position drawn from ``rng`` in the middle 60 % of
    the frame (where the work is)."""
    img = _check(image)
    h, w = img.shape[:2]
    r = max(1.0, radius * _scale(img))
    cy, cx = rng.uniform(0.2, 0.8) * h, rng.uniform(0.2, 0.8) * w
    yy, xx = np.ogrid[:h, :w]
    d2 = ((yy - cy) ** 2 + (xx - cx) ** 2).astype(np.float32)
    spot = strength * np.exp(-d2 / (2 * r * r)) + 0.1 * strength * np.exp(-d2 / (2 * (3 * r) ** 2))
    tint = np.array([1.0, 0.97, 0.9], np.float32)  # a tungsten spotlight
    return to_srgb(to_linear(img) + spot[..., None].astype(np.float32) * tint)


def jpeg(image: Image, rng: np.random.Generator, quality: int = 70) -> Image:
    """A JPEG round trip at ``quality`` (a phone saves at 85–95; a messaging app recompresses at
    about 70), 4:2:0 chroma subsampling (OpenCV's default). ``rng`` is not used."""
    img = _check(image)
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:  # pragma: no cover - OpenCV encodes any uint8 RGB array
        raise MuseumSearchError("JPEG encoding failed")
    decoded = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    return np.asarray(cv2.cvtColor(np.asarray(decoded), cv2.COLOR_BGR2RGB))


def wall(shape: tuple[int, int], rng: np.random.Generator) -> Image:
    """A gallery wall of ``shape`` (H, W): a muted colour drawn from ``rng``, lit unevenly (a smooth
    gradient of about ±15 %) with a faint plaster texture."""
    h, w = shape
    hue = rng.uniform(0, 180)
    hsv = np.array([[[hue, rng.uniform(10, 60), rng.uniform(150, 225)]]]).astype(np.uint8)
    base = to_linear(np.asarray(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)))[0, 0]
    yy, xx = np.mgrid[:h, :w].astype(np.float32)
    gx, gy = rng.uniform(-0.15, 0.15, 2)
    light = 1.0 + gx * (xx / max(w - 1, 1) - 0.5) * 2 + gy * (yy / max(h - 1, 1) - 0.5) * 2
    texture = cv2.GaussianBlur(rng.standard_normal((h, w), dtype=np.float32), (0, 0), 1.5) * 0.02
    return to_srgb((light + texture)[..., None] * base)


def _place(image: Image, rng: np.random.Generator, frame: tuple[int, int], fraction: float) -> Image:
    """``image`` scaled to ``fraction`` of the area of a ``frame`` (H, W) (at most fitting it) and
    placed at a position drawn from ``rng`` on a :func:`wall`."""
    fh, fw = frame
    h, w = image.shape[:2]
    s = min(math.sqrt(fraction * fh * fw / (h * w)), fh / h, fw / w)
    oh, ow = max(1, round(h * s)), max(1, round(w * s))
    interp = cv2.INTER_AREA if s < 1 else cv2.INTER_LINEAR
    obj = cv2.resize(image, (ow, oh), interpolation=interp)
    out = wall((fh, fw), rng)
    y = int(rng.integers(0, fh - oh + 1))
    x = int(rng.integers(0, fw - ow + 1))
    out[y : y + oh, x : x + ow] = obj
    return out


def far(image: Image, rng: np.random.Generator, fraction: float = 0.2) -> Image:
    """Taken from afar: the photo (the work and what is around it) shrunk to ``fraction`` of the
    frame's area (a fifth: about 0.45 of its width and height) at a position drawn from ``rng`` on
    a gallery wall (:func:`wall`), in a frame of the photo's own size."""
    img = _check(image)
    return _place(img, rng, img.shape[:2], fraction)


def webcam(image: Image, rng: np.random.Generator, frame: tuple[int, int] = (480, 640), fraction: float = 0.2,
           upscale: bool = False, photons: float = 500.0, quality: int = 80) -> Image:
    """A kiosk's webcam: a low-resolution frame of ``frame`` (H, W) px at 1000 px (a 640×480
    frame, scaled to the photo's size like every length here: 0.64 of the photo's longest side),
    with the work at ``fraction`` of its area on a wall (:func:`far`), the webcam's sensor noise
    (``photons`` at a pixel of its real frame, :func:`sensor`) and its JPEG (``quality``); ``upscale``: returned enlarged back to
    the photo's longest side (a digital zoom), else at the frame's size."""
    img = _check(image)
    s = _scale(img)
    fh, fw = max(8, round(frame[0] * s)), max(8, round(frame[1] * s))
    out = _place(img, rng, (fh, fw), fraction)
    out = jpeg(to_srgb(sensor(to_linear(out), rng, _photons(photons, out, max(frame)))), rng, quality)
    if upscale:
        k = max(img.shape[:2]) / max(fh, fw)
        out = cv2.resize(out, (round(fw * k), round(fh * k)), interpolation=cv2.INTER_LINEAR)
    return out


def combine(image: Image, rng: np.random.Generator, steps: Steps) -> Image:
    """The conditions ``steps`` (function, parameters) applied in order, with the same ``rng``."""
    out = _check(image)
    for fn, params in steps:
        out = fn(out, rng, **params)
    return out


@dataclass(frozen=True)
class Condition:
    """A named condition with its parameters fixed: ``condition(image, rng)`` applies it."""

    name: str
    description: str
    function: ConditionFn
    parameters: dict[str, Any] = field(default_factory=dict)

    def __call__(self, image: Image, rng: np.random.Generator) -> Image:
        return self.function(_check(image), rng, **self.parameters)


def _identity(image: Image, rng: np.random.Generator) -> Image:
    return np.array(image, copy=True)


#: The phone-like combination of issue 36, in the order light meets it: turned ~15° out of plane,
#: out of focus by 2 px, a dim room (×0.55) on a phone sensor (its noise), saved as a phone's JPEG.
PHONE: Steps = ((perspective, {"degrees": 15.0}), (defocus, {"radius": 2.0}),
         (dim, {"exposure": 0.55, "photons": 600.0}), (jpeg, {"quality": 85}))
#: A harder visitor: askew (10°) and at an angle (25°), shaken (4 px), under a spotlight's glare, in
#: a dark room (×0.35), recompressed by a messaging app (JPEG 70).
PHONE_HARD: Steps = ((tilt, {"degrees": 10.0}), (perspective, {"degrees": 25.0}), (glare, {}), (motion, {"length": 4.0}),
              (dim, {"exposure": 0.35, "photons": 600.0}), (jpeg, {"quality": 70}))


def _conditions() -> dict[str, Condition]:
    rows: list[tuple[str, str, ConditionFn, dict[str, Any]]] = [
        ("clean", "the photo as it is", _identity, {}),
        ("dim-0.6", "a dim room: exposure x0.6, with a dim sensor's noise", dim, {"exposure": 0.6}),
        ("dim-0.3", "a dark room: exposure x0.3, with a dim sensor's noise", dim, {"exposure": 0.3}),
        ("defocus-2", "out of focus: a disc of radius 2 px at 1000 px", defocus, {"radius": 2.0}),
        ("defocus-4", "out of focus: a disc of radius 4 px at 1000 px", defocus, {"radius": 4.0}),
        ("motion-4", "shaken: a streak of 4 px at 1000 px", motion, {"length": 4.0}),
        ("perspective-15", "at an angle: turned 15 degrees out of its plane", perspective, {"degrees": 15.0}),
        ("perspective-30", "at an angle: turned 30 degrees out of its plane", perspective, {"degrees": 30.0}),
        ("tilt-25", "askew: turned 25 degrees in its plane", tilt, {"degrees": 25.0}),
        ("glare", "a spotlight's reflection on varnish or glass", glare, {}),
        ("noise", "sensor noise (250 photons at white)", noise, {}),
        ("far", "from afar: the photo a fifth of the frame, on a wall", far, {}),
        ("webcam", "a webcam's 640x480 frame (at 1000 px), the work a fifth of it, noise, JPEG 80", webcam, {}),
        ("jpeg-70", "recompressed at JPEG quality 70", jpeg, {"quality": 70}),
        ("phone", "phone-like: perspective 15, defocus 2 px, dim x0.55 with noise, JPEG 85", combine,
         {"steps": PHONE}),
        ("phone-hard", "tilt 10, perspective 25, glare, motion 4 px, dim x0.35 with noise, JPEG 70", combine,
         {"steps": PHONE_HARD}),
    ]
    return {name: Condition(name, text, fn, params) for name, text, fn, params in rows}


#: Every condition by name, in the protocol's order ("clean" first).
CONDITIONS: dict[str, Condition] = _conditions()


def photo_seed(condition: str, photo: str, seed: int = 0) -> int:
    """A seed for ``photo`` (a stable name, e.g. its path relative to its query set) under
    ``condition``: independent of the order photos are degraded in, the same on every run."""
    return zlib.crc32(f"{seed}/{condition}/{photo}".encode()) & 0x7FFFFFFF


def degrade(image: Image, condition: str, seed: int = 0) -> Image:
    """``image`` under the condition named ``condition`` (a key of :data:`CONDITIONS`), drawn with
    ``numpy.random.default_rng(seed)``."""
    try:
        cond = CONDITIONS[condition]
    except KeyError:
        raise MuseumSearchError(f"unknown condition {condition!r}; choose one of {', '.join(CONDITIONS)}") from None
    return cond(image, np.random.default_rng(seed))
