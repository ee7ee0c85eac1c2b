"""Export the offline backbones to ONNX for the frozen build (needs the project's environment with torch).

    python packaging/export_models.py OUT_DIR [--force] [--float32] [--no-xz]

Writes ``<key>.onnx`` + ``<key>.json`` (see ``museum_search.core.inference._engines``) for each offline backbone with the
default head and size (``BackboneConfig(name=...)``), and for ``mobilenet_v2`` with the ``logits`` head, with the
weights stored as float16 (``engines.half_weights``: half the size, computed in float32; ``--float32`` keeps them
float32), compressed with xz (``<key>.onnx.xz``, about 20 % smaller; ``--no-xz`` writes plain ``.onnx``). An export already in OUT_DIR that is intact (``engines.read_export``) and stored the same way is kept
unless ``--force`` is given.
packaging/build.sh runs this into ``build/onnx`` and the spec bundles that folder as ``resources/onnx``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from museum_search.core.inference import _engines as engines
from museum_search.core.inference._backbones import REGISTRY, BackboneConfig, meta_for

OFFLINE_BACKBONES = ("mobilenet_v2", "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")


def configs() -> list[BackboneConfig]:
    return [*(BackboneConfig(name=name) for name in OFFLINE_BACKBONES), BackboneConfig(head="logits")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the exports to (created if missing)")
    parser.add_argument("--force", action="store_true", help="export again even if an intact export is there")
    parser.add_argument("--float32", action="store_true",
                        help="store the weights as float32 (default: float16 with casts to float32, half the "
                             "size; the network computes in float32 either way, see engines.half_weights)")
    parser.add_argument("--no-xz", action="store_true",
                        help="write plain .onnx files (default: .onnx.xz, about 20 %% smaller, read by engines.read_export)")
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    missing = [n for n in OFFLINE_BACKBONES if n not in REGISTRY]
    if missing:
        parser.error(f"not in museum_search.core.inference._backbones.REGISTRY: {', '.join(missing)}")
    weights = "float32" if args.float32 else "float16"
    for config in configs():
        meta = meta_for(REGISTRY[config.name], config)
        key = engines.export_key(meta)
        compress = not args.no_xz
        if (not args.force and engines.read_export(out, meta) is not None
                and engines.export_info(out, meta).get("weights", "float32") == weights
                and (engines.export_file(out, meta).suffix == ".xz") == compress):
            print(f"kept     {engines.export_file(out, meta)} ({meta.describe()}, {weights} weights): "
                  "already there and intact")
            continue
        if not engines.torch_available():
            raise SystemExit(f"export_models.py: exporting {meta.describe()} needs torch, which is not installed "
                             "in this environment: run tools/install.sh (or pip install the project) first")
        t0 = time.perf_counter()
        exported_meta, data = engines.export(config, download=False, half=weights == "float16")
        if exported_meta != meta:
            raise SystemExit(f"export_models.py: the export of {config} describes {exported_meta}, not {meta}")
        path = engines.write_export(out, exported_meta, data, weights=weights, compress=compress)
        # the other form of the same export, written here by an earlier run, would be read first or go stale
        other = out / (f"{key}.onnx" if compress else f"{key}.onnx.xz")
        other.unlink(missing_ok=True)
        print(f"exported {path} ({meta.describe()}, {weights} weights): {len(data) / 2**20:.1f} MiB "
              f"in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
