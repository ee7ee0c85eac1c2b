#!/usr/bin/env python3
"""Generate the bundled sample collection and the application icon.

Everything is drawn procedurally from a seed: no photograph, no downloaded image and no file from
``../shared/data`` goes into ``resources/``.  The project may therefore redistribute the output
(see ``resources/sample/README.md``).

What it writes (paths relative to the repository root):

* ``resources/sample/collection/<instance>-<k>.jpg``: 3–4 "photos" of each of 12 generated paintings,
  each painting in a bevelled frame hung on a gallery wall, photographed with perspective, lighting,
  colour temperature, blur, sensor noise and JPEG artefacts; one reference of half the objects is a
  close-up detail (as in CLICIDE).
* ``resources/sample/catalogue.csv``: ``file,instance,title,artist,year,description``.
* ``resources/sample/queries/qNN.jpg`` and ``queries/ground_truth.csv`` (``query,instance``): new
  photos of the same objects plus open-set photos of paintings that are not in the collection
  (empty ``instance``).
* ``resources/icons/museum-search.svg`` and ``museum-search-<N>.png`` (N = 16 … 256).

Usage::

    python tools/make_sample_collection.py              # both, seed 2026
    python tools/make_sample_collection.py --seed 7 --out /tmp/sample --no-icons

The output is deterministic for a given seed and given numpy/OpenCV/Pillow versions (JPEG encoders
and resamplers of other versions may change bytes, not content).  Needs numpy, opencv-python-headless
and Pillow only.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SEED = 2026
SS = 2  # paintings are drawn at SS x their final size, then downsampled (anti-aliasing)
PAINT_LONG = 600  # longest side of a painting, in pixels, at 1x
OUT_LONG, OUT_SHORT = 640, 480  # size of a "photo"

Colour = tuple[float, float, float]


# --------------------------------------------------------------------------------------------
# small drawing helpers (images are float32 RGB in [0, 1])
# --------------------------------------------------------------------------------------------


def grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    yy, xx = np.mgrid[0:h, 0:w]
    return yy.astype(np.float32), xx.astype(np.float32)


def rgb(hex_: str) -> Colour:
    hex_ = hex_.lstrip("#")
    return tuple(int(hex_[i : i + 2], 16) / 255.0 for i in (0, 2, 4))  # type: ignore[return-value]


def value_noise(rng: np.random.Generator, h: int, w: int, cy: int, cx: int) -> np.ndarray:
    """Smooth random field in [0, 1] with about cy x cx features."""
    g = rng.random((max(cy, 1) + 1, max(cx, 1) + 1)).astype(np.float32)
    n = cv2.resize(g, (w, h), interpolation=cv2.INTER_CUBIC)
    return np.clip(n, 0.0, 1.0)


def fbm(rng: np.random.Generator, h: int, w: int, base: int = 3, octaves: int = 5,
        persistence: float = 0.5, aspect: tuple[float, float] = (1.0, 1.0)) -> np.ndarray:
    """Fractal (multi-octave) value noise normalised to [0, 1]."""
    acc = np.zeros((h, w), np.float32)
    amp = 1.0
    for k in range(octaves):
        c = base * 2**k
        acc += amp * value_noise(rng, h, w, max(1, int(c * aspect[0])), max(1, int(c * aspect[1])))
        amp *= persistence
    acc -= acc.min()
    return acc / max(float(acc.max()), 1e-6)


def fbm1d(rng: np.random.Generator, n: int, base: int = 3, octaves: int = 6,
          persistence: float = 0.55) -> np.ndarray:
    """1-D fractal noise in [-1, 1] (for ridges and skylines)."""
    acc = np.zeros(n, np.float32)
    amp, tot = 1.0, 0.0
    for k in range(octaves):
        c = base * 2**k
        g = rng.random((1, c + 1)).astype(np.float32) * 2 - 1
        acc += amp * cv2.resize(g, (n, 1), interpolation=cv2.INTER_CUBIC)[0]
        tot += amp
        amp *= persistence
    return acc / tot


def stops(t: np.ndarray, pts: list[tuple[float, Colour]]) -> np.ndarray:
    """Piecewise-linear colour ramp evaluated at t (any shape) -> (..., 3)."""
    pos = [p for p, _ in pts]
    return np.stack([np.interp(t, pos, [c[i] for _, c in pts]) for i in range(3)], axis=-1).astype(
        np.float32
    )


def smoothstep(e0: float, e1: float, x: np.ndarray) -> np.ndarray:
    t = np.clip((x - e0) / (e1 - e0), 0.0, 1.0)
    return t * t * (3 - 2 * t)


def mix(img: np.ndarray, colour, alpha: np.ndarray) -> np.ndarray:
    a = alpha[..., None] if alpha.ndim == 2 else alpha
    return img * (1 - a) + np.asarray(colour, np.float32) * a


def poly_mask(h: int, w: int, pts) -> np.ndarray:
    m = np.zeros((h, w), np.float32)
    cv2.fillPoly(m, [np.round(np.asarray(pts)).astype(np.int32)], 1.0)
    return m


def solid(h: int, w: int, colour: Colour) -> np.ndarray:
    return np.ones((h, w, 3), np.float32) * np.asarray(colour, np.float32)


def jitter(rng: np.random.Generator, c, amount: float) -> tuple[float, float, float]:
    return tuple(float(v) for v in np.clip(np.asarray(c) + rng.normal(0, amount, 3), 0, 1))


def ellipse_mask(h: int, w: int, cx: float, cy: float, rx: float, ry: float, soft: float = 1.0):
    yy, xx = grid(h, w)
    d = np.sqrt(((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2)
    return 1 - smoothstep(1 - soft / max(rx, ry), 1 + soft / max(rx, ry), d)


def brush_texture(rng: np.random.Generator, h: int, w: int, horizontal: bool = True) -> np.ndarray:
    """Streaky zero-mean texture that looks like dragged paint."""
    n = rng.normal(0, 1, (h, w)).astype(np.float32)
    k = max(3, int(0.03 * max(h, w))) | 1
    n = cv2.GaussianBlur(n, (k, 1) if horizontal else (1, k), 0)
    n = cv2.GaussianBlur(n, (0, 0), 1.0)
    return n / max(float(n.std()), 1e-6)


# --------------------------------------------------------------------------------------------
# the paintings (each: rng, h, w -> float32 RGB image at SS x resolution)
# --------------------------------------------------------------------------------------------


def paint_valley(rng, h, w):
    """Landscape: dusk sky, sun, layered mountain ridges, lake with reflection, pines."""
    yy, xx = grid(h, w)
    horizon = 0.64 * h
    img = stops(yy / (0.42 * h), [(0.0, rgb("1b1f4d")), (0.35, rgb("5a3f7e")), (0.7, rgb("e0755a")),
                                  (1.0, rgb("ffc98a"))])
    sx, sy, sr = w * rng.uniform(0.55, 0.72), h * rng.uniform(0.25, 0.28), 0.05 * w
    d = np.sqrt((xx - sx) ** 2 + (yy - sy) ** 2)
    img += (np.exp(-((d / (5 * sr)) ** 2)) * 0.6)[..., None] * np.array([1.0, 0.7, 0.4], np.float32)
    img = mix(img, rgb("fff2c8"), 1 - smoothstep(sr - 2, sr + 2, d))
    clouds = fbm(rng, h, w, base=2, octaves=5, aspect=(1.0, 0.25))
    cmask = smoothstep(0.55, 0.8, clouds) * (yy < 0.4 * h) * 0.7
    img = mix(img, rgb("f7b3a0"), cmask * smoothstep(0.02 * h, 0.3 * h, yy))
    layers = [(0.36, 0.10, "c99ab0"), (0.27, 0.09, "8a6a9c"), (0.17, 0.08, "4a4f7c"), (0.08, 0.06, "1f3342")]
    for top, amp, col in layers:
        ridge = horizon - h * top + h * amp * fbm1d(rng, w, base=2, octaves=7)
        m = (yy >= ridge[None, :]).astype(np.float32) * (yy < horizon)
        shade = np.clip((yy - ridge[None, :]) / (0.25 * h), 0, 1)[..., None]
        c = np.asarray(rgb(col), np.float32)
        img = mix(img, c * (1 - 0.35 * shade) + 0.05, m)
    # lake: reflection of everything above the horizon, with ripples
    ripple = 2.5 * np.sin(xx / 9.0 + yy / 3.0) + 1.5 * np.sin(yy / 1.7)
    map_y = np.clip(2 * horizon - yy + ripple, 0, horizon - 1).astype(np.float32)
    map_x = (xx + 3.0 * np.sin(yy / 4.0)).astype(np.float32)
    refl = cv2.remap(img, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    lake = refl * 0.7 + np.array(rgb("2a3b66"), np.float32) * 0.3
    streak = smoothstep(0.6, 0.9, fbm(rng, h, w, base=2, octaves=4, aspect=(3.0, 0.2)))
    lake = mix(lake, rgb("ffd9a8"), streak * 0.25)
    img = np.where((yy >= horizon)[..., None], lake, img)
    # foreground shore and pines
    shore = h * 0.9 + h * 0.04 * fbm1d(rng, w, base=2, octaves=5)
    img = mix(img, rgb("1c2418"), (yy >= shore[None, :]).astype(np.float32))
    for _ in range(int(rng.integers(5, 9))):
        px = w * rng.uniform(0.02, 0.3)
        base_y = h * rng.uniform(0.9, 0.97)
        ph = h * rng.uniform(0.12, 0.28)
        pw = ph * 0.28
        pts = [(px, base_y - ph)]
        for k in range(1, 6):
            yk = base_y - ph + ph * k / 5.5
            pts.append((px + pw * k / 5.0, yk))
            pts.append((px + pw * (k - 0.6) / 5.0, yk))
        pts = pts[:1] + pts[1:] + [(px - x + px, y) for x, y in reversed(pts[1:])]
        img = mix(img, rgb("141b12"), poly_mask(h, w, pts))
    return img


def paint_grid(rng, h, w):
    """Neo-plastic grid: recursive rectangles, primaries, thick black lines."""
    rects = []

    def split(x0, y0, x1, y1, depth):
        bw, bh = x1 - x0, y1 - y0
        if depth == 0 or (depth < 3 and rng.random() < 0.3) or min(bw, bh) < 0.12 * w:
            rects.append((x0, y0, x1, y1))
            return
        if bw > bh * rng.uniform(0.7, 1.4):
            c = x0 + bw * rng.uniform(0.25, 0.75)
            split(x0, y0, c, y1, depth - 1)
            split(c, y0, x1, y1, depth - 1)
        else:
            c = y0 + bh * rng.uniform(0.25, 0.75)
            split(x0, y0, x1, c, depth - 1)
            split(x0, c, x1, y1, depth - 1)

    split(0, 0, w, h, 5)
    img = solid(h, w, rgb("f1ede0"))
    order = rng.permutation(len(rects))
    colours = [rgb("c8231c"), rgb("1d3f8f"), rgb("f2c515"), rgb("c8231c"), rgb("161616"), rgb("1d3f8f"),
               rgb("f2c515"), rgb("d9d4c4")]
    for k, idx in enumerate(order[: len(colours)]):
        x0, y0, x1, y1 = rects[idx]
        img[int(y0) : int(y1), int(x0) : int(x1)] = colours[k]
    img *= (1 + 0.035 * brush_texture(rng, h, w, horizontal=True))[..., None]
    lw = max(3, int(0.016 * w))
    for x0, y0, x1, y1 in rects:
        cv2.rectangle(img, (int(x0), int(y0)), (int(x1), int(y1)), (0.07, 0.07, 0.07), lw)
    cv2.rectangle(img, (0, 0), (w - 1, h - 1), (0.07, 0.07, 0.07), lw // 2)
    return img


def paint_concentric(rng, h, w):
    """Grid of squares, each holding wobbly concentric rings (after the Bauhaus colour studies)."""
    rows, cols = (3, 4) if w >= h else (4, 3)
    palette = [rgb(c) for c in ("d62828", "f77f00", "fcbf49", "eae2b7", "003049", "2a9d8f", "8ab17d",
                                "e76f51", "6d597a", "264653", "ffafcc", "1b1b1b", "f4f1de", "3d5a80")]
    img = np.zeros((h, w, 3), np.float32)
    yy, xx = grid(h, w)
    ch, cw = h / rows, w / cols
    for r in range(rows):
        for c in range(cols):
            y0, x0 = int(r * ch), int(c * cw)
            y1, x1 = int((r + 1) * ch), int((c + 1) * cw)
            sub_y, sub_x = yy[y0:y1, x0:x1], xx[y0:y1, x0:x1]
            cell = solid(y1 - y0, x1 - x0, palette[rng.integers(len(palette))])
            cx = (x0 + x1) / 2 + rng.uniform(-0.06, 0.06) * cw
            cy = (y0 + y1) / 2 + rng.uniform(-0.06, 0.06) * ch
            ang = np.arctan2(sub_y - cy, sub_x - cx)
            d = np.sqrt((sub_x - cx) ** 2 + (sub_y - cy) ** 2)
            n_rings = int(rng.integers(4, 7))
            radii = np.sort(rng.uniform(0.07, 0.44, n_rings))[::-1] * min(cw, ch)
            for rad in radii:
                wob = 1 + 0.025 * np.sin(3 * ang + rng.uniform(0, 6.3)) + 0.015 * np.sin(7 * ang + rng.uniform(0, 6.3))
                m = 1 - smoothstep(rad * wob - 1.5, rad * wob + 1.5, d)
                cell = mix(cell, palette[rng.integers(len(palette))], m)
            img[y0:y1, x0:x1] = cell
    img *= (1 + 0.05 * brush_texture(rng, h, w, horizontal=False))[..., None]
    lw = max(2, int(0.006 * w))
    for r in range(1, rows):
        cv2.line(img, (0, int(r * ch)), (w, int(r * ch)), (0.12, 0.1, 0.09), lw)
    for c in range(1, cols):
        cv2.line(img, (int(c * cw), 0), (int(c * cw), h), (0.12, 0.1, 0.09), lw)
    return img


def _strokes(img, rng, n, angle_fn, colour_fn, length, width):
    h, w = img.shape[:2]
    xs = rng.uniform(0, w, n)
    ys = rng.uniform(0, h, n)
    lens = rng.uniform(*length, n)
    wids = rng.integers(width[0], width[1] + 1, n)
    for x, y, L, wd in zip(xs, ys, lens, wids):
        a = angle_fn(x, y)
        dx, dy = math.cos(a) * L / 2, math.sin(a) * L / 2
        col = colour_fn(x, y)
        cv2.line(img, (int(x - dx), int(y - dy)), (int(x + dx), int(y + dy)), col, int(wd), cv2.LINE_8)
    return img


def paint_wheat(rng, h, w):
    """Impressionist wheat field under a windy sky, built from thousands of short strokes."""
    yy, _ = grid(h, w)
    hor = 0.4 * h + 0.05 * h * fbm1d(rng, w, base=2, octaves=4)
    sky = stops(yy / (0.45 * h), [(0, rgb("3e6fb0")), (0.7, rgb("8fb7de")), (1, rgb("d8e4ea"))])
    cl = smoothstep(0.5, 0.75, fbm(rng, h, w, base=2, octaves=5, aspect=(0.6, 1.0)))
    sky = mix(sky, rgb("f4f1ea"), cl)
    field = stops((yy - 0.4 * h) / (0.6 * h), [(0, rgb("d9a630")), (0.5, rgb("e2b84a")), (1, rgb("a87424"))])
    band = fbm(rng, h, w, base=2, octaves=3, aspect=(0.5, 2.0))
    field = mix(field, rgb("6f8c35"), smoothstep(0.62, 0.75, band) * 0.8)
    base = np.where((yy < hor[None, :])[..., None], sky, field)
    flow = fbm(rng, h, w, base=2, octaves=3)
    img = base.copy()

    def angle(x, y):
        f = float(flow[int(y), int(x)])
        if y < hor[int(x)]:
            return (f - 0.5) * 1.4
        return -1.25 + (f - 0.5) * 0.9

    def colour(x, y):
        c = base[int(y), int(x)]
        return jitter(rng, c, 0.06)

    _strokes(img, rng, 5200, angle, colour, (10 * SS, 26 * SS), (2 * SS, 4 * SS))
    # poppies
    for _ in range(60):
        x, y = rng.uniform(0, w), rng.uniform(0.55 * h, h)
        cv2.circle(img, (int(x), int(y)), int(rng.uniform(2, 5) * SS), jitter(rng, rgb("c9261e"), 0.05), -1)
    # crows
    for _ in range(int(rng.integers(5, 9))):
        x, y, s = rng.uniform(0.15, 0.85) * w, rng.uniform(0.08, 0.3) * h, rng.uniform(6, 12) * SS
        pts = np.array([[x - s, y - s * 0.4], [x, y], [x + s, y - s * 0.5]], np.int32)
        cv2.polylines(img, [pts], False, (0.06, 0.06, 0.08), max(2, int(1.5 * SS)))
    return img


def paint_triangles(rng, h, w):
    """Geometric tiling of split squares with a large-scale colour wave."""
    palette = [rgb(c) for c in ("d8a13a", "1f6f6b", "efe6d2", "a8461f", "1d2b44", "7fb2a5")]
    cols = 9 if w >= h else 7
    s = w / cols
    rows = math.ceil(h / s)
    img = solid(h, w, rgb("efe6d2"))
    phase = rng.uniform(0, 6.28)
    for r in range(rows):
        for c in range(cols):
            x0, y0 = c * s, r * s
            corners = [(x0, y0), (x0 + s, y0), (x0 + s, y0 + s), (x0, y0 + s)]
            tris = ([corners[0], corners[1], corners[2]], [corners[0], corners[2], corners[3]]) if rng.random() < 0.5 \
                else ([corners[0], corners[1], corners[3]], [corners[1], corners[2], corners[3]])
            wave = 0.5 + 0.5 * math.sin(c * 0.7 + r * 0.45 + phase)
            for k, tri in enumerate(tris):
                idx = int((wave * 4 + k * 1.7 + rng.integers(0, 2)) % len(palette))
                cv2.fillPoly(img, [np.round(np.array(tri)).astype(np.int32)], palette[idx])
                if rng.random() < 0.35:
                    cen = np.mean(tri, axis=0)
                    inner = [(cen + 0.45 * (np.array(p) - cen)) for p in tri]
                    cv2.fillPoly(img, [np.round(np.array(inner)).astype(np.int32)],
                                 palette[(idx + 3) % len(palette)])
    img *= (1 + 0.03 * brush_texture(rng, h, w))[..., None]
    lw = max(2, int(0.005 * w))
    for r in range(rows + 1):
        cv2.line(img, (0, int(r * s)), (w, int(r * s)), (0.94, 0.9, 0.82), lw)
    for c in range(cols + 1):
        cv2.line(img, (int(c * s), 0), (int(c * s), h), (0.94, 0.9, 0.82), lw)
    return img


def paint_undulation(rng, h, w):
    """Op-art: wavy black and white stripes with a few coloured ones."""
    yy, xx = grid(h, w)
    period = h / rng.uniform(26, 32)
    amp = period * 2.2 * (0.25 + 0.75 * np.sin(np.pi * xx / w) ** 2)
    v = yy + amp * np.sin(2 * np.pi * xx / (w / rng.uniform(1.8, 2.4)) + 2 * np.pi * yy / (h * 0.9))
    k = np.floor(v / period).astype(np.int32)
    frac = v / period - np.floor(v / period)
    edge = smoothstep(0.0, 0.06, frac) * (1 - smoothstep(0.94, 1.0, frac))
    colours = np.array([rgb("f3f0e8"), rgb("151515")] * 4 + [rgb("d7263d"), rgb("151515"),
                        rgb("f3f0e8"), rgb("151515"), rgb("1b998b"), rgb("151515")], np.float32)
    img = colours[np.mod(k, len(colours))]
    img = img * (0.85 + 0.15 * edge[..., None])
    return img.astype(np.float32)


def paint_improvisation(rng, h, w):
    """Abstract composition of circles, lines, triangles and a chequered patch."""
    yy, xx = grid(h, w)
    img = stops((xx / w + yy / h) / 2, [(0, rgb("efe1c6")), (1, rgb("d9b99b"))])
    img *= (0.92 + 0.16 * fbm(rng, h, w, base=3, octaves=5))[..., None]
    halo = cv2.GaussianBlur(ellipse_mask(h, w, w * 0.32, h * 0.38, w * 0.3, w * 0.3), (0, 0), w * 0.05)
    img = mix(img, rgb("5b7fb5"), halo * 0.55)
    cols = [rgb(c) for c in ("d1495b", "edae49", "00798c", "30638e", "003d5b", "e86a92", "1b1b1b", "6a994e")]
    for _ in range(7):
        cx, cy, rr = rng.uniform(0.1, 0.9) * w, rng.uniform(0.1, 0.9) * h, rng.uniform(0.03, 0.13) * w
        col = cols[rng.integers(len(cols))]
        if rng.random() < 0.65:
            cv2.circle(img, (int(cx), int(cy)), int(rr), col, -1)
            if rng.random() < 0.5:
                cv2.circle(img, (int(cx), int(cy)), int(rr), (0.08, 0.08, 0.08), max(2, int(0.006 * w)))
        else:
            cv2.circle(img, (int(cx), int(cy)), int(rr), col, max(3, int(0.018 * w)))
    for _ in range(4):
        c0 = rng.uniform(0.15, 0.85, 2) * [w, h]
        pts = c0 + rng.uniform(-0.13, 0.13, (3, 2)) * w
        cv2.fillPoly(img, [pts.astype(np.int32)], cols[rng.integers(len(cols))])
    for _ in range(6):
        x0, y0 = rng.uniform(0, 1) * w, rng.uniform(0, 1) * h
        a = rng.uniform(0, np.pi)
        L = rng.uniform(0.3, 0.7) * w
        t = np.linspace(-0.5, 0.5, 40)
        bend = rng.uniform(-0.08, 0.08) * w
        px = x0 + np.cos(a) * L * t - np.sin(a) * bend * np.sin(np.pi * (t + 0.5))
        py = y0 + np.sin(a) * L * t + np.cos(a) * bend * np.sin(np.pi * (t + 0.5))
        cv2.polylines(img, [np.stack([px, py], 1).astype(np.int32)], False, (0.07, 0.07, 0.07),
                      int(rng.uniform(0.004, 0.012) * w))
    # chequered patch
    bx, by, cs = rng.uniform(0.55, 0.75) * w, rng.uniform(0.6, 0.8) * h, int(0.03 * w)
    for i in range(5):
        for j in range(4):
            col = (0.08, 0.08, 0.08) if (i + j) % 2 else (0.96, 0.95, 0.9)
            cv2.rectangle(img, (int(bx + i * cs), int(by + j * cs)), (int(bx + (i + 1) * cs), int(by + (j + 1) * cs)),
                          col, -1)
    # hatching
    hx, hy = rng.uniform(0.1, 0.3) * w, rng.uniform(0.65, 0.8) * h
    for i in range(9):
        cv2.line(img, (int(hx + i * 0.015 * w), int(hy)), (int(hx + i * 0.015 * w + 0.06 * w), int(hy + 0.14 * h)),
                 (0.1, 0.1, 0.12), max(2, int(0.003 * w)))
    img *= (1 + 0.04 * brush_texture(rng, h, w, horizontal=False))[..., None]
    return img


def paint_night(rng, h, w):
    """Swirling night sky over hills and a village, with a flame-shaped cypress."""
    yy, xx = grid(h, w)
    base = stops(yy / h, [(0, rgb("13245a")), (0.6, rgb("2c4f9a")), (1, rgb("1b2c4f"))])
    centres = [(w * rng.uniform(0.3, 0.55), h * rng.uniform(0.22, 0.35)),
               (w * rng.uniform(0.6, 0.8), h * rng.uniform(0.4, 0.5))]
    ring = np.zeros((h, w), np.float32)
    for cx, cy in centres:
        d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        ring += np.exp(-d / (0.25 * w)) * (0.5 + 0.5 * np.sin(d / (0.022 * w)))
    base = mix(base, rgb("8fb3e8"), np.clip(ring, 0, 1) * 0.7)
    img = base.copy()
    hills = h * 0.74 + h * 0.05 * fbm1d(rng, w, base=2, octaves=4)

    def angle(x, y):
        best, ang = 1e9, 0.0
        for cx, cy in centres:
            d = math.hypot(x - cx, y - cy)
            if d < best:
                best, ang = d, math.atan2(y - cy, x - cx) + math.pi / 2
        wgt = math.exp(-best / (0.2 * w))
        return wgt * ang + (1 - wgt) * (0.15 * math.sin(x / (0.1 * w)))

    palette = [rgb(c) for c in ("1e3f8a", "3566b8", "6f96d6", "b9cdea", "e8ecd0")]

    def colour(x, y):
        c = base[int(y), int(x)]
        if rng.random() < 0.12:
            c = palette[rng.integers(len(palette))]
        return jitter(rng, c, 0.05)

    _strokes(img, rng, 6500, angle, colour, (12 * SS, 24 * SS), (2 * SS, 4 * SS))
    # stars and moon
    for _ in range(9):
        sx, sy = rng.uniform(0.05, 0.95) * w, rng.uniform(0.04, 0.5) * h
        r = rng.uniform(0.012, 0.022) * w
        for k, col in enumerate(["f7e27a", "fff6c2", "f1d54a"]):
            cv2.circle(img, (int(sx), int(sy)), int(r * (2.4 - 0.7 * k)), rgb(col), max(2, int(0.004 * w)) if k < 2 else -1)
    mx, my, mr = w * 0.85, h * 0.12, 0.055 * w
    cv2.circle(img, (int(mx), int(my)), int(mr * 1.8), rgb("e9d36a"), max(2, int(0.006 * w)))
    cv2.circle(img, (int(mx), int(my)), int(mr), rgb("f6e27a"), -1)
    cv2.circle(img, (int(mx + mr * 0.45), int(my - mr * 0.2)), int(mr * 0.85), tuple(float(v) for v in img[int(my), int(mx + mr * 2.5)]), -1)
    # hills and village
    hm = (yy >= hills[None, :]).astype(np.float32)
    hill_col = stops((yy - 0.7 * h) / (0.3 * h), [(0, rgb("27405e")), (1, rgb("0f1d2b"))])
    img = img * (1 - hm[..., None]) + hill_col * hm[..., None]
    for _ in range(22):
        bx = rng.uniform(0.35, 0.95) * w
        by = hills[int(bx)] + rng.uniform(0.02, 0.12) * h
        bw, bh = rng.uniform(0.02, 0.04) * w, rng.uniform(0.015, 0.03) * h
        cv2.rectangle(img, (int(bx), int(by - bh)), (int(bx + bw), int(by)), rgb("1b2a3c"), -1)
        cv2.fillPoly(img, [np.array([[bx - 2, by - bh], [bx + bw / 2, by - bh * 1.7], [bx + bw + 2, by - bh]], np.int32)],
                     rgb("2b2b3d"))
        if rng.random() < 0.6:
            cv2.rectangle(img, (int(bx + bw * 0.3), int(by - bh * 0.7)), (int(bx + bw * 0.55), int(by - bh * 0.35)),
                          rgb("f2d15b"), -1)
    # cypress
    cx0, top = w * 0.14, h * 0.08
    t = np.linspace(0, 1, 60)
    half = w * 0.075 * np.sin(np.pi * t) ** 0.7 * (0.8 + 0.2 * np.sin(t * 25))
    ys = top + t * (h - top)
    xs = cx0 + 0.03 * w * np.sin(t * 7)
    pts = np.concatenate([np.stack([xs - half, ys], 1), np.stack([xs + half, ys], 1)[::-1]])
    cm = poly_mask(h, w, pts)
    tex = 0.5 + 0.5 * np.sin((yy / (0.02 * h)) + 3 * np.sin(xx / (0.01 * w)))
    cyp = stops(tex, [(0, rgb("0d1a12")), (1, rgb("2c4a2a"))])
    img = img * (1 - cm[..., None]) + cyp * cm[..., None]
    return img


def paint_fields(rng, h, w):
    """Colour-field painting: soft stacked rectangles on a maroon ground."""
    img = solid(h, w, rgb("5a1413"))
    img *= (1 + 0.06 * brush_texture(rng, h, w))[..., None]
    yy, xx = grid(h, w)
    blocks = [(0.05, 0.42, "e3702a"), (0.47, 0.58, "8a1c1a"), (0.63, 0.95, "e8b04a")]
    mx = 0.07 * w
    for y0, y1, col in blocks:
        edge = fbm(rng, h, w, base=3, octaves=4) * 0.03 * h
        sd = np.minimum.reduce([xx - mx, w - mx - xx, yy - y0 * h, y1 * h - yy]) + edge - 0.015 * h
        m = smoothstep(-0.012 * h, 0.012 * h, sd)
        c = np.asarray(rgb(col), np.float32)
        tex = (1 + 0.08 * brush_texture(rng, h, w) + 0.05 * (fbm(rng, h, w, base=2, octaves=3) - 0.5))[..., None]
        img = img * (1 - m[..., None]) + (c * tex) * m[..., None]
    return img


def paint_still_life(rng, h, w):
    """Still life: blue jug, pears and a cloth on a wooden table against a dark wall."""
    yy, xx = grid(h, w)
    wall = stops(xx / w, [(0, rgb("3d4a36")), (0.6, rgb("2a3326")), (1, rgb("1b2119"))])
    wall *= (0.85 + 0.3 * fbm(rng, h, w, base=3, octaves=5))[..., None]
    table_y = 0.62 * h
    grain = brush_texture(rng, h, w, horizontal=True)
    table = stops((yy - table_y) / (0.38 * h), [(0, rgb("7a4a26")), (1, rgb("4a2a14"))])
    table *= (1 + 0.12 * grain)[..., None]
    img = np.where((yy < table_y)[..., None], wall, table)
    cv2.rectangle(img, (0, int(0.9 * h)), (w, h), rgb("2f1a0c"), -1)
    # cloth
    cloth = [(0.05 * w, table_y + 0.02 * h), (0.5 * w, table_y - 0.01 * h), (0.58 * w, 0.93 * h), (0.62 * w, h),
             (0.02 * w, h)]
    cm = poly_mask(h, w, cloth)
    folds = 0.82 + 0.18 * np.sin(xx / (0.035 * w) + np.sin(yy / (0.06 * h)) * 2)
    img = mix(img, np.stack([folds * 0.93, folds * 0.91, folds * 0.86], -1), cm)
    # shadows on the table
    sh = np.zeros((h, w), np.float32)
    cv2.ellipse(sh, (int(0.42 * w), int(table_y + 0.06 * h)), (int(0.16 * w), int(0.03 * h)), 0, 0, 360, 1.0, -1)
    cv2.ellipse(sh, (int(0.8 * w), int(0.71 * h)), (int(0.13 * w), int(0.02 * h)), 0, 0, 360, 1.0, -1)
    img *= (1 - 0.5 * cv2.GaussianBlur(sh, (0, 0), 0.02 * w))[..., None]
    # jug (lathe profile)
    jx, jy0, jy1 = 0.36 * w, 0.22 * h, table_y + 0.06 * h
    t = np.clip((yy - jy0) / (jy1 - jy0), 0, 1)
    prof = 0.06 + 0.11 * np.sin(np.pi * (0.15 + 0.8 * t)) ** 1.5 - 0.03 * smoothstep(0.0, 0.15, 0.15 - t)
    r = prof * w
    nx = (xx - jx) / np.maximum(r, 1)
    jm = ((np.abs(nx) < 1) & (yy > jy0) & (yy < jy1)).astype(np.float32)
    jm = cv2.GaussianBlur(jm, (0, 0), 1.0)
    lam = np.clip(np.sqrt(np.clip(1 - nx**2, 0, 1)) * 0.8 - 0.35 * nx, 0.1, 1.2)
    jug = np.stack([0.12 * lam, 0.25 * lam, 0.62 * lam], -1) + (smoothstep(0.75, 0.95, lam) * 0.5)[..., None]
    cv2.ellipse(img, (int(jx + 0.13 * w), int(0.36 * h)), (int(0.08 * w), int(0.09 * h)), 0, -100, 100, rgb("1c2f6b"),
                int(0.022 * w))
    img = mix(img, jug, jm)
    cv2.ellipse(img, (int(jx), int(jy0)), (int(0.06 * w), int(0.012 * h)), 0, 0, 360, rgb("0e1a40"), -1)
    # fruit
    fruits = [(0.66, 0.6, 0.075, "b7b83a"), (0.8, 0.66, 0.07, "cfa73a"), (0.55, 0.68, 0.05, "b5361f"),
              (0.2, 0.7, 0.055, "d98b2b")]
    for fx, fy, fr, col in fruits:
        cx, cy, rr = fx * w, fy * h, fr * w
        m = ellipse_mask(h, w, cx, cy, rr, rr * 1.05)
        if fr >= 0.07:  # pear: add a smaller top lobe
            m = np.maximum(m, ellipse_mask(h, w, cx + rr * 0.2, cy - rr * 1.1, rr * 0.55, rr * 0.7))
        d = np.sqrt((xx - (cx - rr * 0.4)) ** 2 + (yy - (cy - rr * 0.5)) ** 2) / (2 * rr)
        lit = np.clip(1.15 - d, 0.25, 1.1)
        c = np.asarray(rgb(col), np.float32)
        fruit = c * lit[..., None] + (smoothstep(0.8, 1.0, lit) * 0.35)[..., None]
        img = mix(img, fruit, m)
        if fr >= 0.07:
            cv2.line(img, (int(cx + rr * 0.2), int(cy - rr * 1.75)), (int(cx + rr * 0.35), int(cy - rr * 2.1)),
                     rgb("3b2410"), max(2, int(0.006 * w)))
    img *= (1 + 0.04 * brush_texture(rng, h, w, horizontal=False))[..., None]
    return img


def paint_harbour(rng, h, w):
    """Harbour at night: skyline with lit windows reflected in rippling water."""
    yy, xx = grid(h, w)
    hor = 0.58 * h
    img = stops(yy / hor, [(0, rgb("0b1030")), (0.6, rgb("3b2d63")), (0.9, rgb("c0566a")), (1, rgb("f2a25c"))])
    for _ in range(60):
        cv2.circle(img, (int(rng.uniform(0, w)), int(rng.uniform(0, 0.4) * h)), max(1, int(rng.uniform(0.5, 1.8) * SS)),
                   (0.95, 0.95, 0.85), -1)
    cv2.circle(img, (int(0.2 * w), int(0.16 * h)), int(0.04 * w), rgb("f3ecd0"), -1)
    x = 0.0
    while x < w:
        bw = rng.uniform(0.04, 0.1) * w
        bh = rng.uniform(0.08, 0.33) * h
        col = jitter(rng, rgb("1d2235"), 0.03)
        top = hor - bh
        cv2.rectangle(img, (int(x), int(top)), (int(x + bw), int(hor)), col, -1)
        if rng.random() < 0.2:
            cv2.line(img, (int(x + bw / 2), int(top)), (int(x + bw / 2), int(top - 0.06 * h)), col, max(2, SS))
        if rng.random() < 0.15:
            cv2.ellipse(img, (int(x + bw / 2), int(top)), (int(bw / 2), int(bw / 2)), 0, 180, 360, col, -1)
        ww, wh = 0.008 * w, 0.012 * h
        for wy in np.arange(top + 0.02 * h, hor - 0.02 * h, 0.028 * h):
            for wx in np.arange(x + 0.01 * w, x + bw - ww - 0.005 * w, 0.018 * w):
                if rng.random() < 0.45:
                    cv2.rectangle(img, (int(wx), int(wy)), (int(wx + ww), int(wy + wh)),
                                  jitter(rng, rgb("f6c95a"), 0.06), -1)
        x += bw + rng.uniform(0, 0.015) * w
    # reflection
    map_y = np.clip(2 * hor - yy + 0.006 * h * np.sin(yy / (0.004 * h)), 0, hor - 1).astype(np.float32)
    map_x = (xx + 0.01 * w * np.sin(yy / (0.006 * h) + xx / (0.08 * w))).astype(np.float32)
    refl = cv2.remap(img, map_x, map_y, cv2.INTER_LINEAR)
    refl = cv2.GaussianBlur(refl, (1, 9 * SS + 1), 0)
    water = refl * 0.65 + np.array(rgb("0c1630"), np.float32) * 0.35
    img = np.where((yy >= hor)[..., None], water, img)
    cv2.rectangle(img, (0, int(hor)), (w, int(hor + 0.008 * h)), rgb("111522"), -1)
    # boats
    for _ in range(3):
        bx, by, bs = rng.uniform(0.1, 0.85) * w, rng.uniform(0.72, 0.92) * h, rng.uniform(0.06, 0.1) * w
        cv2.fillPoly(img, [np.array([[bx - bs, by], [bx + bs, by], [bx + bs * 0.7, by + bs * 0.25],
                                     [bx - bs * 0.8, by + bs * 0.25]], np.int32)], rgb("0a0c14"))
        cv2.line(img, (int(bx), int(by)), (int(bx), int(by - bs * 1.5)), rgb("0a0c14"), max(2, SS))
        cv2.fillPoly(img, [np.array([[bx + 3, by - bs * 1.4], [bx + 3, by - bs * 0.15], [bx + bs * 0.8, by - bs * 0.15]],
                                    np.int32)], rgb("d9d2c0"))
    return img


def paint_rose_window(rng, h, w):
    """Stained-glass rose window: Voronoi glass cells with lead lines, in a stone wall."""
    yy, xx = grid(h, w)
    cx, cy, R = w / 2, h / 2, 0.45 * min(h, w)
    # stone wall with masonry courses
    img = solid(h, w, rgb("8c8577")) * (0.8 + 0.35 * fbm(rng, h, w, base=4, octaves=5))[..., None]
    course = 0.07 * h
    for k in range(int(h / course) + 1):
        y = int(k * course)
        cv2.line(img, (0, y), (w, y), rgb("5e584e"), max(2, SS))
        off = (k % 2) * 0.09 * w
        for bx in np.arange(off, w, 0.18 * w):
            cv2.line(img, (int(bx), y), (int(bx), int(y + course)), rgb("5e584e"), max(2, SS))
    d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
    # seed points on symmetric rings
    sym = int(rng.choice([8, 10, 12]))
    pts = [(cx, cy)]
    ring_r = [0.12, 0.26, 0.42, 0.6, 0.8, 0.97]
    for i, rr in enumerate(ring_r):
        n = sym * (1 + i // 2)
        off = rng.uniform(0, 2 * np.pi / n)
        for j in range(n):
            a = off + 2 * np.pi * j / n
            q = rr * R * (1 + rng.normal(0, 0.03))
            pts.append((cx + q * math.cos(a), cy + q * math.sin(a)))
    src = np.ones((h, w), np.uint8)
    for px, py in pts:
        src[int(np.clip(py, 0, h - 1)), int(np.clip(px, 0, w - 1))] = 0
    _, labels = cv2.distanceTransformWithLabels(src, cv2.DIST_L2, 5, labelType=cv2.DIST_LABEL_PIXEL)
    jewel = np.array([rgb(c) for c in ("9b111e", "1d3fa8", "1f7a3a", "e0a21b", "5b2a86", "c75b12", "2a8fb0")],
                     np.float32)
    n_lab = int(labels.max()) + 1
    ring_of = np.zeros(n_lab, np.int32)
    lab_col = np.zeros((n_lab, 3), np.float32)
    lab_bri = rng.uniform(0.75, 1.15, n_lab).astype(np.float32)
    for px, py in pts:
        lab = labels[int(np.clip(py, 0, h - 1)), int(np.clip(px, 0, w - 1))]
        qr = math.hypot(px - cx, py - cy) / R
        ring = int(np.searchsorted(ring_r, qr - 0.05))
        a = (math.atan2(py - cy, px - cx) % (2 * np.pi)) / (2 * np.pi)
        ring_of[lab] = ring
        lab_col[lab] = jewel[(ring * 2 + int(a * sym * (1 + ring // 2)) % 2) % len(jewel)]
    glass = lab_col[labels] * lab_bri[labels][..., None]
    glass *= (0.8 + 0.4 * fbm(rng, h, w, base=6, octaves=4))[..., None]
    glow = np.exp(-((d / R) ** 2) * 1.2)
    glass = glass * (0.7 + 0.6 * glow[..., None])
    lab8 = labels.astype(np.float32)
    k = np.ones((3, 3), np.uint8)
    lead = (cv2.dilate(lab8, k) != cv2.erode(lab8, k)).astype(np.uint8)
    lead = cv2.dilate(lead, np.ones((2 * SS + 1, 2 * SS + 1), np.uint8)).astype(np.float32)
    glass = mix(glass, rgb("151515"), lead)
    # radial tracery bars
    for j in range(sym):
        a = 2 * np.pi * j / sym
        cv2.line(glass, (int(cx + 0.2 * R * math.cos(a)), int(cy + 0.2 * R * math.sin(a))),
                 (int(cx + R * math.cos(a)), int(cy + R * math.sin(a))), rgb("6f695e"), int(0.018 * R))
    cv2.circle(glass, (int(cx), int(cy)), int(0.2 * R), rgb("6f695e"), int(0.03 * R))
    win = 1 - smoothstep(R - 1.5, R + 1.5, d)
    img = mix(img, glass, win)
    cv2.circle(img, (int(cx), int(cy)), int(R + 0.03 * R), rgb("6a6458"), int(0.07 * R))
    cv2.circle(img, (int(cx), int(cy)), int(R + 0.075 * R), rgb("a9a18f"), int(0.02 * R))
    return img


# ---- open-set paintings (never in the collection) ------------------------------------------


def paint_pointillist(rng, h, w):
    """Pointillist seaside: a scene rendered only with dots."""
    yy, xx = grid(h, w)
    hor, beach = 0.45 * h, 0.72 * h + 0.04 * h * np.sin(xx / (0.3 * w))
    scene = stops(yy / hor, [(0, rgb("7fb0d8")), (1, rgb("e8d9c0"))])
    sea = stops((yy - hor) / (0.3 * h), [(0, rgb("2f6fa0")), (1, rgb("58a6b8"))])
    sand = stops((yy - 0.7 * h) / (0.3 * h), [(0, rgb("e8cf96")), (1, rgb("c99a5a"))])
    scene = np.where((yy >= hor)[..., None], sea, scene)
    scene = np.where((yy >= beach)[..., None], sand, scene)
    cv2.circle(scene, (int(0.75 * w), int(0.2 * h)), int(0.06 * w), rgb("fbe39a"), -1)
    bx, by = 0.35 * w, hor + 0.08 * h
    cv2.fillPoly(scene, [np.array([[bx, by - 0.22 * h], [bx, by], [bx + 0.12 * w, by]], np.int32)], rgb("f6f1e6"))
    cv2.fillPoly(scene, [np.array([[bx - 0.07 * w, by], [bx + 0.14 * w, by], [bx + 0.1 * w, by + 0.03 * h],
                                   [bx - 0.05 * w, by + 0.03 * h]], np.int32)], rgb("8a2c1f"))
    cv2.rectangle(scene, (int(0.6 * w), int(0.6 * h)), (int(0.64 * w), int(0.82 * h)), rgb("c23b2a"), -1)
    cv2.ellipse(scene, (int(0.62 * w), int(0.6 * h)), (int(0.14 * w), int(0.05 * h)), 0, 180, 360, rgb("d9573f"), -1)
    img = cv2.GaussianBlur(scene, (0, 0), 3) * 0.9 + 0.1
    n = 22000
    xs, ys = rng.uniform(0, w, n).astype(int), rng.uniform(0, h, n).astype(int)
    for x, y in zip(xs, ys):
        c = scene[min(y, h - 1), min(x, w - 1)]
        if rng.random() < 0.15:
            c = 1.0 - c * 0.6  # complementary flecks
        cv2.circle(img, (int(x), int(y)), int(2.2 * SS), jitter(rng, c, 0.07), -1)
    return img


def paint_winter_tree(rng, h, w):
    """A bare fractal tree in the snow at dusk."""
    yy, _ = grid(h, w)
    img = stops(yy / h, [(0, rgb("9fb0c8")), (0.55, rgb("e8c9c4")), (0.7, rgb("f3e3d3")), (1, rgb("dfe6ef"))])
    ground = 0.78 * h + 0.03 * h * fbm1d(rng, w, base=2, octaves=4)
    far = 0.7 * h + 0.04 * h * fbm1d(rng, w, base=4, octaves=6)
    img = mix(img, rgb("6d7a8f"), ((yy > far[None, :]) & (yy < ground[None, :])).astype(np.float32))
    img = mix(img, rgb("eef2f7"), (yy >= ground[None, :]).astype(np.float32))

    def branch(x, y, ang, length, width, depth):
        if depth == 0 or length < 2:
            return
        x2, y2 = x + length * math.cos(ang), y - length * math.sin(ang)
        cv2.line(img, (int(x), int(y)), (int(x2), int(y2)), rgb("2a2220"), max(1, int(width)))
        for da in (rng.uniform(0.25, 0.55), -rng.uniform(0.25, 0.55)):
            branch(x2, y2, ang + da + rng.normal(0, 0.1), length * rng.uniform(0.68, 0.8), width * 0.68, depth - 1)

    branch(0.5 * w, ground[int(0.5 * w)] + 0.01 * h, math.pi / 2 + rng.normal(0, 0.05), 0.22 * h, 0.035 * w, 10)
    for _ in range(5):
        bx, by, s = rng.uniform(0.1, 0.9) * w, rng.uniform(0.1, 0.35) * h, rng.uniform(5, 9) * SS
        cv2.polylines(img, [np.array([[bx - s, by - s * 0.4], [bx, by], [bx + s, by - s * 0.4]], np.int32)], False,
                      rgb("2a2220"), max(2, SS))
    return img


def paint_checker_bulge(rng, h, w):
    """Op-art chequerboard bulging out of the canvas."""
    yy, xx = grid(h, w)
    cx, cy, R = w * 0.5, h * 0.5, 0.42 * min(h, w)
    dx, dy = xx - cx, yy - cy
    r = np.sqrt(dx**2 + dy**2) + 1e-6
    rn = np.clip(r / R, 0, None)
    rr = np.where(rn < 1, rn**1.8, rn) * R
    u, v = cx + dx / r * rr, cy + dy / r * rr
    s = min(h, w) / 14
    k = (np.floor(u / s) + np.floor(v / s)).astype(np.int32) % 2
    a = stops(xx / w, [(0, rgb("1b3a6b")), (1, rgb("6b1b5a"))])
    b = stops(yy / h, [(0, rgb("f5c542")), (1, rgb("f08a4b"))])
    img = np.where(k[..., None] == 1, a, b)
    shade = 1 - 0.35 * smoothstep(0.6, 1.0, rn) * (rn < 1)
    return (img * shade[..., None]).astype(np.float32)


# --------------------------------------------------------------------------------------------
# frames and gallery walls
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameStyle:
    colour: str
    width: float  # fraction of the painting's longest side
    profile: str  # ornate | wood | flat | strip
    grain: float = 0.0
    spec: float = 0.3
    mat: float = 0.0  # passe-partout width, fraction of the longest side


FRAMES = {
    "gold": FrameStyle("c9a24a", 0.10, "ornate", grain=0.06, spec=0.9),
    "walnut": FrameStyle("4a2c17", 0.075, "wood", grain=0.35, spec=0.15),
    "oak": FrameStyle("a27a4b", 0.07, "wood", grain=0.3, spec=0.12),
    "black": FrameStyle("1a1a1c", 0.04, "flat", spec=0.35),
    "white": FrameStyle("ebe8e1", 0.035, "flat", spec=0.1, mat=0.08),
    "silver": FrameStyle("b7b9bd", 0.06, "ornate", grain=0.04, spec=0.8),
    "strip": FrameStyle("2b2623", 0.02, "strip", grain=0.15, spec=0.1),
    "red": FrameStyle("7c1d17", 0.055, "wood", grain=0.1, spec=0.5),
}


def _profile(name: str, t: np.ndarray) -> np.ndarray:
    if name == "ornate":
        return (0.55 * smoothstep(0.0, 0.12, t) + 0.3 * np.exp(-(((t - 0.3) / 0.05) ** 2))
                - 0.35 * smoothstep(0.42, 0.72, t) + 0.25 * np.exp(-(((t - 0.84) / 0.04) ** 2))
                - 0.25 * smoothstep(0.9, 1.0, t))
    if name == "wood":
        return 0.6 * smoothstep(0.0, 0.15, t) + 0.35 * t - 0.8 * smoothstep(0.82, 1.0, t)
    if name == "flat":
        return 0.5 * smoothstep(0.0, 0.35, t) - 0.5 * smoothstep(0.7, 1.0, t)
    return 0.3 * smoothstep(0.0, 0.5, t) - 0.3 * smoothstep(0.5, 1.0, t)


def add_frame(rng: np.random.Generator, img: np.ndarray, style: FrameStyle) -> np.ndarray:
    """Put the painting in a mitred, bevelled frame lit from the top left."""
    h, w = img.shape[:2]
    L = max(h, w)
    if style.mat > 0:
        m = int(style.mat * L)
        mat = solid(h + 2 * m, w + 2 * m, rgb("f2efe6")) * (1 + 0.015 * brush_texture(rng, h + 2 * m, w + 2 * m))[..., None]
        bev = max(2, int(0.006 * L))
        mat[m - bev : m + h + bev, m - bev : m + w + bev] = rgb("fbfaf6")  # bevelled cut of the mat
        mat[m + h : m + h + bev, m - bev : m + w + bev] *= 0.85
        mat[m - bev : m + h + bev, m + w : m + w + bev] *= 0.9
        mat[m : m + h, m : m + w] = img
        img, h, w = mat, h + 2 * m, w + 2 * m
    fw = max(4, int(style.width * L))
    H, W = h + 2 * fw, w + 2 * fw
    yy, xx = grid(H, W)
    dists = np.stack([yy, H - 1 - yy, xx, W - 1 - xx])  # top, bottom, left, right
    side = np.argmin(dists, axis=0)
    dist = np.min(dists, axis=0)
    t = np.clip(dist / fw, 0, 1)
    along = np.where(side < 2, xx, yy)
    height = _profile(style.profile, t)
    if style.profile == "ornate":  # beads along the ridge
        height = height + 0.12 * np.exp(-(((t - 0.3) / 0.07) ** 2)) * (0.5 + 0.5 * np.sin(2 * np.pi * along / (0.28 * fw)))
        height = height + 0.06 * np.exp(-(((t - 0.6) / 0.1) ** 2)) * np.sin(2 * np.pi * along / (0.9 * fw))
    height = height.astype(np.float32) * fw * 0.35
    gy, gx = np.gradient(height)
    lx, ly, lz = -0.45, -0.6, 0.66
    shade = (lz - gx * lx - gy * ly) / np.sqrt(1 + gx**2 + gy**2) / math.sqrt(lx**2 + ly**2 + lz**2)
    shade = np.clip(shade, 0, 1)
    grain_h = value_noise(rng, H, W, max(2, H // 5), 6)
    grain_v = value_noise(rng, H, W, 6, max(2, W // 5))
    grain = np.where(side < 2, grain_h, grain_v)
    base = np.asarray(rgb(style.colour), np.float32)
    frame = base * (0.2 + 1.0 * shade)[..., None] * (1 + style.grain * (grain - 0.5))[..., None]
    frame += (style.spec * np.clip(shade - 0.78, 0, None) ** 2 * 12)[..., None] * np.array([1, 0.95, 0.85], np.float32)
    frame = np.clip(frame, 0, 1)
    out = frame.copy()
    inner = img.copy()
    # the frame's lip throws a soft shadow on the top and left of the picture
    iy, ix = grid(h, w)
    sig = 0.012 * L
    sh = np.maximum(np.exp(-iy / sig), 0.8 * np.exp(-ix / sig))
    inner *= (1 - 0.35 * sh)[..., None]
    out[fw : fw + h, fw : fw + w] = inner
    return out.astype(np.float32)


def add_canvas_texture(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    n = cv2.GaussianBlur(rng.normal(0, 1, (h, w)).astype(np.float32), (0, 0), 0.7)
    yy, xx = grid(h, w)
    weave = np.sin(xx * 2.1) * np.sin(yy * 2.1)
    return np.clip(img * (1 + 0.025 * n + 0.012 * weave)[..., None], 0, 1)


@dataclass
class Plane:
    img: np.ndarray  # uint8 RGB image of the wall with the framed painting
    frame_box: tuple[float, float, float, float]  # x0, y0, x1, y1 of the frame in plane pixels
    paint_box: tuple[float, float, float, float]  # the painting itself (no frame/mat)


def make_plane(rng: np.random.Generator, framed: np.ndarray, pad: tuple[int, int, int, int],
               wall: str, margin: float, label: bool) -> Plane:
    """Hang the framed painting on a wall; margin is in units of the frame's longest side."""
    Hf, Wf = framed.shape[:2]
    M = int(margin * max(Hf, Wf))
    H, W = Hf + 2 * M, Wf + 2 * M
    sc = max(Hf, Wf) / 700.0
    base = np.asarray(rgb(wall), np.float32)
    low = fbm(rng, H, W, base=2, octaves=3)
    fine = cv2.GaussianBlur(rng.normal(0, 1, (H, W)).astype(np.float32), (0, 0), 0.8 * sc)
    yy = np.arange(H, dtype=np.float32)[:, None]
    img = base * (1 + 0.07 * (low - 0.5) + 0.025 * fine - 0.08 * (yy / H - 0.5))[..., None]
    # drop shadow, light from the top left
    sh = np.zeros((H, W), np.float32)
    off = int(0.025 * max(Hf, Wf))
    sh[M + off : M + Hf + off, M + off // 2 : M + Wf + off // 2] = 1.0
    sh = cv2.GaussianBlur(sh, (0, 0), 0.02 * max(Hf, Wf))
    img *= (1 - 0.45 * sh)[..., None]
    if label:  # museum label card, text shown as grey bars
        lw, lh = 0.17 * Wf, 0.1 * Wf
        lx, ly = M + Wf + 0.07 * Wf, M + Hf * 0.62
        lsh = np.zeros((H, W), np.float32)
        cv2.rectangle(lsh, (int(lx + 3 * sc), int(ly + 4 * sc)), (int(lx + lw + 3 * sc), int(ly + lh + 4 * sc)), 1.0, -1)
        img *= (1 - 0.3 * cv2.GaussianBlur(lsh, (0, 0), 3 * sc))[..., None]
        cv2.rectangle(img, (int(lx), int(ly)), (int(lx + lw), int(ly + lh)), rgb("f4f2ec"), -1)
        n_lines = int(rng.integers(3, 6))
        for k, frac in enumerate(rng.uniform(0.35, 1.0, n_lines)):  # title, artist, description...
            y = ly + lh * (0.15 + 0.7 * k / n_lines)
            cv2.rectangle(img, (int(lx + 0.08 * lw), int(y)), (int(lx + 0.08 * lw + frac * 0.84 * lw), int(y + 0.06 * lh)),
                          (0.35, 0.35, 0.35) if k else (0.12, 0.12, 0.12), -1)
    img[M : M + Hf, M : M + Wf] = framed
    u8 = np.clip(img * 255 + 0.5, 0, 255).astype(np.uint8)
    t, b, left, r = pad
    return Plane(u8, (M, M, M + Wf, M + Hf), (M + left, M + t, M + Wf - r, M + Hf - b))


# --------------------------------------------------------------------------------------------
# the "camera"
# --------------------------------------------------------------------------------------------


def rotation(yaw: float, pitch: float, roll: float) -> np.ndarray:
    cy, sy = math.cos(yaw), math.sin(yaw)
    cp, sp = math.cos(pitch), math.sin(pitch)
    cr, sr = math.cos(roll), math.sin(roll)
    Ry = np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
    Rx = np.array([[1, 0, 0], [0, cp, -sp], [0, sp, cp]])
    Rz = np.array([[cr, -sr, 0], [sr, cr, 0], [0, 0, 1]])
    return Rz @ Rx @ Ry


def homography(target: tuple[float, float], out_size: tuple[int, int], yaw: float, pitch: float, roll: float,
               scale: float, hfov_deg: float) -> np.ndarray:
    """Pinhole camera looking at `target` on the wall plane; `scale` = output px per plane px there."""
    Wo, Ho = out_size
    f = 0.5 * max(Wo, Ho) / math.tan(math.radians(hfov_deg) / 2)
    d = f / scale
    R = rotation(yaw, pitch, roll)
    K = np.array([[f, 0, Wo / 2], [0, f, Ho / 2], [0, 0, 1]])
    M = np.column_stack([R[:, 0], R[:, 1], [0, 0, d]])
    T = np.array([[1, 0, -target[0]], [0, 1, -target[1]], [0, 0, 1]])
    Hm = K @ M @ T
    return Hm / Hm[2, 2]


@dataclass
class Shot:
    kind: str  # front | oblique | detail | query | query_detail
    strong: bool  # stronger photometric changes (queries)


def photograph(rng: np.random.Generator, plane: Plane, shot: Shot) -> np.ndarray:
    fx0, fy0, fx1, fy1 = plane.frame_box
    px0, py0, px1, py1 = plane.paint_box
    Wf, Hf = fx1 - fx0, fy1 - fy0
    portrait = Hf > Wf * 1.05 or (abs(Hf - Wf) < 0.05 * Wf and rng.random() < 0.4)
    if rng.random() < 0.12:
        portrait = not portrait
    Wo, Ho = (OUT_SHORT, OUT_LONG) if portrait else (OUT_LONG, OUT_SHORT)
    fit = min(Wo / Wf, Ho / Hf)
    cx, cy = (fx0 + fx1) / 2, (fy0 + fy1) / 2
    sgn = 1 if rng.random() < 0.5 else -1
    k = shot.kind
    if k == "front":
        yaw, pitch, roll = rng.normal(0, 5), rng.normal(0, 3), rng.normal(0, 1.5)
        cov, off = rng.uniform(0.72, 0.9), rng.uniform(-0.03, 0.03, 2)
    elif k == "oblique":
        yaw, pitch, roll = sgn * rng.uniform(16, 30), rng.uniform(-10, 10), rng.normal(0, 2.5)
        cov, off = rng.uniform(0.6, 0.82), rng.uniform(-0.05, 0.05, 2)
    elif k in ("detail", "query_detail"):
        yaw, pitch, roll = rng.normal(0, 7), rng.normal(0, 5), rng.normal(0, 3)
        cov = rng.uniform(1.8, 2.4)
        pw, ph = px1 - px0, py1 - py0
        tx = (px0 + px1) / 2 + rng.uniform(-0.22, 0.22) * pw
        ty = (py0 + py1) / 2 + rng.uniform(-0.22, 0.22) * ph
        off = np.array([(tx - cx) / Wf, (ty - cy) / Hf])
    else:  # query
        yaw, pitch, roll = sgn * rng.uniform(4, 36), rng.uniform(-14, 14), rng.normal(0, 5)
        cov, off = rng.uniform(0.55, 1.0), rng.uniform(-0.1, 0.1, 2)
    target = (cx + off[0] * Wf, cy + off[1] * Hf)
    scale = cov * fit
    Hm = homography(target, (Wo, Ho), math.radians(yaw), math.radians(pitch), math.radians(roll), scale,
                    rng.uniform(55, 70))
    s_eff = scale * math.cos(math.radians(abs(yaw))) * 0.85
    src = plane.img
    if s_eff < 1:
        src = cv2.GaussianBlur(src, (0, 0), 0.5 * math.sqrt(1 / s_eff**2 - 1))
    warped = cv2.warpPerspective(src, Hm, (Wo, Ho), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT101)
    img = warped.astype(np.float32) / 255.0
    return develop(rng, img, shot.strong)


def develop(rng: np.random.Generator, img: np.ndarray, strong: bool) -> np.ndarray:
    """Lighting, white balance, exposure, blur, sensor noise and camera JPEG."""
    Ho, Wo = img.shape[:2]
    yy, xx = grid(Ho, Wo)
    xn, yn = (xx - Wo / 2) / (Wo / 2), (yy - Ho / 2) / (Ho / 2)
    lin = img**2.2
    a = rng.uniform(0, 2 * np.pi)
    g = rng.uniform(0.1, 0.35) if strong else rng.uniform(0.04, 0.16)
    gain = 1 + g * (xn * math.cos(a) + yn * math.sin(a))
    sx, sy = rng.uniform(-0.5, 0.5), rng.uniform(-0.8, 0.0)
    gain *= 1 + rng.uniform(0.0, 0.5 if strong else 0.25) * np.exp(-((xn - sx) ** 2 + (yn - sy) ** 2) / 0.6)
    gain *= 1 - rng.uniform(0.1, 0.35) * (xn**2 + yn**2) / 2
    gain *= 2 ** (rng.uniform(-0.7, 0.35) if strong else rng.uniform(-0.3, 0.2))
    t = rng.uniform(-0.22, 0.22) if strong else rng.uniform(-0.1, 0.1)
    tint = rng.uniform(-0.04, 0.04)
    wb = np.array([1 + t, 1 + tint, 1 - t], np.float32)
    lin = lin * gain[..., None] * wb
    if strong and rng.random() < 0.35:  # glare on the varnish / glazing
        gx, gy = rng.uniform(-0.6, 0.6), rng.uniform(-0.6, 0.6)
        rx, ry = rng.uniform(0.1, 0.3), rng.uniform(0.05, 0.2)
        lin += (rng.uniform(0.15, 0.4) * np.exp(-(((xn - gx) / rx) ** 2 + ((yn - gy) / ry) ** 2)))[..., None]
    out = np.clip(lin, 0, 1) ** (1 / 2.2)
    sat = rng.uniform(0.75, 1.2) if strong else rng.uniform(0.9, 1.1)
    grey = out.mean(axis=2, keepdims=True)
    out = np.clip(grey + sat * (out - grey), 0, 1)
    if strong and rng.random() < 0.3:  # hand shake
        L = int(rng.integers(4, 9))
        ker = np.zeros((L, L), np.float32)
        ang = rng.uniform(0, np.pi)
        c = (L - 1) / 2
        cv2.line(ker, (round(c - c * math.cos(ang)), round(c - c * math.sin(ang))),
                 (round(c + c * math.cos(ang)), round(c + c * math.sin(ang))), 1.0, 1)
        out = cv2.filter2D(out, -1, ker / ker.sum())
    else:
        out = cv2.GaussianBlur(out, (0, 0), rng.uniform(0.4, 1.3 if strong else 0.9))
    sigma = rng.uniform(0.006, 0.02 if strong else 0.012)
    noise = rng.normal(0, 1, out.shape).astype(np.float32) * sigma * np.sqrt(0.3 + out)
    chroma = cv2.GaussianBlur(rng.normal(0, 1, out.shape).astype(np.float32), (0, 0), 1.2) * sigma * 0.8
    out = np.clip(out + noise + chroma, 0, 1)
    u8 = cv2.cvtColor(np.clip(out * 255 + 0.5, 0, 255).astype(np.uint8), cv2.COLOR_RGB2BGR)
    q = int(rng.integers(55, 80) if strong else rng.integers(70, 90))
    ok, buf = cv2.imencode(".jpg", u8, [cv2.IMWRITE_JPEG_QUALITY, q])
    assert ok
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)  # BGR


# --------------------------------------------------------------------------------------------
# the collection
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artwork:
    instance: str
    paint: Callable
    aspect: float  # width / height
    frame: str
    wall: str
    title: str
    artist: str
    year: str
    description: str
    label: bool = True


COLLECTION = [
    Artwork("valley_at_dusk", paint_valley, 4 / 3, "gold", "2f4a3f", "Valley at Dusk", "Studio museum-search", "2026",
            "Four ridges fade into a violet haze while the sun sinks behind them and the lake repeats the sky. "
            "Every hill line is a random walk; another seed would paint another valley."),
    Artwork("composition_rby", paint_grid, 1.0, "black", "d9d8d3", "Composition in Red, Blue and Yellow No. 3",
            "Atelier Pseudorandom", "2026",
            "Black bars cut a white field into rectangles, a few of them flooded with the three primaries. "
            "The grid is split recursively until the rectangles feel balanced."),
    Artwork("twelve_suns", paint_concentric, 4 / 3, "white", "ece9e2", "Twelve Suns",
            "The Seeded Collective", "2026",
            "Twelve squares, twelve small planets of concentric colour. No ring is perfectly round: "
            "each wobbles a little, as if painted by a patient but human hand."),
    Artwork("wind_over_wheat", paint_wheat, 3 / 2, "gold", "6b1f1d", "Wind over the Wheat",
            "Workshop of the Gaussian Kernel", "2026",
            "Five thousand short strokes follow an invisible wind through a ripening field. "
            "Look for the poppies and the crows lifting from the horizon."),
    Artwork("ochre_tessellation", paint_triangles, 4 / 5, "oak", "b3aa9c", "Tessellation in Ochre and Teal",
            "Atelier Pseudorandom", "2026",
            "Squares split along their diagonals, some holding a smaller triangle of a contrasting colour. "
            "A slow wave of ochre and teal rolls across the tiling."),
    Artwork("undulation", paint_undulation, 1.0, "silver", "ecebe6", "Undulation",
            "Studio museum-search", "2026",
            "Black and white bands swell and narrow until the surface seems to move. "
            "Two coloured threads, red and teal, run through the waves."),
    Artwork("improvisation_circles", paint_improvisation, 4 / 3, "black", "aebbc4", "Improvisation with Circles",
            "The Seeded Collective", "2026",
            "Circles, rings, triangles and a small chequerboard float on a warm ground, held together "
            "by thick black lines like the notes and bars of a score."),
    Artwork("turbulent_night", paint_night, 4 / 3, "walnut", "27314f", "Turbulent Night",
            "Workshop of the Gaussian Kernel", "2026",
            "The sky over a sleeping village turns in two great eddies under a crescent moon. "
            "A dark cypress rises like a flame on the left."),
    Artwork("three_fields_of_ember", paint_fields, 3 / 4, "strip", "e6e2da", "Three Fields of Ember",
            "Studio museum-search", "2026",
            "Three soft-edged fields of orange, crimson and gold hover on a maroon ground. "
            "Stand close: the colour seems to breathe at the edges.", label=False),
    Artwork("still_life_pears", paint_still_life, 4 / 5, "gold", "9c4a34", "Still Life with Pears and a Blue Jug",
            "Anonymous (numpy.random)", "2026",
            "A blue jug, two pears, an apple and an orange on a wooden table with a white cloth, "
            "lit from the left against a dark green wall."),
    Artwork("harbour_lights", paint_harbour, 3 / 2, "walnut", "7b7d80", "Harbour Lights",
            "The Seeded Collective", "2026",
            "Dusk over a harbour town: hundreds of lit windows, a pale moon, and their broken "
            "reflections in the rippling water among moored sailing boats."),
    Artwork("rose_window", paint_rose_window, 1.0, "oak", "24352d", "Rose Window",
            "Workshop of the Gaussian Kernel", "2026",
            "A circular window of jewel-coloured glass set in a stone wall. "
            "Each pane is a Voronoi cell grown from seeds placed on symmetric rings."),
]

OPEN_SET = [
    Artwork("pointillist_seaside", paint_pointillist, 4 / 3, "gold", "8f9b86", "Seaside in Dots", "", "2026", ""),
    Artwork("winter_tree", paint_winter_tree, 3 / 4, "white", "c9c6c0", "Winter Tree", "", "2026", ""),
    Artwork("chequer_bulge", paint_checker_bulge, 1.0, "black", "f0efea", "Chequer Bulge", "", "2026", ""),
]


def render_painting(art: Artwork, rng: np.random.Generator) -> np.ndarray:
    if art.aspect >= 1:
        w, h = PAINT_LONG, round(PAINT_LONG / art.aspect)
    else:
        w, h = round(PAINT_LONG * art.aspect), PAINT_LONG
    big = np.clip(art.paint(rng, h * SS, w * SS), 0, 1).astype(np.float32)
    return add_canvas_texture(rng, big)  # at SS x


def build_planes(art: Artwork, seed: int, index: int) -> tuple[Plane, Plane, np.ndarray]:
    rng = np.random.default_rng([seed, index, 0])
    painting = render_painting(art, rng)
    style = FRAMES[art.frame]
    framed = add_frame(rng, painting, style)  # SS x
    ph, pw = painting.shape[:2]
    Hf, Wf = framed.shape[:2]
    pad_t = (Hf - ph) // 2
    pad_l = (Wf - pw) // 2
    pad = (pad_t, Hf - ph - pad_t, pad_l, Wf - pw - pad_l)
    small = cv2.resize(framed, (Wf // SS, Hf // SS), interpolation=cv2.INTER_AREA)
    pad_small = tuple(p // SS for p in pad)
    far = make_plane(rng, small, pad_small, art.wall, margin=1.3, label=art.label)  # type: ignore[arg-type]
    near = make_plane(rng, framed, pad, art.wall, margin=0.4, label=False)
    flat = cv2.resize(painting, (pw // SS, ph // SS), interpolation=cv2.INTER_AREA)
    return far, near, flat


def save_jpg(path: Path, bgr: np.ndarray, quality: int = 85) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_OPTIMIZE, 1])
    assert ok
    path.write_bytes(buf.tobytes())


def make_sample(out: Path, seed: int, verbose: bool = True, flats: Path | None = None) -> None:
    coll_dir, q_dir = out / "collection", out / "queries"
    for d in (coll_dir, q_dir):
        if d.exists():
            for p in d.glob("*.jpg"):
                p.unlink()
        d.mkdir(parents=True, exist_ok=True)
    cat_rows, gt_rows = [], []
    queries: list[tuple[str, np.ndarray]] = []
    for i, art in enumerate(COLLECTION):
        far, near, flat = build_planes(art, seed, i)
        if flats is not None:
            flats.mkdir(parents=True, exist_ok=True)
            save_jpg(flats / f"{art.instance}.jpg", cv2.cvtColor((flat * 255).astype(np.uint8), cv2.COLOR_RGB2BGR))
        shots = [Shot("front", False), Shot("oblique", False), Shot("oblique", False)]
        if i % 2 == 0:
            shots.append(Shot("detail", False))
        for k, shot in enumerate(shots, 1):
            rng = np.random.default_rng([seed, i, 1, k])
            img = photograph(rng, near if shot.kind == "detail" else far, shot)
            name = f"{art.instance}-{k}.jpg"
            save_jpg(coll_dir / name, img)
            cat_rows.append([name, art.instance, art.title, art.artist, art.year, art.description])
        n_q = 2 if i % 2 == 1 else 1
        for k in range(n_q):
            rng = np.random.default_rng([seed, i, 2, k])
            kind = "query_detail" if (i, k) in ((3, 0), (9, 1)) else "query"
            img = photograph(rng, near if kind == "query_detail" else far, Shot(kind, True))
            queries.append((art.instance, img))
        if verbose:
            print(f"  {art.instance}: {len(shots)} references, {n_q} queries")
    for j, art in enumerate(OPEN_SET):
        far, _near, flat = build_planes(art, seed, 100 + j)
        if flats is not None:
            save_jpg(flats / f"{art.instance}.jpg", cv2.cvtColor((flat * 255).astype(np.uint8), cv2.COLOR_RGB2BGR))
        rng = np.random.default_rng([seed, 100 + j, 2, 0])
        queries.append(("", photograph(rng, far, Shot("query", True))))
        if verbose:
            print(f"  {art.instance}: open-set query")
    order = np.random.default_rng([seed, 999]).permutation(len(queries))  # queries in shuffled order
    for n, idx in enumerate(order, 1):
        inst, img = queries[idx]
        name = f"q{n:02d}.jpg"
        save_jpg(q_dir / name, img)
        gt_rows.append([name, inst])
    with open(out / "catalogue.csv", "w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f, lineterminator="\n")
        wr.writerow(["file", "instance", "title", "artist", "year", "description"])
        wr.writerows(cat_rows)
    with open(q_dir / "ground_truth.csv", "w", newline="", encoding="utf-8") as f:
        wr = csv.writer(f, lineterminator="\n")
        wr.writerow(["query", "instance"])
        wr.writerows(gt_rows)


# --------------------------------------------------------------------------------------------
# the icon: a magnifier over a framed landscape, as SVG and as PNGs drawn with Pillow
# --------------------------------------------------------------------------------------------

ICON_SIZES = (16, 32, 48, 64, 128, 256)
# geometry in a 256 x 256 box
IC = {
    "frame": (20, 36, 196, 188, 14),  # x0, y0, x1, y1, corner radius
    "frame_w": 16,
    "sky": ("#8fd3ff", "#e6f6ff"),
    "hill_far": [(36, 150), (78, 104), (112, 138), (150, 96), (180, 140), (180, 172), (36, 172)],
    "hill_near": [(36, 172), (36, 156), (90, 132), (140, 160), (180, 148), (180, 172)],
    "sun": (70, 78, 15),
    "lens": (166, 156, 54),  # cx, cy, r
    "ring_w": 14,
    "handle": ((204, 194), (236, 226), 24),
}
IC_COL = {
    "frame": "#c9902f", "frame_dark": "#8a5a17", "frame_light": "#f1c66a",
    "hill_far": "#5aa36a", "hill_near": "#2f7a4a", "sun": "#ffcf3a",
    "ring": "#263445", "handle": "#263445", "glass": "#ffffff", "shine": "#ffffff",
}


def icon_svg() -> str:
    x0, y0, x1, y1, rad = IC["frame"]
    fw = IC["frame_w"]
    cx, cy, r = IC["lens"]
    (hx0, hy0), (hx1, hy1), hw = IC["handle"]

    def pts(key: str) -> str:
        return " ".join(f"{x},{y}" for x, y in IC[key])

    sx, sy, sr = IC["sun"]
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- museum-search application icon. Generated by tools/make_sample_collection.py; CC0 / MIT. -->
<svg xmlns="http://www.w3.org/2000/svg" width="256" height="256" viewBox="0 0 256 256">
  <defs>
    <linearGradient id="sky" x1="0" y1="0" x2="0" y2="1">
      <stop offset="0" stop-color="{IC['sky'][0]}"/>
      <stop offset="1" stop-color="{IC['sky'][1]}"/>
    </linearGradient>
    <linearGradient id="gold" x1="0" y1="0" x2="1" y2="1">
      <stop offset="0" stop-color="{IC_COL['frame_light']}"/>
      <stop offset="0.5" stop-color="{IC_COL['frame']}"/>
      <stop offset="1" stop-color="{IC_COL['frame_dark']}"/>
    </linearGradient>
    <clipPath id="lens"><circle cx="{cx}" cy="{cy}" r="{r}"/></clipPath>
  </defs>
  <rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" rx="{rad}" fill="url(#gold)"/>
  <rect x="{x0 + fw}" y="{y0 + fw}" width="{x1 - x0 - 2 * fw}" height="{y1 - y0 - 2 * fw}" fill="url(#sky)"
        stroke="{IC_COL['frame_dark']}" stroke-width="3"/>
  <circle cx="{sx}" cy="{sy}" r="{sr}" fill="{IC_COL['sun']}"/>
  <polygon points="{pts('hill_far')}" fill="{IC_COL['hill_far']}"/>
  <polygon points="{pts('hill_near')}" fill="{IC_COL['hill_near']}"/>
  <line x1="{hx0}" y1="{hy0}" x2="{hx1}" y2="{hy1}" stroke="{IC_COL['handle']}" stroke-width="{hw}"/>
  <circle cx="{hx1}" cy="{hy1}" r="{hw / 2:g}" fill="{IC_COL['handle']}"/>
  <circle cx="{cx}" cy="{cy}" r="{r}" fill="{IC_COL['glass']}" fill-opacity="0.35"/>
  <path d="M {cx - r * 0.62:.1f} {cy - r * 0.1:.1f} A {r * 0.63:.1f} {r * 0.63:.1f} 0 0 1 {cx - r * 0.1:.1f} {cy - r * 0.62:.1f}"
        fill="none" stroke="{IC_COL['shine']}" stroke-width="7" stroke-linecap="round" stroke-opacity="0.85"/>
  <circle cx="{cx}" cy="{cy}" r="{r}" fill="none" stroke="{IC_COL['ring']}" stroke-width="{IC['ring_w']}"/>
</svg>
"""


def _hex(c: str, a: int = 255) -> tuple[int, int, int, int]:
    c = c.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16), a


def icon_png(size: int) -> Image.Image:
    """Rasterise the same geometry with Pillow (8x supersampled); small sizes get bolder strokes."""
    S = 8
    k = size * S / 256.0
    bold = 1.0 if size >= 64 else (1.35 if size >= 32 else 1.7)
    N = size * S
    img = Image.new("RGBA", (N, N), (0, 0, 0, 0))
    x0, y0, x1, y1, rad = IC["frame"]
    fw = IC["frame_w"] * (1.0 if size >= 48 else 1.25)
    # frame: diagonal gold gradient inside a rounded rectangle
    yy, xx = np.mgrid[0:N, 0:N].astype(np.float32)
    t = np.clip(((xx / k - x0) + (yy / k - y0)) / ((x1 - x0) + (y1 - y0)), 0, 1)
    grad = stops(t, [(0, rgb(IC_COL["frame_light"])), (0.5, rgb(IC_COL["frame"])), (1, rgb(IC_COL["frame_dark"]))])
    gimg = Image.fromarray((grad * 255).astype(np.uint8), "RGB").convert("RGBA")
    mask = Image.new("L", (N, N), 0)
    ImageDraw.Draw(mask).rounded_rectangle([x0 * k, y0 * k, x1 * k, y1 * k], radius=rad * k, fill=255)
    img.paste(gimg, (0, 0), mask)
    # picture
    ix0, iy0, ix1, iy1 = (x0 + fw) * k, (y0 + fw) * k, (x1 - fw) * k, (y1 - fw) * k
    ts = np.clip((yy - iy0) / max(iy1 - iy0, 1), 0, 1)
    sky = stops(ts, [(0, rgb(IC["sky"][0])), (1, rgb(IC["sky"][1]))])
    simg = Image.fromarray((sky * 255).astype(np.uint8), "RGB").convert("RGBA")
    pm = Image.new("L", (N, N), 0)
    ImageDraw.Draw(pm).rectangle([ix0, iy0, ix1, iy1], fill=255)
    img.paste(simg, (0, 0), pm)
    pic = Image.new("RGBA", (N, N), (0, 0, 0, 0))
    dp = ImageDraw.Draw(pic)
    sx, sy, sr = IC["sun"]
    sr = sr * (1.0 if size >= 32 else 1.3)
    dp.ellipse([(sx - sr) * k, (sy - sr) * k, (sx + sr) * k, (sy + sr) * k], fill=_hex(IC_COL["sun"]))
    dp.polygon([(x * k, y * k) for x, y in IC["hill_far"]], fill=_hex(IC_COL["hill_far"]))
    dp.polygon([(x * k, y * k) for x, y in IC["hill_near"]], fill=_hex(IC_COL["hill_near"]))
    clip = Image.new("L", (N, N), 0)
    ImageDraw.Draw(clip).rectangle([ix0, iy0, ix1, iy1], fill=255)
    img.paste(pic, (0, 0), Image.fromarray(np.minimum(np.asarray(pic)[..., 3], np.asarray(clip))))
    d = ImageDraw.Draw(img)
    d.rectangle([ix0, iy0, ix1, iy1], outline=_hex(IC_COL["frame_dark"]), width=max(1, int(3 * k * bold)))
    # magnifier
    (hx0, hy0), (hx1, hy1), hw = IC["handle"]
    hw = hw * bold
    d.line([(hx0 * k, hy0 * k), (hx1 * k, hy1 * k)], fill=_hex(IC_COL["handle"]), width=int(hw * k))
    for x, y in ((hx1, hy1),):
        d.ellipse([(x - hw / 2) * k, (y - hw / 2) * k, (x + hw / 2) * k, (y + hw / 2) * k], fill=_hex(IC_COL["handle"]))
    cx, cy, r = IC["lens"]
    glass = Image.new("RGBA", (N, N), (0, 0, 0, 0))
    ImageDraw.Draw(glass).ellipse([(cx - r) * k, (cy - r) * k, (cx + r) * k, (cy + r) * k],
                                  fill=_hex(IC_COL["glass"], 90))
    if size >= 32:
        a0 = r * 0.63
        ImageDraw.Draw(glass).arc([(cx - a0) * k, (cy - a0) * k, (cx + a0) * k, (cy + a0) * k], 190, 260,
                                  fill=_hex(IC_COL["shine"], 220), width=int(7 * k * bold))
    img = Image.alpha_composite(img, glass)
    rw = IC["ring_w"] * bold
    ImageDraw.Draw(img).ellipse([(cx - r - rw / 2) * k, (cy - r - rw / 2) * k, (cx + r + rw / 2) * k,
                                 (cy + r + rw / 2) * k], outline=_hex(IC_COL["ring"]), width=int(rw * k))
    return img.resize((size, size), Image.LANCZOS)


def make_icons(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "museum-search.svg").write_text(icon_svg(), encoding="utf-8")
    for s in ICON_SIZES:
        icon_png(s).save(out / f"museum-search-{s}.png", optimize=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"random seed (default {DEFAULT_SEED})")
    ap.add_argument("--out", type=Path, default=REPO / "resources" / "sample", help="sample collection folder")
    ap.add_argument("--icons-out", type=Path, default=REPO / "resources" / "icons", help="icon folder")
    ap.add_argument("--no-sample", action="store_true", help="do not generate the sample collection")
    ap.add_argument("--no-icons", action="store_true", help="do not generate the icons")
    ap.add_argument("--flats", type=Path, default=None,
                    help="also write the unframed paintings here (for inspection; not part of resources)")
    args = ap.parse_args(argv)
    cv2.setRNGSeed(args.seed)
    if not args.no_sample:
        print(f"sample collection -> {args.out} (seed {args.seed})")
        make_sample(args.out, args.seed, flats=args.flats)
    if not args.no_icons:
        print(f"icons -> {args.icons_out}")
        make_icons(args.icons_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
