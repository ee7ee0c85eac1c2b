"""Readers against a writer (issue 19, item 3): ``Index.load`` called over and over by reader processes
while one writer process saves the same index again and again (each save a new generation: the
manifest is replaced, then the previous generation's files are removed).

Writes bench/results/load_race.json: the number of loads, how many failed (and the first messages),
the number of saves made while the readers ran, and the time each load took (p50, p99, max), with
the machine's load average. The writer's saves are spread evenly over the loads (the writer
waits for the readers' count between saves), so every load races a save. One run; the machine is
shared.

The index is the bundled sample collection's (24 references, verification on: 8 data files a
generation), built once into a temporary folder.

    .venv/bin/python bench/bench_load_race.py [--loads 100000] [--saves 200] [--readers 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from museum_search.core.errors import IndexFormatError
from museum_search.core.index._store import Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive as run

SAMPLE = REPO / "resources" / "sample"


def _reader(path: str, n: int, start, done, out) -> None:
    times = np.empty(n, np.float64)
    failures: list[str] = []
    start.wait()
    begin = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        try:
            index = Index.load(path)
            if len(index.items) != len(index.descriptors):
                failures.append("inconsistent")
        except IndexFormatError as exc:
            failures.append(str(exc))
        times[i] = time.perf_counter() - t0
        if i % 50 == 49:
            with done.get_lock():
                done.value += 50
    out.put((times.tolist(), failures, time.perf_counter() - begin))


def _writer(path: str, saves: int, total: int, start, done, out) -> None:
    """Save ``saves`` times, spread evenly over the readers' ``total`` loads (paced by their count,
    so the saves span the loads whatever the machine's load)."""
    index = Index.load(path, mmap=False)
    start.wait()
    t0 = time.perf_counter()
    for k in range(saves):
        while done.value < k * total // saves:
            time.sleep(0.002)
        index.descriptors = np.roll(np.asarray(index.descriptors), 1, axis=0).copy()
        index.save()
    out.put(("writer", saves, time.perf_counter() - t0, done.value))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", type=int, default=100_000, help="Index.load calls in all")
    ap.add_argument("--saves", type=int, default=200)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "load_race.json")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="load-race-") as tmp:
        path = Path(tmp) / "index"
        run(build_index(SAMPLE / "collection", path, BackboneConfig(size=64),
                        LabellingSpec("catalogue", str(SAMPLE / "catalogue.csv"))))
        t0 = time.perf_counter()
        for _ in range(200):
            Index.load(path)
        per_load = (time.perf_counter() - t0) / 200
        t0 = time.perf_counter()
        idx = Index.load(path, mmap=False)
        for _ in range(5):
            idx.save()
        per_save = (time.perf_counter() - t0) / 5

        ctx = mp.get_context("spawn")
        start, out, done = ctx.Barrier(args.readers + 1), ctx.Queue(), ctx.Value("l", 0)
        share = args.loads // args.readers
        procs = [ctx.Process(target=_reader, args=(str(path), share, start, done, out)) for _ in range(args.readers)]
        procs.append(ctx.Process(target=_writer, args=(str(path), args.saves, share * args.readers, start, done, out)))
        for p in procs:
            p.start()
        times: list[float] = []
        failures: list[str] = []
        reader_seconds: list[float] = []
        writer = None
        for _ in procs:
            got = out.get()
            if got[0] == "writer":
                writer = got
            else:
                times += got[0]
                failures += got[1]
                reader_seconds.append(round(got[2], 1))
        for p in procs:
            p.join()
        t = np.array(times) * 1000
        result = {
            "loads": len(times),
            "failures": len(failures),
            "first_failures": failures[:5],
            "saves": writer[1],
            "writer_seconds": round(writer[2], 1),
            "loads_before_last_save": writer[3],  # the saves are spread over the loads by their count
            "readers": args.readers,
            "reader_seconds": reader_seconds,  # each reader's loads ran while the writer saved
            "load_ms": {"p50": round(float(np.percentile(t, 50)), 3), "p99": round(float(np.percentile(t, 99)), 3),
                        "max": round(float(t.max()), 1)},
            "single_load_ms_idle": round(per_load * 1000, 3),
            "save_ms": round(per_save * 1000, 1),
            "loadavg": os.getloadavg(),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
