"""Neighbour lists of a large index (issue 24, items 3 and 5): the k-NN graph method against the old
IVF regions, faiss HNSW and exact brute force; ICFRR with the new lists on real data; the 1M build and
appending 1,000 references to it.

Parts (each one run writes its key of bench/results/knn.json, keeping the others):

* ``synthetic`` (``--n``, default 100,000; both kinds of ``bench_scale.prepare`` data: "themes",
  objects grouped in themes, and "objects", 10 views of each object around random centres): on the
  same memory-mapped float16 matrix, in one process, one after the other:
  - **new**: ``_neighbours.neighbour_lists(d, 32, ann=...)`` (the k-NN graph method of ``core/knn.py`` and
    the exact re-scoring), with the time of each stage (cells, probes, scan, exact ranking);
  - **old**: the IVF-region lists of commit ``OLD_COMMIT`` (its ``AnnIndex.build`` +
    ``neighbour_lists``, loaded from git), and the largest / median cell;
  - **faiss HNSW alone**: ``IndexHNSWFlat`` (M = 32, efConstruction 40, inner product), every row
    searched for 33 with efSearch 64, itself dropped: build + search, no exact re-scoring;
  - **exact**: ``_neighbours.neighbour_lists(d, 32)`` (themes only: its time does not depend on the data).
  Recall@32 against exact lists of a seeded sample of 1,000 rows (float64 dot products rounded to
  float32, ties by lower row: computed here, independently), and the share of each sampled row's 9
  other views found in its 32 ("other views recall").
* ``real``: COIL-100 (references every 20 degrees, queries at 10/130/250 degrees, as
  tests/test_data_coil.py) and the paintings (references, the three query sets): each index's exact
  lists against the k-NN graph method's (default settings, and 2 probes to make them inexact): rows
  equal, then ICFRR (plain search + ICFRR, the collection's K_q/K_g) with each: MAP, MP@1 and the
  queries whose ranking differs.
* ``million`` (``--n``, default 1,000,000; themes data): ``import_index`` of the 1M float16 matrix
  (``--ann yes``) with the time of every stage, then 1,000 more references (10 views of 100 new
  objects) appended: ``AnnIndex.updated`` + ``update_neighbour_lists``, their times, and recall@32 /
  other views recall after (sample of 500 old and 500 new rows, exact as above).

The machine is shared and noisy (2 cores, other jobs): seconds are indicative; ratios in one run.
Usage:
    python bench/bench_knn.py synthetic [--n 100000] [--work DIR]
    python bench/bench_knn.py real
    python bench/bench_knn.py million [--n 1000000] [--work DIR] [--append-only | --lists-only]
(``--append-only``: the append again on the index an earlier run left in --work; ``--lists-only``:
the neighbour lists of that run's 1M matrix alone, with their stages and CPU time.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_scale import VIEWS, prepare

from museum_search.core.index import _exact, _neighbours
from museum_search.core.progress import drive
from museum_search.core.ranking import neg_distance, order

RESULTS = HERE / "results" / "knn.json"
K = 32
SAMPLE = 1000
#: the last commit with the IVF-region neighbour lists (the "old" method)
OLD_COMMIT = "253350e"


class LoadAverage:
    """The 1-minute load average, sampled every ``every`` seconds on a thread while it runs."""

    def __init__(self, every: float = 15.0):
        import threading

        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while True:
            self.samples.append(round(os.getloadavg()[0], 2))
            if self._stop.wait(every):
                return

    def summary(self) -> dict:
        s = np.asarray(self.samples or [os.getloadavg()[0]])
        return {"min": round(float(s.min()), 2), "median": round(float(np.median(s)), 2),
                "max": round(float(s.max()), 2), "samples": len(s)}

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return self.summary()


class Sized:
    """What ``neighbour_lists(ann=...)`` needs of the approximate index: its size."""

    def __init__(self, n: int):
        self.ntotal = n


def exact_rows(d: np.ndarray, rows: np.ndarray, k: int = K) -> np.ndarray:
    """The exact lists of ``rows``: float64 dot products with every row, rounded to float32, as
    ``-D``, self excluded, ties by lower row (the definition, written again here)."""
    out = np.empty((len(rows), k), dtype=np.int64)
    step = max(1, 100_000_000 // len(d))  # rows at a time: bounded memory at 1M
    for r in range(0, len(rows), step):
        rr = rows[r:r + step]
        x = np.asarray(d[rr], dtype=np.float64)
        s = np.empty((len(rr), len(d)), dtype=np.float32)
        for a in range(0, len(d), 50_000):
            s[:, a:a + 50_000] = (x @ np.asarray(d[a:a + 50_000], dtype=np.float64).T).astype(np.float32)
        s = neg_distance(s)
        s[np.arange(len(rr)), rr] = -np.inf
        out[r:r + step] = order(s, k)
    return out


def recalls(lists: np.ndarray, rows: np.ndarray, exact: np.ndarray) -> dict:
    got = lists[rows, :K]
    r = np.mean([len(set(g.tolist()) & set(e.tolist())) / K for g, e in zip(got, exact)])
    same = np.mean([np.array_equal(g, e) for g, e in zip(got, exact)])
    views = np.mean([len((set(range(i // VIEWS * VIEWS, i // VIEWS * VIEWS + VIEWS)) - {int(i)})
                          & set(g.tolist())) / (VIEWS - 1) for i, g in zip(rows, got)])
    return {"recall_at_32": round(float(r), 4), "other_views_recall": round(float(views), 4),
            "rows_equal_to_exact": round(float(same), 4)}


def timed_stages(gen, marks: dict[str, float], n: int):
    """Drive ``gen``; the time at which its progress first reaches each fraction of ``marks``."""
    t0 = time.perf_counter()
    times: dict[str, float] = {}
    try:
        while True:
            p = next(gen)
            for name, frac in marks.items():
                if name not in times and p.done >= frac * n:
                    times[name] = round(time.perf_counter() - t0, 2)
    except StopIteration as stop:
        return stop.value, round(time.perf_counter() - t0, 2), times


def old_module():
    """``museum_search.core.ann`` (now :mod:`museum_search.core.index._neighbours`) as of :data:`OLD_COMMIT` (the IVF-region lists)."""
    src = subprocess.run(["git", "-C", str(HERE.parent), "show", f"{OLD_COMMIT}:museum_search/core/ann.py"],
                         check=True, capture_output=True, text=True).stdout
    f = Path(tempfile.mkdtemp()) / "ann_old.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location("museum_search.core._ann_old", f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def hnsw_lists(d: np.ndarray) -> tuple[np.ndarray, float, float]:
    faiss = _exact._faiss()
    n, dim = d.shape
    index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 40
    t = time.perf_counter()
    for a in range(0, n, 50_000):
        index.add(np.asarray(d[a:a + 50_000], dtype=np.float32))
    built = time.perf_counter() - t
    index.hnsw.efSearch = 64
    out = np.empty((n, K), dtype=np.int64)
    t = time.perf_counter()
    for a in range(0, n, 50_000):
        x = np.asarray(d[a:a + 50_000], dtype=np.float32)
        _, labels = index.search(x, K + 1)
        rows = np.arange(a, a + len(x))[:, None]
        for i, lab in enumerate(labels):
            lab = lab[lab != rows[i, 0]]
            out[a + i] = lab[:K]
    return out, round(built, 2), round(time.perf_counter() - t, 2)


def synthetic(work: Path, n: int) -> dict:
    from museum_search.core.index._knn import KnnParams

    res: dict = {"n": n, "k": K, "sample_rows": SAMPLE, "knn_params": {**vars(KnnParams()), "cells": KnnParams().cells(n)}}
    old = old_module()
    for kind in ("themes", "objects"):
        folder = work / kind
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "desc.npy").exists():
            prepare(folder, n, queries=1, kind=kind)
        d = np.load(folder / "desc.npy", mmap_mode="r")
        rows = np.sort(np.random.default_rng(0).choice(n, SAMPLE, replace=False))
        t = time.perf_counter()
        exact = exact_rows(d, rows)
        row: dict = {"exact_sample_s": round(time.perf_counter() - t, 2)}
        print(kind, "exact sample", row["exact_sample_s"], flush=True)
        # new: the k-NN graph method (fractions of its progress: cells 0.09, probes 0.18, scan 0.9)
        lists, total, st = timed_stages(_neighbours.neighbour_lists(d, K, ann=Sized(n)),
                                        {"cells": 0.09, "probes": 0.18, "scan": 0.9}, n)
        stages = {"cells_s": st.get("cells"), "probes_s": round(st["probes"] - st["cells"], 2),
                  "scan_s": round(st["scan"] - st["probes"], 2), "exact_ranking_s": round(total - st["scan"], 2)}
        row["new"] = {"seconds": total, "stages": stages, **recalls(lists, rows, exact)}
        print(kind, "new", row["new"], flush=True)
        # old: the IVF regions
        t = time.perf_counter()
        old_ann = drive(old.AnnIndex.build(d))
        t_ann = time.perf_counter() - t
        members, _ = old_ann.cells(8)
        sizes = np.array([len(m) for m in members])
        t = time.perf_counter()
        lists = drive(old.neighbour_lists(d, K, ann=old_ann))
        row["old"] = {"seconds": round(time.perf_counter() - t, 2), "ann_build_s": round(t_ann, 2),
                      "largest_cell": int(sizes.max()), "median_cell": float(np.median(sizes)),
                      **recalls(lists, rows, exact)}
        print(kind, "old", row["old"], flush=True)
        del old_ann
        # faiss HNSW alone
        lists, built, searched = hnsw_lists(d)
        row["faiss_hnsw"] = {"seconds": round(built + searched, 2), "build_s": built, "search_all_s": searched,
                             "M": 32, "efConstruction": 40, "efSearch": 64, **recalls(lists, rows, exact)}
        print(kind, "hnsw", row["faiss_hnsw"], flush=True)
        del lists
        if kind == "themes":  # exact brute force (the same arithmetic whatever the data)
            t = time.perf_counter()
            lists = drive(_neighbours.neighbour_lists(d, K))
            row["exact"] = {"seconds": round(time.perf_counter() - t, 2), **recalls(lists, rows, exact)}
            print(kind, "exact", row["exact"], flush=True)
        res[kind] = row
    return res


# ---- real data: ICFRR with exact and k-NN graph lists ------------------------------------------


def real() -> dict:
    import re

    from museum_search.core.answer._pipeline import QuerySettings
    from museum_search.core.evaluation._querysets import load_queryset
    from museum_search.core.evaluation._runner import run_evaluation
    from museum_search.core.index._knn import KnnParams
    from museum_search.core.index._labels import COIL100_REGEX
    from museum_search.core.index._store import K_MAX, Index, LabellingSpec
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.jobs._indexing import build_index

    data = Path(os.environ.get("MUSEUM_SEARCH_DATA", "/work/shared/data"))
    tmp = Path(tempfile.mkdtemp(prefix="bench_knn_real_"))
    out: dict = {}
    try:
        # COIL-100 as tests/test_data_coil.py
        angle = re.compile(r"__(\d+)\.")
        root = data / "coil100"
        names = sorted(p.name for p in root.glob("*.jpg"))
        refs = [x for x in names if int(angle.search(x).group(1)) % 20 == 0]
        queries = [x for x in names if int(angle.search(x).group(1)) in (10, 130, 250)]
        ref_dir = tmp / "coil_refs"
        ref_dir.mkdir()
        for x in refs:
            (ref_dir / x).symlink_to(root / x)
        drive(build_index(ref_dir, tmp / "coil", BackboneConfig(size=224), LabellingSpec("regex", regex=COIL100_REGEX)))
        coil_qs = [load_queryset(root, layout="regex", regex=COIL100_REGEX, files=queries)]
        drive(build_index(data / "paintings" / "references", tmp / "paintings", BackboneConfig()))
        paint_qs = [load_queryset(data / "paintings" / "queries" / q) for q in ("qsd1_w1", "qsd1_w3", "qsd2_w3")]
        settings = QuerySettings(regions=False, verify=False, rerank="icfrr")
        for name, path, qsets in (("coil100", tmp / "coil", coil_qs), ("paintings", tmp / "paintings", paint_qs)):
            base = Index.load(path)
            n = len(base)
            exact = drive(_neighbours.neighbour_lists(base.descriptors, K_MAX))
            entry: dict = {"references": n, "k": K_MAX}

            def evaluate(lists, path=path, qsets=qsets):
                index = Index.load(path)
                index.neighbours = lists
                reports = [run_evaluation(index, qs, settings) for qs in qsets]
                aps = np.concatenate([np.asarray(r.per_query["map"], dtype=float) for r in reports])
                summary = {"map": round(float(np.nanmean(aps)), 4),
                           "mp@1": round(float(np.mean([r.summary["mp@1"] for r in reports])), 4)}
                return summary, aps

            ex_summary, ex_aps = evaluate(exact)
            entry["exact_lists"] = ex_summary
            for label, params in (("knn_default", KnnParams()), ("knn_2_probes", KnnParams(probes=2))):
                lists = drive(_neighbours.neighbour_lists(base.descriptors, K_MAX, ann=Sized(n), knn=params))
                equal_rows = float(np.mean(np.all(lists == exact, axis=1)))
                recall = float(np.mean([len(set(a) & set(e)) / K_MAX for a, e in zip(lists, exact)]))
                summary, aps = evaluate(lists)
                entry[label] = {"cells": params.cells(n), "probes": params.probes,
                                "rows_equal_to_exact": round(equal_rows, 4), "recall_at_k": round(recall, 4),
                                **summary, "queries_whose_ap_differs": int(np.sum(~np.isclose(aps, ex_aps,
                                                                                                equal_nan=True)))}
            out[name] = entry
            print(name, entry, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# ---- 1M: the build and an append -----------------------------------------------------------------


def million(work: Path, n: int, added: int = 1000, append_only: bool = False, lists_only: bool = False) -> dict:
    from museum_search.core.jobs._importing import import_index

    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    if not (work / "desc.npy").exists():
        prepare(work, n + added, queries=1)
    res: dict = {"n": n, "added": added, "generate_s": round(time.perf_counter() - t, 1)}
    everything = np.load(work / "desc.npy", mmap_mode="r")
    base_file = work / "base.npy"
    if not base_file.exists():
        b = np.lib.format.open_memmap(base_file, mode="w+", dtype=np.float16, shape=(n, everything.shape[1]))
        for a in range(0, n, 100_000):
            b[a:a + 100_000] = everything[a:min(n, a + 100_000)]
        b.flush()
        del b
    items = work / "items.csv"
    base_items = work / "base_items.csv"
    with open(items, encoding="utf-8") as f, open(base_items, "w", encoding="utf-8") as g:
        for i, line in enumerate(f):
            if i > n:
                break
            g.write(line)
    out = work / "index"
    if lists_only:  # the neighbour lists alone, again (the build's figure is one stage among others)
        res = {**json.loads(RESULTS.read_text())["million"], **res}
        cpu = time.process_time()
        _, total, st = timed_stages(_neighbours.neighbour_lists(np.load(base_file, mmap_mode="r"), K, ann=Sized(n)),
                                    {"cells": 0.09, "probes": 0.18, "scan": 0.9}, n)
        res["lists_alone"] = {"seconds": total, "cpu_s": round(time.process_time() - cpu, 1),
                              "stages": {"cells_s": st.get("cells"), "probes_s": round(st["probes"] - st["cells"], 2),
                                         "scan_s": round(st["scan"] - st["probes"], 2),
                                         "exact_ranking_s": round(total - st["scan"], 2)}}
        print("1M lists alone", res["lists_alone"], flush=True)
        return res
    if append_only:  # the build of an earlier run (its figures already in knn.json)
        res = {**json.loads(RESULTS.read_text())["million"], **res}
        return _append(res, out, everything, n, added)
    shutil.rmtree(out, ignore_errors=True)
    load = LoadAverage()
    t0 = time.perf_counter()
    stages: dict[str, float] = {}
    last = None
    gen = import_index(str(base_file), str(base_items), str(out), float16=True, ann="yes")
    try:
        while True:
            p = next(gen)
            if p.stage != last:
                stages[p.stage] = round(time.perf_counter() - t0, 2)
                last = p.stage
                print(f"  {stages[p.stage]:8.1f} s  {p.stage}", flush=True)
    except StopIteration:
        pass
    total = time.perf_counter() - t0
    names = list(stages)
    by_stage = {s: round((stages[names[i + 1]] if i + 1 < len(names) else total) - stages[s], 2)
                for i, s in enumerate(names)}
    res["build"] = {"seconds": round(total, 2), "stages_s": by_stage,
                    "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                    "load_average_1min": load.stop()}
    from museum_search.core.index._store import Index

    built_ann = Index.load(out).ann
    res["build"]["ann"] = None if built_ann is None else built_ann.params.to_dict()
    print("1M build", res["build"], flush=True)
    _save("million", res)
    return _append(res, out, everything, n, added)


def _append(res: dict, out: Path, everything: np.ndarray, n: int, added: int) -> dict:
    from museum_search.core.index._store import Index

    index = Index.load(out)
    old_lists = np.asarray(index.neighbours)
    after = everything[:n + added]
    m = np.arange(n, dtype=np.int64)
    load = LoadAverage()
    t = time.perf_counter()
    upd = drive(index.ann.updated(after, m))
    t_ann = time.perf_counter() - t
    t = time.perf_counter()
    lists = drive(_neighbours.update_neighbour_lists(old_lists, m, after, K, ann=upd, old_ann=index.ann))
    t_lists = time.perf_counter() - t
    append_load = load.stop()
    rng = np.random.default_rng(0)
    rows = np.sort(np.concatenate([rng.choice(n, 500, replace=False), n + rng.choice(added, 500, replace=False)]))
    exact = exact_rows(after, rows)
    old_rows = rows[rows < n]
    res["append"] = {"ann_update_s": round(t_ann, 2), "lists_update_s": round(t_lists, 2),
                     "seconds": round(t_ann + t_lists, 2), "load_average_1min": append_load,
                     "ann_tuning_after": None if upd.params.tuning is None else upd.params.tuning.to_dict(),
                     "ann_settings_after": {"nprobe": upd.params.nprobe, "shortlist": upd.params.shortlist},
                     "after_sample_old_rows": recalls(lists, old_rows, exact[rows < n]),
                     "after_sample_new_rows": recalls(lists, rows[rows >= n], exact[rows >= n]),
                     "before_sample_old_rows": recalls(old_lists, old_rows, exact_rows(everything[:n], old_rows))}
    print("append", res["append"], flush=True)
    return res


def _save(key: str, value: dict) -> None:
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    doc.setdefault("what", "neighbour lists of a large index: the k-NN graph method (core/knn.py) against "
                           "the old IVF regions, faiss HNSW and exact; ICFRR on real data; the 1M build and append")
    doc["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                      "note": "2 cores shared with other jobs: one run, seconds indicative"}
    doc[key] = {**value, "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=("synthetic", "real", "million"))
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--append-only", action="store_true", help="million: append to the index built by an earlier run in --work")
    ap.add_argument("--lists-only", action="store_true", help="million: time the neighbour lists alone (an earlier run's data)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_knn_"))
    if args.part == "synthetic":
        _save("synthetic", synthetic(work, args.n or 100_000))
    elif args.part == "real":
        _save("real", real())
    else:
        _save("million", million(work, args.n or 1_000_000, append_only=args.append_only,
                                         lists_only=args.lists_only))


if __name__ == "__main__":
    main()
