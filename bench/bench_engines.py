"""Inference engines: ONNX Runtime against PyTorch eager, measured in one run on the paintings.

Writes bench/results/engines.json:

- agreement: the smallest cosine between the two engines' descriptors of every paintings reference,
  for every offline backbone and head (R-MAC runs on torch with either engine: see core/engines.py);
- indexing throughput (describing the 287 references, no verification), onnx / torch;
- query latency of the default pipeline (regions, verification), split into decode / forward
  (describe) / search / verification, median over the queries, for both engines.

- bundled: the frozen build's exports (float16 weights, xz) against torch, for every paintings reference.

    .venv/bin/python bench/bench_engines.py [--quick] [--part all|agreement|bundled] [--configs B/H ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
DATA = REPO.parent / "shared" / "data"

from museum_search.core.answer._pipeline import QueryPipeline, load_query
from museum_search.core.images import load_image
from museum_search.core.inference import _engines as engines
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.inference._engines import build_extractor
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive

BACKBONES = ("mobilenet_v2", "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")
HEADS = ("gem", "gap", "mac", "logits", "rmac")


def agreement(refs: list[Path], only: set[str] | None = None) -> dict:
    images = [load_image(p, max_side=512) for p in refs]
    out = {}
    for name in BACKBONES:
        for head in HEADS:
            if only and f"{name}/{head}" not in only:
                continue
            cfg = BackboneConfig(name=name, head=head)
            onnx, torch_ = build_extractor(cfg, engine="onnx"), build_extractor(cfg, engine="torch")
            a, b = onnx.embed_images(images), torch_.embed_images(images)
            cos = np.sum(a * b, axis=1)
            out[f"{name}/{head}"] = {"engine_used": onnx.engine, "min_cosine": float(cos.min()),
                                     "mean_cosine": float(cos.mean()), "references": len(images)}
            print(f"agreement {name:<20} {head:<7} {onnx.engine:<5} min cosine {cos.min():.7f}", flush=True)
    return out


def bundled(refs: list[Path], folder: Path) -> dict:
    """The frozen build's exports (float16 weights, xz; packaging/export_models.py) against torch."""
    from museum_search.core.inference._backbones import REGISTRY, meta_for

    images = [load_image(p, max_side=512) for p in refs]
    out = {}
    for cfg in [*(BackboneConfig(name=n) for n in BACKBONES), BackboneConfig(head="logits")]:
        meta = meta_for(REGISTRY[cfg.name], cfg)
        data = engines.read_export(folder, meta)
        if data is None:
            raise SystemExit(f"no intact export of {meta.summary()} in {folder}: run packaging/export_models.py")
        a = engines.OnnxExtractor(meta, data, folder).embed_images(images)
        b = build_extractor(cfg, engine="torch").embed_images(images)
        cos = np.sum(a * b, axis=1)
        out[f"{cfg.name}/{cfg.head}"] = {"weights": engines.export_info(folder, meta).get("weights"),
                                         "file_bytes": engines.export_file(folder, meta).stat().st_size,
                                         "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                                         "references": len(images)}
        print(f"bundled   {cfg.name:<20} {cfg.head:<7} min cosine {cos.min():.7f}", flush=True)
    return out


def indexing(folder: Path, tmp: Path) -> dict:
    out = {}
    for engine in ("torch", "onnx", "torch", "onnx"):  # alternated, the second of each counts
        build_extractor(BackboneConfig(), engine=engine)  # built (and exported) outside the timing
        t = time.perf_counter()
        report = drive(build_index(folder, tmp / f"index-{engine}-{time.monotonic_ns()}", verification=False,
                                   engine=engine))
        out[engine] = {"seconds": time.perf_counter() - t, "references": len(report.index)}
        print(f"indexing {engine}: {out[engine]['seconds']:.1f} s", flush=True)
    n = out["onnx"]["references"]
    return {"seconds": {k: v["seconds"] for k, v in out.items()}, "references": n,
            "throughput_images_per_second": {k: n / v["seconds"] for k, v in out.items()},
            "onnx_over_torch_throughput": out["torch"]["seconds"] / out["onnx"]["seconds"]}


def latency(index_path: Path, queries: list[Path]) -> dict:
    from museum_search.core.index._store import Index

    index = Index.load(index_path)
    out = {}
    for engine in ("torch", "onnx"):
        pipe = QueryPipeline(index, extractor=build_extractor(index.meta.config(), engine=engine))
        pipe.warm_up()
        rows = []
        for p in queries:
            t = time.perf_counter()
            q = load_query(p)
            decode = time.perf_counter() - t
            pipe.answer([q])
            rows.append({"decode": decode, "forward": pipe.timings["describe"], "search": pipe.timings["search"],
                         "verification": pipe.timings["verify"],
                         "total": decode + sum(pipe.timings.values())})
        out[engine] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"latency {engine}: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in out[engine].items()), flush=True)
    out["forward_torch_over_onnx"] = out["torch"]["forward"] / out["onnx"]["forward"]
    out["total_torch_over_onnx"] = out["torch"]["total"] / out["onnx"]["total"]
    out["queries"] = len(queries)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="20 references for the agreement")
    ap.add_argument("--part", choices=("all", "agreement", "bundled"), default="all",
                    help="run one part and merge it into the existing engines.json (default: all parts)")
    ap.add_argument("--configs", nargs="*", metavar="BACKBONE/HEAD",
                    help="with --part agreement: only these configurations (merged with those already measured)")
    ap.add_argument("--bundled-dir", type=Path, default=REPO / "build" / "onnx",
                    help="with --part bundled: the frozen build's exports (default build/onnx)")
    args = ap.parse_args(argv)
    refs = sorted((DATA / "paintings" / "references").glob("*.jpg"))
    if not refs:
        print(f"shared data not found at {DATA}", file=sys.stderr)
        return 1
    queries = sorted((DATA / "paintings" / "queries" / "qsd1_w1").glob("*.jpg"))[:30]
    results: dict = {"machine": "2-core CPU, shared; one run", "onnxruntime": __import__("onnxruntime").__version__,
                     "torch": __import__("torch").__version__}
    out = HERE / "results" / "engines.json"

    def save() -> None:  # after each part: a long run stopped half-way keeps what it measured
        out.write_text(json.dumps(results, indent=1))

    if args.part != "all":  # one part, merged into the results of earlier runs
        results = {**json.loads(out.read_text()), **{k: results[k] for k in ("onnxruntime", "torch")}}
        if args.part == "bundled":
            results["bundled"] = bundled(refs[:20] if args.quick else refs, args.bundled_dir)
        else:
            measured = agreement(refs[:20] if args.quick else refs, set(args.configs or []) or None)
            results["agreement"] = {**results.get("agreement", {}), **measured}
        save()
        print(f"written {out}")
        return 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        results["indexing"] = indexing(DATA / "paintings" / "references", tmp)
        save()
        idx = tmp / "index-verified"
        drive(build_index(DATA / "paintings" / "references", idx, engine="onnx"))
        results["latency"] = latency(idx, queries)
        save()
    results["agreement"] = agreement(refs[:20] if args.quick else refs)
    save()
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
