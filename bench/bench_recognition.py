"""Recognition with the one query pipeline (issue: verified answers, an honest "not in this collection").

Writes bench/results/recognition.json. Every figure comes from one run on this machine:

- paintings (../shared/data/paintings): MP@1 per query set with the defaults (no flags: regions,
  verification, calibrated verdict) and with verification off;
- leave-out protocol: 20 % of the paintings left out of the index, their queries are unknown
  objects: share of unknown queries rejected, of known queries wrongly rejected, accuracy;
- the sample collection (resources/sample, 3 unknown queries): the same verdict figures;
- COIL-100 (references every 20°, queries at 10/130/250°): MAP and MP@1, default vs verification off;
- index build time with local features and calibration, as a ratio to describing only;
- warm query latency with verification (p50, p95) as a ratio to the forward pass, split into
  decode / describe / search / verify; the first query after loading the index against the p50.

    .venv/bin/python bench/bench_recognition.py [--skip-coil]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, load_query
from museum_search.core.answer._verdict import Verdict, open_set_figures
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import run_evaluation
from museum_search.core.index._labels import COIL100_REGEX
from museum_search.core.index._store import Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = REPO.parent / "shared" / "data"
QUERY_SETS = ("qsd1_w1", "qsd1_w3", "qsd2_w3")


def _stages(gen):
    """Drive a build; seconds per stage."""
    times: dict[str, float] = {}
    drive(gen, lambda p: times.__setitem__(p.stage, p.elapsed))
    return times


def paintings(tmp: Path) -> dict:
    out: dict = {}
    refs = DATA / "paintings" / "references"
    t0 = time.perf_counter()
    stages = _stages(build_index(refs, tmp / "paintings", BackboneConfig()))
    total = time.perf_counter() - t0
    index = Index.load(tmp / "paintings")
    out["build_seconds"] = {"total": total, **stages}
    out["build_ratio_with_verification_to_describing_only"] = total / stages["describing"]
    out["verdict"] = index.verdict
    for name, settings in (("default", None), ("verification off", QuerySettings(verify=False))):
        row = {}
        for qs in QUERY_SETS:
            rep = run_evaluation(index, load_queryset(DATA / "paintings" / "queries" / qs), settings)
            row[qs] = {"mp@1": rep.summary["mp@1"], "map": rep.summary["map"]}
        row["mp@1 over the three sets"] = float(np.mean([row[q]["mp@1"] for q in QUERY_SETS]))
        out[name] = row
        print(f"paintings {name:<18} " + "  ".join(f"{q} {row[q]['mp@1']:.3f}" for q in QUERY_SETS)
              + f"  all {row['mp@1 over the three sets']:.3f}", flush=True)
    # in a fresh process, so that the first query is really the first one after loading the index
    import subprocess

    res = subprocess.run([sys.executable, __file__, "--latency", str(tmp / "paintings")],
                         capture_output=True, text=True, check=True)
    out["latency"] = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"latency {json.dumps(out['latency'])}", flush=True)
    return out


def leave_out(tmp: Path, share: float = 0.2, seed: int = 20261122) -> dict:
    refs = sorted((DATA / "paintings" / "references").glob("*.jpg"))
    rng = np.random.default_rng(seed)
    left = set(rng.choice(len(refs), size=int(len(refs) * share), replace=False).tolist())
    folder = tmp / "paintings-80"
    folder.mkdir()
    for i, f in enumerate(refs):
        if i not in left:
            (folder / f.name).symlink_to(f)
    index = drive(build_index(folder, None, BackboneConfig())).index
    out: dict = {"left_out": len(left), "indexed": len(index), "verdict": index.verdict}
    for name, settings in (("default", None), ("verification off", QuerySettings(verify=False))):
        evidence = []
        for qs in QUERY_SETS:
            evidence += run_evaluation(index, load_queryset(DATA / "paintings" / "queries" / qs), settings).evidence
        v = Verdict.of_index(index)
        out[name] = open_set_figures(evidence if settings is None else
                                     [type(e)(e.cosine, None, e.known, e.correct) for e in evidence], v)
        print(f"leave-out {name:<18} {out[name]}", flush=True)
    return out


def sample(tmp: Path) -> dict:
    root = REPO / "resources" / "sample"
    index = drive(build_index(root / "collection", None,
                              labelling=LabellingSpec("catalogue", str(root / "catalogue.csv")))).index
    out: dict = {"verdict": index.verdict}
    for name, settings in (("default", None), ("verification off", QuerySettings(verify=False))):
        rep = run_evaluation(index, load_queryset(root / "queries"), settings)
        out[name] = {"mp@1": rep.summary["mp@1"], **rep.summary["verdict"]}
        print(f"sample {name:<18} {out[name]}", flush=True)
    return out


def coil(tmp: Path) -> dict:
    root = DATA / "coil100"
    angle = re.compile(r"__(\d+)\.")
    names = sorted(p.name for p in root.glob("*.jpg"))
    refs = [n for n in names if int(angle.search(n).group(1)) % 20 == 0]
    queries = [n for n in names if int(angle.search(n).group(1)) in (10, 130, 250)]
    folder = tmp / "coil"
    folder.mkdir()
    for n in refs:
        (folder / n).symlink_to(root / n)
    index = drive(build_index(folder, None, BackboneConfig(size=224), LabellingSpec("regex", regex=COIL100_REGEX))).index
    qs = load_queryset(root, layout="regex", regex=COIL100_REGEX, files=queries)
    out: dict = {"verdict": index.verdict}
    for name, settings in (("default", None), ("verification off", QuerySettings(verify=False)),
                           ("whole image, verification off", QuerySettings(verify=False, regions=False))):
        s = run_evaluation(index, qs, settings).summary
        out[name] = {"map": s["map"], "mp@1": s["mp@1"], "amnro": s["amnro"]}
        print(f"COIL-100 {name:<30} MAP {s['map']:.4f} MP@1 {s['mp@1']:.4f}", flush=True)
    return out


def latency(index: Index, paths: list[Path], n: int = 40) -> dict:
    """Per-query seconds of the default pipeline, and the bare forward pass of the same queries."""
    paths = paths_all = paths[:n]
    pipe = QueryPipeline(index)
    t = time.perf_counter()
    pipe.answer([load_query(paths[0])])  # the first query of a process that has only loaded the index
    first_cold = time.perf_counter() - t
    pipe = QueryPipeline(index)
    pipe.warm_up()  # what the Search tab and the kiosk do on a worker when an index is opened
    t = time.perf_counter()
    pipe.answer([load_query(paths[1])])
    first = time.perf_counter() - t
    paths = paths[1:]
    rows = []
    for p in paths[1:]:
        t0 = time.perf_counter()
        q = load_query(p)
        t1 = time.perf_counter()
        pipe.answer([q])
        total = time.perf_counter() - t0
        inputs = pipe.inputs(q)
        t2 = time.perf_counter()
        pipe.extractor.embed(inputs)  # the bare forward pass of the same regions
        forward = time.perf_counter() - t2
        rows.append({"decode": t1 - t0, **pipe.timings, "total": total, "forward": forward})
    # the same two photos again, warm: is the first query slow because it is first, or because of
    # the photo (more keypoints, a larger shortlist to verify)?
    warm_same = []
    for p in paths_all[:2]:
        t = time.perf_counter()
        pipe.answer([load_query(p)])
        warm_same.append(time.perf_counter() - t)
    tot = np.array([r["total"] for r in rows])
    fwd = np.median([r["forward"] for r in rows])
    out = {
        "queries": len(rows) + 1,
        "p50_seconds": float(np.percentile(tot, 50)), "p95_seconds": float(np.percentile(tot, 95)),
        "forward_seconds_median": float(fwd),
        "p50_over_forward": float(np.percentile(tot, 50) / fwd), "p95_over_forward": float(np.percentile(tot, 95) / fwd),
        "first_query_seconds_after_warm_up": first, "first_over_p50": first / float(np.percentile(tot, 50)),
        "first_query_seconds_cold_process": first_cold,
        "first_cold_over_p50": first_cold / float(np.percentile(tot, 50)),
        "first_cold_over_same_photo_warm": first_cold / warm_same[0],
        "first_after_warm_up_over_same_photo_warm": first / warm_same[1],
        "split_median_seconds": {k: float(np.median([r[k] for r in rows]))
                                 for k in ("decode", "describe", "search", "verify")},
    }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-coil", action="store_true")
    ap.add_argument("--latency", metavar="INDEX", help=argparse.SUPPRESS)  # internal: one fresh process
    args = ap.parse_args(argv)
    if args.latency:
        paths = [p for qs in QUERY_SETS for p in sorted((DATA / "paintings" / "queries" / qs).glob("*.jpg"))]
        print(json.dumps(latency(Index.load(args.latency), paths)))
        return 0
    if not (DATA / "paintings" / "catalogue.csv").is_file():
        print(f"shared data not found at {DATA}", file=sys.stderr)
        return 1
    import tempfile

    results: dict = {"machine": "2-core CPU, shared; one run"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        results["sample"] = sample(tmp)
        results["paintings"] = paintings(tmp)
        results["leave_out"] = leave_out(tmp)
        if not args.skip_coil:
            results["coil100"] = coil(tmp)
    out = HERE / "results" / "recognition.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
