"""The calibrated verdict on every kind of object (issue 21): COIL-100 leave-out, paintings, exact copies, GAP.

Writes bench/results/verdict.json (or --out). Every figure comes from one run on this machine:

- **COIL-100 leave-out** (3D objects on a turntable): every 5th object (5, 10, ..., 100) is left out
  of the index; the other 80 are indexed with their views every 20 degrees; the queries are the
  views at 10, 130 and 250 degrees of all 100 objects (known and unknown). Figures for the default
  verdict (the calibrated model on all the evidence), for SIFT alone (the rule of inliers the same
  calibration chose: at least ``min_inliers`` distinct matching points), and for no verification
  (the model of the cosine and its margin). ``--matcher xfeat`` builds the index with XFeat.
- **COIL-100, last 20 left out** (``--only coil-last20``): the same protocol with objects 81-100 left out
  (another kind of split; some unknown objects have look-alikes among the known ones).
- **paintings** (../shared/data/paintings): MP@1 of the three dev query sets, and the leave-out
  protocol of bench_recognition.py (20 % of the paintings left out, seed 20261122): unknown
  rejected, known rejected, accuracy, for the model, SIFT alone and no verification; the known
  queries whose best photo has no more than 5 SIFT inliers (the dark works), and how many of
  them the verdict recognises.
- **shortlist** (``--only shortlist``, on the two leave-out indexes): MP@1, MAP and the verdict's
  figures when the query pipeline verifies the best 20 (the default), 15 or 10 references.
- **exact copies**: every reference photo of the sample, of a one-photo-per-object COIL index (the
  0-degree view of objects 5, 10, ..., 100) and of the paintings, queried as itself.
- **GAP** (the Met dataset's Global Average Precision, and over known queries) on the COIL and
  paintings leave-out sets, with the answers' confidences, each checked against an independent
  computation (scikit-learn's average precision: GAP = (R / M) AP over all queries sorted by
  confidence, R = right answers, M = known queries).

    .venv/bin/python bench/bench_verdict.py [--work DIR] [--only coil,paintings,copies] [--matcher sift] [--whitening]

``--work``: where the indexes are built (kept, so a second run with the same folder reuses them).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, load_query
from museum_search.core.answer._verdict import Verdict, open_set_figures
from museum_search.core.evaluation._metrics import gap_known, global_average_precision
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
ANGLE = re.compile(r"__(\d+)\.")


#: ``--whitening``: the indexes learn the verdict's whitening (built in ``NAME-w.idx`` beside the others).
WHITENING = False


def _build(folder: Path, out: Path, config: BackboneConfig, labelling: LabellingSpec | None, matcher: str) -> Index:
    """The index of ``folder`` in ``out`` (reused when it is already there); build seconds printed."""
    if WHITENING:
        out = out.with_name(f"{out.stem}-w{out.suffix}")
    if not (out / "manifest.json").exists():
        t = time.perf_counter()
        drive(build_index(folder, out, config, labelling or LabellingSpec(), matcher=matcher, whitening=WHITENING))
        print(f"built {out.name} in {time.perf_counter() - t:.0f} s", flush=True)
    return Index.load(out)


def _links(folder: Path, files: list[Path]) -> Path:
    if not folder.exists():
        folder.mkdir(parents=True)
        for f in files:
            (folder / f.name).symlink_to(f)
    return folder


def gap_check(evidence) -> dict:
    """GAP and GAP over known queries from the answers' confidences, and the same from scikit-learn."""
    from sklearn.metrics import average_precision_score

    conf = np.array([e.confidence for e in evidence], float)
    right = np.array([e.known and e.correct for e in evidence], bool)
    known = np.array([e.known for e in evidence], bool)
    out = {"gap": global_average_precision(conf, right, known), "gap_known": gap_known(conf, right, known)}
    m = int(known.sum())

    def independent(mask):
        # (R / M) * AP of "right" over the queries in ``mask`` sorted by confidence, ties by query order
        c, r = conf[mask], right[mask]
        if not r.any():
            return 0.0
        order = np.lexsort((np.arange(len(c)), -c))  # by confidence, then position
        ranks = np.empty(len(c))
        ranks[order] = np.arange(len(c), 0, -1)  # distinct scores that keep the tie order
        return float(r.sum() / m * average_precision_score(r, ranks))

    out["gap_sklearn"] = independent(np.ones(len(conf), bool))
    out["gap_known_sklearn"] = independent(known)
    out["agree"] = bool(abs(out["gap"] - out["gap_sklearn"]) < 1e-9
                        and abs(out["gap_known"] - out["gap_known_sklearn"]) < 1e-9)
    return out


def figures(index: Index, evidence_verified, evidence_cosine, mp1: dict) -> dict:
    """The verdict's figures: the model, SIFT alone (the rule of inliers), no verification."""
    v = Verdict.of_index(index)
    rule = Verdict(min_inliers=v.min_inliers, min_cosine=v.min_cosine)
    unverified = [replace(e, inliers=None, rival=0) for e in evidence_cosine]
    out = {
        "model": {**open_set_figures(evidence_verified, v), "mp@1": mp1["verified"], **gap_check(evidence_verified)},
        "inliers alone (rule)": {**open_set_figures(evidence_verified, rule), "min_inliers": v.min_inliers},
        "no verification (cosine model)": {**open_set_figures(unverified, v), "mp@1": mp1["cosine"],
                                           **gap_check(evidence_cosine)},
        "calibration": v.operating_point, "source": v.source,
        "model_verified": v.model_verified.to_dict() if v.model_verified else None,
    }
    for name in ("model", "inliers alone (rule)", "no verification (cosine model)"):
        f = out[name]
        print(f"  {name:<32} known rejected {f['known_rejected']:.3f}  unknown rejected "
              f"{f['unknown_rejected'] if f['unknown_rejected'] is None else round(f['unknown_rejected'], 3)}  "
              f"accuracy {f['accuracy']:.3f}" + (f"  GAP {f['gap']:.3f}" if "gap" in f else ""), flush=True)
    return out


def _run(index, qs_list, settings):
    evidence, records = [], []
    for qs in qs_list:
        rep = run_evaluation(index, qs, settings)
        evidence += rep.evidence
        records += rep.records
    mp1 = float(np.mean([r.correct for r in records if not r.open_set])) if records else float("nan")
    return evidence, records, mp1


#: COIL-100's objects left out of the leave-out index (:func:`coil`).
COIL_LEFT_OUT = set(range(5, 101, 5))


#: The other split (issue 36): the last 20 objects (81-100) left out, a block rather than every 5th,
#: so that some unknown objects have look-alikes in the index.
COIL_LAST_20 = set(range(81, 101))


def _coil_leave_out(work: Path, matcher: str, left_out: set[int] = COIL_LEFT_OUT, name: str = "coil-80"):
    """(index, query set) of the COIL-100 leave-out protocol (the module doc); ``left_out``: the
    objects left out of the index (kept in ``work / name``)."""
    root = DATA / "coil100"
    names = sorted(p.name for p in root.glob("*.jpg"))
    obj = re.compile(r"obj(\d+)__")
    refs = [root / n for n in names
            if int(ANGLE.search(n).group(1)) % 20 == 0 and int(obj.match(n).group(1)) not in left_out]
    queries = [n for n in names if int(ANGLE.search(n).group(1)) in (10, 130, 250)]
    folder = _links(work / name, refs)
    index = _build(folder, work / f"{name}-{matcher}.idx", BackboneConfig(size=224),
                   LabellingSpec("regex", regex=COIL100_REGEX), matcher)
    return index, load_queryset(root, layout="regex", regex=COIL100_REGEX, files=queries)


def _paintings_leave_out(work: Path, matcher: str):
    """(index, left-out reference positions, the three query sets) of the paintings' leave-out protocol."""
    refs = sorted((DATA / "paintings" / "references").glob("*.jpg"))
    rng = np.random.default_rng(20261122)
    left = set(rng.choice(len(refs), size=int(len(refs) * 0.2), replace=False).tolist())
    folder = _links(work / "paintings-80", [f for i, f in enumerate(refs) if i not in left])
    index = _build(folder, work / f"paintings-80-{matcher}.idx", BackboneConfig(), None, matcher)
    return index, left, [load_queryset(DATA / "paintings" / "queries" / q) for q in QUERY_SETS]


def coil(work: Path, matcher: str) -> dict:
    left = COIL_LEFT_OUT
    index, qs = _coil_leave_out(work, matcher)
    ev_v, rec, mp_v = _run(index, [qs], None)
    ev_c, _, mp_c = _run(index, [qs], QuerySettings(verify=False))
    print(f"COIL-100 leave-out ({matcher}): {len(index)} references, {len(ev_v)} queries, MP@1 {mp_v:.3f}", flush=True)
    out = {"references": len(index), "queries": len(ev_v), "left_out_objects": sorted(left),
           **figures(index, ev_v, ev_c, {"verified": mp_v, "cosine": mp_c})}
    return out


def coil_last20(work: Path, matcher: str) -> dict:
    """COIL-100 with another split: the last 20 objects (81-100) left out (:data:`COIL_LAST_20`)."""
    index, qs = _coil_leave_out(work, matcher, COIL_LAST_20, "coil-last20")
    ev_v, rec, mp_v = _run(index, [qs], None)
    ev_c, _, mp_c = _run(index, [qs], QuerySettings(verify=False))
    print(f"COIL-100, last 20 left out ({matcher}): {len(index)} references, {len(ev_v)} queries, MP@1 {mp_v:.3f}",
          flush=True)
    looks = [e for e in ev_v if not e.known and e.accepted(Verdict.of_index(index)) and (e.inliers or 0) < 8]
    return {"references": len(index), "queries": len(ev_v), "left_out_objects": sorted(COIL_LAST_20),
            **figures(index, ev_v, ev_c, {"verified": mp_v, "cosine": mp_c}),
            "unknown_accepted_with_fewer_than_8_inliers": len(looks)}


def paintings(work: Path, matcher: str) -> dict:
    full = _build(DATA / "paintings" / "references", work / f"paintings-{matcher}.idx", BackboneConfig(), None, matcher)
    out: dict = {"dev": {}}
    for qs in QUERY_SETS:
        ev, rec, mp = _run(full, [load_queryset(DATA / "paintings" / "queries" / qs)], None)
        out["dev"][qs] = {"mp@1": mp, **open_set_figures(ev, Verdict.of_index(full))}
    out["dev"]["mp@1 over the three sets"] = float(np.mean([out["dev"][q]["mp@1"] for q in QUERY_SETS]))
    print(f"paintings dev ({matcher}): MP@1 {out['dev']['mp@1 over the three sets']:.3f} "
          + "  ".join(f"{q} known rejected {out['dev'][q]['known_rejected']:.3f}" for q in QUERY_SETS), flush=True)
    index, left, qsets = _paintings_leave_out(work, matcher)
    ev_v, rec, mp_v = _run(index, qsets, None)
    ev_c, _, mp_c = _run(index, qsets, QuerySettings(verify=False))
    print(f"paintings leave-out ({matcher}): {len(index)} references, {len(ev_v)} queries", flush=True)
    out["leave_out"] = {"left_out": len(left), **figures(index, ev_v, ev_c, {"verified": mp_v, "cosine": mp_c})}
    v = Verdict.of_index(index)
    rule = Verdict(min_inliers=v.min_inliers)
    weak = [(r, e) for r, e in zip(rec, ev_v) if e.known and not e.accepted(rule)]
    out["leave_out"]["sift_alone_rejects"] = {
        "what": "known queries the rule of SIFT inliers alone rejects (the dark and weakly textured works)",
        "queries": len(weak), "recognised_by_model": sum(1 for _, e in weak if e.correct and e.accepted(v)),
        "evidence": [{"query": str(Path(r.query).relative_to(DATA)), "brightness": _brightness(r.query),
                      **e.to_dict(), "confidence": e.confidence, "accepted": e.accepted(v)} for r, e in weak]}
    print(f"  known queries SIFT alone rejects: {len(weak)}, recognised by the model "
          f"{out['leave_out']['sift_alone_rejects']['recognised_by_model']}", flush=True)
    return out


def _brightness(path: str) -> float:
    """Mean grey level of a photo (0-255): the dark works are the ones SIFT cannot see."""
    from museum_search.core.images import load_image

    return round(float(load_image(path, max_side=256).mean()), 1)


def copies(work: Path, matcher: str) -> dict:
    """Every reference photo queried as itself: is it 'in the collection'?"""
    out = {}
    sample = REPO / "resources" / "sample"
    coil_root = DATA / "coil100"
    coil_one = [coil_root / f"obj{n}__0.jpg" for n in range(5, 101, 5)]
    sets = {
        "sample": (_build(sample / "collection", work / f"sample-{matcher}.idx", BackboneConfig(),
                          LabellingSpec("catalogue", str(sample / "catalogue.csv")), matcher)),
        "coil one photo per object": _build(_links(work / "coil-one", coil_one), work / f"coil-one-{matcher}.idx",
                                            BackboneConfig(size=224), LabellingSpec("regex", regex=COIL100_REGEX),
                                            matcher),
        "paintings": _build(DATA / "paintings" / "references", work / f"paintings-{matcher}.idx", BackboneConfig(),
                            None, matcher),
    }
    for name, index in sets.items():
        pipe = QueryPipeline(index)
        refused = []
        for row in range(len(index)):
            a = pipe.answer([load_query(index.abspath(row))])[0]
            if not (a.in_collection and a.top.instance == index.items[row].instance):
                refused.append({"path": index.items[row].path, "top": a.top.instance, "reason": a.reason})
        out[name] = {"references": len(index), "recognised": len(index) - len(refused), "refused": refused}
        print(f"exact copies, {name}: {len(index) - len(refused)} of {len(index)} recognised", flush=True)
    return out


#: Shortlist lengths measured by :func:`shortlist` (the query pipeline verifies 20).
SHORTLISTS = (20, 15, 10)


def shortlist(work: Path, matcher: str) -> dict:
    """How short the verified shortlist can be (issue 24): on the COIL-100 and paintings leave-out
    indexes (calibrated with the default, 20), per length of :data:`SHORTLISTS`: MP@1, MAP of each
    query set and the calibrated verdict's figures."""
    coil_index, coil_queries = _coil_leave_out(work, matcher)
    paintings_index, _, paintings_queries = _paintings_leave_out(work, matcher)
    out: dict = {}
    for name, index, qsets in (("coil", coil_index, [coil_queries]), ("paintings", paintings_index, paintings_queries)):
        v = Verdict.of_index(index)
        out[name] = {}
        for top in SHORTLISTS:
            evidence, records, maps = [], [], []
            for qs in qsets:
                rep = run_evaluation(index, qs, QuerySettings(verify_top=top))
                evidence += rep.evidence
                records += rep.records
                maps.append(rep.summary["map"])
            mp1 = float(np.mean([r.correct for r in records if not r.open_set]))
            f = open_set_figures(evidence, v)
            out[name][f"verify top {top}"] = {"mp@1": mp1, "map_per_query_set": maps, **f}
            print(f"shortlist {top} on {name}: MP@1 {mp1:.3f} MAP {[round(m, 4) for m in maps]} known rejected "
                  f"{f['known_rejected']:.3f} unknown rejected {f['unknown_rejected']:.3f}", flush=True)
    return out


def latency(work: Path, matcher: str, n: int = 40) -> dict:
    """Seconds per query of the default pipeline on the paintings (the dev queries), p50 and p95,
    as ratios to the forward pass (describing the photo's regions), and the split by step."""
    index = _build(DATA / "paintings" / "references", work / f"paintings-{matcher}.idx", BackboneConfig(), None, matcher)
    paths = sorted((DATA / "paintings" / "queries").glob("*/*.jpg"))[:n]
    pipe = QueryPipeline(index)
    pipe.warm_up()
    # the verdict's whitening (an index built with it): the seconds its own step takes in each query
    # (timing the same queries without it would not do: its verdict decides otherwise, and an accepted
    # answer looks further, for more objects in the photo)
    spent = [0.0]
    whitened = pipe._whitened

    def timed_whitened(*args, **kwargs):
        t = time.perf_counter()
        try:
            return whitened(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    pipe._whitened = timed_whitened  # type: ignore[method-assign]
    rows = []
    for p in paths:
        spent[0] = 0.0
        t = time.perf_counter()
        pipe.answer([load_query(p)])
        rows.append({"total": time.perf_counter() - t, **pipe.timings, "whitening": spent[0]})
    total = np.array([r["total"] for r in rows])
    forward = float(np.median([r["describe"] for r in rows]))
    out = {"queries": len(rows), "p50_seconds": float(np.percentile(total, 50)),
           "p95_seconds": float(np.percentile(total, 95)), "forward_seconds_median": forward,
           "p50_over_forward": float(np.percentile(total, 50) / forward),
           "p95_over_forward": float(np.percentile(total, 95) / forward),
           "split_median_seconds": {k: float(np.median([r[k] for r in rows])) for k in ("describe", "search", "verify")}}
    if index.whitening is not None:
        out["whitening_seconds_median"] = float(np.median([r["whitening"] for r in rows]))
        out["whitening_share_of_p50"] = out["whitening_seconds_median"] / out["p50_seconds"]
    print(f"latency ({matcher}): p50 {out['p50_seconds']:.3f} s = {out['p50_over_forward']:.1f} x the forward pass, "
          f"p95 {out['p95_seconds']:.3f} s = {out['p95_over_forward']:.1f} x", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--only", default="coil,paintings,copies,latency")
    ap.add_argument("--matcher", default="sift")
    ap.add_argument("--whitening", action="store_true", help="indexes that learn the verdict's whitening "
                    "(figures under MATCHER+whitening)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "verdict.json")
    args = ap.parse_args()
    global WHITENING
    WHITENING = args.whitening
    key = args.matcher + ("+whitening" if args.whitening else "")
    if not (DATA / "coil100").is_dir():
        print(f"error: {DATA} is missing", file=sys.stderr)
        return 1
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-verdict-"))
    work.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results["machine"] = "2-core CPU, shared; one run"
    for part in args.only.split(","):
        t = time.perf_counter()
        results.setdefault(key, {})[part] = {"coil": coil, "coil-last20": coil_last20, "paintings": paintings,
                                                       "copies": copies, "shortlist": shortlist,
                                                       "latency": latency}[part](
            work, args.matcher)
        results[key][part]["seconds"] = round(time.perf_counter() - t, 1)
        args.out.write_text(json.dumps(results, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
