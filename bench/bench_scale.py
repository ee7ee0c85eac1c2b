"""Scale: a million references on one machine (issue 12).

Synthetic but clustered 1280-d float16 descriptors: N / 10 objects with 10 noisy views each, the
objects themselves grouped in themes (so unrelated objects are not orthogonal, as with real CNN
descriptors: cosines of unrelated objects around 0.3, of two views of one object around 0.8).
Queries are new noisy views of indexed objects (float32), given as descriptors.

For each size (default 100,000 and 1,000,000), in child processes (so each peak resident memory is
its own, from ``wait4`` / ``VmHWM``):

1. **build**: ``import_index`` of the .npy with ``--float16`` (checks and normalization, SQLite
   items, the approximate index, each reference's 32 nearest neighbours, the atomic save), with
   the time of every stage;
2. **open**: a new process opens the index and answers one query: the time to the first result,
   from the process start and from ``Index.load``;
3. **query**: single-query latency (p50, p95) with the approximate search, then with the exact
   search, in the same process; recall@10 of the approximate top 10 against the exact top 10;
   MP@1 of both against the query's object; ICFRR per query (approximate search + ICFRR from the
   stored neighbour lists); resident memory after the approximate queries and after the exact ones
   (the exact search reads the whole memory-mapped matrix: its pages count as resident).

The machine is shared and noisy: one run, ratios and memory are the figures; seconds are indicative.
Results: bench/results/scale.json. Usage:
    python bench/bench_scale.py [--sizes 100000 1000000] [--queries 200] [--exact-queries 50] [--work DIR]

**Search speed against faiss** (``--part search``, issue 24; bench/results/search_speed.json): for
each size and each kind of data, ``themes`` (above) and ``objects`` (N / 10 objects with random
centres, no themes, 10 views each: two views of one object at cosine ~0.74, unrelated objects ~0),
in a child process on the memory-mapped float16 .npy:

* build ``AnnIndex.build`` (default parameters, tuned on the data: ``params.tuning``);
* per query (one at a time, the methods interleaved in a new random order for each query, so that
  the machine's load and the caches' state fall on all alike),
  p50/p95 ms and recall@10 against museum-search's exact top 10:
  - ``exact``: ``search.top(index, q, 10, "exact")`` on the memory map (what the app's exact
    search costs for a top 10): each query's exact prefix (``_exact.exact_prefix``: faiss's scan of
    the file's view for the top 1,024, the rows above the 1,024th score) ranked, every score only
    when the prefix is shorter than 10 (``exact_prefix_rows``: the prefixes' sizes, how many fell
    back); runs labelled ``-prefix`` (``--label prefix``); earlier runs timed ``exact_all_scores``
    under this name;
  - ``exact_all_scores``: ``order(exact_scores(d, q), 10)``: every reference's score (faiss's view
    searched with k = N), then the top 10 (what the pipeline's ``score_matrix`` costs);
  - ``faiss_fp16_flat``: faiss ``IndexScalarQuantizer`` fp16, inner product, ``search(q, 10)``
    (its own in-memory copy of the float16 codes);
  - ``ann``: ``AnnIndex.search(d, q, 10)`` (what ``search.top(..., "ann")`` does): IVF-PQ shortlist,
    exact re-scoring of it from the memory map, ranking of the shortlist only;
  - ``faiss_ivfpq_refine``: the same faiss IVF-PQ index (same nprobe) in a faiss ``IndexRefine``
    with an fp16 flat index (k_factor = shortlist / 10): the IVF-PQ search and the exact re-scoring
    of the same shortlist, in faiss alone; ``faiss_ivfpq`` its IVF-PQ search alone;
  - ``faiss_fp16_view_k10``: the faiss view of the memory-mapped file that ``exact`` scans (with
    k = N, every score), searched for its top 10 only: where exact's time goes (the memory map, or
    asking faiss for every score);
* ratios ``exact / faiss_fp16_flat`` (and ``exact_all_scores / faiss_fp16_flat``) and
  ``ann / faiss_ivfpq_refine`` of the p50, p95 and p25 wall
  times and of the p50 CPU time of the process (``time.process_time``: what the machine's other
  work, which preempts us, does not add; a few-millisecond call's p50 wall time falls on either
  side of a preemption); ``auto_recall_at_10`` (the default search's); the approximate index's
  build time (with its tuning); resident memory at each step (``rss_mib``: VmRSS, VmHWM, RssAnon,
  RssFile; ``ours_after_queries`` before faiss's copies exist) and the load average.
    python bench/bench_scale.py --part search --sizes 100000 [--kinds themes objects] [--queries 200]
        [--label prefix]  (runs are stored as KIND-N[-LABEL]: a label keeps the earlier runs)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DIM = 1280
VIEWS = 10
THEMES = 1000


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def prepare(work: Path, n: int, queries: int, seed: int = 0, kind: str = "themes") -> None:
    """desc.npy (n x DIM float16), items.csv, queries.npy (float32) and queries.json (their objects).
    ``kind``: "themes" (objects grouped in themes) or "objects" (random object centres, no themes)."""
    rng = np.random.default_rng(seed)
    objects = n // VIEWS
    common = _unit(rng.standard_normal(DIM))
    themes = _unit(rng.standard_normal((THEMES, DIM)))
    theme_of = rng.integers(0, THEMES, objects)
    desc = np.lib.format.open_memmap(work / "desc.npy", mode="w+", dtype=np.float16, shape=(n, DIM))
    step = 10_000  # objects at a time
    centres_seed = rng.integers(1 << 31)

    def centres(a: int, b: int) -> np.ndarray:
        r = np.random.default_rng([centres_seed, a])
        own = _unit(r.standard_normal((b - a, DIM)))
        if kind == "objects":
            return own
        return _unit(0.55 * common + 0.55 * themes[theme_of[a:b]] + 0.65 * own)

    def views(c: np.ndarray, r: np.random.Generator, k: int) -> np.ndarray:
        noise = _unit(r.standard_normal((len(c), k, DIM)))
        return _unit(c[:, None, :] + 0.6 * noise)

    picked = np.sort(rng.choice(objects, queries, replace=False))
    qs = []
    for a in range(0, objects, step):
        b = min(objects, a + step)
        r = np.random.default_rng([seed, a, 1])
        c = centres(a, b)
        desc[a * VIEWS:b * VIEWS] = views(c, r, VIEWS).reshape(-1, DIM).astype(np.float16)
        mine = picked[(picked >= a) & (picked < b)]
        if len(mine):  # a new view of each picked object (not one of the indexed views)
            qs.append(views(c[mine - a], np.random.default_rng([seed, a, 2]), 1)[:, 0])
    desc.flush()
    del desc
    with open(work / "items.csv", "w", encoding="utf-8") as f:
        f.write("path,instance,title\n")
        for i in range(n):
            f.write(f"obj{i // VIEWS:07d}/view{i % VIEWS}.jpg,obj{i // VIEWS:07d},Object {i // VIEWS} view {i % VIEWS}\n")
    q = np.concatenate(qs).astype(np.float32)
    np.save(work / "queries.npy", q)
    (work / "queries.json").write_text(json.dumps([f"obj{int(o):07d}" for o in picked]))


BUILD = r"""
import json, resource, sys, time
from museum_search.core.jobs._importing import import_index
t0 = time.perf_counter(); stages = {}; last = None
gen = import_index(sys.argv[1], sys.argv[2], sys.argv[3], float16=True, ann="yes")
try:
    while True:
        p = next(gen)
        if p.stage != last:
            stages[p.stage] = round(time.perf_counter() - t0, 2); last = p.stage
except StopIteration as stop:
    report = stop.value
total = time.perf_counter() - t0
print(json.dumps({"seconds": round(total, 2), "stage_starts": stages,
                  "neighbours": report.index.neighbours_stored,
                  "ann": report.index.ann.params.to_dict() if report.index.ann is not None else None,
                  "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""

QUERY = r"""
import json, sys, time
started = float(sys.argv[4])
import numpy as np
from museum_search.core.index._store import Index
from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, descriptor_query
from museum_search.core.answer._rerank import RerankOptions

def rss():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            out[line.split(":")[0]] = round(int(line.split()[1]) / 1024, 1)
    return out

index_path, n_exact = sys.argv[1], int(sys.argv[5])
qd = np.load(sys.argv[2]); truth = json.load(open(sys.argv[3]))
queries = [descriptor_query(q, f"row {i}") for i, q in enumerate(qd)]
t_load = time.time()
index = Index.load(index_path)
opened = time.time() - t_load
pipe = QueryPipeline.for_descriptors(index, QuerySettings(k=10, search="auto"))
first = pipe.answer(queries[:1])[0]
res = {"first_result_from_process_start_s": round(time.time() - started, 3),
       "first_result_from_load_s": round(time.time() - t_load, 3), "load_s": round(opened, 3),
       "auto_mode": pipe.search_mode}

def run(p, qs):
    lat, tops = [], []
    for q in qs:
        t = time.perf_counter(); a = p.answer([q])[0]; lat.append(time.perf_counter() - t)
        tops.append([r.row for r in a.results])
    return np.array(lat), tops

ann = QueryPipeline.for_descriptors(index, QuerySettings(k=10, search="ann"))
lat_a, top_a = run(ann, queries)
res["ann"] = {"p50_ms": round(1000 * float(np.median(lat_a)), 2), "p95_ms": round(1000 * float(np.percentile(lat_a, 95)), 2),
              "queries": len(queries), "mp1": float(np.mean([index.items[t[0]].instance == truth[i] for i, t in enumerate(top_a)]))}
res["rss_after_ann_mib"] = rss()
ic = QueryPipeline.for_descriptors(index, QuerySettings(k=10, search="ann", rerank="icfrr",
                                                         options=RerankOptions(k_q=10, k_g=10)))
ic.answer(queries[:1])  # the ICFRR graph of the stored neighbour lists is built once per index
lat_i, top_i = run(ic, queries[:n_exact])
res["icfrr_ann"] = {"p50_ms": round(1000 * float(np.median(lat_i)), 2), "p95_ms": round(1000 * float(np.percentile(lat_i, 95)), 2),
                    "queries": n_exact, "k_q": 10, "k_g": 10,
                    "mp1": float(np.mean([index.items[t[0]].instance == truth[i] for i, t in enumerate(top_i)]))}
res["rss_after_icfrr_mib"] = rss()
ex = QueryPipeline.for_descriptors(index, QuerySettings(k=10, search="exact"))
lat_e, top_e = run(ex, queries[:n_exact])
res["exact"] = {"p50_ms": round(1000 * float(np.median(lat_e)), 2), "p95_ms": round(1000 * float(np.percentile(lat_e, 95)), 2),
                "queries": n_exact, "mp1": float(np.mean([index.items[t[0]].instance == truth[i] for i, t in enumerate(top_e)]))}
res["recall_at_10"] = float(np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(top_a, top_e)]))
res["ann_top1_equals_exact_top1"] = float(np.mean([a[0] == e[0] for a, e in zip(top_a, top_e)]))
res["ann_speedup_p50"] = round(res["exact"]["p50_ms"] / res["ann"]["p50_ms"], 1)
res["rss_after_exact_mib"] = rss()
print(json.dumps(res))
"""


SEARCH = r"""
import json, sys, time
from types import SimpleNamespace
import numpy as np
from museum_search.core.index import _approximate, _exact, _modes
from museum_search.core.answer import _search as search
from museum_search.core.progress import drive
from museum_search.core.ranking import order

import os

# resident memory (MiB) from /proc/self/status: VmRSS (now), VmHWM (the peak so far), RssAnon (the
# process's own memory: faiss's copies, the IVF-PQ), RssFile (mapped files' pages: the .npy, once per map)
def rss():
    out = {}
    for line in open("/proc/self/status"):
        key = line.split(":")[0]
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = round(int(line.split()[1]) / 1024, 1)
    return out

def load():
    return [round(x, 2) for x in os.getloadavg()]

d = np.load(sys.argv[1], mmap_mode="r")
qs = np.load(sys.argv[2])
n = len(d)
res = {"rss_mib": {"start": rss()}, "load_average": {"start": load()}}
t = time.perf_counter()
index = drive(_approximate.AnnIndex.build(d))
res["ann_build_s"] = round(time.perf_counter() - t, 2)
res["ann_params"] = index.params.to_dict()
res["rss_mib"]["after_build"] = rss()
res["load_average"]["after_build"] = load()
for i in range(min(5, len(qs))):  # museum-search's own queries, before faiss's copies exist
    order(_exact.exact_scores(d, qs[i:i + 1]), 10)
    index.search(d, qs[i:i + 1], 10)
res["rss_mib"]["ours_after_queries"] = rss()
faiss = _exact._faiss()
flat = faiss.IndexScalarQuantizer(d.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
refine_codes = faiss.IndexScalarQuantizer(d.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_L2)
for a in range(0, n, 16384):
    x = np.asarray(d[a:a + 16384], dtype=np.float32)
    flat.add(x)
    refine_codes.add(x)
shortlist = index.params.shortlist
refine = faiss.IndexRefine(index._index, refine_codes)
refine.k_factor = shortlist / 10
res["rss_mib"]["after_faiss_copies"] = rss()
view = _exact._flat_view(d)  # the faiss view of the file's own pages that exact search scans

class Refs:  # what search.top reads of an Index: the descriptors, their dimension and count
    def __init__(self, d):
        self.descriptors, self.meta = d, SimpleNamespace(dim=d.shape[1])
    def __len__(self):
        return len(self.descriptors)
refs = Refs(d)

def ms_exact(q):  # the app's exact top 10: the exact prefix, ranked
    return search.top(refs, q, 10, "exact")[0][0]
def ms_exact_all(q):  # every score (faiss's view with k = N), then the top 10
    s = _exact.exact_scores(d, q)
    return order(s, 10)[0]
def ms_ann(q):
    return index.search(d, q, 10)[0][0]
def f_flat(q):
    return flat.search(q, 10)[1][0]
def f_view(q):
    return view.search(q, 10)[1][0]
def f_refine(q):
    return refine.search(q, 10)[1][0]
def f_ivfpq(q):
    return index._index.search(q, shortlist)[1][0]
methods = {"exact": ms_exact, "exact_all_scores": ms_exact_all, "faiss_fp16_flat": f_flat, "ann": ms_ann, "faiss_ivfpq_refine": f_refine,
           "faiss_ivfpq": f_ivfpq}
if view is not None:  # the same scan as faiss_fp16_flat but of the memory map, k = 10 (not k = N)
    methods["faiss_fp16_view_k10"] = f_view
for f in methods.values():  # warm: the memory map's pages, faiss's threads
    f(qs[:1])
times = {k: [] for k in methods}
cpu = {k: [] for k in methods}  # CPU time of the process (all its threads): what preemption does not add
tops = {k: [] for k in methods}
names = list(methods)
shuffle = np.random.default_rng(0)
res["load_average"]["queries_start"] = load()
t_queries = time.perf_counter()
for i in range(len(qs)):
    q = qs[i:i + 1]
    for k in shuffle.permutation(names):  # a new order per query: no method always follows another
        t, c = time.perf_counter(), time.process_time()
        top = methods[k](q)
        times[k].append(1000 * (time.perf_counter() - t))
        cpu[k].append(1000 * (time.process_time() - c))
        tops[k].append(np.asarray(top))
res["queries_s"] = round(time.perf_counter() - t_queries, 1)
res["load_average"]["queries_end"] = load()
truth = tops["exact"]
out = {}
for k in names:
    v = np.array(times[k])
    row = {"p50_ms": round(float(np.median(v)), 3), "p95_ms": round(float(np.percentile(v, 95)), 3),
           "p25_ms": round(float(np.percentile(v, 25)), 3), "cpu_p50_ms": round(float(np.median(cpu[k])), 3)}
    if k != "faiss_ivfpq":
        row["recall_at_10"] = round(float(np.mean([len(np.intersect1d(a, b)) / 10 for a, b in zip(tops[k], truth)])), 4)
    out[k] = row
out["exact"]["top10_identical_to_faiss_fp16_flat"] = round(float(np.mean(
    [np.array_equal(a, b) for a, b in zip(tops["exact"], tops["faiss_fp16_flat"])])), 4)
out["exact"]["top10_identical_to_exact_all_scores"] = round(float(np.mean(
    [np.array_equal(a, b) for a, b in zip(tops["exact"], tops["exact_all_scores"])])), 4)
sizes = [len(_exact.exact_prefix(d, qs[i:i + 1], search.PREFIX_ROWS)[0][0]) for i in range(len(qs))]
res["exact_prefix_rows"] = {"m": search.PREFIX_ROWS, "min": int(min(sizes)), "p50": float(np.median(sizes)),
                            "max": int(max(sizes)), "queries_shorter_than_10": int(sum(x < 10 for x in sizes))}
res["queries"] = len(qs)
res["methods"] = out
res["ratio_exact_to_faiss_fp16_flat_p50"] = round(out["exact"]["p50_ms"] / out["faiss_fp16_flat"]["p50_ms"], 2)
res["ratio_ann_to_faiss_ivfpq_refine_p50"] = round(out["ann"]["p50_ms"] / out["faiss_ivfpq_refine"]["p50_ms"], 2)
res["ratio_exact_to_faiss_fp16_flat_p95"] = round(out["exact"]["p95_ms"] / out["faiss_fp16_flat"]["p95_ms"], 2)
for stat in ("p50", "p95"):
    res[f"ratio_exact_all_scores_to_faiss_fp16_flat_{stat}"] = round(
        out["exact_all_scores"][f"{stat}_ms"] / out["faiss_fp16_flat"][f"{stat}_ms"], 2)
res["ratio_ann_to_faiss_ivfpq_refine_p95"] = round(out["ann"]["p95_ms"] / out["faiss_ivfpq_refine"]["p95_ms"], 2)
for stat in ("p25", "cpu_p50"):
    res[f"ratio_exact_to_faiss_fp16_flat_{stat}"] = round(out["exact"][f"{stat}_ms"] / out["faiss_fp16_flat"][f"{stat}_ms"], 2)
    res[f"ratio_ann_to_faiss_ivfpq_refine_{stat}"] = round(out["ann"][f"{stat}_ms"] / out["faiss_ivfpq_refine"][f"{stat}_ms"], 2)
res["auto_mode"] = _modes.resolve_mode("auto", n, index)
res["auto_recall_at_10"] = out["ann"]["recall_at_10"] if res["auto_mode"] == "ann" else 1.0
if "faiss_fp16_view_k10" in out:  # where exact's time goes: the memory map, or the k = N search
    res["ratio_exact_to_faiss_fp16_view_k10_p50"] = round(out["exact"]["p50_ms"] / out["faiss_fp16_view_k10"]["p50_ms"], 2)
    res["ratio_faiss_fp16_view_k10_to_faiss_fp16_flat_p50"] = round(
        out["faiss_fp16_view_k10"]["p50_ms"] / out["faiss_fp16_flat"]["p50_ms"], 2)
res["rss_mib"]["end"] = rss()
print(json.dumps(res))
"""


def search_speed(work: Path, n: int, kind: str, queries: int) -> dict:
    """The search part (``--part search``) at size ``n`` on data of ``kind``."""
    d = work / f"{kind}-n{n}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--prepare", str(d), "--n", str(n), "--queries", str(queries),
                    "--kind", kind], check=True)
    print(f"[{kind} {n:,}] data generated in {time.perf_counter() - t:.0f} s", flush=True)
    load = os.getloadavg()[0]
    res, peak = child(SEARCH, str(d / "desc.npy"), str(d / "queries.npy"))
    res.update({"n": n, "dim": DIM, "kind": kind, "views_per_object": VIEWS, "peak_rss_mib": peak,
                "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
                "command": "python bench/bench_scale.py " + " ".join(sys.argv[1:]),
                "rss_counts": "VmRSS/VmHWM of the search process (MiB, /proc/self/status): RssFile is the "
                              "descriptors' memory-mapped float16 .npy pages, counted once per map that touched "
                              "them (the numpy map, read by the build, and faiss's view of the same file, read by "
                              "exact and ann: the page cache holds them once); RssAnon is the process's own "
                              "memory (the IVF-PQ; after 'ours_after_queries', faiss's two fp16 copies, "
                              "2 x N x D bytes, for the peers). 'ours_after_queries' is museum-search's query "
                              "memory: built, 5 exact and 5 approximate queries answered, no peer yet"})
    print(f"[{kind} {n:,}] {json.dumps(res)}", flush=True)
    return res


def child(script: str, *args: str) -> tuple[dict, float]:
    """Run ``script`` in a new interpreter; its JSON output and peak resident memory (MiB, wait4)."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child failed: {out}")
    return json.loads(out.strip().splitlines()[-1]), round(usage.ru_maxrss / 1024, 1)


def one_size(work: Path, n: int, queries: int, n_exact: int) -> dict:
    d = work / f"n{n}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--prepare", str(d), "--n", str(n), "--queries", str(queries)], check=True)
    prep = time.perf_counter() - t
    print(f"[{n:,}] data generated in {prep:.0f} s", flush=True)
    build, build_peak = child(BUILD, str(d / "desc.npy"), str(d / "items.csv"), str(d / "idx"))
    build["peak_rss_mib"] = build_peak
    size = sum(p.stat().st_size for p in (d / "idx").iterdir() if p.is_file())
    files = {p.name.split("-")[0]: p.stat().st_size for p in (d / "idx").iterdir() if p.is_file()}
    print(f"[{n:,}] built in {build['seconds']:.0f} s, peak {build_peak:.0f} MiB: {build['stage_starts']}", flush=True)
    os.sync()
    q, q_peak = child(QUERY, str(d / "idx"), str(d / "queries.npy"), str(d / "queries.json"), repr(time.time()),
                      str(n_exact))
    q["peak_rss_mib"] = q_peak
    print(f"[{n:,}] {json.dumps(q)}", flush=True)
    return {"n": n, "dim": DIM, "views_per_object": VIEWS, "generate_s": round(prep, 1), "build": build,
            "index_bytes": size, "file_bytes": files, "query": q}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--exact-queries", type=int, default=50)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated data and indexes")
    ap.add_argument("--prepare", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--part", choices=["scale", "search"], default="scale",
                    help="scale: build, open and query through the app (scale.json); search: exact and "
                         "approximate search against faiss on two kinds of data (search_speed.json)")
    ap.add_argument("--kinds", nargs="+", choices=["themes", "objects"], default=["themes", "objects"])
    ap.add_argument("--kind", default="themes", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help="--part search: store the runs as KIND-N-LABEL (keeps earlier runs)")
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare, args.n, args.queries, kind=args.kind)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    if args.part == "search":
        out = HERE / "results" / "search_speed.json"
        results = json.loads(out.read_text()) if out.exists() else {}
        results.setdefault("runs", {})
        machine = {"cpus": os.cpu_count(), "load_at_start": round(os.getloadavg()[0], 2)}
        if not args.label:
            results["machine"] = machine
            results["command"] = "python bench/bench_scale.py " + " ".join(sys.argv[1:])
        for n in args.sizes:
            for kind in args.kinds:
                key = f"{kind}-{n}" + (f"-{args.label}" if args.label else "")
                results["runs"][key] = search_speed(work, n, kind, args.queries)
                results["runs"][key]["machine"] = machine
                out.write_text(json.dumps(results, indent=2))
                if not args.keep:
                    shutil.rmtree(work / f"{kind}-n{n}", ignore_errors=True)
        print(f"written {out}")
        return
    out = HERE / "results" / "scale.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    results.setdefault("runs", {})
    results["machine"] = {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()[0]}
    for n in args.sizes:
        results["runs"][str(n)] = one_size(work, n, args.queries, args.exact_queries)
        results["runs"][str(n)]["load_after"] = round(os.getloadavg()[0], 2)
        out.write_text(json.dumps(results, indent=2))
        if not args.keep:
            shutil.rmtree(work / f"n{n}", ignore_errors=True)
    print(f"written {out}")


if __name__ == "__main__":
    main()
