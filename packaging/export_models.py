"""Export the offline backbones to ONNX for the frozen build (needs the project's environment with torch).

    python packaging/export_models.py OUT_DIR [--force]

Writes ``<key>.onnx`` + ``<key>.json`` (see ``museum_search.core.engines``) for each offline backbone with the
default head and size (``BackboneConfig(name=...)``), and for ``mobilenet_v2`` with the ``logits`` head. An
export already in OUT_DIR that is intact (``engines.read_export``) is kept unless ``--force`` is given.
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

from museum_search.core import engines
from museum_search.core.backbones import REGISTRY, BackboneConfig, meta_for

OFFLINE_BACKBONES = ("mobilenet_v2", "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2")


def configs() -> list[BackboneConfig]:
    return [*(BackboneConfig(name=name) for name in OFFLINE_BACKBONES), BackboneConfig(head="logits")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the exports to (created if missing)")
    parser.add_argument("--force", action="store_true", help="export again even if an intact export is there")
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    missing = [n for n in OFFLINE_BACKBONES if n not in REGISTRY]
    if missing:
        parser.error(f"not in museum_search.core.backbones.REGISTRY: {', '.join(missing)}")
    for config in configs():
        meta = meta_for(REGISTRY[config.name], config)
        key = engines.export_key(meta)
        if not args.force and engines.read_export(out, meta) is not None:
            print(f"kept     {out / (key + '.onnx')} ({meta.describe()}): already there and intact")
            continue
        if not engines.torch_available():
            raise SystemExit(f"export_models.py: exporting {meta.describe()} needs torch, which is not installed "
                             "in this environment: run tools/install.sh (or pip install the project) first")
        t0 = time.perf_counter()
        exported_meta, data = engines.export(config, download=False)
        if exported_meta != meta:
            raise SystemExit(f"export_models.py: the export of {config} describes {exported_meta}, not {meta}")
        path = engines.write_export(out, exported_meta, data)
        print(f"exported {path} ({meta.describe()}): {len(data) / 2**20:.1f} MiB in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
