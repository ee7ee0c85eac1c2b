"""Updating the neighbour lists (and the approximate index) after an update, against computing them
from scratch (issue 21, item 5: "update in seconds").

Synthetic clustered 1280-d float16 descriptors (``bench_scale.prepare``: objects of 10 noisy views,
grouped in themes), memory-mapped from a .npy. For each size, the first N rows are the index and
the 100 rows after them (10 objects the index does not have) the photos added. Scenarios: add 1,
add 100, remove 1 (a random reference). Each reference keeps its 32 nearest neighbours
(:data:`museum_search.core.index._store.K_MAX`).

* **exact** (below ``_modes.AUTO_MIN_REFERENCES``, 20,000 by default): ``update_neighbour_lists``
  against ``neighbour_lists`` of the updated descriptors; identical = equal arrays.
* **ann** (from ``_modes.AUTO_MIN_REFERENCES``, 100,000 by default, as ``update`` does with ``--ann auto``):
  ``AnnIndex.updated`` + ``update_neighbour_lists``. From scratch = ``AnnIndex.build`` +
  ``neighbour_lists`` (the k-NN graph method) as measured on the index before the update (the same
  size give or take 100, not run again per scenario). Checked against exact lists computed here
  (float64, every row): the new rows and the rows that lost a neighbour hold their exact lists,
  every kept row the exact top of its old list and the new rows; recall@32 of a sample of 1,000
  rows after the update (``--full-check``: equal to ``neighbour_lists`` of the updated index, a
  full computation; ``--rebuild``: also against a rebuild from scratch: rows equal and neighbours
  in common).

The machine is shared (2 cores, other jobs): one run, seconds are indicative.
Results: bench/results/update_neighbours.json. Usage:
    python bench/bench_update_neighbours.py [--exact-sizes 20000] [--ann-sizes 100000] [--full-check]
                                            [--rebuild] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_knn import exact_rows  # the lists by the definition: an independent computation
from bench_scale import prepare

from museum_search.core.index import _approximate, _neighbours
from museum_search.core.index._store import K_MAX
from museum_search.core.progress import drive
from museum_search.core.ranking import neg_distance, order

EXTRA = 100


def timed(gen):
    t = time.perf_counter()
    out = drive(gen)
    return out, round(time.perf_counter() - t, 3)


def scenarios(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    yield "add 1", [], np.arange(n, n + 1)
    yield "add 100", [], np.arange(n, n + EXTRA)
    yield "remove 1", [int(rng.integers(n))], np.arange(n, n)


def updated_matrix(work: Path, name: str, base: np.ndarray, extra: np.ndarray, removed: list[int],
                   added: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The descriptors after the update (kept rows in order, then the added ones), memory-mapped
    from a .npy like an index's, and the old -> new map."""
    n = len(base)
    keep = np.ones(n, dtype=bool)
    keep[removed] = False
    m = np.full(n, -1, dtype=np.int64)
    m[keep] = np.arange(int(keep.sum()))
    f = work / f"after-{name.replace(' ', '-')}.npy"
    out = np.lib.format.open_memmap(f, mode="w+", dtype=np.float16, shape=(int(keep.sum()) + len(added), base.shape[1]))
    step = 50_000
    pos = 0
    for a in range(0, n, step):
        part = np.asarray(base[a:a + step])[keep[a:a + step]]
        out[pos:pos + len(part)] = part
        pos += len(part)
    out[pos:] = extra[added - n]
    out.flush()
    del out
    return np.load(f, mmap_mode="r"), m


def merged_exactly(d: np.ndarray, got: np.ndarray, old: np.ndarray, m: np.ndarray, k: int) -> dict:
    """With an approximate index: the new rows and the rows that lost a neighbour hold their exact
    lists; every kept row holds the exact top ``k`` of its old list (renumbered) and the new rows."""
    kept_old = np.flatnonzero(m >= 0)
    new_rows = np.setdiff1d(np.arange(len(d)), m[kept_old])
    renumbered = m[np.asarray(old[kept_old, :k], dtype=np.int64)]
    lost = (renumbered < 0).any(axis=1)
    redo = np.union1d(m[kept_old[lost]], new_rows)
    redo_exact = bool(np.array_equal(got[redo], exact_rows(d, redo, k))) if len(redo) else True
    changed = np.flatnonzero(np.any(got[m[kept_old[~lost]]] != renumbered[~lost], axis=1))
    ok = True
    newx = np.asarray(d[new_rows], dtype=np.float64)
    for i in changed:
        row = int(m[kept_old[~lost]][i])
        x = np.asarray(d[row], dtype=np.float64)
        cands = np.concatenate([np.sort(renumbered[~lost][i]), new_rows])
        dots = np.concatenate([np.asarray(d[cands[:k]], np.float64) @ x, newx @ x])
        best = cands[order(neg_distance(dots.astype(np.float32)[None, :]), k)[0]]
        ok &= bool(np.array_equal(got[row], best))
    return {"recomputed_rows": int(len(redo)), "recomputed_rows_exact": redo_exact,
            "kept_rows_changed": int(len(changed)), "kept_rows_merged_exactly": ok}


def one_size(work: Path, n: int, mode: str, full_check: bool, rebuild: bool) -> dict:
    prepare(work, n + EXTRA, queries=1)
    everything = np.load(work / "desc.npy", mmap_mode="r")
    extra = np.asarray(everything[n:])
    base_file = work / "base.npy"
    b = np.lib.format.open_memmap(base_file, mode="w+", dtype=np.float16, shape=(n, everything.shape[1]))
    b[:] = everything[:n]
    b.flush()
    del b, everything
    base = np.load(base_file, mmap_mode="r")
    k = K_MAX
    res: dict = {"references": n, "mode": mode, "k": k, "scenarios": {}}
    old_ann = None
    if mode == "ann":
        old_ann, t_ann = timed(_approximate.AnnIndex.build(base))
        res["base_ann_build_s"] = t_ann
        res["ann"] = old_ann.summary()
    old, t_old = timed(_neighbours.neighbour_lists(base, k, ann=old_ann))
    res["base_lists_s"] = t_old
    built = f", ann build {res['base_ann_build_s']:.1f} s" if old_ann else ""
    print(f"{n:,} {mode}: base lists {t_old:.1f} s{built}", flush=True)
    for name, removed, added in scenarios(n):
        after, m = updated_matrix(work, name, base, extra, removed, added)
        row: dict = {"added": len(added), "removed": len(removed)}
        if mode == "exact":
            got, t_inc = timed(_neighbours.update_neighbour_lists(old, m, after, k))
            ref, t_full = timed(_neighbours.neighbour_lists(after, k))
            row.update(incremental_s=t_inc, from_scratch_s=t_full, speedup=round(t_full / max(t_inc, 1e-9), 1),
                       identical=bool(np.array_equal(got, ref)))
        else:
            upd, t_upd = timed(old_ann.updated(after, m))
            got, t_lists = timed(_neighbours.update_neighbour_lists(old, m, after, k, ann=upd, old_ann=old_ann))
            t_full = res["base_ann_build_s"] + res["base_lists_s"]
            row.update(ann_update_s=t_upd, lists_update_s=t_lists, incremental_s=round(t_upd + t_lists, 3),
                       from_scratch_s=round(t_full, 3), speedup=round(t_full / max(t_upd + t_lists, 1e-9), 1))
            if full_check:
                ref, t_same = timed(_neighbours.neighbour_lists(after, k, ann=upd))
                row.update(lists_from_scratch_same_ann_s=t_same, checked_rows="all",
                           identical=bool(np.array_equal(got, ref)))
            else:
                row.update(merged_exactly(after, got, old, m, k))
                sample = np.sort(np.random.default_rng(1).choice(len(after), 1000, replace=False))
                ref = exact_rows(after, sample, k)
                row["recall_at_32_sample_after"] = round(float(np.mean(
                    [len(np.intersect1d(a, b)) / k for a, b in zip(got[sample], ref)])), 4)
            if rebuild:
                fresh, t_build = timed(_approximate.AnnIndex.build(after))
                scratch, t_fl = timed(_neighbours.neighbour_lists(after, k, ann=fresh))
                row.update(rebuild_s=round(t_build + t_fl, 3),
                           rows_equal_to_rebuild=round(float(np.mean(np.all(got == scratch, axis=1))), 4),
                           overlap_with_rebuild=round(float(np.mean(
                               [len(np.intersect1d(a, b)) / k for a, b in zip(got, scratch)])), 4))
        res["scenarios"][name] = row
        print(f"  {name}: {row}", flush=True)
        del after
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exact-sizes", type=int, nargs="*", default=[20_000])
    ap.add_argument("--ann-sizes", type=int, nargs="*", default=[100_000])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--full-check", action="store_true", help="ann: compare every row (a full computation each)")
    ap.add_argument("--rebuild", action="store_true", help="ann: also compare with a rebuild from scratch")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "update_neighbours.json")
    args = ap.parse_args()
    runs = []
    for n, mode in [*((n, "exact") for n in args.exact_sizes), *((n, "ann") for n in args.ann_sizes)]:
        work = Path(tempfile.mkdtemp(prefix="bench-update-nb-", dir=args.work))
        try:
            runs.append(one_size(work, n, mode, args.full_check, args.rebuild))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out = {
        "what": "neighbour lists (and approximate index) updated vs computed from scratch after an update",
        "descriptors": "synthetic clustered 1280-d float16 (bench_scale.prepare), memory-mapped",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "note": "2 cores shared with other jobs: one run, seconds indicative"},
        "runs": runs,
    }
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
