"""Every object in the photo (issue 36, item 4): photos of two works, and wrong extra objects.

Writes bench/results/objects.json. With the default index of the paintings (287 references) and of
the sample collection, the defaults a visitor gets (regions, verification of the best 20, the
calibrated verdict), through the evaluation runner (so the figures are the ``evaluate`` ones):

- qsd2_w3's photos of two paintings (two rows in ground_truth.csv): in how many both are named
  among ``Answer.objects``, and what each answer says (qsd2_w3/00019 in particular);
- every single-object photo of qsd1_w1, qsd1_w3, qsd2_w3 and the sample: the share whose answer
  names an object it does not show (goal ≤ 2 %); the sample's unknown photos too (any object named
  is extra);
- the run's "all objects found" and "extra objects named" per set (``evaluate``'s figures).

    .venv/bin/python bench/bench_objects.py [--matcher sift|xfeat] [--work DIR]

``--work DIR`` keeps the indexes there (built once).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import run_evaluation
from museum_search.core.index._store import Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive as run

DATA = ROOT.parent / "shared" / "data"
SAMPLE = ROOT / "resources" / "sample"
SETS = ("qsd1_w1", "qsd1_w3", "qsd2_w3")


def _index(folder: Path, out: Path, matcher: str, labelling=None) -> Index:
    if (out / "manifest.json").is_file():
        return Index.load(out)
    kwargs = {"labelling": labelling} if labelling is not None else {}
    return run(build_index(folder, out, BackboneConfig(), matcher=matcher, **kwargs)).index


def _records(index: Index, folder: Path):
    report = run_evaluation(index, load_queryset(folder))
    return report, [{"query": Path(r.query).name, "relevant": r.relevant,
                     "named": [i for i, _ in r.objects], "confidences": [round(c, 3) for _, c in r.objects],
                     "in_collection": r.in_collection, "reason": r.reason} for r in report.records]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--matcher", default="sift", choices=("sift", "xfeat"))
    ap.add_argument("--work", type=Path, default=None, help="keep the indexes in this folder")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "objects.json")
    args = ap.parse_args()
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-objects-"))
    t0 = time.perf_counter()
    paintings = _index(DATA / "paintings" / "references", work / f"paintings-{args.matcher}", args.matcher)
    sample = _index(SAMPLE / "collection", work / f"sample-{args.matcher}", args.matcher,
                    LabellingSpec("catalogue", str(SAMPLE / "catalogue.csv")))
    built = time.perf_counter() - t0
    doc: dict = {"matcher": args.matcher, "references": len(paintings), "build_s": round(built, 1), "sets": {}}
    single, single_extra, unknown, unknown_extra = 0, 0, 0, 0
    t1 = time.perf_counter()
    for name, index, folder in [*((s, paintings, DATA / "paintings" / "queries" / s) for s in SETS),
                                ("sample", sample, SAMPLE / "queries")]:
        report, recs = _records(index, folder)
        one = [r for r in recs if len(r["relevant"]) == 1]
        extra = [r for r in one if set(r["named"]) - set(r["relevant"])]
        none = [r for r in recs if not r["relevant"]]
        single += len(one)
        single_extra += len(extra)
        unknown += len(none)
        unknown_extra += sum(1 for r in none if r["named"])
        entry = {"photos": len(recs), "all_objects": report.summary["all_objects"],
                 "extra_objects": report.summary["extra_objects"], "mp@1": report.summary["mp@1"],
                 "single_object_photos": len(one), "single_naming_a_wrong_extra": [r["query"] for r in extra]}
        two = [r for r in recs if len(r["relevant"]) >= 2]
        if two:
            entry["two_object_photos"] = len(two)
            entry["both_named"] = sum(1 for r in two if set(r["relevant"]) <= set(r["named"]))
            entry["two_object_answers"] = two
        doc["sets"][name] = entry
        print(f"{name}: {json.dumps({k: v for k, v in entry.items() if k != 'two_object_answers'})}")
    doc["query_s"] = round(time.perf_counter() - t1, 1)
    doc["single_object_photos"] = single
    doc["single_naming_a_wrong_extra"] = single_extra
    doc["wrong_extra_share"] = single_extra / single if single else None
    doc["unknown_photos"] = unknown
    doc["unknown_naming_an_object"] = unknown_extra
    q19 = next(r for r in doc["sets"]["qsd2_w3"]["two_object_answers"] if r["query"] == "00019.jpg")
    doc["qsd2_w3/00019"] = q19
    print(f"two-painting photos of qsd2_w3: both named in {doc['sets']['qsd2_w3']['both_named']} of "
          f"{doc['sets']['qsd2_w3']['two_object_photos']}; single-object photos naming a wrong extra object: "
          f"{single_extra} of {single} ({100 * doc['wrong_extra_share']:.1f} %); 00019: {q19['reason']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results[args.matcher] = doc
    args.out.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
