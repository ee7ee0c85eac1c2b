"""The loop works (issue 34): visitors' photos not recognised in week 1, confirmed by staff through
the review queue, make week 2's photos recognised.

On each dev set with unknown objects (``paintings-leave-out``: the paintings less 20 % left out,
queried with qsd1_w1, qsd1_w3 and qsd2_w3; ``coil-leave-out``: COIL-100 less every 5th object,
references every 20 degrees; see ``bench_visitors.py``), each object's held-back photos are split
into **week 1** and **week 2**:

- paintings: an object with several photos has them dealt alternately to the two weeks; an object
  with one photo has it in both weeks, taken by two visitors (two independent draws of the
  conditions below); COIL: ``--coil-per-week`` held-back angles (not multiples of 20) per object and
  week, drawn at random without overlap;
- every photo as a visitor's phone takes it: the protocol's ``phone`` or ``phone-hard`` combination
  (:mod:`museum_search.core.conditions`), drawn per object (where it hangs: the room's light, where
  visitors stand), the same both weeks; what is random in it (noise, shake, angle, glare) drawn anew
  per photo and week.

Then, as a museum would run it:

1. the index as built, calibrated by this code (**before**), answers week 1 and week 2;
2. week 1's answers go through a real :class:`VisitorLog` keeping "unsure" photos (not recognised,
   or not surely);
3. staff review the kept photos: those of known objects **not recognised** become views of the object
   they show (:func:`add_views_job`, one "this is object X" action per object, timed), those of
   objects not in the collection are marked "not in our collection" (:func:`mark_unknown`);
4. the updated index answers week 2 again (**after**).

Reported per set and pooled: known rejected, MP@1, unknown rejected, wrong accepted (as in
``bench_visitors.py``), the photos kept and added, and the seconds of each "this is object X" action.
Writes ``bench/results/review_loop.json``.

    .venv/bin/python bench/bench_review_loop.py [--source-work /tmp/visitors-work] [--work DIR]
        [--sets paintings-leave-out,coil-leave-out] [--coil-per-week 2]
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
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from bench_verdict import COIL_LEFT_OUT, DATA, QUERY_SETS
from bench_visitors import MAX_SIDE, figures, indexes, load_text

from museum_search.core.answer import QueryPipeline, QuerySettings, Verdict, query_from_array
from museum_search.core.conditions import degrade, photo_seed
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.images import load_image
from museum_search.core.index import Index
from museum_search.core.index._labels import COIL100_REGEX
from museum_search.core.jobs import update_index
from museum_search.core.jobs._calibration import calibrate
from museum_search.core.progress import drive
from museum_search.core.visitors import KeepPolicy, VisitorLog, add_views_job, mark_unknown

SETS = ("paintings-leave-out", "coil-leave-out")
KIND = {"paintings-leave-out": "paintings-80", "coil-leave-out": "coil-80"}
#: The phone-like combinations of the protocol a visitor's photo is drawn from.
PHONE_LIKE = ("phone", "phone-hard")
WEEK1 = datetime(2026, 11, 2, 14, 0)


# A photo of a week: (name, source file, relevant instances, condition, seed).
Photo = tuple[str, str, frozenset, str, int]


def _visitor(obj: str, name: str, week: int) -> tuple[str, int]:
    """The condition and seed of the photo ``name`` of the object ``obj`` in ``week``: the condition
    is the object's (where it hangs: the room's light, where visitors stand), the same both weeks;
    what is random in it (the noise, the shake's direction, the angle, the glare's place) is drawn
    anew for each photo and week (another visitor)."""
    return PHONE_LIKE[photo_seed("loop", obj) % len(PHONE_LIKE)], photo_seed("loop", name, week)


def paintings_weeks() -> tuple[list[Photo], list[Photo]]:
    by_object: dict[str, list[tuple[str, str, frozenset]]] = {}
    for qs_name in QUERY_SETS:
        qs = load_queryset(DATA / "paintings" / "queries" / qs_name)
        for q in qs.queries:
            name = f"{qs_name}/{Path(q.path).name}"
            by_object.setdefault(min(q.relevant) if q.relevant else name, []).append((name, q.path, q.relevant))
    weeks: tuple[list[Photo], list[Photo]] = ([], [])
    for obj, photos in by_object.items():
        if len(photos) == 1:
            photos = photos * 2  # one photo: two visitors, one each week
        for i, (name, path, relevant) in enumerate(photos):
            week = i % 2
            weeks[week].append((f"w{week + 1}/{name}", path, relevant, *_visitor(obj, name, week)))
    return weeks


def coil_weeks(per_week: int) -> tuple[list[Photo], list[Photo]]:
    root = DATA / "coil100"
    angle, obj = re.compile(r"__(\d+)\."), re.compile(r"obj(\d+)__")
    by_object: dict[int, list[str]] = {}
    for p in sorted(root.glob("*.jpg")):
        if int(angle.search(p.name).group(1)) % 20:
            by_object.setdefault(int(obj.match(p.name).group(1)), []).append(p.name)
    rng = np.random.default_rng(20261128)
    files = {}
    for o, names in by_object.items():
        files[o] = [names[i] for i in rng.choice(len(names), size=2 * per_week, replace=False)]
    qs = load_queryset(root, layout="regex", regex=COIL100_REGEX, files=[n for f in files.values() for n in f])
    relevant = {Path(q.path).name: q.relevant for q in qs.queries}
    weeks: tuple[list[Photo], list[Photo]] = ([], [])
    for o, names in files.items():
        for i, name in enumerate(names):
            week = int(i >= per_week)
            weeks[week].append((f"w{week + 1}/{name}", str(root / name), relevant[name],
                                *_visitor(str(o), name, week)))
    return weeks


def pixels(photo: Photo) -> np.ndarray:
    _, path, _, condition, seed = photo
    return degrade(load_image(path, max_side=MAX_SIDE), condition, seed)


def ask(index: Index, photos: list[Photo], verdict: Verdict | None = None) -> tuple[list, list]:
    """(the answers, the figures' rows: known, right, accepted, confidence) of ``photos`` (judged by
    ``verdict``, default the index's)."""
    pipe = QueryPipeline(index, QuerySettings(verdict=verdict))
    instances = set(index.instances)
    answers, rows = [], []
    for photo in photos:
        img = pixels(photo)
        (a,) = pipe.answer([query_from_array(img, photo[0])])
        relevant = photo[2]
        known = bool(relevant & instances)
        right = a.top is not None and a.top.instance in relevant
        answers.append((a, img))
        rows.append((known, right, bool(a.in_collection), np.nan if a.confidence is None else float(a.confidence)))
    return answers, rows


def prepared(kind: str, args: argparse.Namespace, work: Path) -> tuple[Path, float | None]:
    """A fresh copy in ``work`` of the set's index (built in ``--source-work`` when not there),
    calibrated by this code (once, kept in ``--cache``); (its path, the calibration's seconds, None
    when the cache had it)."""
    calibrated = args.cache / f"{kind}-calibrated.idx"
    seconds = None
    if not (calibrated / "manifest.json").exists():
        indexes(args.source_work, "sift")[kind]().save(calibrated)
        # up to date with its files first (an index built before they were touched describes them again)
        drive(update_index(Index.load(calibrated)))
        src = Index.load(calibrated)
        t = time.perf_counter()
        src.store_verdict(drive(calibrate(src)))
        seconds = time.perf_counter() - t
    out = work / f"{kind}.idx"
    Index.load(calibrated).save(out)
    return out, seconds


def review(index_path: Path, log: VisitorLog, truth: dict[str, frozenset], known: set[str]) -> dict:
    """The staff's review of week 1's kept photos (see the module doc); what was done and timed."""
    kept = log.kept("new")
    by_object: dict[str, list[str]] = {}
    unknown, left = [], 0
    for k in kept:
        relevant = truth[k.id]
        if not relevant & known:
            unknown.append(k.id)
        elif not k.in_collection:
            by_object.setdefault(min(relevant & known), []).append(k.id)
        else:
            left += 1  # recognised but not surely: left in the queue
    t = time.perf_counter()
    if unknown:
        mark_unknown(log, unknown)
    unknown_seconds = time.perf_counter() - t
    actions = []
    for instance, ids in sorted(by_object.items()):
        t = time.perf_counter()
        drive(add_views_job(index_path, log, ids, instance))
        actions.append({"instance": instance, "photos": len(ids), "seconds": round(time.perf_counter() - t, 2)})
    seconds = [a["seconds"] for a in actions]
    return {"kept": len(kept), "added_photos": sum(a["photos"] for a in actions), "actions": len(actions),
            "marked_unknown": len(unknown), "mark_unknown_seconds": round(unknown_seconds, 2),
            "left_in_queue_recognised_unsure": left,
            "action_seconds": {"median": round(float(np.median(seconds)), 2) if seconds else None,
                               "mean": round(float(np.mean(seconds)), 2) if seconds else None,
                               "max": round(float(np.max(seconds)), 2) if seconds else None},
            "each_action": actions}


def run_set(name: str, args: argparse.Namespace) -> tuple[dict, list, list]:
    work = args.work / name
    work.mkdir(parents=True, exist_ok=True)
    week1, week2 = paintings_weeks() if name == "paintings-leave-out" else coil_weeks(args.coil_per_week)
    index_path, calib_seconds = prepared(KIND[name], args, work)
    index = Index.load(index_path)
    known = set(index.instances)
    t = time.perf_counter()
    answers1, rows1 = ask(index, week1)
    _, before = ask(index, week2)
    ask_seconds = time.perf_counter() - t
    policy = KeepPolicy(keep="unsure", quota_mb=10_000, per_day=1_000_000, retention_days=3650)
    truth = {}
    with VisitorLog.open(index_path, policy, folder=work / "visitors") as log:
        for i, ((answer, img), photo) in enumerate(zip(answers1, week1)):
            k = log.record(answer, source="phone", image=img, when=WEEK1 + timedelta(minutes=i))
            if k is not None:
                truth[k.id] = photo[2]
        done = review(index_path, log, truth, known)
    after_index = Index.load(index_path)
    _, after = ask(after_index, week2)
    _, references_only = ask(after_index, week2, Verdict.of_index(index))  # the views, not the refit
    result = {
        "references_before": len(index), "references_after": len(after_index),
        "week1_photos": len(week1), "week2_photos": len(week2),
        "week1": figures(rows1), "week2_before": figures(before), "week2_after": figures(after),
        "week2_after_views_with_the_verdict_before": figures(references_only),
        "review": done, "calibration_seconds": None if calib_seconds is None else round(calib_seconds, 1),
        "staff_views": after_index.verdict.get("staff_views"),
        "verdict_after": after_index.verdict.get("source"),
        "answer_seconds_per_photo": round(ask_seconds / (len(week1) + len(week2)), 3),
    }
    return result, before, after


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source-work", type=Path, default=Path("/tmp/visitors-work"),
                    help="where bench_visitors.py keeps its indexes (built there when missing)")
    ap.add_argument("--work", type=Path, default=None, help="where this run's copies of the indexes go")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bench-review-loop-cache",
                    help="the indexes calibrated by this code, kept between runs")
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--coil-per-week", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "review_loop.json")
    args = ap.parse_args()
    args.work = args.work or Path(tempfile.mkdtemp(prefix="bench-review-loop-"))
    args.source_work.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, shared with other jobs; one run",
        "load_at_start": load_text(), "command": " ".join(sys.argv[1:]),
        "protocol": {"conditions": PHONE_LIKE, "keep": "unsure", "coil_per_week": args.coil_per_week,
                     "coil_left_out": sorted(COIL_LEFT_OUT),
                     "review": "kept photos of known objects not recognised: 'this is object X' (one action per "
                               "object); kept photos of objects not in the collection: 'not in our collection'"},
        "sets": {}, "pooled": {},
    }
    pooled_before, pooled_after = [], []
    for name in args.sets.split(","):
        r, before, after = run_set(name, args)
        results["sets"][name] = r
        pooled_before += before
        pooled_after += after
        b, a = r["week2_before"], r["week2_after"]
        print(f"{name}: week 2 known rejected {b['known_rejected']:.3f} -> {a['known_rejected']:.3f}, MP@1 "
              f"{b['mp@1']:.3f} -> {a['mp@1']:.3f}, unknown rejected {b['unknown_rejected']:.3f} -> "
              f"{a['unknown_rejected']:.3f}, wrong accepted {b['wrong_accepted']:.3f} -> {a['wrong_accepted']:.3f}; "
              f"{r['review']['added_photos']} photos added in {r['review']['actions']} actions "
              f"(median {r['review']['action_seconds']['median']} s)", flush=True)
    results["pooled"] = {"week2_before": figures(pooled_before), "week2_after": figures(pooled_after)}
    results["seconds"] = round(time.perf_counter() - start, 1)
    results["load_at_end"] = load_text()
    args.out.write_text(json.dumps(results, indent=1, default=float) + "\n")
    print(f"{results['seconds']:.0f} s; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
