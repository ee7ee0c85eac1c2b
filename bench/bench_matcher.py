"""SIFT against XFeat as the verification matcher, through the product's code paths (issue 21, item 3).

For each data set, one index is described once (default backbone, no verification, no neighbour lists);
then for each matcher its stored local features are computed by the build stage itself
(``spatial.compute_local_features(paths, spatial.params_for(matcher))``) and put on the index, and every
query is answered by ``QueryPipeline`` (default settings: five regions, top 20 verified), whose verifier
takes the index's matcher (``spatial.params_of_index``). Measured per data set and matcher:

- **MP@1** over the known queries with verification on (the ranking's gate: ``--gate-sift`` / ``--gate-xfeat``
  inliers, the bonus capped at the matcher's ``INLIER_CAP``) and with verification off; ``mp1_by_gate`` and
  ``map_by_gate``: MP@1 and MAP recomputed from the same cosines and verified inliers (``spatial.blend`` +
  ``query.object_inliers``, the pipeline's own ranking) for other gates, and MAP for a variant that lifts
  only the objects verified alike the best one (within ``verdict.DISTINCT``).
- **same-object vs wrong-object inliers** (raw, no verdict): for each query, the most inliers of a
  shortlisted photo of its object (``same``, known queries whose object is in the shortlist) and of
  any other object (``wrong``; unknown queries count here too). ``separation``: medians and tails,
  AUC (same vs wrong over queries), the share of known queries whose object beats every other, the
  smallest gate above every wrong count and the share of known queries at it.
- **ms per verification**: query extraction (``extract_features``) + matching and homography against
  one stored reference (``Verifier.verify_rows`` with one row), p50/p95 over up to 40 queries;
  ``pipeline_verify_ms``: the pipeline's whole verification step (extraction + top 20).
- **bytes per reference** stored (offsets, points, descriptors, sizes) and the build stage's ms per
  reference.
- paintings: the known queries with 0 SIFT inliers on their object (the dark works) and what XFeat does.
- ``references_sift_keypoints``: SIFT keypoints per stored reference (median, share under 100/150) and
  ``auto``: what ``spatial.auto_matcher`` (the ``auto`` matcher) picks for the collection from them.

Data (read-only): ``--data`` (default ``../shared/data``): paintings (287 references, query sets
qsd1_w1, qsd1_w3, qsd2_w3), COIL-100 (references every 20 degrees, queries at 10/130/250; the
references are symlinked into a temporary folder) and the bundled sample (``resources/sample``).

Usage::

    .venv/bin/python bench/bench_matcher.py [--data ../shared/data] [--coil-objects 100] [--skip-coil]

writes ``bench/results/matcher.json``. About 10 minutes on 2 busy cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cv2

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, load_query
from museum_search.core.answer._verdict import DISTINCT, Verdict
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.index._labels import COIL100_REGEX
from museum_search.core.index._store import LabellingSpec
from museum_search.core.inference._engines import build_extractor
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive
from museum_search.core.ranking import order
from museum_search.core.verification import _spatial as spatial
from museum_search.core.verification._shortlist import object_inliers

MATCHERS = ("sift", "xfeat")
GATES = (5, 10, 15, 20, 30, 40, 60)


def pct(v, q):
    return None if len(v) == 0 else round(float(np.percentile(np.asarray(v, float), q)), 2)


def auc(pos, neg) -> float | None:
    """P(same > wrong) + 0.5 P(same == wrong) over all (same, wrong) pairs of values."""
    if not pos or not neg:
        return None
    p, n = np.asarray(pos, float)[:, None], np.asarray(neg, float)[None, :]
    return round(float((p > n).mean() + 0.5 * (p == n).mean()), 4)


def separation(rows: list[dict]) -> dict:
    known = [r for r in rows if r["relevant"]]
    same = [r["same"] for r in known if r["same"] is not None]
    wrong = [r["wrong"] for r in rows]
    top = max(wrong) if wrong else 0
    return {
        "known_queries": len(known), "object_shortlisted": len(same),
        "same_median": pct(same, 50), "same_p10": pct(same, 10), "same_min": min(same) if same else None,
        "wrong_median": pct(wrong, 50), "wrong_p95": pct(wrong, 95), "wrong_max": top,
        "auc": auc(same, wrong),
        "object_beats_others": round(float(np.mean([(r["same"] or 0) > r["wrong"] for r in known])), 4)
        if known else None,
        "gate_above_every_wrong": top + 1,
        "known_at_that_gate": round(float(np.mean([(r["same"] or 0) > top for r in known])), 4) if known else None,
    }


def rescored(answer, labels: np.ndarray, gate: int, params: spatial.SpatialParams, best_alike: bool = False):
    """The pipeline's ranking for another gate, from the answer's own cosines and verified inliers
    (``best_alike``: a variant that lifts only the objects verified alike the best one, within DISTINCT)."""
    scores = np.array(answer.cosine, np.float32)
    if answer.verified_inliers:
        short = np.array(sorted(answer.verified_inliers), np.int64)
        inl = object_inliers(np.array([answer.verified_inliers[int(r)] for r in short]), labels[short], gate)
        if best_alike:
            inl = np.where(inl * DISTINCT > inl.max(), inl, 0)
        scores[short] = spatial.blend(scores[short], inl, params, gate)
    return order(scores)


def average_precision(order: np.ndarray, labels: np.ndarray, relevant) -> float:
    rel = np.isin(labels[order], list(relevant))
    hits = np.flatnonzero(rel)
    return float(np.mean((np.arange(len(hits)) + 1) / (hits + 1))) if len(hits) else 0.0


def run_dataset(name: str, index, queries, extractor, gates: dict[str, int], dark: bool = False) -> dict:
    t0 = time.perf_counter()
    paths = [index.abspath(i) for i in range(len(index))]
    labels = index.labels
    images = [load_query(q.path) for q in queries]
    base = QueryPipeline(index, QuerySettings(verify=False), extractor=extractor)
    desc = base.embed(images)
    plain = base.answer(images, descriptors=desc)
    known = [i for i, q in enumerate(queries) if q.relevant]
    out: dict = {"references": len(index), "instances": len(index.instances), "queries": len(queries),
                 "known_queries": len(known),
                 "mp1_no_verification": round(float(np.mean([plain[i].top.instance in queries[i].relevant
                                                              for i in known])), 4),
                 "map_no_verification": round(float(np.mean([average_precision(order(plain[i].cosine), labels,
                                                                               queries[i].relevant)
                                                             for i in known])), 4)}
    per_query: dict[str, list] = {}
    for m in MATCHERS:
        params = spatial.params_for(m)
        t1 = time.perf_counter()
        local = drive(spatial.compute_local_features(paths, params))
        build_s = time.perf_counter() - t1
        index.local = local
        spatial.clear_memory_cache()
        nbytes = sum(int(np.asarray(getattr(local, p)).nbytes) for p in ("offsets", "points", "descriptors", "sizes"))
        counts = np.diff(local.offsets)
        pipe = QueryPipeline(index, QuerySettings(verdict=Verdict(min_inliers=gates[m])), extractor=extractor)
        assert pipe._spatial.params.effective_feature == m, "the pipeline does not verify with the index's matcher"
        rows, verify_ms, answers = [], [], []
        for i, (q, img) in enumerate(zip(queries, images)):
            a = pipe.answer([img], descriptors=desc[i:i + 1])[0]
            verify_ms.append(pipe.timings["verify"] * 1e3)
            answers.append(a)
            same = [n for r, n in a.verified_inliers.items() if labels[r] in q.relevant]
            wrong = [n for r, n in a.verified_inliers.items() if labels[r] not in q.relevant]
            rows.append({"query": os.path.relpath(q.path, REPO.parent), "relevant": sorted(q.relevant),
                         "same": max(same) if same else None, "wrong": max(wrong) if wrong else 0,
                         "top": a.top.instance if a.top else None,
                         "top_cosine": round(a.top.cosine, 4) if a.top else None})
        mp1 = float(np.mean([answers[i].top.instance in queries[i].relevant for i in known]))
        by_gate, map_by_gate, map_alike = {}, {}, {}
        for g in GATES:
            orders = [rescored(answers[i], labels, g, params) for i in known]
            by_gate[g] = round(float(np.mean([labels[o[0]] in queries[i].relevant for o, i in zip(orders, known)])), 4)
            map_by_gate[g] = round(float(np.mean([average_precision(o, labels, queries[i].relevant)
                                                  for o, i in zip(orders, known)])), 4)
            map_alike[g] = round(float(np.mean([average_precision(rescored(answers[i], labels, g, params, True),
                                                                  labels, queries[i].relevant) for i in known])), 4)
        # one verification: the query's extraction + matching and homography against one stored reference
        ext_ms, match_ms = [], []
        verifier = pipe._spatial
        for i in known[:40]:
            row = next((r for r in range(len(index)) if labels[r] in queries[i].relevant), 0)
            verifier.verify_rows(spatial.extract_features(images[i].image, params), [row], index)  # warm
            t = time.perf_counter()
            qf = spatial.extract_features(images[i].image, params)
            t2 = time.perf_counter()
            verifier.verify_rows(qf, [row], index)
            t3 = time.perf_counter()
            ext_ms.append((t2 - t) * 1e3)
            match_ms.append((t3 - t2) * 1e3)
        total = np.add(ext_ms, match_ms)
        out[m] = {
            "settings": local.settings, "gate": gates[m], "inlier_cap": params.inlier_cap,
            "mp1": round(mp1, 4), "mp1_by_gate": by_gate, "map_by_gate": map_by_gate,
            "map_by_gate_lifting_only_objects_alike_the_best": map_alike,
            "separation": separation(rows),
            "ms_per_verification": {"p50": pct(total, 50), "p95": pct(total, 95),
                                    "extract_p50": pct(ext_ms, 50), "match_homography_p50": pct(match_ms, 50)},
            "pipeline_verify_ms": {"p50": pct(verify_ms, 50), "p95": pct(verify_ms, 95)},
            "bytes_per_reference": round(nbytes / len(index)),
            "keypoints_per_reference": {"median": pct(counts, 50), "mean": round(float(counts.mean()), 1)},
            "build_ms_per_reference": round(build_s * 1e3 / len(index), 1),
        }
        if m == "sift":
            auto = spatial.auto_matcher(counts[local.sizes[:, 0] > 0])
            out["references_sift_keypoints"] = {
                "median": pct(counts, 50), "share_under_100": round(float((counts < 100).mean()), 4),
                "share_under_150": round(float((counts < 150).mean()), 4)}
        per_query[m] = rows
        s = out[m]["separation"]
        print(f"{name:10s} {m:6s} MP@1 {mp1:.4f} (no verification {out['mp1_no_verification']:.4f}) "
              f"same med {s['same_median']} p10 {s['same_p10']} | wrong med {s['wrong_median']} p95 {s['wrong_p95']} "
              f"max {s['wrong_max']} | AUC {s['auc']} beats {s['object_beats_others']} | "
              f"{out[m]['ms_per_verification']['p50']} ms/verification, {out[m]['bytes_per_reference']} B/ref | "
              f"MP@1 by gate {by_gate} MAP by gate {map_by_gate} (lifting only objects alike the best: {map_alike})",
              flush=True)
    out["auto"] = dict(zip(("chooses", "why"), auto))
    out["per_query"] = [{"query": a["query"], "relevant": a["relevant"],
                         **{f"{m}_{k}": per_query[m][i][k] for m in MATCHERS for k in ("same", "wrong", "top")}}
                        for i, a in enumerate(per_query["sift"])]
    if dark:
        rows = []
        for i, r in enumerate(out["per_query"]):
            if r["relevant"] and not r["sift_same"]:
                img = images[i].image
                rows.append({"query": r["query"], "relevant": r["relevant"],
                             "query_mean_grey": round(float(img.mean()), 1),
                             **{k: r[k] for k in r if k.startswith(("sift_", "xfeat_"))},
                             **{f"{m}_right": r[f"{m}_top"] in r["relevant"] for m in MATCHERS}})
        out["sift_blind_known_queries"] = rows
        print(f"{name}: known queries with 0 SIFT inliers on their object: {json.dumps(rows, indent=None)}")
    index.local = None
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "matcher.json")
    ap.add_argument("--coil-objects", type=int, default=100, help="COIL-100 objects used (the first N)")
    ap.add_argument("--skip-coil", action="store_true")
    ap.add_argument("--gate-sift", type=int, default=15, help="the ranking's gate for SIFT (Verdict's default)")
    ap.add_argument("--gate-xfeat", type=int, default=30, help="the ranking's gate for XFeat")
    args = ap.parse_args()
    t0 = time.perf_counter()
    gates = {"sift": args.gate_sift, "xfeat": args.gate_xfeat}
    extractor = build_extractor(None)
    result: dict = {
        "settings": {"matchers": {m: {"params": repr(spatial.params_for(m))} for m in MATCHERS}, "gates": gates,
                     "backbone": extractor.meta.summary(), "engine": extractor.engine,
                     "query_settings": "QuerySettings() defaults (5 regions, top 20 verified), verdict rule gate "
                                       "as above"},
        "env": {"python": platform.python_version(), "opencv": cv2.__version__, "numpy": np.__version__,
                "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
        "datasets": {},
    }

    def save():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
        os.replace(tmp, args.out)

    # the bundled sample
    s = REPO / "resources" / "sample"
    index = drive(build_index(s / "collection", None, labelling=LabellingSpec("catalogue", str(s / "catalogue.csv")),
                              extractor=extractor, verification=False, neighbours=0)).index
    result["datasets"]["sample"] = run_dataset("sample", index, load_queryset(s / "queries").queries, extractor, gates)
    save()

    # paintings
    p = args.data / "paintings"
    index = drive(build_index(p / "references", None, labelling=LabellingSpec("catalogue", str(p / "catalogue.csv")),
                              extractor=extractor, verification=False, neighbours=0)).index
    queries = [q for qs in ("qsd1_w1", "qsd1_w3", "qsd2_w3") for q in load_queryset(p / "queries" / qs).queries]
    result["datasets"]["paintings"] = run_dataset("paintings", index, queries, extractor, gates, dark=True)
    save()

    # COIL-100
    if not args.skip_coil:
        root = args.data / "coil100"
        angle = re.compile(r"obj(\d+)__(\d+)\.")
        names = sorted(n.name for n in root.glob("obj*__*.jpg")
                       if int(angle.search(n.name).group(1)) <= args.coil_objects)
        refs = [n for n in names if int(angle.search(n).group(2)) % 20 == 0]
        qnames = [n for n in names if int(angle.search(n).group(2)) in (10, 130, 250)]
        with tempfile.TemporaryDirectory(prefix="bench-matcher-") as tmp:
            folder = Path(tmp) / "coil"
            folder.mkdir()
            for n in refs:
                (folder / n).symlink_to(root / n)
            index = drive(build_index(folder, None, labelling=LabellingSpec("regex", regex=COIL100_REGEX),
                                      extractor=extractor, verification=False, neighbours=0)).index
            qs = load_queryset(root, layout="regex", regex=COIL100_REGEX, files=qnames).queries
            result["datasets"]["coil100"] = run_dataset("coil100", index, qs, extractor, gates)
        save()

    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["env"]["loadavg_end"] = os.getloadavg()
    save()
    print(f"wrote {args.out} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
