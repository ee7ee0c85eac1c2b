"""A verified photo query against the forward pass, before and after (issue 24, item 6).

Writes bench/results/verify_speed.json. In one run on this machine:

- the paintings index (../shared/data/paintings/references) and the sample's (resources/sample) are
  built twice, by the code before (``--before``: a git worktree of the commit to compare with, e.g.
  ``git worktree add /tmp/wt-before HEAD~3``) and by this checkout, each calibrated by its own code
  (a query side of SIFT is part of what an index is calibrated with); their calibrated verdicts are
  compared;
- each code then answers on its own paintings index, in fresh processes, alternately (before,
  after, after with OpenBLAS on one thread (:data:`ONE_BLAS`), before, ...: ``--rounds``), each
  process answering every query of the three paintings query sets: per query the seconds of the
  whole photo query (decode, describe, search, verify, verdict) and of the bare forward pass of the
  same regions; p50/p95 of the query as ratios to the median forward pass, and the split of the
  query's time;
- every answer's evidence (top object, verdict, inliers, rival, confidence, the inliers of every
  verified reference) from both codes, compared query by query (the queries whose top object or
  verdict differ are listed); MP@1 and MAP of the three query sets and the verdict's figures
  (``run_evaluation``), on the paintings and on the sample, each code on its own indexes.

    .venv/bin/python bench/bench_verify_speed.py --before /tmp/wt-before [--work DIR] [--rounds 2]
    .venv/bin/python bench/bench_verify_speed.py --alternatives --work DIR
    .venv/bin/python bench/bench_verify_speed.py --profile --work DIR

``--work``: where the indexes are built (kept; a second run reuses them). ``--alternatives``: on
those indexes (this checkout's), what another query image size for SIFT or a shorter shortlist
would change (MP@1, the verdict's figures, the answers, the time of describing and verifying), written to
bench/results/verify_speed_alternatives.json. ``--profile``: where this checkout's query spends its
time, part by part (:func:`profile`), and with OpenBLAS on one thread, added to the results as
"profile".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# museum_search first: as the app does, it sets OpenBLAS's thread timeout before numpy loads it (in a
# worker, the package of the code under test)
import museum_search

# isort: split
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DATA = REPO.parent / "shared" / "data"
QUERY_SETS = ("qsd1_w1", "qsd1_w3", "qsd2_w3")
SAMPLE = REPO / "resources" / "sample"


def _paintings_queries() -> list[Path]:
    return [p for qs in QUERY_SETS for p in sorted((DATA / "paintings" / "queries" / qs).glob("*.jpg"))]


# ---- in a worker process (the code under test is the one on its PYTHONPATH) ---------------------


def build(kind: str, out: Path) -> dict:
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive

    t = time.perf_counter()
    if kind == "paintings":
        index = drive(build_index(DATA / "paintings" / "references", out, BackboneConfig())).index
    else:
        index = drive(build_index(SAMPLE / "collection", out,
                                  labelling=LabellingSpec("catalogue", str(SAMPLE / "catalogue.csv")))).index
    return {"seconds": time.perf_counter() - t, "verdict": index.verdict}


def evidence_of(answer) -> dict:
    top = answer.top
    return {"instance": None if top is None else top.instance, "in_collection": bool(answer.in_collection),
            "inliers": answer.top_inliers, "rival": int(answer.rival),
            "confidence": None if answer.confidence is None else round(float(answer.confidence), 6),
            "reason": answer.reason,
            "verified": sorted((int(r), int(n)) for r, n in answer.verified_inliers.items())}


def latency(index_dir: str) -> dict:
    """Every paintings query answered once warm: seconds of the query and of its forward pass."""
    from museum_search.core.answer._pipeline import QueryPipeline, load_query
    from museum_search.core.index._store import Index

    index = Index.load(index_dir)
    pipe = QueryPipeline(index)
    pipe.warm_up()
    rows, answers = [], {}
    for p in _paintings_queries():
        t0 = time.perf_counter()
        q = load_query(p)
        t1 = time.perf_counter()
        (a,) = pipe.answer([q])
        total = time.perf_counter() - t0
        inputs = pipe.inputs(q)
        t2 = time.perf_counter()
        pipe.extractor.embed(inputs)  # the bare forward pass of the same regions
        forward = time.perf_counter() - t2
        rows.append({"decode": t1 - t0, **pipe.timings, "total": total, "forward": forward})
        answers[f"{p.parent.name}/{p.name}"] = evidence_of(a)
    tot = np.array([r["total"] for r in rows])
    fwd = float(np.median([r["forward"] for r in rows]))
    return {
        "code": str(Path(museum_search.__file__).parent),
        "queries": len(rows),
        "p50_seconds": float(np.percentile(tot, 50)), "p95_seconds": float(np.percentile(tot, 95)),
        "forward_seconds_median": fwd,
        "p50_over_forward": float(np.percentile(tot, 50)) / fwd, "p95_over_forward": float(np.percentile(tot, 95)) / fwd,
        "split_median_seconds": {k: float(np.median([r[k] for r in rows])) for k in ("decode", "describe", "search", "verify")},
        "load_average_1min": os.getloadavg()[0],
        "answers": answers,
    }


def profile(index_dir: str) -> dict:
    """Where one photo query's time goes, part by part, in one process (every paintings query):
    the bare forward pass; SIFT on the photo alone (OpenCV's threads as they are, and one); the
    matching of its shortlist and the homographies alone; and, in the whole query, when the photo's
    features were ready against when the network's descriptors were (the wait for SIFT), and the
    verification step's parts. Medians in ms, wall and CPU (of the process: every thread)."""
    from dataclasses import replace

    import cv2

    import museum_search.core.verification._shortlist as verification
    from museum_search.core.answer._pipeline import QueryImage, QueryPipeline, load_query
    from museum_search.core.index._store import Index
    from museum_search.core.ranking import order
    from museum_search.core.verification import _spatial as spatial

    index = Index.load(index_dir)
    pipe = QueryPipeline(index)
    pipe.warm_up()
    params = pipe.verification.params
    marks: dict[str, float] = {}

    def mark(fn, key):
        def wrapped(*a, **k):
            try:
                return fn(*a, **k)
            finally:
                marks[key] = time.perf_counter()
        return wrapped

    real_qf, real_embed = verification.query_features, pipe.embed
    rows: dict[str, list] = {}

    def add(key, wall, cpu=None):
        rows.setdefault(key, []).append((wall, cpu))

    def timed(key, fn, *args):
        t, c = time.perf_counter(), time.process_time()
        out = fn(*args)
        add(key, time.perf_counter() - t, time.process_time() - c)
        return out

    threads = cv2.getNumThreads()
    for p in _paintings_queries():
        q = load_query(p)
        inputs = pipe.inputs(q)
        timed("forward pass alone", pipe.extractor.embed, inputs)
        qf = timed(f"SIFT on the photo alone ({threads} OpenCV threads)", spatial.query_features, q.image, params)
        cv2.setNumThreads(1)
        timed("SIFT on the photo alone (1 OpenCV thread)", spatial.query_features, q.image, params)
        cv2.setNumThreads(threads)
        half = replace(params, query_side=params.max_side // 2)  # SIFT's 2x upsampled octave costs as much as this
        timed(f"SIFT on the photo at half its side alone ({threads} OpenCV threads)", spatial.query_features, q.image, half)
        scores = pipe.answer([QueryImage(q.name, q.image.copy())])[0].cosine
        refs = [pipe.verification.verifier.reference_features(index, int(r)) for r in order(scores, 20)]
        refs = [r for r in refs if r is not None]
        pairs = timed("matching the shortlist alone", spatial.match_features, qf, [r[0] for r in refs], params)
        timed("homographies of the shortlist alone",
              lambda found, refs: [spatial._homography(s, d, params, r[1]) for (s, d), r in zip(found, refs)], pairs, refs)
        # the whole query, with the moments the photo's features and the descriptors were ready
        verification.query_features = mark(real_qf, "features")
        pipe.embed = mark(real_embed, "descriptors")
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            pipe.answer([QueryImage(q.name, q.image.copy())])
            add("whole query (decoded photo)", time.perf_counter() - t0, time.process_time() - c0)
        finally:
            verification.query_features = real_qf
            del pipe.embed
        add("in the query: descriptors ready", marks["descriptors"] - t0)
        add("in the query: SIFT ready", marks["features"] - t0)
        add("in the query: wait for SIFT after the search", max(0.0, marks["features"] - t0 - pipe.timings["describe"]
                                                                - pipe.timings["search"]))
        for k, v in pipe.timings.items():
            add(f"in the query: step {k}", v)
    out = {}
    for key, vals in rows.items():
        wall = [w for w, _ in vals]
        cpu = [c for _, c in vals if c is not None]
        out[key] = {"wall_ms_median": round(1000 * float(np.median(wall)), 2)}
        if cpu:
            out[key]["cpu_ms_median"] = round(1000 * float(np.median(cpu)), 2)
    out["load_average_1min"] = os.getloadavg()[0]
    return out


def figures(paintings_dir: str, sample_dir: str) -> dict:
    """MP@1, MAP and the verdict's figures of the paintings' three query sets and of the sample."""
    from museum_search.core.evaluation._querysets import load_queryset
    from museum_search.core.evaluation._runner import run_evaluation
    from museum_search.core.index._store import Index

    out: dict = {}
    index = Index.load(paintings_dir)
    evidence = []
    for qs in QUERY_SETS:
        rep = run_evaluation(index, load_queryset(DATA / "paintings" / "queries" / qs))
        out[qs] = {"mp@1": rep.summary["mp@1"], "map": rep.summary["map"], **rep.summary["verdict"]}
        evidence += [r.answer_evidence for r in rep.records]
    out["paintings verdict"] = _verdict_counts(evidence)
    rep = run_evaluation(Index.load(sample_dir), load_queryset(SAMPLE / "queries"))
    out["sample"] = {"mp@1": rep.summary["mp@1"], "map": rep.summary["map"], **rep.summary["verdict"]}
    out["sample verdict"] = _verdict_counts([r.answer_evidence for r in rep.records])
    return out


def _verdict_counts(evidence) -> dict:
    """Counted here from each answer's evidence (not from the summary): accepted and rejected, by
    known/unknown and right/wrong."""
    known = [e for e in evidence if e.known]
    unknown = [e for e in evidence if not e.known]
    return {"known": len(known), "unknown": len(unknown),
            "known_right_top": sum(e.correct for e in known),
            "confidence_sum": round(float(sum(e.confidence or 0.0 for e in evidence)), 6)}


#: (query side, verify top); None: the index's own query side (its manifest's; 640 px for an index
#: built before indexes recorded one). The verdict stays the one the index was calibrated with.
ALTERNATIVES = ((None, 20), (640, 20), (480, 20), (400, 20), (None, 10), (None, 5))


def alternatives(paintings_dir: str, sample_dir: str) -> dict:
    """What another query image size for SIFT (``SpatialParams.query_side``; the index keeps the
    verdict calibrated at its own) or a shorter shortlist (``verify_top``) would change: per setting, MP@1 and the verdict's figures of each query set,
    the queries whose answer (top object, verdict, inliers, rival, confidence) differs from the
    default's, and the median seconds of the verification step (qsd1_w1) as a ratio to the default's."""
    from dataclasses import replace

    import museum_search.core.answer._pipeline as query
    from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, load_query
    from museum_search.core.evaluation._querysets import load_queryset
    from museum_search.core.evaluation._runner import run_evaluation
    from museum_search.core.index._store import Index

    sets = {f"paintings/{qs}": (paintings_dir, DATA / "paintings" / "queries" / qs) for qs in QUERY_SETS}
    sets["sample"] = (sample_dir, SAMPLE / "queries")
    indexes = {d: Index.load(d) for d in (paintings_dir, sample_dir)}
    timing_queries = [load_query(p) for p in sorted((DATA / "paintings" / "queries" / "qsd1_w1").glob("*.jpg"))]
    of_index = query.params_of_index
    out: dict = {}
    answers: dict = {}
    for side, top in ALTERNATIVES:
        query.params_of_index = (of_index if side is None else
                                 lambda index, top_n=20, side=side: replace(of_index(index, top_n), query_side=side))
        settings = QuerySettings(verify_top=top)
        own = of_index(indexes[paintings_dir]).query_side or of_index(indexes[paintings_dir]).max_side
        name = f"query side {side or f'of the index ({own})'}, verify top {top}"
        row: dict = {}
        got: dict = {}
        for label, (index_dir, folder) in sets.items():
            index = indexes[index_dir]
            rep = run_evaluation(index, load_queryset(folder), settings)
            row[label] = {"mp@1": rep.summary["mp@1"], **rep.summary["verdict"]}
            for r in rep.records:
                got[r.query] = (index.items[int(r.ranking[0])].instance if len(r.ranking) else None, r.in_collection,
                                r.top_inliers, r.rival_inliers, None if r.confidence is None else round(r.confidence, 6))
        pipe = QueryPipeline(indexes[paintings_dir], settings)
        pipe.warm_up()
        verify = []
        for q in timing_queries:
            pipe.answer([q])
            verify.append(pipe.timings["verify"] + pipe.timings["describe"])
        row["describe+verify median seconds (qsd1_w1)"] = float(np.median(verify))
        answers[name] = got
        out[name] = row
    query.params_of_index = of_index
    base_name = next(iter(out))
    base = answers[base_name]
    for name, row in out.items():
        differ = {q: {"default": base[q], "this": answers[name][q]} for q in base if answers[name][q] != base[q]}
        row["answers differing from the default"] = {
            "queries": len(base), "top object": sum(base[q][0] != answers[name][q][0] for q in base),
            "verdict": sum(base[q][1] != answers[name][q][1] for q in base), "any field": len(differ),
            "top object or verdict": {q: v for q, v in differ.items() if v["default"][:2] != v["this"][:2]}}
        row["describe+verify over the default's"] = (row["describe+verify median seconds (qsd1_w1)"]
                                                     / out[base_name]["describe+verify median seconds (qsd1_w1)"])
    return out


# ---- the driver ----------------------------------------------------------------------------------


#: the third code measured (after's code, with OpenBLAS on one thread): after NumPy's matrix product
#: of the search, OpenBLAS's idle threads spin for a while and take a core from the forward pass,
#: SIFT and matching, in the query and in the bare forward pass measured after it
ONE_BLAS = "after, OpenBLAS on one thread"


def _run(code: Path, *args: str, one_blas: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    if one_blas:
        env["OPENBLAS_NUM_THREADS"] = "1"
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], cwd=str(code), env=env,
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"worker {args} with {code} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _figures_only(figures: dict) -> dict:
    """The figures of :func:`figures` without the sums of confidences (which any change of inliers moves)."""
    return {k: {f: v for f, v in row.items() if f != "confidence_sum"} for k, row in figures.items()}


def _same(a: dict, b: dict) -> dict:
    keys = sorted(a)
    differ = [k for k in keys if a[k] != b.get(k)]
    fields = ("instance", "in_collection", "inliers", "rival", "confidence", "verified")
    return {"queries": len(keys), "identical": len(keys) - len(differ),
            "differ_by_field": {f: sum(a[k][f] != b[k][f] for k in keys) for f in fields},
            "top object or verdict": {k: {"before": a[k], "after": b[k]} for k in differ
                                      if (a[k]["instance"], a[k]["in_collection"]) != (b[k]["instance"], b[k]["in_collection"])},
            "differing": {k: {"before": a[k], "after": b[k]} for k in differ[:10]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a checkout (git worktree) of the code to compare with")
    ap.add_argument("--work", default=None, help="folder of the indexes (kept)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "verify_speed.json"))
    ap.add_argument("--alternatives", action="store_true",
                    help="only measure smaller query sizes for SIFT and shorter shortlists (needs the indexes of "
                         "a previous run in --work); writes bench/results/verify_speed_alternatives.json")
    ap.add_argument("--profile", action="store_true",
                    help="only profile this checkout's query part by part on the paintings index of a previous run "
                         "in --work; added to --out as 'profile'")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        what, *rest = args.worker
        result = {"build": lambda: build(rest[0], Path(rest[1])), "latency": lambda: latency(rest[0]),
                  "figures": lambda: figures(rest[0], rest[1]), "profile": lambda: profile(rest[0]),
                  "alternatives": lambda: alternatives(rest[0], rest[1])}[what]()
        print(json.dumps(result))
        return 0
    if args.profile:
        index = Path(args.work or "") / "paintings-after"
        if not (index / "manifest.json").exists():
            print("--profile needs --work with the indexes of a previous run", file=sys.stderr)
            return 2
        target = Path(args.out)
        out = json.loads(target.read_text()) if target.exists() else {}
        for key, one in (("profile", False), (f"profile, {ONE_BLAS}", True)):
            got = _run(REPO, "--worker", "profile", str(index), one_blas=one)
            out[key] = {"code": str(REPO), **got}
            print(key, json.dumps(got, indent=1), flush=True)
        target.write_text(json.dumps(out, indent=1) + "\n")
        return 0
    if args.alternatives:
        work = Path(args.work or "")
        if not (work / "paintings-after" / "manifest.json").exists() or not (work / "sample-after" / "manifest.json").exists():
            print("--alternatives needs --work with the indexes of a previous run", file=sys.stderr)
            return 2
        got = _run(REPO, "--worker", "alternatives", str(work / "paintings-after"), str(work / "sample-after"))
        target = HERE / "results" / "verify_speed_alternatives.json"
        target.write_text(json.dumps({"machine": "2-core CPU, shared; one run", **got}, indent=1) + "\n")
        for name, row in got.items():
            print(name, json.dumps({k: v for k, v in row.items() if k != "answers differing from the default"}),
                  json.dumps({k: v for k, v in row["answers differing from the default"].items()
                              if k != "top object or verdict"}), flush=True)
        print(f"written {target}")
        return 0
    if not args.before or not (Path(args.before) / "museum_search").is_dir():
        print("--before must name a checkout of the code to compare with (git worktree add /tmp/wt-before HEAD)",
              file=sys.stderr)
        return 2
    if not (DATA / "paintings" / "catalogue.csv").is_file():
        print(f"shared data not found at {DATA}", file=sys.stderr)
        return 1
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="verify-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    codes = {"before": Path(args.before).resolve(), "after": REPO}
    out: dict = {"machine": "2-core CPU, shared; one run", "before": str(codes["before"]), "load_average_start": os.getloadavg()}
    builds = {}
    for name, code in codes.items():  # each code builds (and calibrates) its own indexes
        for kind in ("paintings", "sample"):
            folder = work / f"{kind}-{name}"
            got = (_run(code, "--worker", "build", kind, str(folder)) if not (folder / "manifest.json").exists()
                   else {"seconds": None})
            manifest = json.loads((folder / "manifest.json").read_text())
            got.update(verdict=manifest.get("verdict"), local_features=manifest.get("local_features"))
            builds[(name, kind)] = got
            print(f"{kind} index built by {name}: {got['seconds']} s, local features {got['local_features']}", flush=True)
    out["calibrated verdict identical"] = builds[("before", "paintings")]["verdict"] == builds[("after", "paintings")]["verdict"]
    out["build seconds"] = {name: builds[(name, "paintings")]["seconds"] for name in codes}
    out["local features"] = {name: builds[(name, "paintings")]["local_features"] for name in codes}
    out["verdict"] = {name: builds[(name, "paintings")]["verdict"] for name in codes}
    index = {name: str(work / f"paintings-{name}") for name in codes}
    runs: dict[str, list] = {"before": [], "after": [], ONE_BLAS: []}
    for r in range(args.rounds):
        for name, code in [*codes.items(), (ONE_BLAS, REPO)]:
            got = _run(code, "--worker", "latency", index["before" if name == "before" else "after"],
                       one_blas=name == ONE_BLAS)
            runs[name].append(got)
            print(f"round {r + 1} {name}: p50 {got['p50_seconds'] * 1000:.1f} ms = {got['p50_over_forward']:.2f}x forward "
                  f"({got['forward_seconds_median'] * 1000:.1f} ms), p95 {got['p95_over_forward']:.2f}x, "
                  f"split {json.dumps({k: round(v * 1000, 1) for k, v in got['split_median_seconds'].items()})} ms",
                  flush=True)
    out["latency"] = {name: [{k: v for k, v in g.items() if k != "answers"} for g in got] for name, got in runs.items()}
    out["answers, before vs after"] = _same(runs["before"][0]["answers"], runs["after"][0]["answers"])
    out["answers, after vs after (repeatable)"] = _same(runs["after"][0]["answers"], runs["after"][-1]["answers"])
    out[f"answers, after vs {ONE_BLAS}"] = _same(runs["after"][0]["answers"], runs[ONE_BLAS][0]["answers"])
    out["figures"] = {name: _run(code, "--worker", "figures", index[name], str(work / f"sample-{name}"))
                      for name, code in codes.items()}
    out["figures identical"] = out["figures"]["before"] == out["figures"]["after"]
    out["MP@1, MAP and verdict figures identical"] = _figures_only(out["figures"]["before"]) == _figures_only(
        out["figures"]["after"])
    out["load_average_end"] = os.getloadavg()
    print(json.dumps({k: out[k] for k in ("calibrated verdict identical", "figures identical",
                                          "MP@1, MAP and verdict figures identical")}), flush=True)
    print(json.dumps(out["answers, before vs after"]["differ_by_field"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
