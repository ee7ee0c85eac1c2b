"""How honest the app's "time left" is: whole jobs run as the app runs them, the estimate it shows
compared with the true time left at 25 %, 50 % and 75 % of each job's duration (issue 35).

Jobs: the sample's build and evaluation, the paintings' build (/work/shared/data/paintings) and an
evaluation of its qsd1_w1 queries. Each job's progress records are saved as a trace (the time each
arrived, its stage, counts and elapsed time), so an estimator can be replayed on the same traces:

    python bench/bench_eta.py record --out bench/results/eta_traces.json [--only sample]
    python bench/bench_eta.py replay bench/results/eta_traces.json

``replay`` feeds every trace to the estimator of this checkout (core.progress: the app's worker
wraps every job in ``with_eta``; a build's plan is ``build_plan``) and prints, for each job, the
time left shown at 25/50/75 % of its duration against the truth, and the largest jump of the shown
value between two records a second apart or less beyond the time that passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAINTINGS = Path("/work/shared/data/paintings")
#: Stage costs replayed with (``replay --cost calibrating=30``), so that estimators are compared on one plan.
COSTS: dict[str, float] = {}


def _trace(gen):
    """Run ``gen`` to its end; the records' raw fields, with the second each arrived."""
    from museum_search.core.progress import Progress

    t0 = time.monotonic()
    out = []
    while True:
        try:
            p = next(gen)
        except StopIteration:
            break
        if isinstance(p, Progress):
            out.append({"t": time.monotonic() - t0, "stage": p.stage, "done": p.done, "total": p.total,
                        "elapsed": p.elapsed, "expected": p.expected, "kind": type(p).__name__})
    return {"records": out, "end": time.monotonic() - t0}


def _jobs(only: str | None):
    from museum_search.core import paths
    from museum_search.core.answer import QuerySettings
    from museum_search.core.evaluation import load_queryset
    from museum_search.core.index import Index
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.jobs import build_job
    from museum_search.gui.evaluation_tab import _evaluation_job  # the app's job: answers, then the intervals

    tmp = Path(tempfile.mkdtemp(prefix="bench_eta_"))
    sample = paths.sample_collection()
    sets = [("sample", sample / "collection", sample / "catalogue.csv", sample / "queries")]
    if PAINTINGS.is_dir():
        sets.append(("paintings", PAINTINGS / "references", PAINTINGS / "catalogue.csv", PAINTINGS / "queries" / "qsd1_w1"))
    for name, coll, cat, queries in sets:
        if only and name != only:
            continue
        out = tmp / name
        spec = LabellingSpec("catalogue", str(cat)) if cat.is_file() else LabellingSpec()
        yield f"{name} build", "build", lambda coll=coll, out=out, spec=spec: build_job(
            coll, out, BackboneConfig(), spec, batch_size=8, engine="auto")
        yield f"{name} evaluation", "evaluation", lambda out=out, queries=queries: _evaluation_job(
            Index.load(out), load_queryset(queries), QuerySettings(), batch_size=8)


def record(args) -> None:
    traces = {}
    for name, kind, make in _jobs(args.only):
        print(f"running {name}…", flush=True)
        traces[name] = {"kind": kind, **_trace(make())}
        print(f"  {traces[name]['end']:.1f} s, {len(traces[name]['records'])} records", flush=True)
        Path(args.out).write_text(json.dumps(traces))
    replay_traces(traces)


def _shown(kind: str, records):
    """The time left the app shows after each record (None: nothing shown), as this checkout computes it."""
    from museum_search.core import progress
    from museum_search.core.evaluation import EvalStep
    from museum_search.core.jobs._indexing import build_plan
    from museum_search.core.progress import EtaEstimator, Progress

    fill = [EtaEstimator().update]
    if kind == "build":
        from museum_search.core.jobs import _indexing

        saved = dict(_indexing.STAGE_COSTS)
        _indexing.STAGE_COSTS.update(COSTS)  # the same plan for every estimator compared
        try:
            fill.insert(0, progress.JobEta(build_plan()).update)
        finally:
            _indexing.STAGE_COSTS.update(saved)
    elif hasattr(progress, "evaluation_plan"):
        fill.insert(0, progress.JobEta(progress.evaluation_plan()).update)
    shown = []
    for r in records:
        cls = EvalStep if r["kind"] == "EvalStep" else Progress
        try:
            p = cls(r["done"], r["total"], stage=r["stage"], elapsed=r["elapsed"])
        except TypeError:
            p = Progress(r["done"], r["total"], stage=r["stage"], elapsed=r["elapsed"])
        p.expected = r["expected"]
        for f in fill:
            f(p)
        point = p.job_eta if p.steps > 0 else p.eta
        shown_range = progress.time_left(p) if hasattr(progress, "time_left") else (point, point)
        shown.append(None if shown_range is None or point is None else (point, *shown_range))
    return shown


def replay_traces(traces) -> None:
    """Per job: at 25/50/75 % of its duration, the time left shown (a number, or a range when the
    estimate is not precise enough, "…" when nothing is shown) against the truth, the error of the
    estimate (its middle) and whether the truth was inside what was shown; the largest jump of the
    estimate between records less than a second apart, beyond the time that passed."""
    print(f"{'job':22s} {'took':>6s}   " + "   ".join(f"{q:>3d} %: shown / true (err)" for q in (25, 50, 75))
          + "   largest jump")
    for name, tr in traces.items():
        recs, end = tr["records"], tr["end"]
        shown = _shown(tr["kind"], recs)
        cells = []
        for q in (0.25, 0.5, 0.75):
            at = q * end
            last = [s for r, s in zip(recs, shown) if r["t"] <= at]
            est = last[-1] if last else None
            true = end - at
            if est is None:
                cells.append(f"{'…':>11s} / {true:5.1f} {'':>12s}")
                continue
            point, lo, hi = est
            text = f"{point:5.1f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"
            inside = "in" if lo - 0.5 <= true <= hi + 0.5 else "out"
            cells.append(f"{text:>11s} / {true:5.1f} ({100 * (point - true) / true:+4.0f} % {inside:>3s})")
        jump = 0.0
        prev = None
        for r, s in zip(recs, shown):
            if s is None:
                continue
            if prev is not None and r["t"] - prev[0] <= 1.0:
                jump = max(jump, abs(s[0] - (prev[1] - (r["t"] - prev[0]))))
            prev = (r["t"], s[0])
        print(f"{name:22s} {end:5.1f}s   " + "   ".join(cells) + f"   {jump:5.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", default=str(ROOT / "bench" / "results" / "eta_traces.json"))
    rec.add_argument("--only", choices=["sample", "paintings"])
    rep = sub.add_parser("replay")
    rep.add_argument("traces")
    rep.add_argument("--cost", action="append", default=[], help="STAGE=COST: a stage's planned cost replayed")
    args = ap.parse_args()
    for item in getattr(args, "cost", []):
        stage, _, cost = item.rpartition("=")
        COSTS[stage] = float(cost)
    if args.cmd == "record":
        record(args)
    else:
        replay_traces(json.loads(Path(args.traces).read_text()))


if __name__ == "__main__":
    main()
