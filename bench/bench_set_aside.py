"""What setting aside the features several objects share costs (issue 36): build time and bytes per reference.

On three collections of other kinds (the sample: 42 photos of 12 framed works; the paintings less 20 %:
230 single photos; COIL-100 every 20 degrees less every 5th object: 1,436 turntable photos), in one run:

- the whole build (``build_index``, no output folder: describing, local features, the set-aside,
  the neighbour lists, the calibration), with the set-aside and without it (the stage replaced by
  nothing), alternately (``--rounds``), in seconds, and the set-aside stage's own seconds (its
  progress records);
- the local features stored per reference (points and descriptors, the bytes the index keeps) with
  and without it, and the share of features set aside.

Writes bench/results/set_aside.json (``--out``).

    .venv/bin/python bench/bench_set_aside.py [--rounds 2] [--sets sample,paintings-80,coil-80]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import numpy as np
from bench_verdict import COIL_LEFT_OUT, DATA, REPO, _links

from museum_search.core.index._labels import COIL100_REGEX
from museum_search.core.index._store import LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs import _indexing
from museum_search.core.jobs._indexing import build_index
from museum_search.core.verification._shared import STAGE

SAMPLE = REPO / "resources" / "sample"


def collections(work: Path) -> dict[str, tuple[Path, BackboneConfig, LabellingSpec]]:
    angle, obj = re.compile(r"__(\d+)\."), re.compile(r"obj(\d+)__")
    coil = [p for p in sorted((DATA / "coil100").glob("*.jpg")) if int(angle.search(p.name).group(1)) % 20 == 0
            and int(obj.match(p.name).group(1)) not in COIL_LEFT_OUT]
    refs = sorted((DATA / "paintings" / "references").glob("*.jpg"))
    left = set(np.random.default_rng(20261122).choice(len(refs), size=int(len(refs) * 0.2), replace=False).tolist())
    return {
        "sample": (SAMPLE / "collection", BackboneConfig(), LabellingSpec("catalogue", str(SAMPLE / "catalogue.csv"))),
        "paintings-80": (_links(work / "paintings-80", [f for i, f in enumerate(refs) if i not in left]),
                         BackboneConfig(), LabellingSpec()),
        "coil-80": (_links(work / "coil-80", coil), BackboneConfig(size=224),
                    LabellingSpec("regex", regex=COIL100_REGEX)),
    }


def one_build(folder: Path, config: BackboneConfig, labelling: LabellingSpec, set_aside: bool) -> dict:
    """The build's seconds, the set-aside stage's seconds and what the index keeps of local features."""
    original = _indexing.without_shared_features
    if not set_aside:
        def nothing(local, *args, **kwargs):
            return local, 0
            yield  # a generator, as the stage is

        _indexing.without_shared_features = nothing
    stage_seconds = 0.0
    try:
        t = time.perf_counter()
        gen = build_index(folder, None, config, labelling, neighbours=20)
        try:
            while True:
                p = next(gen)
                if p.stage == STAGE:
                    stage_seconds = p.elapsed
        except StopIteration as stop:
            report = stop.value
        seconds = time.perf_counter() - t
    finally:
        _indexing.without_shared_features = original
    local = report.index.local
    stored = local.points.nbytes + local.descriptors.nbytes + local.offsets.nbytes + local.sizes.nbytes
    return {"seconds": seconds, "stage_seconds": stage_seconds, "features": int(len(local.descriptors)),
            "references": len(report.index),
            "bytes_per_reference": stored / len(report.index)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--sets", default="sample,paintings-80,coil-80")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "set_aside.json")
    args = ap.parse_args()
    if not (DATA / "coil100").is_dir():
        print(f"error: {DATA} is missing", file=sys.stderr)
        return 1
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-set-aside-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: dict = {"machine": f"{os.cpu_count()} cores, shared with other jobs; one run",
                     "load_at_start": [round(x, 2) for x in os.getloadavg()], "sets": {}}
    colls = collections(work)
    for name in args.sets.split(","):
        folder, config, labelling = colls[name]
        runs: dict[str, list[dict]] = {"with": [], "without": []}
        for _ in range(args.rounds):
            for mode in ("without", "with"):
                runs[mode].append(one_build(folder, config, labelling, mode == "with"))
        w, wo = runs["with"], runs["without"]
        f = {
            "references": w[0]["references"],
            "build_seconds_without": [round(r["seconds"], 1) for r in wo],
            "build_seconds_with": [round(r["seconds"], 1) for r in w],
            "build_ratio": round(float(np.median([r["seconds"] for r in w]) / np.median([r["seconds"] for r in wo])), 3),
            "set_aside_stage_seconds": [round(r["stage_seconds"], 1) for r in w],
            "features_without": wo[0]["features"], "features_with": w[0]["features"],
            "set_aside_share": round(1 - w[0]["features"] / max(1, wo[0]["features"]), 4),
            "bytes_per_reference_without": round(wo[0]["bytes_per_reference"]),
            "bytes_per_reference_with": round(w[0]["bytes_per_reference"]),
        }
        results["sets"][name] = f
        print(f"{name}: build {f['build_seconds_without']} -> {f['build_seconds_with']} s (x{f['build_ratio']}), "
              f"stage {f['set_aside_stage_seconds']} s, features set aside {f['set_aside_share']:.1%}, "
              f"bytes/reference {f['bytes_per_reference_without']} -> {f['bytes_per_reference_with']}", flush=True)
        results["seconds"] = round(time.perf_counter() - start, 1)
        results["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
