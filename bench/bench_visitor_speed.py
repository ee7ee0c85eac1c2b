"""What the second look and the visitor views cost (issue 36, item 5): the verified photo query's
latency as ratios to the forward pass, with and without the second look, on clean photos and on
photos as visitors take them; and the calibration's time with and without the visitor views.

In one run on this machine, on the paintings index of ``bench_visitors.py`` (287 references, SIFT,
built in ``--work``) and the three paintings query sets, clean and under ``--conditions``
(default: phone, far, webcam, the protocol's photos in ``--work``, made by ``bench_visitors.py``):

- each photo is answered by the query pipeline with ``deep=0`` (one look, as before issue 36) and
  with the default second look, alternately (the same photo, decoded once), and its bare forward
  pass is timed; p50 and p95 of each as ratios to the median forward pass, and the share of photos
  that took a second look;
- the calibration of the sample index and of the paintings-80 index, with and without the visitor
  views, alternately (``--rounds``), in seconds.

The reference features stored change with issue 36 only by the features several objects share,
set aside at the build (``bench_set_aside.py`` measures that; bytes per reference: the index's
``local`` files, reported). Writes bench/results/visitor_speed.json.

    .venv/bin/python bench/bench_visitor_speed.py --work /tmp/visitors-work [--conditions phone,far] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from bench_visitors import degraded, indexes, load_text, query_sets

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, load_query
from museum_search.core.jobs._calibration import calibration_evidence
from museum_search.core.progress import drive
from museum_search.core.verification import SURE


def _stats(seconds: list[float], forward: float) -> dict:
    s = np.asarray(seconds)
    return {"p50_ratio": round(float(np.percentile(s, 50)) / forward, 2),
            "p95_ratio": round(float(np.percentile(s, 95)) / forward, 2),
            "p50_ms": round(1e3 * float(np.percentile(s, 50)), 1), "p95_ms": round(1e3 * float(np.percentile(s, 95)), 1)}


def latency(index, photos: list[str]) -> dict:
    """Per photo: one look, two looks, the forward pass (alternately); the figures."""
    one = QueryPipeline(index, QuerySettings(deep=0))
    two = QueryPipeline(index, QuerySettings(), extractor=one.extractor)
    one.warm_up()
    two.warm_up()
    t_one, t_two, t_fwd, second = [], [], [], 0
    for path in photos:
        q = load_query(path)
        t = time.perf_counter()
        one.answer([q])
        t_one.append(time.perf_counter() - t)
        t = time.perf_counter()
        (a,) = two.answer([q])
        t_two.append(time.perf_counter() - t)
        first = one.answer([q])[0]  # untimed: did the first look find enough?
        second += int((first.top_inliers or 0) < SURE)  # about: the best object of its shortlist decides
        t = time.perf_counter()
        one.extractor.embed(one.inputs(q))
        t_fwd.append(time.perf_counter() - t)
    forward = float(np.median(t_fwd))
    return {"photos": len(photos), "forward_ms": round(1e3 * forward, 1), "second_look_share": round(second / len(photos), 3),
            "one_look": _stats(t_one, forward), "two_looks": _stats(t_two, forward)}


def calibration_seconds(index, rounds: int) -> dict:
    out: dict[str, list[float]] = {"clean_views": [], "with_visitor_views": []}
    for _ in range(rounds):
        for key, visitors in (("clean_views", False), ("with_visitor_views", True)):
            t = time.perf_counter()
            drive(calibration_evidence(index, visitors=visitors))
            out[key].append(round(time.perf_counter() - t, 1))
    return {**out, "ratio": round(float(np.median(out["with_visitor_views"]) / np.median(out["clean_views"])), 2)}


def local_bytes(index) -> int | None:
    folder = Path(index.path)
    files = [p for p in folder.rglob("*") if p.is_file() and "local" in p.name]
    return sum(p.stat().st_size for p in files) // max(1, len(index)) if files else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True, help="bench_visitors.py's --work folder")
    ap.add_argument("--conditions", default="phone,far,webcam")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "visitor_speed.json")
    args = ap.parse_args()
    start = time.perf_counter()
    results: dict = {"machine": f"{os.cpu_count()} cores, shared with other jobs; one run", "load_at_start": load_text(),
                     "latency": {}, "calibration_seconds": {}}
    factories = indexes(args.work, "sift")
    paintings = factories["paintings"]()
    results["local_feature_bytes_per_reference"] = local_bytes(paintings)
    sets = {name: query_sets(name, ())[1][0] for name in ("qsd1_w1", "qsd1_w3", "qsd2_w3")}
    for condition in ["clean", *args.conditions.split(",")]:
        photos = [q.path for name, qs in sets.items()
                  for q in degraded(qs, condition, args.work / "photos" / condition / name / "0").queries]
        results["latency"][condition] = f = latency(paintings, photos)
        print(condition, json.dumps(f), flush=True)
    for name in ("sample", "paintings-80"):
        results["calibration_seconds"][name] = c = calibration_seconds(factories[name](), args.rounds)
        print(name, json.dumps(c), flush=True)
    results["seconds"] = round(time.perf_counter() - start, 1)
    results["load_at_end"] = load_text()
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
