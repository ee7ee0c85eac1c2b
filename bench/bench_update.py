"""Update of one photo in seconds (issue 21, item 5): adding one painting to the other 286.

Writes bench/results/update.json (or --out). One run on this machine:

1. an index of 286 of the 287 paintings (../shared/data/paintings/references, linked into a
   temporary folder) is built with verification and calibration;
2. the 287th photo is added to the folder and ``update_index`` runs (the CLI's and the app's
   update): it describes and computes local features for the new photo only, refits the verdict
   from the stored calibration evidence and the new photo's own view, and saves;
3. for comparison, in the same process: describing that one photo (the forward pass of its
   regions, warm), and what the update did before (calibrating the verdict again on its views).

Reports the update's seconds by stage, and the ratios update / describing the photo, before and after.

    .venv/bin/python bench/bench_update.py [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.inference._engines import extractor_for_meta
from museum_search.core.inference._extract import extract
from museum_search.core.jobs._calibration import calibrate
from museum_search.core.jobs._indexing import build_index, update_index
from museum_search.core.progress import drive

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"


def _stages(gen) -> tuple[object, dict[str, float]]:
    """Drive a progress generator; its result and the seconds of each stage (from the end of the
    stage before it to its own last report)."""
    events: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    result = drive(gen, lambda p: events.append((time.perf_counter() - t0, p.stage)))
    total = time.perf_counter() - t0
    stages: dict[str, float] = {}
    start = 0.0
    for i, (t, stage) in enumerate(events):
        if i + 1 == len(events) or events[i + 1][1] != stage:
            stages[stage] = stages.get(stage, 0.0) + t - start
            start = t
    return result, {"total": total, **stages, "saving and the rest": total - start}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "update.json")
    args = ap.parse_args()
    refs = sorted((DATA / "paintings" / "references").glob("*.jpg"))
    if not refs:
        print(f"error: {DATA} is missing", file=sys.stderr)
        return 1
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-update-"))
    folder, out = work / "paintings-286", work / "index"
    folder.mkdir(parents=True)
    for f in refs[:-1]:
        (folder / f.name).symlink_to(f)
    t = time.perf_counter()
    drive(build_index(folder, out, BackboneConfig()))
    build = time.perf_counter() - t
    new = refs[-1]
    (folder / new.name).symlink_to(new)
    index = Index.load(out)
    extractor = extractor_for_meta(index.meta)
    drive(extract([new], extractor))  # warm
    t = time.perf_counter()
    drive(extract([new], extractor))
    describe = time.perf_counter() - t
    report, stages = _stages(update_index(Index.load(out), extractor=extractor))
    updated = Index.load(out)
    t = time.perf_counter()
    drive(calibrate(updated, extractor))  # what the update did before: calibrate again
    recalibrate = time.perf_counter() - t
    before = stages["total"] - stages.get("calibrating", 0.0) + recalibrate
    res = {
        "machine": "2-core CPU, shared; one run",
        "references_before": len(refs) - 1, "added": report.added, "build_seconds": round(build, 1),
        "describe_one_photo_seconds": round(describe, 3),
        "update_seconds": {k: round(v, 3) for k, v in stages.items()},
        "update_over_describe": round(stages["total"] / describe, 2),
        "update_minus_describe_seconds": round(stages["total"] - describe, 3),
        "before": {"calibration_seconds": round(recalibrate, 1), "update_seconds": round(before, 1),
                   "update_over_describe": round(before / describe, 1)},
        "verdict_source": updated.verdict["source"],
    }
    print(json.dumps(res, indent=1))
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
