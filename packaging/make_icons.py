"""Make the Windows .ico and macOS .icns application icons from resources/icons/museum-search-*.png.

    python packaging/make_icons.py            # -> build/icons/museum-search.ico and museum-search.icns
    python packaging/make_icons.py --out DIR

Needs only Pillow. Sizes above the largest PNG (the 512 and 1024 px macOS icons) are rendered from
museum-search.svg when PySide6 is importable, else scaled up from the largest PNG. museum-search.spec picks the files up from build/icons/ (the build folder is not
committed); without them PyInstaller converts the 256 px PNG itself (also with Pillow).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
ICONS = ROOT / "resources" / "icons"
NAME = "museum-search"

ICO_SIZES = [16, 24, 32, 48, 64, 128, 256]  # what Windows Explorer and the taskbar ask for
ICNS_SIZES = [16, 32, 64, 128, 256, 512, 1024]  # Pillow writes the icns types it can from these


def load_pngs(folder: Path = ICONS) -> dict[int, Image.Image]:
    """The square PNGs museum-search-<size>.png, by size."""
    from PIL import Image

    found = {}
    for path in folder.glob(f"{NAME}-*.png"):
        m = re.fullmatch(rf"{re.escape(NAME)}-(\d+)\.png", path.name)
        if m:
            img = Image.open(path).convert("RGBA")
            if img.width == img.height:
                found[img.width] = img
    if not found:
        raise SystemExit(f"make_icons: no {NAME}-<size>.png in {folder}")
    return dict(sorted(found.items()))


def render_svg(svg: Path, size: int):
    """The SVG rendered at size x size with Qt, or None when PySide6/QtSvg is not available."""
    try:
        import os

        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
        from PIL import Image
        from PySide6.QtCore import QBuffer, QIODevice
        from PySide6.QtGui import QGuiApplication, QImage, QPainter
        from PySide6.QtSvg import QSvgRenderer
    except ImportError:
        return None
    app = QGuiApplication.instance() or QGuiApplication([])  # painting text/paths needs an application
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        return None
    image = QImage(size, size, QImage.Format.Format_ARGB32)
    image.fill(0)
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    del app
    buf = QBuffer()
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buf, "PNG")
    import io

    return Image.open(io.BytesIO(bytes(buf.data()))).convert("RGBA")


def _best(pngs: dict, size: int, svg: Path | None = None):
    """The PNG of exactly this size, else the smallest larger one scaled down, else the SVG rendered at
    this size, else the largest PNG scaled up."""
    from PIL import Image

    if size in pngs:
        return pngs[size]
    larger = [s for s in pngs if s > size]
    if not larger and svg is not None and svg.is_file():
        rendered = render_svg(svg, size)
        if rendered is not None:
            return rendered
    src = pngs[min(larger)] if larger else pngs[max(pngs)]
    return src.resize((size, size), Image.Resampling.LANCZOS)


def make_ico(pngs: dict, out: Path) -> Path:
    sizes = [s for s in ICO_SIZES if s <= max(pngs)]
    images = [_best(pngs, s) for s in sizes]
    # Pillow writes the largest image and every requested size <= it; give it the hand-made ones too.
    images[-1].save(out, format="ICO", sizes=[(s, s) for s in sizes], append_images=images[:-1])
    return out


def make_icns(pngs: dict, out: Path, svg: Path | None = None) -> Path:
    images = [_best(pngs, s, svg) for s in ICNS_SIZES]
    images[-1].save(out, format="ICNS", append_images=images[:-1])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "icons", help="output folder")
    parser.add_argument("--icons", type=Path, default=ICONS, help="folder of museum-search-<size>.png")
    args = parser.parse_args(argv)
    pngs = load_pngs(args.icons)
    args.out.mkdir(parents=True, exist_ok=True)
    for path in (make_ico(pngs, args.out / f"{NAME}.ico"), make_icns(pngs, args.out / f"{NAME}.icns", args.icons / f"{NAME}.svg")):
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
