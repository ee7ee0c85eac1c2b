"""From how many references is approximate search worth it? Exact brute force against the faiss
IVF-PQ index of :mod:`museum_search.core.index._approximate` (with exact re-scoring of its shortlist), on
memory-mapped float16 descriptors, at several collection sizes.

Synthetic but clustered 1280-d descriptors, written as a float16 .npy and memory-mapped: objects
of 10 noisy views each (view noise drawn per object, so some objects are much harder than others),
objects in groups of 50 related ones (a shared component), L2-normalized. Queries are new noisy
views of random references (what a visitor's photo is): in their exact top 10, about two thirds
are views of the same object and the rest close relatives, with scores near each other (a hard
case for an approximate index).

For each size N (one run; the machine is shared, so the load average is recorded):
* exact: ``_exact.exact_scores`` of one query (float16 converted a chunk at a time), p50/p95 over
  ``--latency-queries`` single queries after one warm-up;
* ann: ``AnnIndex.build`` time (training on a sample, then adding), the serialized index size, and
  ``AnnIndex.search`` of one query (candidates, exact re-scoring, top 10), p50/p95;
* recall@10 of the ann search against exact over ``--queries`` queries.
Also, at ``--neighbours-n`` references: ``_neighbours.neighbour_lists`` (k = 32) exactly and from the
approximate index (time, and the overlap of the two).

The rule for ``_modes.AUTO_MIN_REFERENCES`` (printed at the end): the smallest measured N at which
exact search is at least ``--margin`` (3) times slower than ann search at the median, takes at
least ``--noticeable-ms`` (100 ms, a wait a user notices) and ann keeps recall@10 >= 0.95.

    python bench/bench_ann_threshold.py [--sizes 10000,30000,100000,300000] [--work DIR]

Prints a table and writes bench/results/ann_threshold.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from museum_search.core.index import _approximate, _exact, _modes, _neighbours
from museum_search.core.progress import drive
from museum_search.core.ranking import order

HERE = Path(__file__).resolve().parent


def write_synthetic(path: Path, n: int, dim: int = 1280, views: int = 10, per_group: int = 50,
                    group_weight: float = 1.5, noise: tuple[float, float] = (0.5, 1.5), seed: int = 0,
                    dtype=np.float16, chunk_objects: int = 2000) -> np.ndarray:
    """``n`` clustered unit vectors written to ``path`` (.npy) a chunk at a time; returned memory-mapped.

    Object ``o`` (rows ``o*views ...``) = normalize(group_weight * g + e) with ``g`` its group's
    random direction (groups of ``per_group`` objects) and ``e`` its own; a view = normalize(object
    + s * noise) with ``s`` drawn per object in ``noise`` (unit-variance noise over all dims)."""
    rng = np.random.default_rng(seed)
    objects = -(-n // views)
    groups = rng.standard_normal((-(-objects // per_group), dim), dtype=np.float32) / np.float32(np.sqrt(dim))
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n, dim))
    for o0 in range(0, objects, chunk_objects):
        o1 = min(objects, o0 + chunk_objects)
        obj = group_weight * groups[np.arange(o0, o1) // per_group]
        obj += rng.standard_normal((o1 - o0, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        obj /= np.linalg.norm(obj, axis=1, keepdims=True)
        s = np.repeat(rng.uniform(*noise, size=(o1 - o0, 1)).astype(np.float32), views, 0)
        v = np.repeat(obj, views, 0) + s * rng.standard_normal(((o1 - o0) * views, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        a, b = o0 * views, min(n, o1 * views)
        arr[a:b] = v[: b - a]
    arr.flush()
    del arr
    return np.load(path, mmap_mode="r")


def synthetic_queries(d: np.ndarray, count: int, noise: tuple[float, float] = (0.5, 1.5), seed: int = 1) -> np.ndarray:
    """New noisy views of ``count`` random references (float32, unit)."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(len(d), count, replace=False))
    dim = d.shape[1]
    q = np.asarray(d[rows], np.float32)
    q += rng.uniform(*noise, size=(count, 1)).astype(np.float32) * rng.standard_normal((count, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return q


def latencies(fn, queries: np.ndarray, budget_s: float = 40.0) -> list[float]:
    """Seconds of ``fn(one query)`` for each query (after one warm-up), until ``budget_s`` is spent."""
    fn(queries[:1])
    out, spent = [], 0.0
    for i in range(len(queries)):
        t0 = time.perf_counter()
        fn(queries[i : i + 1])
        out.append(time.perf_counter() - t0)
        spent += out[-1]
        if spent > budget_s and len(out) >= 5:
            break
    return out


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(values), p))


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(f[f >= 0].tolist()) & set(t.tolist())) / k for f, t in zip(found, truth)]))


def bench_size(work: Path, n: int, dim: int, queries: int, latency_queries: int) -> dict:
    t0 = time.perf_counter()
    d = write_synthetic(work / f"descriptors-{n}.npy", n, dim)
    t_write = time.perf_counter() - t0
    q = synthetic_queries(d, queries)
    truth = order(_exact.exact_scores(d, q), 10)
    exact_lat = latencies(lambda x: order(_exact.exact_scores(d, x), 10), q[:latency_queries])

    stages: dict[str, float] = {}
    t0 = time.perf_counter()
    last = [t0, None]
    gen = _approximate.AnnIndex.build(d)
    while True:
        try:
            p = next(gen)
        except StopIteration as stop:
            index = stop.value
            break
        now = time.perf_counter()
        if last[1] is not None:
            stages[last[1]] = stages.get(last[1], 0.0) + now - last[0]
        last = [now, p.stage]
    stages[last[1]] = stages.get(last[1], 0.0) + time.perf_counter() - last[0]
    t_build = time.perf_counter() - t0
    blob = index.to_bytes()
    ann_lat = latencies(lambda x: index.search(d, x, 10), q[:latency_queries])
    rows, _ = index.search(d, q, 10)
    rec = recall_at(rows, truth)
    # recall of the shortlist alone (before re-scoring): what the re-scoring can at best recover
    cand = index.candidates(q)
    shortlist_rec = recall_at(cand, truth)
    row = {
        "N": n,
        "write_s": round(t_write, 1),
        "exact_p50_ms": round(pct(exact_lat, 50) * 1e3, 1),
        "exact_p95_ms": round(pct(exact_lat, 95) * 1e3, 1),
        "exact_latency_queries": len(exact_lat),
        "ann_p50_ms": round(pct(ann_lat, 50) * 1e3, 2),
        "ann_p95_ms": round(pct(ann_lat, 95) * 1e3, 2),
        "ann_latency_queries": len(ann_lat),
        "speedup_p50": round(pct(exact_lat, 50) / pct(ann_lat, 50), 1),
        "recall_at_10": round(rec, 4),
        "shortlist_recall_at_10": round(shortlist_rec, 4),
        "build_s": round(t_build, 1),
        "train_s": round(stages.get(_approximate.TRAIN_STAGE, 0.0), 1),
        "add_s": round(stages.get(_approximate.ADD_STAGE, 0.0), 1),
        "ann_bytes": len(blob),
        "ann_bytes_per_reference": round(len(blob) / n, 1),
        "descriptor_bytes": int(d.nbytes),
        "params": index.params.to_dict(),
    }
    path = work / f"ann-{n}.faiss"
    path.write_bytes(blob)
    again = _approximate.AnnIndex.read(path, index.params)
    row["read_back_identical"] = bool(np.array_equal(again.candidates(q[:20]), index.candidates(q[:20])))
    return row


def bench_neighbours(work: Path, n: int, dim: int, k: int = 32) -> dict:
    d = write_synthetic(work / f"neighbours-{n}.npy", n, dim, seed=3)
    t0 = time.perf_counter()
    exact = drive(_neighbours.neighbour_lists(d, k))
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = drive(_approximate.AnnIndex.build(d))
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    approx = drive(_neighbours.neighbour_lists(d, k, ann=index))
    t_approx = time.perf_counter() - t0
    overlap = float(np.mean([len(set(a) & set(e)) / k for a, e in zip(approx.tolist(), exact.tolist())]))
    return {"N": n, "k": k, "exact_s": round(t_exact, 1), "ann_build_s": round(t_build, 1),
            "ann_s": round(t_approx, 1), "overlap": round(overlap, 4),
            "rows_identical": round(float(np.mean(np.all(approx == exact, axis=1))), 4),
            "exact_us_per_reference": round(t_exact / n * 1e6, 1),
            "ann_us_per_reference": round(t_approx / n * 1e6, 1)}


def choose_threshold(rows: list[dict], margin: float, noticeable_ms: float) -> int | None:
    for r in sorted(rows, key=lambda r: r["N"]):
        if (r["exact_p50_ms"] >= margin * r["ann_p50_ms"] and r["exact_p50_ms"] >= noticeable_ms
                and r["recall_at_10"] >= 0.95):
            return r["N"]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,30000,100000,300000")
    ap.add_argument("--dim", type=int, default=1280)
    ap.add_argument("--queries", type=int, default=200, help="queries for recall@10")
    ap.add_argument("--latency-queries", type=int, default=30, help="single queries timed per mode")
    ap.add_argument("--neighbours-n", type=int, default=30000, help="0: skip the neighbour lists")
    ap.add_argument("--margin", type=float, default=3.0)
    ap.add_argument("--noticeable-ms", type=float, default=100.0)
    ap.add_argument("--work", default=None, help="folder for the temporary files (default: a temp dir)")
    ap.add_argument("--out", default=str(HERE / "results" / "ann_threshold.json"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    import faiss

    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
               "faiss": faiss.__version__, "faiss_threads": faiss.omp_get_max_threads(),
               "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        rows = []
        for n in sizes:
            rows.append(bench_size(work, n, args.dim, args.queries, args.latency_queries))
            r = rows[-1]
            print(f"N={n:>8,}  exact p50 {r['exact_p50_ms']:8.1f} ms  ann p50 {r['ann_p50_ms']:6.2f} ms  "
                  f"x{r['speedup_p50']:<6} recall@10 {r['recall_at_10']:.3f}  build {r['build_s']:.1f} s", flush=True)
            for f in work.glob(f"*-{n}.*"):
                f.unlink()
        neighbours = bench_neighbours(work, args.neighbours_n, args.dim) if args.neighbours_n else None
    machine["load_average_at_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    threshold = choose_threshold(rows, args.margin, args.noticeable_ms)
    report = {
        "machine": machine,
        "dim": args.dim,
        "dtype": "float16 (memory-mapped .npy)",
        "data": "10 views per object, objects in groups of 50, view noise U(0.5, 1.5) per object; "
                "queries: new views of random references",
        "queries_for_recall": args.queries,
        "rule": f"smallest N with exact p50 >= {args.margin} x ann p50, exact p50 >= {args.noticeable_ms} ms, "
                "recall@10 >= 0.95",
        "threshold_measured": threshold,
        "AUTO_MIN_REFERENCES": _modes.AUTO_MIN_REFERENCES,
        "sizes": rows,
        "neighbour_lists": neighbours,
        "total_s": round(time.perf_counter() - t_all, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print(f"{'N':>9} {'exact p50':>10} {'exact p95':>10} {'ann p50':>8} {'ann p95':>8} {'speedup':>8} "
          f"{'recall@10':>9} {'shortlist':>9} {'build s':>8} {'ann MB':>7}")
    for r in rows:
        print(f"{r['N']:>9,} {r['exact_p50_ms']:>8.1f}ms {r['exact_p95_ms']:>8.1f}ms {r['ann_p50_ms']:>6.2f}ms "
              f"{r['ann_p95_ms']:>6.2f}ms {r['speedup_p50']:>7}x {r['recall_at_10']:>9.3f} "
              f"{r['shortlist_recall_at_10']:>9.3f} {r['build_s']:>8.1f} {r['ann_bytes'] / 2**20:>7.1f}")
    if neighbours:
        print(f"neighbour lists (k={neighbours['k']}) at N={neighbours['N']:,}: exact {neighbours['exact_s']} s, "
              f"ann {neighbours['ann_s']} s (+ build {neighbours['ann_build_s']} s), overlap {neighbours['overlap']}")
    print(f"threshold by the rule: {threshold}; _modes.AUTO_MIN_REFERENCES = {_modes.AUTO_MIN_REFERENCES}")
    print(f"load average at start {machine['load_average_at_start']}, at end {machine['load_average_at_end']}; "
          f"wrote {out}")


if __name__ == "__main__":
    main()
