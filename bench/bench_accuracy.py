"""Accuracy on the real data in ../shared/data, written to bench/results/accuracy.json.

- paintings: MP@1 and MAP per query set for the default pipeline (GeM@256, query regions,
  verified), the same not verified, with whole-image queries, and the papers' "IM" baseline
  (logits@224, whole image);
- COIL-100 (references every 20°, queries at 10°/130°/250°): MAP and MP@1 with and without ICFRR
  (parameters suggested from the collection, and a few others).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from museum_search.core.answer._icfrr import suggest_params
from museum_search.core.answer._pipeline import QuerySettings
from museum_search.core.answer._rerank import RerankOptions
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import run_evaluation
from museum_search.core.index._labels import COIL100_REGEX
from museum_search.core.index._store import LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive as run

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data"


def paintings() -> dict:
    root = DATA / "paintings"
    out: dict = {}
    default = run(build_index(root / "references", None, BackboneConfig())).index
    im = run(build_index(root / "references", None, BackboneConfig(head="logits"), verification=False)).index
    runs = {
        "default (GeM@256, query regions, verified)": (default, QuerySettings()),
        "GeM@256, query regions, not verified": (default, QuerySettings(verify=False)),
        "GeM@256, whole-image queries, not verified": (default, QuerySettings(verify=False, regions=False)),
        "IM baseline (logits@224, whole image)": (im, QuerySettings(verify=False, regions=False)),
    }
    for name, (index, settings) in runs.items():
        row = {}
        for qs in ("qsd1_w1", "qsd1_w3", "qsd2_w3"):
            t0 = time.perf_counter()
            rep = run_evaluation(index, load_queryset(root / "queries" / qs), settings)
            row[qs] = {"mp@1": rep.summary["mp@1"], "map": rep.summary["map"], "seconds": time.perf_counter() - t0}
        row["mean mp@1"] = sum(row[q]["mp@1"] for q in ("qsd1_w1", "qsd1_w3", "qsd2_w3")) / 3
        out[name] = row
        print(f"{name:<42} " + "  ".join(f"{q} {row[q]['mp@1']:.3f}" for q in ("qsd1_w1", "qsd1_w3", "qsd2_w3"))
              + f"  mean {row['mean mp@1']:.3f}", flush=True)
    return out


def coil() -> dict:
    root = DATA / "coil100"
    angle = re.compile(r"__(\d+)\.")
    names = sorted(p.name for p in root.glob("*.jpg"))
    refs = [n for n in names if int(angle.search(n).group(1)) % 20 == 0]
    queries = [n for n in names if int(angle.search(n).group(1)) in (10, 130, 250)]
    tmp = Path(tempfile.mkdtemp(prefix="coil-refs-"))
    for n in refs:
        (tmp / n).symlink_to(root / n)
    index = run(build_index(tmp, None, BackboneConfig(size=224), LabellingSpec("regex", regex=COIL100_REGEX),
                            verification=False)).index
    qs = load_queryset(root, layout="regex", regex=COIL100_REGEX, files=queries)
    base = suggest_params(index.labels)
    out = {"references": len(index), "queries": len(qs.queries), "suggested": {"k_q": base.k_q, "k_g": base.k_g}}
    settings = [("none", None), (f"ICFRR suggested K={base.k_q}, beta 0.5", RerankOptions())]
    for k in (5, 15):
        settings.append((f"ICFRR K={k}, beta 0.5", RerankOptions(k_q=k, k_g=k)))
    settings.append((f"ICFRR K={base.k_q}, beta 0.5, reference mode", RerankOptions(icfrr_mode="reference")))
    for name, opts in settings:
        rep = run_evaluation(index, qs, QuerySettings(regions=False, verify=False, rerank="icfrr" if opts else "",
                                                      options=opts or RerankOptions()))
        out[name] = {"map": rep.summary["map"], "mp@1": rep.summary["mp@1"], "amnro": rep.summary["amnro"]}
        print(f"COIL-100 {name:<40} MAP {rep.summary['map']:.4f}  MP@1 {rep.summary['mp@1']:.4f}  "
              f"AMNRO {rep.summary['amnro']:.4f}", flush=True)
    return out


def main() -> None:
    results = {"paintings": paintings(), "coil100": coil()}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "accuracy.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
