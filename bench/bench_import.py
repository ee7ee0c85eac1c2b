"""Bring your own descriptors: `museum-search import` time and index size, float32 vs --float16.

1. The sample collection: its index's descriptors exported (.npy + ITEMS.csv) and imported again.
2. A synthetic array of N x D float32 rows (default 100,000 x 1280, Gaussian, not normalized) with
   an ITEMS.csv of N rows (10 views per object, no file exists).

Each import is one run of the command line in a child process (start-up included), float32 and
--float16; the time, the child's peak resident memory and the index size on disk are reported and
saved to bench/results/import.json. The machine is shared: one run, seconds are indicative.
Usage: python bench/bench_import.py [--n 100000] [--dim 1280] [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SAMPLE = HERE.parent / "resources" / "sample"


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def timed_import(descriptors: Path, items: Path, out: Path, *extra: str) -> dict:
    """One import in a child process: its wall time, peak resident memory (wait4) and index size."""
    log = out.with_suffix(".log")
    t0 = time.perf_counter()
    with open(log, "w") as f:
        child = subprocess.Popen([sys.executable, "-m", "museum_search", "import", str(descriptors), "--items",
                                  str(items), "-o", str(out), *extra], stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(log.read_text())
    return {"seconds": round(seconds, 2), "index_bytes": folder_size(out),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "output": log.read_text().strip()}


def prepare(work: Path, n: int, dim: int) -> None:
    """Both inputs, written by a child process so that this one stays small: a forked child starts
    with its parent's peak resident memory, which would count in the imports' peaks."""
    subprocess.run([sys.executable, __file__, "--prepare", str(work), "--n", str(n), "--dim", str(dim)], check=True)


def export_sample(work: Path) -> tuple[Path, Path]:
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    index = run(build_index(SAMPLE / "collection", None, verification=False,
                            labelling=LabellingSpec("catalogue", str(SAMPLE / "catalogue.csv")))).index
    np.save(work / "sample.npy", np.asarray(index.descriptors))
    with open(work / "sample.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "instance", "title"])
        for it in index.items:
            w.writerow([it.path, it.instance, it.metadata.get("title", "")])
    return work / "sample.npy", work / "sample.csv"


def synthetic_inputs(work: Path, n: int, dim: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    path = work / "synthetic.npy"
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    for lo in range(0, n, 10_000):
        array[lo:lo + 10_000] = rng.standard_normal((min(10_000, n - lo), dim), dtype=np.float32)
    array.flush()
    del array
    with open(work / "synthetic.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "instance"])
        for i in range(n):
            w.writerow([f"objects/{i // 10:06d}/view-{i % 10}.jpg", f"object-{i // 10:06d}"])
    return path, work / "synthetic.csv"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=1280)
    ap.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--prepare", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prepare:
        export_sample(args.prepare)
        synthetic_inputs(args.prepare, args.n, args.dim)
        return
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-import-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"cpu_count": os.cpu_count(), "load_average": os.getloadavg()}
    prepare(work, args.n, args.dim)
    for name, desc, items in (("sample", work / "sample.npy", work / "sample.csv"),
                              (f"synthetic {args.n}x{args.dim}", work / "synthetic.npy", work / "synthetic.csv")):
        runs = {}
        for dtype, extra in (("float32", ()), ("float16", ("--float16",))):
            runs[dtype] = timed_import(desc, items, work / f"{name.split()[0]}-{dtype}", *extra)
            print(f"{name} {dtype}: {runs[dtype]['seconds']} s, {runs[dtype]['index_bytes'] / 1e6:.1f} MB on disk, "
                  f"peak RSS {runs[dtype]['peak_rss_mib']} MiB", flush=True)
        runs["npy_bytes"] = desc.stat().st_size
        results[name] = runs
    results["load_average_after"] = os.getloadavg()
    out = HERE / "results" / "import.json"
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
