"""Indexing throughput vs the bare forward pass, and query latency broken down.

1. Throughput: ``extract`` (decode on a thread pool + forward) over N real images, as a ratio to
   the bare forward pass of the same backbone on the same, already decoded and pre-processed
   inputs (target >= 0.9: decoding must overlap inference).
2. Query latency for one photo (the default 5-region query, and a whole-image query):
   decode / forward / search, with search against 10,000
   references (the paintings' descriptors tiled with noise), as a share of the forward pass
   (target: search + overhead <= 15 % of the forward pass).

Both measured in one run (the machine is shared: compare ratios, not seconds).
Usage: python bench/bench_indexing.py [--images DIR] [--n 120] [--size 512]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from museum_search.core.answer._search import results_for, score_matrix
from museum_search.core.images import is_image_file, load_image
from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import DEFAULT_SIZE, BackboneConfig
from museum_search.core.inference._engines import build_extractor
from museum_search.core.inference._extract import extract, query_crops
from museum_search.core.progress import drive as run
from museum_search.core.ranking import order

HERE = Path(__file__).resolve().parent
DEFAULT_IMAGES = HERE.parent.parent / "shared" / "data" / "paintings" / "references"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES)
    ap.add_argument("--n", type=int, default=120)
    ap.add_argument("--size", type=int, default=DEFAULT_SIZE)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()
    paths = sorted(p for p in args.images.iterdir() if is_image_file(p))[: args.n]
    ext = build_extractor(BackboneConfig(size=args.size))
    # warm-up
    ext.embed([ext.preprocess(load_image(paths[0], max_side=ext.max_side))])

    # bare forward pass on pre-decoded inputs, batched the same way as extract(); the two are
    # alternated and the best of the rounds taken, so a burst of load elsewhere hits both alike
    inputs = [ext.preprocess(load_image(p, max_side=ext.max_side)) for p in paths]
    forwards, fulls = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for i in range(0, len(inputs), args.batch_size):
            ext.embed(inputs[i : i + args.batch_size])
        forwards.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        res = run(extract(paths, ext, batch_size=args.batch_size))
        fulls.append(time.perf_counter() - t0)
        assert len(res.ok) == len(paths)
    forward, full = min(forwards), min(fulls)

    t0 = time.perf_counter()
    for p in paths:
        load_image(p, max_side=ext.max_side)
    decode_serial = time.perf_counter() - t0

    # query latency against 10,000 references
    rng = np.random.default_rng(0)
    base = res.descriptors
    reps = int(np.ceil(10000 / len(base)))
    desc = np.tile(base, (reps, 1))[:10000] + rng.normal(0, 0.01, (10000, base.shape[1])).astype(np.float32)
    desc /= np.linalg.norm(desc, axis=1, keepdims=True)
    items = [Item(f"{i}.jpg", 0, 0.0, f"inst{i // 3}") for i in range(10000)]
    index = Index("/", ext.meta, items, desc.astype(np.float32))
    q_path = paths[0]

    def latency(regions: bool) -> dict[str, float]:
        timings = {"decode": [], "forward": [], "search": []}
        for _ in range(10):
            t0 = time.perf_counter()
            img = load_image(q_path, max_side=ext.max_side)
            x = [ext.preprocess(c) for c in query_crops(img, regions)]
            t1 = time.perf_counter()
            q = ext.embed(x)[None]
            t2 = time.perf_counter()
            s = score_matrix(index, q)[0]
            results_for(index, order(s, 10), s)
            t3 = time.perf_counter()
            timings["decode"].append(t1 - t0)
            timings["forward"].append(t2 - t1)
            timings["search"].append(t3 - t2)
        return {k: float(np.median(v)) for k, v in timings.items()}

    med_whole = latency(False)
    med = latency(True)
    out = {
        "images": len(paths),
        "forward_s_rounds": forwards,
        "indexing_s_rounds": fulls,
        "size": args.size,
        "cores": os.cpu_count(),
        "bare_forward_img_per_s": len(paths) / forward,
        "indexing_img_per_s": len(paths) / full,
        "throughput_ratio": forward / full,
        "serial_decode_s_share_of_forward": decode_serial / forward,
        "query_ms": {k: 1000 * v for k, v in med.items()},
        "search_10k_over_forward": med["search"] / med["forward"],
        "search_plus_decode_over_forward": (med["search"] + med["decode"]) / med["forward"],
        "whole_image_query_ms": {k: 1000 * v for k, v in med_whole.items()},
        "whole_image_search_10k_over_forward": med_whole["search"] / med_whole["forward"],
        "whole_image_search_plus_decode_over_forward": (med_whole["search"] + med_whole["decode"]) / med_whole["forward"],
    }
    print(f"indexing {out['indexing_img_per_s']:.2f} img/s vs bare forward {out['bare_forward_img_per_s']:.2f} img/s "
          f"-> ratio {out['throughput_ratio']:.3f} (target >= 0.9)")
    print(f"(serial decoding alone costs {out['serial_decode_s_share_of_forward']:.2f} of the forward time)")
    for label, key in (("default query (5 regions)", ""), ("whole-image query", "whole_image_")):
        print(f"{label} latency (median of 10, ms): "
              + ", ".join(f"{k} {v:.1f}" for k, v in out[f"{key}query_ms"].items()))
        print(f"  search over 10,000 references = {out[f'{key}search_10k_over_forward']:.3f} of the forward pass "
              f"(target <= 0.15); with decoding {out[f'{key}search_plus_decode_over_forward']:.3f}")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "indexing.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
