"""Geometric verification: the papers' SIFT baseline, the query pipeline's verification step.

For each query, the ``top_n`` references with the best global scores are verified geometrically
(:class:`Verifier`; the query pipeline, :mod:`museum_search.core.answer._pipeline`, runs it):

1. local features (SIFT, or ORB where this OpenCV has no SIFT; or the learned XFeat,
   ``feature="xfeat"``, run through ONNX Runtime: :mod:`museum_search.core.verification._xfeat`) of both images, each resized so
   that its longest side is at most ``max_side`` px, at most ``max_keypoints`` keypoints;
2. nearest-neighbour matches (L2 for SIFT, found with one matrix product per block of
   references, in 8-bit integers where ONNX Runtime runs, exactly the float32 product's matches, at
   about a quarter of its cost: :func:`_match_sift_int8`; Hamming for ORB) that pass Lowe's ratio
   test (``ratio``), one match per reference keypoint (the closest); for XFeat, mutual nearest
   neighbours by cosine (:func:`museum_search.core.verification._xfeat.match_mnn`);
3. a homography fitted from the reference to the query by ``cv2.findHomography`` with OpenCV's
   USAC RANSAC (default ``estimator="usac"``; ``"ransac"`` is classic ``cv2.RANSAC``, which gives
   the same inlier counts here but runs all its 2000 iterations on hopeless pairs, about twice
   slower per query; ``"magsac"`` is also available),
   reprojection threshold ``ransac_threshold`` px, at least 4 matches; its inliers are counted.
   A degenerate homography counts as 0 inliers: mirroring (determinant ≤ 0), a scale change
   beyond ``max_scale``, or the reference's outline (the painting, seen from in front) mapped
   through infinity or onto a non-convex quadrilateral in the query; and so does one whose inliers
   cover less than ``min_coverage`` of the reference (a detail such as a wall label).

The new score of a verified reference with at least ``gate`` inliers (the verdict's threshold;
fewer are noise and change nothing) is (:func:`blend`)::

    new = global + weight · min(inliers, inlier_cap) / inlier_cap

so it is monotone in both the global score and the inlier count; with the defaults
(``weight=1``, ``inlier_cap=50`` for SIFT) every inlier is worth 0.02 of cosine similarity, and 50 or more
inliers add 1.0, which outweighs any difference of global scores within a top-N (a true match of
a painting typically has 50–500 inliers, a wrong reference 0–6). XFeat finds more of both (a true
match 100–400, a wrong one up to 25 on paintings and 75 on small 3D objects), so its cap is
:data:`INLIER_CAP` ``["xfeat"]``. References outside the top-N
keep their scores. The bonus is never negative, so a reference never falls behind one it was ahead
of before verification.

Note that RANSAC always "explains" 4 matches with a homography, so a handful of inliers (about
4–8) is noise; only counts well above that mean a match.

Reference features are computed when the index is built and stored with it (:class:`LocalFeatures`).
For an index without them (or with other feature settings) they are cached per index: in memory,
shared by every verifier of the process
(least recently used first out, at most ``memory_cache`` references per index;
:func:`clear_memory_cache` empties it) and, when the index has a folder (``index.path``), on disk in
``<index>/spatial-<feature>-<max_side>-<max_keypoints>/<sha1 of the relative path>.npz``
(``np.savez``, read back with ``allow_pickle=False``). Every entry records the reference's
relative path, file size and modification time (ns), the feature settings and the OpenCV version;
an entry that does not match the file as it is now is recomputed and overwritten, never used. Disk
writes are atomic (temporary file, then ``os.replace``). A reference image that cannot be read
counts as 0 inliers (and is logged); verification never fails because of one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import threading
import time
import weakref
import zipfile
from collections import OrderedDict
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from museum_search.core.errors import ImageError, MuseumSearchError, reraise_interrupt
from museum_search.core.images import load_image
from museum_search.core.index import Features, LocalFeatures
from museum_search.core.progress import DecodePool, Progress
from museum_search.core.verification import _xfeat as xfeat
from museum_search.core.verification._blocks import gemm_groups

log = logging.getLogger(__name__)

HAS_SIFT = hasattr(cv2, "SIFT_create")
FEATURES = ("sift", "orb", "xfeat")
#: What ``index --matcher`` chooses from: a feature, or ``auto`` (both calibrated, the better kept:
#: ``index._auto_matcher``).
MATCHERS = ("sift", "xfeat", "auto")
#: Inliers at which the verification bonus is full, per feature (XFeat finds 2-5 times more matches).
INLIER_CAP = {"sift": 50, "orb": 50, "xfeat": 150}
#: The longest side (px) at which new indexes compute a query photo's SIFT features
#: (``SpatialParams.query_side``, stored in the index's ``local_features`` settings and so used by its
#: calibration too): SIFT's cost is in its pixels, and OpenCV's SIFT works on the photo doubled in
#: size. Measured on the paintings (bench/bench_verify_speed.py, bench/bench_verdict.py), each index
#: calibrated at its side: 320 px keeps MP@1, the calibrated verdict's figures and the exact copies
#: of 640 px, at 302 keypoints per photo against 710 and half the query's time.
#: Indexes without the setting (built before it) keep ``max_side``, which their verdict was calibrated with.
QUERY_SIDE = {"sift": 320}
_ESTIMATORS = {"ransac": "RANSAC", "usac": "USAC_DEFAULT", "magsac": "USAC_MAGSAC"}  # cv2 names
MIN_MATCHES = 4  # a homography needs 4 point pairs
CACHE_FORMAT = 1

# (N, 2) float32 keypoint positions, (N, D) descriptors: uint8 for SIFT and ORB, float16 for XFeat


@dataclass
class SpatialParams:
    """Settings of spatial verification; see the module docstring for the score formula."""

    top_n: int = 20  # references verified per query (the best by global score)
    weight: float = 1.0  # w in: new = global + w · min(inliers, cap) / cap
    inlier_cap: int | None = None  # inliers beyond this add nothing more (None: the feature's INLIER_CAP)
    max_side: int = 640  # images are resized so that their longest side is at most this (px)
    ratio: float = 0.8  # Lowe's ratio test: best distance < ratio · second best
    feature: str = "sift"  # "sift", "orb" ("sift" falls back to "orb" without cv2.SIFT_create) or "xfeat"
    max_keypoints: int = 1000  # keypoints kept per image (the strongest)
    ransac_threshold: float = 5.0  # RANSAC reprojection threshold, px (in the resized images)
    estimator: str = "usac"  # cv2.findHomography method: "usac" (cv2.USAC_DEFAULT), "ransac", "magsac"
    max_scale: float = 10.0  # reject homographies that scale lengths by more than this (or 1/this)
    min_coverage: float = 0.03  # the inliers must spread over this share of the reference image
    memory_cache: int = 2000  # reference feature sets kept in memory per index
    #: longest side (px) at which a *query* photo's features are computed (None: ``max_side``); their
    #: positions are given in the ``max_side`` frame all the same (:func:`query_features`)
    query_side: int | None = None

    def __post_init__(self) -> None:
        self.feature = self.feature.lower()
        if self.feature not in FEATURES:
            raise MuseumSearchError(f"unknown local feature {self.feature!r}; choose one of {', '.join(FEATURES)}")
        if self.inlier_cap is None:
            self.inlier_cap = INLIER_CAP[self.feature]
        if self.top_n < 0 or self.inlier_cap < 1 or self.max_side < 16 or self.max_keypoints < MIN_MATCHES \
                or (self.query_side is not None and self.query_side < 16):
            raise MuseumSearchError(
                "spatial verification needs top_n ≥ 0, inlier_cap ≥ 1, max_side ≥ 16, query_side ≥ 16 and "
                "max_keypoints ≥ 4"
            )
        self.estimator = self.estimator.lower()
        if self.estimator not in _ESTIMATORS:
            raise MuseumSearchError(
                f"unknown homography estimator {self.estimator!r}; choose one of {', '.join(_ESTIMATORS)}")
        if not 0.0 < self.ratio <= 1.0:
            raise MuseumSearchError(f"the ratio test threshold must be in (0, 1], not {self.ratio}")

    @property
    def photo_side(self) -> int:
        """The longest side (px) a query photo's features are computed at (:func:`query_features`):
        ``query_side``, at most ``max_side``; XFeat's always at ``max_side``."""
        if self.effective_feature == "xfeat":
            return self.max_side
        return min(self.query_side or self.max_side, self.max_side)

    @property
    def effective_feature(self) -> str:
        """The feature actually used: ORB when SIFT is asked for but this OpenCV lacks it."""
        if self.feature == "xfeat":
            return "xfeat"
        return "sift" if self.feature == "sift" and HAS_SIFT else "orb"


# ---- local features and verification ------------------------------------------------------


_detectors = threading.local()


def _detector(feature: str, max_keypoints: int):
    """One detector per thread and setting (OpenCV detectors are not safe to share across threads)."""
    key = (feature, max_keypoints)
    cache = getattr(_detectors, "cache", None)
    if cache is None:
        cache = _detectors.cache = {}
    det = cache.get(key)
    if det is None:
        if feature == "sift":
            det = cv2.SIFT.create(nfeatures=max_keypoints)
        else:
            det = cv2.ORB.create(nfeatures=max_keypoints)
        cache[key] = det
    return det


def _to_gray(image: np.ndarray, max_side: int) -> np.ndarray:
    img = np.asarray(image)
    if img.dtype != np.uint8:
        img = np.clip(img, 0, 255).astype(np.uint8)
    if img.ndim == 3:
        if img.shape[2] == 1:
            img = img[:, :, 0]
        elif img.shape[2] == 4:
            img = cv2.cvtColor(img, cv2.COLOR_RGBA2GRAY)
        else:
            img = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
    if img.ndim != 2 or img.size == 0:
        raise ValueError(f"not an image: array of shape {np.shape(image)}")
    h, w = img.shape
    s = max_side / max(h, w)
    if s < 1.0:
        img = cv2.resize(img, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(img)


def extract_features(image: np.ndarray, params: SpatialParams | None = None) -> Features:
    """Keypoint positions (N, 2) float32 and descriptors (N, D) uint8 of an RGB (or gray) image.

    Positions are in the frame of the image resized to ``params.max_side``. SIFT descriptors are
    integer-valued in OpenCV, so storing them as uint8 is lossless (and 4× smaller).
    """
    params = params or SpatialParams()
    feature = params.effective_feature
    if feature == "xfeat":
        return xfeat.extract(image, params.max_side, params.max_keypoints)
    gray = _to_gray(image, params.max_side)
    kps, desc = _detector(feature, params.max_keypoints).detectAndCompute(gray, None)
    dim = descriptor_layout(params)[0]
    if desc is None or not kps:
        return np.empty((0, 2), np.float32), np.empty((0, dim), np.uint8)
    pts = np.asarray(cv2.KeyPoint.convert(kps), np.float32).reshape(-1, 2)
    if desc.dtype != np.uint8:
        desc = np.clip(np.rint(desc), 0, 255).astype(np.uint8)
    return pts, np.ascontiguousarray(desc)


def query_features(image: np.ndarray, params: SpatialParams | None = None) -> Features:
    """The features of a query photo: :func:`extract_features` at ``params.query_side`` px (a
    smaller image: SIFT's cost is in its pixels), the positions carried into the frame of the photo
    resized to ``params.max_side``, where the homography's threshold and the viewers measure them."""
    params = params or SpatialParams()
    side = params.photo_side
    h, w = np.shape(image)[:2]
    frame = _resized_size(image, params.max_side)
    if side >= params.max_side or max(h, w) <= side:
        return extract_features(image, params)
    pts, desc = extract_features(image, replace(params, max_side=side))
    small = _resized_size(image, side)
    scale = np.array([frame[0] / small[0], frame[1] / small[1]], np.float32)
    return ((pts + 0.5) * scale - 0.5).astype(np.float32), desc


def normalised_light(image: np.ndarray) -> np.ndarray:
    """``image`` (RGB uint8) with its luminance equalised locally (CLAHE on the L channel of Lab,
    clip limit 2, tiles of 1/8 of each side): a dim or low-contrast photo's details reach SIFT's
    contrast threshold (on the protocol's phone-like paintings at 640 px, 98.7 % of the right
    references reach 8 inliers against 93.3 % without; ``bench/bench_visitors.py``)."""
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        return img
    lab = cv2.cvtColor(img, cv2.COLOR_RGB2LAB)
    lab[..., 0] = cv2.createCLAHE(clipLimit=2.0, tileGridSize=(8, 8)).apply(np.ascontiguousarray(lab[..., 0]))
    return cv2.cvtColor(lab, cv2.COLOR_LAB2RGB)


def closer_features(image: np.ndarray, params: SpatialParams) -> Features:
    """The photo's features for a second, closer look (:class:`museum_search.core.verification.Verification`):
    its light normalised (:func:`normalised_light`) and at the stored features' side (``max_side``),
    not the first pass's smaller ``query_side``."""
    return query_features(normalised_light(image), replace(params, query_side=None))


def part_features(image: np.ndarray, box: tuple[int, int, int, int], params: SpatialParams) -> Features:
    """The features of the part ``box`` (x0, y0, x1, y1 px) of the photo ``image`` for a closer look
    at it alone (:func:`closer_features` of the part: its own keypoints, not those the rest of the
    photo outshines), their positions carried into the photo's frame (``image`` resized to
    ``params.max_side``), where they are matched and drawn as the photo's own."""
    x0, y0, x1, y1 = (int(v) for v in box)
    part = np.ascontiguousarray(np.asarray(image)[y0:y1, x0:x1])
    pts, desc = closer_features(part, params)
    h, w = np.shape(image)[:2]
    fw, fh = _resized_size(image, params.max_side)
    pw, ph = _resized_size(part, params.max_side)
    px = (pts + 0.5) * np.array([part.shape[1] / pw, part.shape[0] / ph], np.float32) + np.array([x0, y0], np.float32)
    return (px * np.array([fw / w, fh / h], np.float32) - 0.5).astype(np.float32), desc


_EMPTY = (np.empty((0, 2), np.float32), np.empty((0, 2), np.float32))
#: similarity-matrix entries per block when matching many references: 2 MB of int32, about one
#: reference against the photo, which stays in cache while its keys are made (matching the paintings'
#: shortlists: 18.8 ms against 21.5 ms per query with blocks of 4M entries, the same matches)
_GEMM_BLOCK = 500_000


def _ratio_pairs(ia: np.ndarray, ib: np.ndarray, d1: np.ndarray, d2: np.ndarray, ratio: float,
                 pa: np.ndarray, pb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the matches that pass the ratio test, keeping the closest one per keypoint of b."""
    keep = d1 < ratio * d2
    ia, ib, d1 = ia[keep], ib[keep], d1[keep]
    if len(ia) == 0:
        return _EMPTY
    order = np.lexsort((ia, d1))  # by distance, ties by query keypoint: deterministic
    _, first = np.unique(ib[order], return_index=True)
    sel = order[first]
    return pa[ia[sel]], pb[ib[sel]]


# ---- SIFT matching in 8-bit integers -------------------------------------------------------------
#
# SIFT descriptors are bytes, so a's nearest neighbours in b can be found with an 8-bit integer matrix
# product (ONNX Runtime's MatMulInteger, VNNI/AMX where the CPU has them: about 4 times the float32
# product's speed), exactly: every distance is an integer, the same the float32 product gives (its
# values are integers below 2**24, so exact too). For each reference keypoint i and photo keypoint j
# the product gives y = b_i·(a_j − 128) (the photo's bytes shifted into int8), so
#
#     |b_i|² − 2 a_j·b_i = c_i − 2 y,    c_i = |b_i|² − 256 Σ b_i
#
# and the key (|b_i|² − 2 a_j·b_i)·2**s + (i's place in its reference), s bits for the place, orders a
# photo keypoint's distances to one reference with the place as the tie-breaker: its smallest is
# the nearest neighbour and its distance, the smallest after that the second distance. All in int32,
# checked to fit; else (or without ONNX Runtime) the float32 product is used.

_INT8: dict[str, Any] = {}  # "session": the ONNX Runtime session, or None when it cannot be made


def _int8_session():
    """The ONNX Runtime session computing ``y`` ((N, M) int32) from the references' bytes (N, 128)
    and the photo's shifted bytes (128, M) int8; None when ONNX Runtime cannot run it here."""
    with _LOCK:
        if "session" in _INT8:
            return _INT8["session"]
        try:
            import onnxruntime as ort
            from onnx import TensorProto as T
            from onnx import helper

            nodes = [helper.make_node("MatMulInteger", ["b", "a", "zb", "za"], ["y"])]
            inputs = [helper.make_tensor_value_info("b", T.UINT8, ["n", 128]),
                      helper.make_tensor_value_info("a", T.INT8, [128, "m"])]
            zero = [helper.make_tensor("zb", T.UINT8, [], [0]), helper.make_tensor("za", T.INT8, [], [0])]
            graph = helper.make_graph(nodes, "sift-products", inputs,
                                      [helper.make_tensor_value_info("y", T.INT32, ["n", "m"])], initializer=zero)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
            model.ir_version = 8
            so = ort.SessionOptions()
            so.intra_op_num_threads = max(1, os.cpu_count() or 1)
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting between runs
            session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # any failure here only means matching with the float32 product
            reraise_interrupt(exc)  # (a Ctrl-C while ONNX Runtime loads is not one)
            log.info("8-bit SIFT matching unavailable (%s); matching with the float32 product", exc)
            session = None
        _INT8["session"] = session
        return session


#: (squared norms, sums) int32 of a reference's byte descriptors, when known beforehand (stored
#: features: :meth:`museum_search.core.index.LocalFeatures.byte_terms`); None: computed here
Terms = tuple[np.ndarray, np.ndarray] | None


def _byte_terms(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bf = b.astype(np.float32)  # sums of at most 128 squares of bytes: exact in float32 (< 2**24)
    return np.einsum("ij,ij->i", bf, bf), bf.sum(axis=1)


def _int8_keys(bb: np.ndarray, bsum: np.ndarray, place: np.ndarray, bits: int, a_norm: int) -> np.ndarray | None:
    """``c·2**s + place`` ((N, 1) int32) of a block of reference descriptors b (N, 128) uint8 of
    squared norms ``bb`` and sums ``bsum``, ``place`` the place of each in its reference (see
    above; ``a_norm``: a bound of the photo's descriptors' norms), or None when the keys might not
    fit in int32."""
    bb, bsum = bb.astype(np.int64), bsum.astype(np.int64)
    c = bb - 256 * bsum
    big = 1 << 31
    # every intermediate and the keys stay within int32: |y| ≤ 128 Σ b_i, and the distance term
    # |b|² − 2a·b lies within [−2|a||b|, |b|²]
    b_norm = int(np.sqrt(bb.max())) + 1
    if ((128 * int(bsum.max())) << (bits + 1)) >= big or ((int(np.abs(c).max()) + 1) << bits) >= big \
            or ((b_norm * b_norm + 2 * b_norm * a_norm + 1) << bits) >= big:
        return None
    return ((c << bits) + place).astype(np.int32)[:, None]


#: the photo's keypoints are padded to a multiple of this in the 8-bit product (ONNX Runtime's
#: kernel is faster on whole panels: about 4.0 against 2.9 ms for 591 and 592 keypoints)
_PANEL = 16


def _match_sift_int8(fa: Features, refs: Sequence[Features], ratio: float, terms: Sequence[Terms] | None = None
                     ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """:func:`_match_sift` with the 8-bit product (the same matches); None when it cannot be used.
    ``terms``: each reference's :data:`Terms`, when known."""
    session = _int8_session()
    pa, da = fa
    if session is None or da.dtype != np.uint8 or da.shape[1] != 128:
        return None
    todo = [j for j, (pb, _) in enumerate(refs) if len(pb) >= 2]
    if any(refs[j][1].dtype != np.uint8 for j in todo):
        return None
    longest = max((len(refs[j][0]) for j in todo), default=2)
    bits = max(1, int(longest - 1).bit_length())
    m = len(pa)
    a_shifted = np.zeros((128, -(-m // _PANEL) * _PANEL), np.int8)  # padding columns: ignored
    a_shifted[:, :m] = (da.astype(np.int16) - 128).astype(np.int8).T
    a_norm = int(np.sqrt(np.einsum("ij,ij->i", da, da, dtype=np.int64).max())) + 1
    aa = np.einsum("ij,ij->i", da.astype(np.float32), da.astype(np.float32))
    blocks = []  # every block checked before any product: None means nothing was done
    for group in gemm_groups([len(pb) for pb, _ in refs], todo, max(1, _GEMM_BLOCK // a_shifted.shape[1])):
        b = np.concatenate([refs[j][1] for j in group])
        known = [None if terms is None else terms[j] for j in group]
        bb, bsum = (np.concatenate(t) for t in zip(*known)) if all(t is not None for t in known) else _byte_terms(b)
        ck = _int8_keys(bb, bsum, np.concatenate([np.arange(len(refs[j][0])) for j in group]), bits, a_norm)
        if ck is None:
            return None
        blocks.append((group, b, ck))
    cols = np.arange(m)
    low = (1 << bits) - 1
    scale = np.int32(-(1 << (bits + 1)))

    out: list[tuple[np.ndarray, np.ndarray]] = [_EMPTY] * len(refs)

    def finish(block: tuple[list[int], np.ndarray, np.ndarray]) -> None:
        group, b, ck = block
        # the padding columns too: contiguous rows make these passes twice as fast as a [:, :m] view
        y = session.run(None, {"b": b, "a": a_shifted})[0]
        start = 0
        for j in group:
            pb = refs[j][0]
            seg = y[start:start + len(pb)]  # one reference's rows, in cache: made its keys in place
            seg *= scale
            seg += ck[start:start + len(pb)]
            start += len(pb)
            first = seg.min(axis=0)[:m]
            ib = (first & low).astype(np.int64)
            seg[ib, cols] = np.iinfo(np.int32).max
            second = seg.min(axis=0)[:m]
            d1 = np.sqrt(np.maximum((first >> bits).astype(np.float32) + aa, 0.0))
            d2 = np.sqrt(np.maximum((second >> bits).astype(np.float32) + aa, 0.0))
            out[j] = _ratio_pairs(cols, ib, d1, d2, ratio, pa, pb)

    pool = _match_pool() if len(blocks) > 1 else None
    if pool is None:
        for block in blocks:
            finish(block)
    else:  # each block writes its own references' matches: the same result in any order
        list(pool.map(finish, blocks))  # raises what a block raised
    return out


_POOL: dict[str, Any] = {}


def _match_pool():
    """The threads the blocks of a shortlist's 8-bit matching are shared among (None on one core).

    After its product (1.8 ms for a paintings shortlist of 20), a block's keys, minima and ratio
    test are NumPy passes over its (references' keypoints × photo's keypoints) int32 products
    (9.7 ms), which release the GIL: the photo query's verification runs them on every core."""
    workers = min(4, os.cpu_count() or 1)
    if workers < 2:
        return None
    with _LOCK:
        pool = _POOL.get("pool")
        if pool is None:
            from concurrent.futures import ThreadPoolExecutor

            pool = _POOL["pool"] = ThreadPoolExecutor(workers, thread_name_prefix="sift-matching")
        return pool


def _match_sift(fa: Features, refs: Sequence[Features], ratio: float, terms: Sequence[Terms] | None = None
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Ratio-test matches of a against each of ``refs``: one matrix product per block of references,
    in 8-bit integers when ONNX Runtime can (:func:`_match_sift_int8`), else in float32 (BLAS).

    Squared L2 distances are |a|² + |b|² − 2a·b; OpenCV's brute-force matcher gives the same
    nearest neighbours but is several times slower than the matrix product.
    """
    pa, da = fa
    out: list[tuple[np.ndarray, np.ndarray]] = [_EMPTY] * len(refs)
    if len(pa) < MIN_MATCHES:
        return out
    fast = _match_sift_int8(fa, refs, ratio, terms)
    if fast is not None:
        return fast
    return _match_sift_float(fa, refs, ratio)


def _match_sift_float(fa: Features, refs: Sequence[Features], ratio: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`_match_sift` with the float32 product (NumPy's BLAS)."""
    pa, da = fa
    out: list[tuple[np.ndarray, np.ndarray]] = [_EMPTY] * len(refs)
    a = da.astype(np.float32)
    aa = np.einsum("ij,ij->i", a, a)
    # [−2a, 1] · [b, |b|²]ᵀ = |b|² − 2a·b in a single product (|a|² is added to the minima only)
    a_aug = np.hstack([-2.0 * a, np.ones((len(a), 1), np.float32)])
    todo = [j for j, (pb, _) in enumerate(refs) if len(pb) >= 2]
    rows = np.arange(len(a))
    block_cols = max(1, _GEMM_BLOCK // len(a))
    for group in gemm_groups([len(pb) for pb, _ in refs], todo, block_cols):
        b = np.concatenate([refs[j][1] for j in group]).astype(np.float32)
        b_aug = np.hstack([b, np.einsum("ij,ij->i", b, b)[:, None]])
        sim = a_aug @ b_aug.T
        start = 0
        for j in group:
            pb = refs[j][0]
            seg = sim[:, start:start + len(pb)]
            start += len(pb)
            ib = np.argmin(seg, axis=1)
            d1 = seg[rows, ib].copy()
            seg[rows, ib] = np.inf
            d2 = seg.min(axis=1)
            d1 = np.sqrt(np.maximum(d1 + aa, 0.0))
            d2 = np.sqrt(np.maximum(d2 + aa, 0.0))
            out[j] = _ratio_pairs(rows, ib, d1, d2, ratio, pa, pb)
    return out


def _match_orb(fa: Features, fb: Features, ratio: float) -> tuple[np.ndarray, np.ndarray]:
    (pa, da), (pb, db) = fa, fb
    if len(pa) < MIN_MATCHES or len(pb) < 2:
        return _EMPTY
    knn = [p for p in cv2.BFMatcher(cv2.NORM_HAMMING).knnMatch(da, db, k=2) if len(p) == 2]
    if not knn:
        return _EMPTY
    ia = np.array([m.queryIdx for m, _ in knn], np.int64)
    ib = np.array([m.trainIdx for m, _ in knn], np.int64)
    d1 = np.array([m.distance for m, _ in knn], np.float32)
    d2 = np.array([n.distance for _, n in knn], np.float32)
    return _ratio_pairs(ia, ib, d1, d2, ratio, pa, pb)


def match_features(fa: Features, refs: Sequence[Features], params: SpatialParams,
                   terms: Sequence[Terms] | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each of ``refs``: (positions in a, positions in the reference) of the putative matches
    (``terms``: each reference's :data:`Terms` for SIFT, when known).

    A match is a's nearest neighbour in the reference that passes Lowe's ratio test; when several
    keypoints of a pick the same reference keypoint, only the closest is kept.
    """
    if params.effective_feature == "sift":
        return _match_sift(fa, refs, params.ratio, terms)
    if params.effective_feature == "xfeat":
        return xfeat.match_mnn(fa, refs)
    return [_match_orb(fa, fb, params.ratio) for fb in refs]


def homography_is_plausible(H: np.ndarray, width: float, height: float, max_scale: float = 10.0) -> bool:
    """False for a degenerate homography of an image of size ``width``×``height`` (source frame).

    Rejects mirroring (determinant of the linear part ≤ 0), a scale change beyond ``max_scale`` (or
    below ``1/max_scale``), and maps that send a corner of the source image through infinity or
    fold its outline into a non-convex quadrilateral.
    """
    if H is None or H.shape != (3, 3) or not np.all(np.isfinite(H)) or abs(H[2, 2]) < 1e-12:
        return False
    H = H / H[2, 2]
    det = float(np.linalg.det(H[:2, :2]))
    if not (det > 0 and 1.0 / max_scale**2 <= det <= max_scale**2):
        return False
    corners = np.array([[0, 0, 1], [width, 0, 1], [width, height, 1], [0, height, 1]], np.float64)
    proj = corners @ H.T
    if np.any(proj[:, 2] <= 1e-9):
        return False
    q = proj[:, :2] / proj[:, 2:3]
    edges = np.roll(q, -1, axis=0) - q
    cross = edges[:, 0] * np.roll(edges, -1, axis=0)[:, 1] - edges[:, 1] * np.roll(edges, -1, axis=0)[:, 0]
    return bool(np.all(cross > 0) or np.all(cross < 0))


def _homography(src: np.ndarray, dst: np.ndarray, params: SpatialParams, size_b: tuple[float, float]
                ) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """(inliers, H from b to a, inlier mask) of the robust homography; (0, None, None) if degenerate.

    The homography is fitted from the reference (b) to the query (a) so that the degeneracy test can
    map b's outline (the painting, which must be seen from in front) into the query."""
    if len(src) < MIN_MATCHES:
        return 0, None, None
    method = getattr(cv2, _ESTIMATORS[params.estimator])
    try:
        H, mask = cv2.findHomography(dst.reshape(-1, 1, 2), src.reshape(-1, 1, 2), method,
                                     params.ransac_threshold, maxIters=2000, confidence=0.995)
    except cv2.error as exc:  # a degenerate point set can make some estimators fail
        log.debug("homography estimation failed: %s", exc)
        return 0, None, None
    if H is None or mask is None:
        return 0, None, None
    if not homography_is_plausible(H, size_b[0], size_b[1], params.max_scale):
        return 0, None, None
    mask = mask.ravel().astype(bool)
    if coverage(dst[mask], size_b) < params.min_coverage:
        return 0, None, None  # a small detail (a wall label, a frame corner), not the object
    return int(np.count_nonzero(mask)), H, mask


def coverage(points: np.ndarray, size: tuple[float, float]) -> float:
    """Share of an image of ``size`` (width, height) covered by the convex hull of ``points``.

    Verification requires the inliers to spread over a part of the reference: a match confined to a
    small detail that many references share (the museum label beside every painting, a frame
    corner) says nothing about the object."""
    if len(points) < 3:
        return 0.0
    hull = cv2.convexHull(np.asarray(points, np.float32).reshape(-1, 1, 2))
    return float(cv2.contourArea(hull)) / max(1.0, float(size[0]) * float(size[1]))


def outline_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two convex quadrilaterals ((4, 2) outlines), 0 when disjoint."""
    a = np.asarray(a, np.float32).reshape(-1, 2)
    b = np.asarray(b, np.float32).reshape(-1, 2)
    try:
        inter, _ = cv2.intersectConvexConvex(cv2.convexHull(a), cv2.convexHull(b))
    except cv2.error:
        return 0.0
    union = cv2.contourArea(cv2.convexHull(a)) + cv2.contourArea(cv2.convexHull(b)) - inter
    return float(inter / union) if union > 0 else 0.0


@dataclass
class Matches:
    """Why a reference matched a query: what a viewer draws (as VISE does).

    Coordinates are in the frames of the two images resized to ``max_side`` (``query_size`` and
    ``reference_size`` give those frames, (width, height)); scale them to the displayed images.
    """

    inliers: int
    query_points: np.ndarray  # (n, 2) inlier keypoints in the query
    reference_points: np.ndarray  # (n, 2) the matching keypoints in the reference
    outline: np.ndarray | None  # (4, 2) the reference's corners projected into the query, or None
    query_size: tuple[float, float]
    reference_size: tuple[float, float]


#: what verification found for one reference: (its matches in the photo, in the reference, the
#: homography from the reference to the photo, its inlier mask), as :func:`matches_of` finds them
Found = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def matches_of(fa: Features, fb: Features, params: SpatialParams, size_a: tuple[float, float],
                size_b: tuple[float, float], found: Found | None = None) -> Matches:
    """The inlier matches and the projected outline of reference b in query a (``found``: what
    :func:`verify_many` found for them, when it verified them: not found again)."""
    if found is None:
        src, dst = match_features(fa, [fb], params)[0]
        _, H, mask = _homography(src, dst, params, size_b)
    else:
        src, dst, H, mask = found
    n = 0 if mask is None else int(np.count_nonzero(mask))
    if H is None or mask is None:
        empty = np.empty((0, 2), np.float32)
        return Matches(0, empty, empty, None, size_a, size_b)
    w, h = size_b
    corners = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32).reshape(-1, 1, 2)
    outline = cv2.perspectiveTransform(corners, H).reshape(-1, 2)
    return Matches(n, src[mask].astype(np.float32), dst[mask].astype(np.float32), outline, size_a, size_b)


def _extent(pts: np.ndarray) -> tuple[float, float]:
    return (float(pts[:, 0].max()) + 1.0, float(pts[:, 1].max()) + 1.0) if len(pts) else (1.0, 1.0)


def verify_features(fa: Features, fb: Features, params: SpatialParams | None = None,
                    size_b: tuple[float, float] | None = None) -> int:
    """Inliers of the RANSAC homography between a's keypoints (query) and b's (reference).

    ``size_b`` (width, height of image b in the resized frame) is used by the degeneracy check; by
    default it is the extent of b's keypoints.
    """
    return verify_many(fa, [fb], params, None if size_b is None else [size_b])[0]


def verify_many(fa: Features, refs: Sequence[Features], params: SpatialParams | None = None,
                sizes: Sequence[tuple[float, float]] | None = None, keep: list[Found] | None = None,
                terms: Sequence[Terms] | None = None) -> list[int]:
    """:func:`verify_features` of query a against each of ``refs`` (matching is batched); ``keep``:
    a list to which what was found for each reference is appended (:func:`matches_of` uses it);
    ``terms``: :func:`match_features`'."""
    params = params or SpatialParams()
    if sizes is None:
        sizes = [_extent(fb[0]) for fb in refs]
    out = []
    for (src, dst), size in zip(match_features(fa, refs, params, terms), sizes):
        n, H, mask = _homography(src, dst, params, size)
        out.append(n)
        if keep is not None:
            keep.append((src, dst, H, mask))
    return out


def _resized_size(image: np.ndarray, max_side: int) -> tuple[float, float]:
    h, w = np.shape(image)[:2]
    s = min(1.0, max_side / max(h, w))
    return (max(1, round(w * s)), max(1, round(h * s)))


def verify_pair(img_a: np.ndarray, img_b: np.ndarray, params: SpatialParams | None = None) -> int:
    """Number of RANSAC homography inliers between two RGB images (0 if not verifiable).

    ``img_a`` plays the query, ``img_b`` the reference (whose outline must map to a convex
    quadrilateral in ``img_a``).
    """
    params = params or SpatialParams()
    fa = extract_features(img_a, params)
    fb = extract_features(img_b, params)
    return verify_features(fa, fb, params, _resized_size(img_b, params.max_side))


def blend(global_scores: np.ndarray, inliers: np.ndarray, params: SpatialParams, gate: int = 0) -> np.ndarray:
    """``global + weight · min(inliers, cap) / cap`` (element-wise) where ``inliers ≥ gate``; the
    global score unchanged elsewhere (fewer inliers than the verdict's threshold are noise)."""
    inl = np.asarray(inliers, np.float64)
    cap = params.inlier_cap
    assert cap is not None  # set by SpatialParams.__post_init__
    bonus = np.where(inl >= gate, np.minimum(inl, cap) / cap, 0.0)
    return (np.asarray(global_scores, np.float64) + params.weight * bonus).astype(np.float32)


# ---- image loading --------------------------------------------------------------------------


def _load_rgb(path: str | os.PathLike, max_side: int) -> np.ndarray:
    """The image at ``path`` as RGB uint8, at most ``max_side`` px; raises :class:`ImageError`."""
    return load_image(path, max_side=max_side)


# ---- the verifier ---------------------------------------------------------------------------

# In-memory reference features, shared by every verifier of the process (a pipeline is often
# rebuilt for each search): index → {feature settings → {row: (cache key, features, resized
# (width, height))}}, least recently used first; features None: that version of the file is
# unreadable. An index that is garbage-collected takes its entries with it.
_MEMORY: weakref.WeakKeyDictionary[Any, dict[tuple, OrderedDict[int, tuple[dict, Any, Any]]]] = (
    weakref.WeakKeyDictionary()
)
_WARNED: set[tuple] = set()  # unreadable file versions already logged
_DISK_FAILED: set[str] = set()  # cache folders that could not be written (not retried)
_LOCK = threading.Lock()


def clear_memory_cache() -> None:
    """Forget every reference's features kept in memory (the disk caches stay)."""
    with _LOCK:
        _MEMORY.clear()
        _WARNED.clear()


class Verifier:
    """Verifies a query photo against references of an index (see the module doc)."""

    name = "verification"

    def __init__(self, params: SpatialParams | None = None):
        self.params = params or SpatialParams()
        self.stats = {"computed": 0, "disk_hits": 0, "memory_hits": 0, "unreadable": 0}
        self._found: tuple[Features, Any, dict[int, Found]] | None = None  # of the last verify_rows

    def summary(self) -> str:
        p = self.params
        return (f"verification ({p.effective_feature.upper()}, top {p.top_n}, "
                f"+{p.weight:g}·min(inliers,{p.inlier_cap})/{p.inlier_cap})")

    # ---- reference features (cached) ---------------------------------------------------------
    def _settings(self) -> tuple:
        p = self.params
        return (p.effective_feature, p.max_side, p.max_keypoints)

    def _memory(self, index) -> OrderedDict:
        """This index's in-memory cache for these feature settings (call with ``_LOCK`` held)."""
        return _MEMORY.setdefault(index, {}).setdefault(self._settings(), OrderedDict())

    def _cache_dir(self, index) -> Path | None:
        if getattr(index, "path", None) is None:
            return None
        p = self.params
        return Path(index.path) / f"spatial-{p.effective_feature}-{p.max_side}-{p.max_keypoints}"

    def _key(self, index, row: int) -> dict[str, Any] | None:
        """What a cached entry must match: the file as it is now and the feature settings."""
        item = index.items[row]
        try:
            st = os.stat(index.abspath(row))
        except OSError:
            return None
        p = self.params
        key = {"format": CACHE_FORMAT, "path": item.path, "size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns),
               "feature": p.effective_feature, "max_side": p.max_side, "max_keypoints": p.max_keypoints,
               "opencv": cv2.__version__}
        if p.effective_feature == "xfeat":
            key["model"] = xfeat.model_id(p.max_keypoints)
        return key

    def reference_features(self, index, row: int) -> tuple[Features, tuple[float, float]] | None:
        """Features of reference ``row`` and its resized (width, height); None if unreadable.

        Taken from the features stored with the index (computed when it was built or updated)
        when their settings are these; otherwise computed and cached.
        """
        stored = getattr(index, "local", None)
        if stored is not None and same_features(stored.settings, settings_of(self.params)):
            self.stats["memory_hits"] += 1
            return stored.get(row)
        key = self._key(index, row)
        if key is None:
            self._unreadable(index, row, "file not found", ("missing", index.items[row].path))
            return None
        with _LOCK:
            mem = self._memory(index)
            hit = mem.get(row)
            if hit is not None and hit[0] == key:
                mem.move_to_end(row)
                self.stats["memory_hits"] += 1
                return None if hit[1] is None else (hit[1], hit[2])
        cache_dir = self._cache_dir(index)
        cache_file = None
        got = None
        if cache_dir is not None:
            cache_file = cache_dir / (hashlib.sha1(index.items[row].path.encode("utf-8")).hexdigest() + ".npz")
            got = self._read_disk(cache_file, key)
            if got is not None:
                self.stats["disk_hits"] += 1
        if got is None:
            try:
                img = _load_rgb(index.abspath(row), self.params.max_side)
                feats = extract_features(img, self.params)
            except (ImageError, OSError, ValueError, cv2.error) as exc:
                self._unreadable(index, row, getattr(exc, "reason", None) or str(exc), tuple(key.values()))
                with _LOCK:  # remember that this version of the file is unreadable
                    self._memory(index)[row] = (key, None, None)
                return None
            got = feats, _resized_size(img, self.params.max_side)
            self.stats["computed"] += 1
            if cache_file is not None:
                self._write_disk(cache_file, key, got)
        with _LOCK:
            mem = self._memory(index)
            mem[row] = (key, got[0], got[1])
            mem.move_to_end(row)
            while len(mem) > self.params.memory_cache:
                mem.popitem(last=False)
        return got

    def _unreadable(self, index, row: int, reason: str, what: tuple) -> None:
        """Log an unreadable reference once per file version (then at debug level)."""
        with _LOCK:
            first = what not in _WARNED
            _WARNED.add(what)
        if first:
            self.stats["unreadable"] += 1
        log.log(logging.WARNING if first else logging.DEBUG,
                "spatial verification: reference %s cannot be read (%s); counted as 0 inliers",
                index.abspath(row), reason)

    @staticmethod
    def _read_disk(path: Path, key: dict[str, Any]) -> tuple[Features, tuple[float, float]] | None:
        try:
            with np.load(path, allow_pickle=False) as z:
                if json.loads(str(z["key"])) != key:
                    return None  # stale: the file or the settings changed
                pts = np.asarray(z["pts"], np.float32).reshape(-1, 2)
                desc = np.asarray(z["desc"])
                size = tuple(float(v) for v in z["size"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            log.info("spatial cache entry %s is unusable (%s); recomputing", path, exc)
            return None
        if len(desc) != len(pts) or len(size) != 2 or desc.dtype not in (np.uint8, np.float16):
            return None
        return (pts, desc), (size[0], size[1])

    def _write_disk(self, path: Path, key: dict[str, Any], got: tuple[Features, tuple[float, float]]) -> None:
        folder = str(path.parent)
        if folder in _DISK_FAILED:
            return
        (pts, desc), size = got
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                np.savez(f, key=np.array(json.dumps(key, sort_keys=True)), pts=pts, desc=desc,
                         size=np.array(size, np.float64))
            os.replace(tmp, path)
        except OSError as exc:
            _DISK_FAILED.add(folder)
            log.warning("cannot write the spatial verification cache in %s (%s); keeping it in memory only",
                        folder, exc)
        finally:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass

    # ---- verification --------------------------------------------------------------------------
    def verify_rows(self, q: Features, rows: Sequence[int] | np.ndarray, index) -> np.ndarray:
        """Inliers of the query's features against each reference row (0 for unreadable references).
        What was found for each is kept until the next call (:meth:`found`)."""
        refs = [self.reference_features(index, int(r)) for r in rows]
        ok = [j for j, ref in enumerate(refs) if ref is not None]
        found = [ref for ref in refs if ref is not None]  # refs[j] for j in ok
        inl = np.zeros(len(rows), np.int64)
        kept: list[Found] = []
        if ok:
            inl[ok] = verify_many(q, [ref[0] for ref in found], self.params, [ref[1] for ref in found], kept,
                                  self._terms(index, [int(rows[j]) for j in ok]))
        self._found = (q, index, {int(rows[j]): f for j, f in zip(ok, kept)})
        return inl

    def _terms(self, index, rows: list[int]) -> list[Terms] | None:
        """The :data:`Terms` of the stored features of ``rows`` (None when they are not what is matched)."""
        stored = getattr(index, "local", None)
        terms = getattr(stored, "byte_terms", None)
        if stored is None or terms is None or not same_features(stored.settings, settings_of(self.params)):
            return None
        return [terms(r) for r in rows]

    def found(self, q: Features, index, row: int) -> Found | None:
        """What the last :meth:`verify_rows` found for reference ``row`` of ``index`` with the query
        features ``q`` (the same objects), or None."""
        last = self._found
        if last is None or last[0] is not q or last[1] is not index:
            return None
        return last[2].get(int(row))

    def last_found(self) -> Any:
        """What the last :meth:`verify_rows` found (to :meth:`restore_found` after another look)."""
        return self._found

    def restore_found(self, found: Any) -> None:
        """Make ``found`` (from :meth:`last_found`) what :meth:`found` answers from again."""
        self._found = found

    def verify(self, query_image: np.ndarray, rows: Sequence[int], index) -> np.ndarray:
        """Homography inliers between a query image (RGB) and each reference row of ``index``."""
        return self.verify_rows(query_features(query_image, self.params), rows, index)

    def inliers(self, query_image: np.ndarray, reference_row: int, index) -> int:
        """Homography inliers between a query image (RGB) and reference ``reference_row`` of ``index``."""
        return int(self.verify(query_image, [int(reference_row)], index)[0])


def settings_of(params: SpatialParams) -> dict[str, Any]:
    """What the stored local features were computed with (an index's manifest records it); XFeat's
    also name the model (:func:`museum_search.core.verification._xfeat.model_id`). With the side a query photo's features are
    computed at (``query_side``) when it is not ``max_side``: not a property of the stored features
    (:func:`same_features` leaves it out), but of the verification the index was calibrated with."""
    out: dict[str, Any] = {"feature": params.effective_feature, "max_side": int(params.max_side),
                           "max_keypoints": int(params.max_keypoints)}
    if out["feature"] == "xfeat":
        out["model"] = xfeat.model_id(params.max_keypoints)
    elif params.query_side is not None and params.query_side < params.max_side:
        out["query_side"] = int(params.query_side)
    return out


def same_features(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether local-feature ``settings`` a and b describe the same reference features (the query
    side aside)."""
    if a is None or b is None:
        return a is b
    return {k: v for k, v in a.items() if k != "query_side"} == {k: v for k, v in b.items() if k != "query_side"}


def descriptor_layout(params: SpatialParams) -> tuple[int, Any]:
    """(dimension, dtype) of the descriptors of ``params``' feature: SIFT 128 uint8, ORB 32 uint8
    (bits), XFeat 64 float16."""
    return {"sift": (128, np.uint8), "orb": (32, np.uint8), "xfeat": (xfeat.DIM, np.float16)}[params.effective_feature]


# ---- the matcher of an index ------------------------------------------------------------------
#
# An index stores the local features of one matcher (its manifest's ``local_features`` settings), chosen
# when it is built (the build job's ``matcher`` argument: ``index --matcher``, the app's Settings; no
# process-wide choice) and kept by ``update``; queries verify with the same one (:func:`params_of_index`).

#: The matcher of new indexes when none is chosen (``$MUSEUM_SEARCH_MATCHER`` overrides it). SIFT, from
#: the verdict's figures (bench/bench_verdict.py): with the calibrated verdict SIFT meets the targets on
#: COIL-100 (4.6 % of known objects rejected, 98.3 % of unknown ones) where XFeat does not (9.6 %, 96.6 %:
#: look-alike objects share many XFeat matches), while XFeat is better on the paintings (0 % against
#: 1.3 % known rejected at the same 93.3 % unknown rejected; it sees the dark works) at 1.4 times the
#: storage and more time per query. ``auto`` calibrates both and keeps the better, at twice the cost.
DEFAULT_MATCHER = "sift"


def default_matcher() -> str:
    """``$MUSEUM_SEARCH_MATCHER`` when it names a matcher, else :data:`DEFAULT_MATCHER`."""
    env = os.environ.get("MUSEUM_SEARCH_MATCHER", "").strip().lower()
    return env if env in MATCHERS else DEFAULT_MATCHER


def params_for(matcher: str, top_n: int = 20) -> SpatialParams:
    """The verification settings of a matcher (``"sift"`` or ``"xfeat"``; ``"orb"`` too)."""
    if matcher not in FEATURES:
        raise MuseumSearchError(f"unknown matcher {matcher!r}; choose one of {', '.join(MATCHERS)}")
    return SpatialParams(top_n=top_n, feature=matcher, query_side=QUERY_SIDE.get(matcher))


def params_of_index(index, top_n: int = 20) -> SpatialParams:
    """The verification settings that use ``index``'s stored local features: their feature (the index's
    matcher), frame size and keypoints; SIFT's defaults for an index without stored features."""
    stored = getattr(index, "local", None)
    return params_of_settings(stored.settings if stored is not None else None, top_n)


def params_of_settings(settings: dict[str, Any] | None, top_n: int = 20) -> SpatialParams:
    """The verification settings of stored local features' ``settings`` (:func:`settings_of`)."""
    if not settings:
        return SpatialParams(top_n=top_n)
    try:
        side = settings.get("query_side")
        return SpatialParams(top_n=top_n, feature=str(settings["feature"]), max_side=int(settings["max_side"]),
                             max_keypoints=int(settings["max_keypoints"]), query_side=None if side is None else int(side))
    except (KeyError, TypeError, ValueError, MuseumSearchError) as exc:
        log.warning("the local features of this index have settings this version does not know (%s): "
                    "verifying with SIFT, computed as needed", exc)
        return SpatialParams(top_n=top_n)


def prepare(params: SpatialParams) -> None:
    """Make sure the local features of ``params`` can be computed here: XFeat's model is loaded (or
    exported) now; raises :class:`museum_search.core.verification._xfeat.XFeatUnavailable` saying what to install."""
    if params.effective_feature == "xfeat":
        xfeat.session(params.max_keypoints)


def resolve_matcher(matcher: str | None = None) -> str:
    """``matcher`` checked ("sift", "xfeat" or "auto"); None: :func:`default_matcher`."""
    name = (matcher or default_matcher()).lower()
    if name not in MATCHERS:
        raise MuseumSearchError(f"unknown matcher {matcher!r}; choose one of {', '.join(MATCHERS)}")
    return name


def compute_local_features(paths: Sequence[str | os.PathLike], params: SpatialParams | None = None,
                           workers: int = 2) -> Generator[Any, None, LocalFeatures]:
    """Local features of every image of ``paths`` (unreadable ones: none), as a progress generator.

    Runs on a thread pool (OpenCV releases the GIL); closing the generator cancels.
    """
    params = params or SpatialParams()
    dim, dtype = descriptor_layout(params)
    prepare(params)  # XFeat that cannot run: one clear error before any work, not one per photo

    def one(path):
        try:
            img = _load_rgb(path, params.max_side)
            return extract_features(img, params), _resized_size(img, params.max_side)
        except (ImageError, OSError, ValueError, cv2.error) as exc:
            log.warning("local features of %s cannot be computed (%s)", path, getattr(exc, "reason", exc))
            return None

    total = len(paths)
    out: list = [None] * total
    t0 = time.perf_counter()
    pool = DecodePool(workers, "local-features")
    finished = False
    try:
        window = 4 * max(1, workers)
        futures: dict[int, Any] = {}
        nxt = 0
        for i in range(total):
            while nxt < total and nxt < i + window:  # keep a window of files in flight
                futures[nxt] = pool.submit(one, paths[nxt])
                nxt += 1
            out[i] = futures.pop(i).result()
            yield Progress(i + 1, total, stage="local features", current=str(paths[i]),
                           elapsed=time.perf_counter() - t0)
        finished = True
    finally:  # cancelled or interrupted: a read still running is not waited for
        pool.shutdown(wait=finished, cancel_futures=True)
    return LocalFeatures.from_list(out, settings_of(params), dim, dtype)
