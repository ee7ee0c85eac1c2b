"""The visitor-photo protocol (issue 36, item 1): the query photos as a visitor's phone takes them.

Every query photo of the dev sets is degraded by each condition of
:mod:`museum_search.core.conditions` (dim, defocus and motion blur, perspective, in-plane tilt, glare,
sensor noise, far away, a webcam's frame, JPEG, and the phone-like combinations; "clean" is the photo
as it is), with a seed of its own per condition and photo (:func:`~museum_search.core.conditions.photo_seed`),
saved losslessly (PNG) under ``--work``, and answered by the query pipeline (the same path as
``evaluate``) with the default settings except for the verification:

- ``sift``: an index built with ``matcher="sift"`` (the default), verifying the best ``--verify-top``;
- ``xfeat``: the same collection indexed with ``matcher="xfeat"``, verifying the best ``--verify-top``;
- ``none``: the SIFT index, not verified (``QuerySettings(verify=False)``: the global descriptor and
  the verdict's cosine model).

Each index is calibrated by its own build, on clean views: the figures are the "before" of issue 36.

Sets (the protocols of ``bench_verdict.py``, whose helpers build the indexes):

- ``sample``: the sample collection (42 references of 12 objects) and its 21 queries (3 unknown);
- ``qsd1_w1``, ``qsd1_w3``, ``qsd2_w3``: the paintings' dev query sets (30 photos each) against the 287
  references (every painting known);
- ``paintings-leave-out``: the three sets against the paintings less 20 % left out (seed 20261122):
  90 photos, known and unknown;
- ``coil-leave-out``: COIL-100 with every 5th object left out, references every 20°; queries the views
  at ``--coil-angles`` (default 10, 130, 250: 299 photos, 59 unknown).

Per condition, set and matcher: MP@1 (over the known photos), known rejected (told "not in this
collection"), unknown rejected, **wrong accepted** (photos answered "in the collection" with a wrong
object, or an unknown one accepted, over all photos; split into known and unknown in the JSON),
**wrong extra object** (photos whose answer names a further object the photo does not show), and
GAP (:func:`museum_search.core.evaluation._metrics.global_average_precision` over the answers'
confidences); and the same pooled over the sets with unknown photos (:data:`POOLED`: each photo
once, every kind of object). Writes ``bench/results/visitors.json`` (``--out``) with every figure, the machine load
and the run time, and prints a table.

    .venv/bin/python bench/bench_visitors.py [--quick] [--work DIR] [--conditions a,b] [--sets a,b]
        [--matchers sift,xfeat,none] [--verify-top 20] [--coil-angles 10,130,250]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import cv2
import numpy as np
from bench_verdict import COIL_LEFT_OUT, DATA, QUERY_SETS, REPO, _build, _links

from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings
from museum_search.core.answer._verdict import Verdict
from museum_search.core.conditions import CONDITIONS, degrade, photo_seed
from museum_search.core.evaluation._metrics import global_average_precision
from museum_search.core.evaluation._querysets import QuerySet, load_queryset
from museum_search.core.evaluation._runner import EvalReport, run_evaluation
from museum_search.core.images import load_image
from museum_search.core.index._labels import COIL100_REGEX
from museum_search.core.index._store import Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._calibration import calibrate
from museum_search.core.jobs._indexing import _add_verification
from museum_search.core.progress import drive
from museum_search.core.verification import DEEP, params_of_settings

SAMPLE = REPO / "resources" / "sample"
SETS = ("sample", "qsd1_w1", "qsd1_w3", "qsd2_w3", "paintings-leave-out", "coil-leave-out")
MATCHERS = ("sift", "xfeat", "none")
#: The sets pooled in the summary: those with unknown photos, each photo once.
POOLED = ("sample", "paintings-leave-out", "coil-leave-out")
#: ``--quick``: a few conditions on the small sets (a few minutes).
QUICK_CONDITIONS = ("clean", "dim-0.3", "defocus-4", "phone")
QUICK_SETS = ("sample", "qsd1_w3", "paintings-leave-out")
#: Photos are never enlarged past this side before a condition is applied (the pipeline decodes at 640).
MAX_SIDE = 1024


def indexes(work: Path, matcher: str) -> dict[str, Callable[[], Index]]:
    """The index of each kind of set, built (or reused) on demand: ``sample``, ``paintings`` (287
    references), ``paintings-80`` and ``coil-80`` (the leave-out protocols of ``bench_verdict.py``)."""
    import re

    def coil80() -> Index:
        root = DATA / "coil100"
        angle, obj = re.compile(r"__(\d+)\."), re.compile(r"obj(\d+)__")
        refs = [p for p in sorted(root.glob("*.jpg")) if int(angle.search(p.name).group(1)) % 20 == 0
                and int(obj.match(p.name).group(1)) not in COIL_LEFT_OUT]
        return _build(_links(work / "coil-80", refs), work / f"coil-80-{matcher}.idx", BackboneConfig(size=224),
                      LabellingSpec("regex", regex=COIL100_REGEX), matcher)

    def paintings80() -> Index:
        refs = sorted((DATA / "paintings" / "references").glob("*.jpg"))
        rng = np.random.default_rng(20261122)
        left = set(rng.choice(len(refs), size=int(len(refs) * 0.2), replace=False).tolist())
        folder = _links(work / "paintings-80", [f for i, f in enumerate(refs) if i not in left])
        return _build(folder, work / f"paintings-80-{matcher}.idx", BackboneConfig(), None, matcher)

    return {
        "sample": lambda: _build(SAMPLE / "collection", work / f"sample-{matcher}.idx", BackboneConfig(),
                                 LabellingSpec("catalogue", str(SAMPLE / "catalogue.csv")), matcher),
        "paintings": lambda: _build(DATA / "paintings" / "references", work / f"paintings-{matcher}.idx",
                                    BackboneConfig(), None, matcher),
        "paintings-80": paintings80,
        "coil-80": coil80,
    }


def query_sets(name: str, coil_angles: tuple[int, ...]) -> tuple[str, list[QuerySet]]:
    """(the kind of index, the clean query sets) of the set ``name``."""
    paintings = DATA / "paintings" / "queries"
    if name == "sample":
        return "sample", [load_queryset(SAMPLE / "queries")]
    if name in QUERY_SETS:
        return "paintings", [load_queryset(paintings / name)]
    if name == "paintings-leave-out":
        return "paintings-80", [load_queryset(paintings / q) for q in QUERY_SETS]
    if name == "coil-leave-out":
        root = DATA / "coil100"
        files = [p.name for p in sorted(root.glob("*.jpg")) if int(p.stem.rsplit("__", 1)[1]) in coil_angles]
        return "coil-80", [load_queryset(root, layout="regex", regex=COIL100_REGEX, files=files)]
    raise SystemExit(f"unknown set {name!r}; choose from {', '.join(SETS)}")


def degraded(qs: QuerySet, condition: str, out: Path) -> QuerySet:
    """``qs`` with every photo under ``condition``, saved as PNG in ``out`` (reused when there); the
    clean condition is the photos themselves."""
    if condition == "clean":
        return qs
    out.mkdir(parents=True, exist_ok=True)
    queries = []
    for q in qs.queries:
        rel = os.path.relpath(q.path, qs.root)
        dest = out / (rel.replace(os.sep, "__").rsplit(".", 1)[0] + ".png")
        if not dest.exists():
            img = degrade(load_image(q.path, max_side=MAX_SIDE), condition, photo_seed(condition, rel))
            tmp = dest.with_suffix(".tmp.png")
            cv2.imwrite(str(tmp), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            tmp.replace(dest)
        queries.append(replace(q, path=str(dest)))
    return QuerySet(qs.layout, str(out), queries, list(qs.ignored))


#: One answer: (the object is known, the top answer is right, the verdict accepts it, its confidence,
#: it names a further object (``Answer.objects`` past the first) that the photo does not show).
Row = tuple[bool, bool, bool, float, bool]


def answers(reports: list[EvalReport]) -> list[Row]:
    """Every answer of the reports, as :data:`Row`s judged by each report's verdict."""
    return [(e.known, e.correct, e.accepted(rep.verdict), np.nan if e.confidence is None else e.confidence,
             any(i not in r.relevant for i, _ in r.objects[1:]))
            for rep in reports for r, e in zip(rep.records, rep.evidence)]


def share(num: int, den: int) -> float | None:
    return num / den if den else None


def figures(rows: list[Row]) -> dict:
    """MP@1, known and unknown rejected, wrong accepted and GAP of the answers ``rows``."""
    known = [r for r in rows if r[0]]
    unknown = [r for r in rows if not r[0]]
    wrong_known = sum(1 for r in known if r[2] and not r[1])
    wrong_unknown = sum(1 for r in unknown if r[2])
    return {
        "queries": len(rows), "known_queries": len(known), "unknown_queries": len(unknown),
        "mp@1": share(sum(1 for r in known if r[1]), len(known)),
        "known_rejected": share(sum(1 for r in known if not r[2]), len(known)),
        "unknown_rejected": share(len(unknown) - wrong_unknown, len(unknown)),
        "wrong_accepted": share(wrong_known + wrong_unknown, len(rows)),
        "wrong_extra_object": share(sum(1 for r in rows if r[4]), len(rows)),
        "known_wrong_accepted": share(wrong_known, len(known)),
        "unknown_accepted": share(wrong_unknown, len(unknown)),
        "accuracy": share(sum(1 for r in known if r[1] and r[2]) + len(unknown) - wrong_unknown, len(rows)),
        "gap": global_average_precision(np.array([r[3] for r in rows], float), [r[1] for r in rows],
                                        [r[0] for r in rows]) if known else None,
    }


def settings_of(matcher: str, verify_top: int, deep: int = DEEP, verdict: Verdict | None = None) -> QuerySettings:
    if matcher == "none":
        return QuerySettings(verify=False, verdict=verdict)
    return QuerySettings(verify_top=verify_top, deep=deep, verdict=verdict)


def calibrated(index: Index, recalibrate: bool, whitening: bool | None = None) -> tuple[Verdict | None, float]:
    """(the verdict of ``index`` calibrated again by this code, or None: the one its build stored;
    the seconds it took). ``whitening``: learn the verdict's whitening again (True), drop it
    (False), or as the index has it (None)."""
    if not recalibrate:
        return None, 0.0
    # what the build set aside of the references' features (shared by several objects) is kept in
    # memory only, for the calibration that follows it; without it a calibration's unknown views meet
    # fewer points than the build's did (COIL-100's leave-out: threshold 0.79 against the build's
    # 0.73). So the local features are computed and set aside again, as a build does.
    drive(_add_verification(index, None, [], calibrate=False, params=params_of_settings(index.local.settings),
                            check_all=True))
    t = time.perf_counter()  # the features' time counts as the index's (``load_or_build_seconds``)
    verdict = drive(calibrate(index, whitening=whitening))
    return verdict, time.perf_counter() - t


def load_text() -> dict:
    one, five, fifteen = os.getloadavg()
    return {"loadavg_1_5_15": [round(one, 2), round(five, 2), round(fifteen, 2)], "cpus": os.cpu_count()}


def fmt(v) -> str:
    return "   -  " if v is None else f"{v:6.3f}"


def row_text(condition: str, name: str, matcher: str, f: dict) -> str:
    seconds = f"{f['seconds']:6.1f}" if "seconds" in f else ""
    return (f"{condition:<15} {name:<20} {matcher:<5} {f['known_queries']:>4}/{f['unknown_queries']:<3} "
            f"{fmt(f['mp@1'])} {fmt(f['known_rejected'])} {fmt(f['unknown_rejected'])} {fmt(f['wrong_accepted'])} "
            f"{fmt(f['gap'])} {fmt(f.get('wrong_extra_object'))}  {seconds}")


HEADER = (f"{'condition':<15} {'set':<20} {'match':<5} {'kn/unk':<8} {'MP@1':>6} {'kn.rej':>6} {'un.rej':>6} "
          f"{'wrong':>6} {'GAP':>6} {'extra':>6}  {'s':>6}")


def run(args: argparse.Namespace, results: dict, save: Callable[[], None]) -> None:
    """Every (set, matcher, condition) asked for, in that order, saved after each."""
    work: Path = args.work
    built: dict[tuple[str, str], Index] = {}
    verdicts: dict[tuple[str, str], Verdict | None] = {}
    factories = {m: indexes(work, m) for m in ("sift", "xfeat")}
    pooled: dict[tuple[str, str], list[Row]] = {}
    print(HEADER, flush=True)
    for name in args.sets:
        kind, clean = query_sets(name, args.coil_angles)
        for matcher in args.matchers:
            index_matcher = "sift" if matcher == "none" else matcher
            key = (kind, index_matcher)
            if key not in built:
                t = time.perf_counter()
                built[key] = factories[index_matcher][kind]()
                verdicts[key], seconds = calibrated(built[key], args.recalibrate, args.whitening)
                results["indexes"][f"{kind}-{index_matcher}"] = {
                    "references": len(built[key]), "load_or_build_seconds": round(time.perf_counter() - t - seconds, 1),
                    "calibration_seconds": round(seconds, 1) if args.recalibrate else None}
            index = built[key]
            # one pipeline per index and matcher
            pipe = QueryPipeline(index, settings_of(matcher, args.verify_top, args.deep, verdicts[key]))
            for condition in args.conditions:
                t = time.perf_counter()
                qsets = [degraded(qs, condition, work / "photos" / condition / name / str(i))
                         for i, qs in enumerate(clean)]
                t_photos = time.perf_counter() - t
                reports = [run_evaluation(index, qs, pipeline=pipe) for qs in qsets]
                rows = answers(reports)
                f = {**figures(rows), "skipped": sum(len(rep.skipped) for rep in reports)}
                if name in POOLED:
                    pooled.setdefault((condition, matcher), []).extend(rows)
                f["seconds"] = round(time.perf_counter() - t, 1)
                f["photo_seconds"] = round(t_photos, 1)
                results["figures"].setdefault(condition, {}).setdefault(name, {})[matcher] = f
                print(row_text(condition, name, matcher, f), flush=True)
                save()
    for (condition, matcher), rows in pooled.items():
        results["pooled"].setdefault(condition, {})[matcher] = figures(rows)


def table(results: dict) -> str:
    """The figures as a text table, by condition, set and matcher."""
    lines = [HEADER]
    for condition, sets in results["figures"].items():
        for name, by_matcher in sets.items():
            for matcher, f in by_matcher.items():
                lines.append(row_text(condition, name, matcher, f))
    lines += ["", f"pooled over {', '.join(POOLED)}:", HEADER]
    for condition, by_matcher in results["pooled"].items():
        for matcher, f in by_matcher.items():
            lines.append(row_text(condition, "pooled", matcher, f))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"conditions {','.join(QUICK_CONDITIONS)} on sets "
                                                         f"{','.join(QUICK_SETS)}")
    ap.add_argument("--work", type=Path, default=None, help="where the indexes and degraded photos are kept")
    ap.add_argument("--conditions", default=None, help=f"comma-separated, of: {', '.join(CONDITIONS)}")
    ap.add_argument("--sets", default=None, help=f"comma-separated, of: {', '.join(SETS)}")
    ap.add_argument("--matchers", default=",".join(MATCHERS))
    ap.add_argument("--verify-top", type=int, default=20)
    ap.add_argument("--deep", type=int, default=DEEP,
                    help=f"references the second, closer look verifies when the first is unsure (default {DEEP}; "
                         "0: no second look, as before issue 36)")
    ap.add_argument("--recalibrate", action="store_true",
                    help="calibrate each index again with this code, its local features computed and set "
                         "aside again as a build does (default: the verdict its build stored)")
    ap.add_argument("--whitening", choices=("yes", "no"), default=None,
                    help="with --recalibrate: learn the verdict's whitening (yes) or calibrate without one (no); "
                         "default: as each index was built")
    ap.add_argument("--coil-angles", default="10,130,250")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "visitors.json")
    args = ap.parse_args()
    if not (DATA / "coil100").is_dir():
        print(f"error: {DATA} is missing", file=sys.stderr)
        return 1
    args.conditions = (args.conditions.split(",") if args.conditions
                       else list(QUICK_CONDITIONS if args.quick else CONDITIONS))
    args.sets = args.sets.split(",") if args.sets else list(QUICK_SETS if args.quick else SETS)
    args.matchers = args.matchers.split(",")
    args.coil_angles = tuple(int(a) for a in args.coil_angles.split(","))
    if args.whitening and not args.recalibrate:
        ap.error("--whitening needs --recalibrate (the indexes are calibrated again)")
    args.whitening = None if args.whitening is None else args.whitening == "yes"
    for c in args.conditions:
        if c not in CONDITIONS:
            ap.error(f"unknown condition {c!r}; choose from {', '.join(CONDITIONS)}")
    for m in args.matchers:
        if m not in MATCHERS:
            ap.error(f"unknown matcher {m!r}; choose from {', '.join(MATCHERS)}")
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-visitors-"))
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs; one run",
        "load_at_start": load_text(),
        "command": " ".join(sys.argv[1:]),
        "protocol": {"conditions": {c: CONDITIONS[c].description for c in args.conditions}, "sets": args.sets,
                     "matchers": args.matchers, "verify_top": args.verify_top, "deep": args.deep,
                     "recalibrated": args.recalibrate, "whitening": args.whitening, "coil_angles": args.coil_angles,
                     "wrong_accepted": "answers accepted with a wrong object (known) or accepted at all (unknown), "
                                       "over all photos of the set"},
        "indexes": {}, "figures": {}, "pooled": {},
    }

    def save() -> None:
        results["seconds"] = round(time.perf_counter() - start, 1)
        results["load_at_end"] = load_text()
        args.out.write_text(json.dumps(results, indent=1, default=float) + "\n")

    run(args, results, save)
    save()
    print(f"\n{table(results)}\n\n{results['seconds']:.0f} s; load {results['load_at_end']['loadavg_1_5_15']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
