"""Time spatial verification (top_n=20) per query on the paintings queries qsd1_w1.

The global scores are synthetic: each query's true reference plus 19 others drawn at random get
the top-20 scores (the true one is never first), so the cost is that of a real top-20 and the
result says how often verification alone puts the true painting first among 20 candidates.

Three passes over the queries, each with its own timing:

- ``cold``: empty caches, every reference's features are computed (and written to the disk cache);
- ``disk``: a new re-ranker (empty memory), references read from the disk cache;
- ``warm``: the same re-ranker again, references from memory: the steady state of a session;

then the warm time with the other homography estimators (``usac``, ``magsac``) and the time of the
query features alone (the part no cache can save).

Usage: ``python bench/bench_spatial.py [--data ../shared/data] [--top-n 20]``; writes
``bench/results/spatial.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import BackboneMeta
from museum_search.core.ranking import order
from museum_search.core.verification._spatial import (
    SpatialParams,
    Verifier,
    blend,
    extract_features,
)


def verified(rr: Verifier, scores: np.ndarray, index, images) -> np.ndarray:
    """The scores after verifying each query's top-N (the query pipeline's step, ungated)."""
    out = scores.copy()
    for qi, img in enumerate(images):
        short = order(out[qi], rr.params.top_n)
        out[qi, short] = blend(out[qi, short], rr.verify(img, short, index), rr.params)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--queries", default="qsd1_w1")
    ap.add_argument("--top-n", type=int, default=20)
    ap.add_argument("--feature", default="sift")
    ap.add_argument("--estimator", default="ransac", choices=("ransac", "usac", "magsac"))
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "spatial.json"))
    args = ap.parse_args()

    paint = Path(args.data) / "paintings"
    refs = sorted(p.name for p in (paint / "references").glob("*.jpg"))
    items = []
    for name in refs:
        st = (paint / "references" / name).stat()
        items.append(Item(name, st.st_size, st.st_mtime, Path(name).stem))
    qdir = paint / "queries" / args.queries
    with open(qdir / "ground_truth.csv", newline="") as f:
        gt = [(r["query"], r["instance"]) for r in csv.DictReader(f) if r["instance"]]
    row_of = {it.instance: i for i, it in enumerate(items)}
    gt = [(q, inst) for q, inst in gt if inst in row_of]

    rng = np.random.default_rng(0)
    n, top = len(items), args.top_n
    scores = rng.uniform(0.0, 0.3, (len(gt), n)).astype(np.float32)
    for qi, (_, inst) in enumerate(gt):
        t = row_of[inst]
        others = rng.choice(np.delete(np.arange(n), t), top - 1, replace=False)
        cand = np.concatenate([others[:1], [t], others[1:]])  # true reference at global rank 2
        scores[qi, cand] = np.linspace(0.8, 0.6, top, dtype=np.float32)
    query_images = [cv2.cvtColor(cv2.imread(str(qdir / q)), cv2.COLOR_BGR2RGB) for q, _ in gt]

    params = SpatialParams(top_n=top, feature=args.feature, estimator=args.estimator)
    out: dict = {
        "benchmark": "spatial verification re-ranking",
        "queries": f"paintings/{args.queries}", "n_queries": len(gt), "n_references": n,
        "params": {k: v for k, v in vars(params).items()},
        "feature_used": params.effective_feature,
        "opencv": cv2.__version__, "cv2_threads": cv2.getNumThreads(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "machine": platform.machine(),
    }
    true_rows = np.array([row_of[inst] for _, inst in gt])
    with tempfile.TemporaryDirectory() as tmp:
        index = Index(paint / "references", _meta(), items, np.zeros((n, 4), np.float32), path=tmp)
        timings: dict[str, float] = {}
        cpu: dict[str, float] = {}
        load_before = os.getloadavg()[0]
        rr = Verifier(params)
        for name in ("cold", "disk", "warm"):
            if name == "disk":
                rr = Verifier(params)
            t0, c0 = time.perf_counter(), time.process_time()
            new = verified(rr, scores, index, query_images)
            timings[name] = (time.perf_counter() - t0) / len(gt)
            cpu[name] = (time.process_time() - c0) / len(gt)
        first = {params.estimator: float(np.mean(order(np.atleast_2d(new))[:, 0] == true_rows))}
        # the other homography estimators, warm (the reference features do not depend on them)
        for est in ("ransac", "usac", "magsac"):
            if est == params.estimator:
                continue
            other = Verifier(replace(params, estimator=est))
            verified(other, scores, index, query_images)  # fills its memory from disk
            t0, c0 = time.perf_counter(), time.process_time()
            new = verified(other, scores, index, query_images)
            timings[f"warm_{est}"] = (time.perf_counter() - t0) / len(gt)
            cpu[f"warm_{est}"] = (time.process_time() - c0) / len(gt)
            first[est] = float(np.mean(order(np.atleast_2d(new))[:, 0] == true_rows))
        # where the warm time goes: query features vs matching + homographies
        t0, c0 = time.perf_counter(), time.process_time()
        for img in query_images:
            extract_features(img, params)
        timings["query_features_only"] = (time.perf_counter() - t0) / len(gt)
        cpu["query_features_only"] = (time.process_time() - c0) / len(gt)
        cache_bytes = sum(p.stat().st_size for p in Path(tmp).rglob("*.npz"))
        n_cached = len(list(Path(tmp).rglob("*.npz")))
    out.update({
        "seconds_per_query": {k: round(v, 4) for k, v in timings.items()},
        "cpu_seconds_per_query": {k: round(v, 4) for k, v in cpu.items()},
        "warm_over_cold": round(timings["warm"] / timings["cold"], 3),
        "disk_over_cold": round(timings["disk"] / timings["cold"], 3),
        "true_first_after_spatial": first,
        "true_first_before_spatial": 0.0,
        "disk_cache": {"entries": n_cached, "bytes": cache_bytes,
                       "bytes_per_reference": round(cache_bytes / max(1, n_cached))},
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before, after
    })
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))
    return 0


def _meta() -> BackboneMeta:
    return BackboneMeta(name="none", weights_id="none", head="gem", input_policy="longest_side", size=0,
                        scales=(1.0,), gem_p=3.0, dim=4, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))


if __name__ == "__main__":
    raise SystemExit(main())
