"""Indexing on Ray: describing the paintings' references on a 2-worker local Ray instance against a
plain local describe (core/distributed.py), measured in one run.

Writes bench/results/ray.json:

- agreement: the smallest cosine between the Ray and the plain descriptors of every reference, and
  whether the same files were described (and skipped);
- throughput (references/s, no verification: describing only) of the plain run and of the Ray run
  (cold: the workers start, import the network and load it during the run; warm: later runs on the
  same instance, alternating with plain runs, each against the plain runs around it), and the
  ratios Ray / plain;
- the Ray start-up (``ray.init(num_cpus=2)`` of a local instance) separately, and the ratio with it
  counted.

The plain run describes with the same extractor object the Ray workers build (default backbone, the
process's inference engine), already loaded. The machine is shared (its load average is recorded):
one run, ratios are indicative.

    .venv/bin/python bench/bench_ray.py [--workers 2] [--rounds 5] [--limit N] [--verification]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("MUSEUM_SEARCH_SHARED_DATA", REPO.parent / "shared" / "data"))

from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.inference._engines import build_extractor
from museum_search.core.inference._extract import extract
from museum_search.core.jobs._distributed import describe_on_ray
from museum_search.core.progress import drive
from museum_search.core.verification._spatial import SpatialParams, compute_local_features


def timed(gen):
    """Drive ``gen``; (its result, seconds)."""
    t0 = time.perf_counter()
    result = drive(gen)
    return result, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray instance (default 2)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N references")
    ap.add_argument("--verification", action="store_true", help="also compute the local features (both runs)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating warm Ray / plain runs (default 5)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "ray.json")
    args = ap.parse_args(argv)

    import ray

    refs = sorted((DATA / "paintings" / "references").glob("*.jpg"))[: args.limit]
    if not refs:
        raise SystemExit(f"no paintings references under {DATA / 'paintings' / 'references'}")
    n = len(refs)
    results: dict = {"machine": f"{os.cpu_count()}-core CPU, shared; one run", "load_average": os.getloadavg(),
                     "ray": ray.__version__, "references": n, "verification": args.verification,
                     "workers": args.workers}

    ext = build_extractor(BackboneConfig())
    results["engine"] = ext.engine
    results["backbone"] = ext.meta.summary()

    def plain():
        res = yield from extract(refs, ext)
        local = None
        if args.verification:
            local = yield from compute_local_features([refs[i] for i in res.ok], SpatialParams())
        return res, local

    drive(extract(refs[:8], ext))  # the network's first run (allocation) not counted

    def compare(res, local, ref, ref_local) -> dict:
        same = res.ok == ref.ok and res.skipped == ref.skipped
        a, b = res.descriptors.astype(np.float64), ref.descriptors.astype(np.float64)
        cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)) if same else [np.nan]
        out = {"same_files": same, "min_cosine": float(np.min(cos)),
               "max_abs_difference": float(np.abs(a - b).max()) if same else None}
        if args.verification:
            out["same_local_features"] = all(np.array_equal(getattr(local, k), getattr(ref_local, k))
                                             for k in ("offsets", "points", "descriptors", "sizes"))
        return out

    # The machine is shared: plain and Ray runs alternate, and the medians are compared.
    (ref, ref_local), t = timed(plain())
    t_plain = [t]
    print(f"plain: {n} references in {t:.2f} s ({n / t:.1f}/s), engine {ext.engine}", flush=True)
    t0 = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, logging_level="warning")
    t_init = time.perf_counter() - t0
    print(f"ray.init(num_cpus={args.workers}): {t_init:.2f} s", flush=True)
    try:
        cluster_cpus = ray.cluster_resources().get("CPU")
        (res, local), t_cold = timed(describe_on_ray(refs, ext, verification=args.verification))
        agreement = [compare(res, local, ref, ref_local)]
        print(f"ray cold: {t_cold:.2f} s ({n / t_cold:.1f}/s), {agreement[-1]}", flush=True)
        t_warm = []
        for _ in range(args.rounds):
            (res, local), t = timed(describe_on_ray(refs, ext, verification=args.verification))
            t_warm.append(t)
            agreement.append(compare(res, local, ref, ref_local))
            print(f"ray warm: {t:.2f} s ({n / t:.1f}/s), {agreement[-1]}", flush=True)
            _, t = timed(plain())
            t_plain.append(t)
            print(f"plain: {t:.2f} s ({n / t:.1f}/s)", flush=True)
    finally:
        ray.shutdown()

    plain_s, warm_s = float(np.median(t_plain)), float(np.median(t_warm))
    # each warm Ray run against the mean of the plain runs just before and after it (the load of a
    # shared machine drifts): the median of these ratios
    bracketed = [(t_plain[k] + t_plain[k + 1]) / 2 / t for k, t in enumerate(t_warm)]
    results.update({
        "plain": {"seconds_median": round(plain_s, 3), "per_second": round(n / plain_s, 2),
                  "runs_seconds": [round(t, 3) for t in t_plain]},
        "ray_start_seconds": round(t_init, 3),
        "ray_cluster_cpus": cluster_cpus,
        "ray_cold": {"seconds": round(t_cold, 3), "per_second": round(n / t_cold, 2),
                     "ratio_to_plain": round(plain_s / t_cold, 3)},
        "ray_warm": {"seconds_median": round(warm_s, 3), "per_second": round(n / warm_s, 2),
                     "ratio_to_plain": round(float(np.median(bracketed)), 3),
                     "ratios_bracketed": [round(r, 3) for r in bracketed],
                     "ratio_of_medians": round(plain_s / warm_s, 3), "runs_seconds": [round(t, 3) for t in t_warm]},
        "ratio_cold_with_start": round(plain_s / (t_cold + t_init), 3),
        "agreement": {"runs": len(agreement), "same_files": all(a["same_files"] for a in agreement),
                      "min_cosine": min(a["min_cosine"] for a in agreement),
                      "max_abs_difference": max(a["max_abs_difference"] or 0.0 for a in agreement),
                      **({"same_local_features": all(a["same_local_features"] for a in agreement)}
                         if args.verification else {})},
        "load_average_after": os.getloadavg(),
        "note": "ratio = plain seconds / Ray seconds (above 1: Ray is faster). cold: the first Ray run (its "
                "workers start, import the network and load it) against the median plain run; with start-up: "
                "ray.init counted too. warm: later runs on the same instance, each against the mean "
                "of the plain runs just before and after it, median. min_cosine in float64.",
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"ratio warm {results['ray_warm']['ratio_to_plain']}, cold {results['ray_cold']['ratio_to_plain']}, "
          f"cold with start-up {results['ratio_cold_with_start']}; min cosine "
          f"{results['agreement']['min_cosine']:.9f}; saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
