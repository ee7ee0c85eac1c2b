"""Peak memory of decoding decompression bombs with and without the decode budget, how well the
budget's estimate bounds real peaks, and what the budget costs in decode throughput.

1. The bomb: a 20,000 x 20,000 16-bit RGBA PNG of 3 MB (3.2 GB decoded). Unbudgeted (the old
   behaviour) its peak is the estimate of ``decode_cost`` (measured once with
   ``--measure-unbudgeted-bomb``: 6.4 GB and half a minute); with the default 1 GiB budget it
   is refused from its header, and the peak RSS of the child process is measured.
2. Three smaller bombs (4,500 x 4,500 16-bit RGBA, ~0.34 GB at peak each) through ``extract``
   with 3 workers: peak RSS unbudgeted vs with a 600 MB budget (each fits, two do not).
3. The estimate against measured peaks, one image of each kind decoded alone (ratio <= 1: the
   estimate bounds the peak).
4. Decode throughput (``load_image`` on a thread pool, as ``extract`` does) on the paintings
   references, with the default budget vs without; rounds alternated, best of each, ratio
   measured in one run (the machine is shared: compare ratios, not seconds).

Every memory figure is the peak resident size of a fresh child process (Linux: VmHWM, reset
after the imports; elsewhere ``ru_maxrss``) minus its resident size after the imports.

Usage: ``python bench/bench_decode_memory.py [--images DIR] [--n 287] [--rounds 5]
[--measure-unbudgeted-bomb]``; writes ``bench/results/decode_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from museum_search.core import images
from museum_search.core.images import DECODE_BUDGET_ENV, decode_cost, is_image_file, load_image
from museum_search.core.inference._extract import default_workers

MIB = 1 << 20
DEFAULT_IMAGES = REPO.parent / "shared" / "data" / "paintings" / "references"

# The peak resident size is the kernel's high-water mark VmHWM, what ru_maxrss reports, except
# that ru_maxrss also keeps the peaks of threads that exited, which cannot be reset. After the
# imports (torch's import peaks above its resting size) the mark is reset (/proc/self/clear_refs)
# and figures are peak - resident size at START.
CHILD_PRELUDE = """
import json, resource, sys, time
import numpy as np
from museum_search.core import images
from museum_search.core.inference._extract import extract
from museum_search.core.progress import drive as run
def _status_mb(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(key)) / 1024
def peak_mb():
    try:
        return _status_mb("VmHWM:")
    except OSError:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return kb / (1 << 20) if sys.platform == "darwin" else kb / 1024  # bytes on macOS
def start_mb():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak to the current resident size
        return _status_mb("VmRSS:")
    except OSError:
        return peak_mb()  # elsewhere: figures are at most the true ones
START = start_mb()
"""

STUB = """
class Meta:
    dim = 4
class Stub:  # decoding only: no network
    meta = Meta()
    max_side = 512
    def preprocess(self, image):
        return image.reshape(-1, 3).mean(axis=0).astype(np.float32)
    def embed(self, batch):
        return np.full((len(batch), 4), 0.5, np.float32)
"""


def child(code: str, budget_mb: float | None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop(DECODE_BUDGET_ENV, None)
    if budget_mb is not None:
        env[DECODE_BUDGET_ENV] = str(budget_mb)
    r = subprocess.run([sys.executable, "-c", CHILD_PRELUDE + STUB + textwrap.dedent(code)],
                       capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_png_bomb(path: Path, width: int, height: int, value: int = 0xFF) -> Path:
    """16-bit RGBA PNG of one colour, deflated by repeating one fully flushed block."""
    row = b"\x00" + bytes([value]) * (width * 8)
    per_block = max(1, (4 * MIB) // len(row))
    block = row * per_block
    n_blocks, rest = divmod(height, per_block)
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    first = comp.compress(block) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(block) + comp.flush(zlib.Z_FULL_FLUSH)
    adler = 1
    for _ in range(n_blocks):
        adler = zlib.adler32(block, adler)
    tail = row * rest
    adler = zlib.adler32(tail, adler)
    parts = [b"\x78\x9c"] + ([first] + [again] * (n_blocks - 1) if n_blocks else [])
    stream = b"".join(parts + [comp.compress(tail) + comp.flush(), struct.pack(">I", adler)])
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 6, 0, 0, 0)))
        for i in range(0, len(stream), MIB):
            f.write(png_chunk(b"IDAT", stream[i : i + MIB]))
        f.write(png_chunk(b"IEND", b""))
    return path


def decode_peak(path: Path, max_side: int | None, budget_mb: float | None) -> dict:
    return child(f"""
        t0 = time.perf_counter()
        try:
            shape, reason = list(images.load_image({str(path)!r}, max_side={max_side!r}).shape), None
        except images.ImageError as exc:
            shape, reason = None, exc.reason
        print(json.dumps({{"peak_mb": peak_mb() - START, "process_peak_mb": peak_mb(), "shape": shape,
                          "reason": reason, "s": time.perf_counter() - t0}}))
    """, budget_mb)


def kinds(tmp: Path) -> dict[str, tuple[Path, int | None]]:
    """One file of each kind, about 12 MP, with the max_side it is decoded at."""
    rng = np.random.default_rng(0)
    w, h = 4000, 3000
    noise = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
    rgb = np.asarray(Image.fromarray(noise).resize((w, h), Image.BILINEAR))
    rgba = np.dstack([rgb, np.full((h, w), 200, np.uint8)])
    out: dict[str, tuple[Path, int | None]] = {}

    def save(name: str, im: Image.Image, fmt: str, max_side: int | None = None, **kw) -> None:
        path = tmp / name
        im.save(path, fmt, **kw)
        out[name] = (path, max_side)

    save("rgb8.png", Image.fromarray(rgb), "PNG", compress_level=1)
    save("rgba8.png", Image.fromarray(rgba), "PNG", compress_level=1)
    save("grey8.png", Image.fromarray(rgb[..., 0]), "PNG", compress_level=1)
    import cv2

    for name, a in (("rgb16.png", rgb[..., ::-1]), ("rgba16.png", rgba[..., [2, 1, 0, 3]])):
        path = tmp / name
        path.write_bytes(cv2.imencode(".png", a.astype(np.uint16) * 257, [cv2.IMWRITE_PNG_COMPRESSION, 1])[1].tobytes())
        out[name] = (path, None)
    save("baseline.jpg", Image.fromarray(rgb), "JPEG", quality=90)
    out["baseline_1024.jpg"] = (tmp / "baseline.jpg", 1024)
    save("progressive.jpg", Image.fromarray(rgb), "JPEG", quality=90, progressive=True)
    out["progressive_512.jpg"] = (tmp / "progressive.jpg", 512)
    save("oriented6.jpg", Image.fromarray(rgb), "JPEG", quality=90, exif=_exif(6))
    save("cmyk.jpg", Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=90)
    save("rgb8.tif", Image.fromarray(rgb), "TIFF")
    save("rgb8_lzw.tif", Image.fromarray(rgb), "TIFF", compression="tiff_lzw")
    save("lossy.webp", Image.fromarray(rgb), "WEBP", quality=80)
    save("lossless_rgba.webp", Image.fromarray(rgba), "WEBP", lossless=True, method=0)
    save("rgb.bmp", Image.fromarray(rgb), "BMP")
    return out


def _exif(orientation: int) -> Image.Exif:
    e = Image.Exif()
    e[0x0112] = orientation
    return e


def throughput(paths: list[Path], max_side: int, rounds: int) -> dict:
    workers = default_workers()
    budget = images.decode_budget()
    default = images.DECODE_BUDGET_BYTES or None
    timings: dict[str, list[float]] = {"with_budget": [], "without_budget": []}
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda p: load_image(p, max_side=max_side), paths[:8]))  # warm-up
        for _ in range(rounds):
            for key, total in (("with_budget", default), ("without_budget", None)):
                images.set_decode_budget(total)
                budget.reset_high_water()
                t0 = time.perf_counter()
                list(pool.map(lambda p: load_image(p, max_side=max_side), paths))
                timings[key].append(time.perf_counter() - t0)
    images.set_decode_budget(default)
    best = {k: min(v) for k, v in timings.items()}
    # The budget's own cost, free of the noise of a shared machine: one uncontended hold.
    n = 100_000
    t0 = time.perf_counter()
    for _ in range(n):
        with budget.hold(1 << 20):
            pass
    hold_s = (time.perf_counter() - t0) / n
    per_image_s = best["with_budget"] * workers / len(paths)
    return {
        "images": len(paths),
        "max_side": max_side,
        "workers": workers,
        "rounds_s": timings,
        "img_per_s": {k: len(paths) / v for k, v in best.items()},
        "ratio_with_over_without": best["without_budget"] / best["with_budget"],
        "ratio_median_of_rounds": float(np.median(
            [b / a for a, b in zip(timings["with_budget"], timings["without_budget"])])),
        "budget_hold_us": hold_s * 1e6,
        "budget_hold_share_of_decode": hold_s / per_image_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=Path, default=DEFAULT_IMAGES)
    ap.add_argument("--n", type=int, default=287)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-side", type=int, default=512)
    ap.add_argument("--measure-unbudgeted-bomb", action="store_true",
                    help="also decode the 20,000 px bomb without a budget (needs ~7 GB, ~40 s)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "decode_memory.json")
    args = ap.parse_args()
    result: dict = {
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "default_budget_mb": images.DECODE_BUDGET_BYTES / MIB,
    }
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp_s:
        tmp = Path(tmp_s)

        # 1. the bomb
        bomb = write_png_bomb(tmp / "bomb.png", 20_000, 20_000, value=0x7F)
        budgeted = decode_peak(bomb, 512, None)
        result["bomb"] = {
            "file": "20000x20000 16-bit RGBA PNG (alpha 50 %)",
            "file_mb": bomb.stat().st_size / MIB,
            "decoded_mb": 20_000 * 20_000 * 8 / MIB,
            "unbudgeted_estimate_mb": decode_cost(bomb, 512) / MIB,
            "budgeted_peak_mb": budgeted["peak_mb"],  # refused from the header: ~0
            "budgeted_process_peak_mb": budgeted["process_peak_mb"],  # imports included
            "budgeted_reason": budgeted["reason"],
        }
        if args.measure_unbudgeted_bomb:
            result["bomb"]["unbudgeted_measured_mb"] = decode_peak(bomb, 512, 0)["peak_mb"]
        print(f"bomb: unbudgeted estimate {result['bomb']['unbudgeted_estimate_mb']:.0f} MB"
              + (f" (measured {result['bomb']['unbudgeted_measured_mb']:.0f} MB)" if args.measure_unbudgeted_bomb else "")
              + f"; with the budget +{budgeted['peak_mb']:.0f} MB (process peak "
              f"{budgeted['process_peak_mb']:.0f} MB): {budgeted['reason']}")
        bomb.unlink()

        # 2. three bombs in parallel through extract()
        paths = [str(write_png_bomb(tmp / f"b{i}.png", 4500, 4500)) for i in range(3)]
        code = f"""
            t0 = time.perf_counter()
            res = run(extract({paths!r}, Stub(), batch_size=1, workers=3))
            b = images.decode_budget()
            print(json.dumps({{"peak_mb": peak_mb() - START, "ok": len(res.ok), "skipped": res.skipped,
                              "budget_high_water_mb": b.high_water / {MIB}, "s": time.perf_counter() - t0}}))
        """
        par = {"each_estimate_mb": decode_cost(paths[0], 512) / MIB,
               "unbudgeted": child(code, 0), "budget_600mb": child(code, 600)}
        result["parallel_bombs"] = {"file": "3 x 4500x4500 16-bit RGBA PNG, 3 workers", **par}
        print(f"3 parallel bombs: unbudgeted peak {par['unbudgeted']['peak_mb']:.0f} MB "
              f"({par['unbudgeted']['s']:.1f} s); 600 MB budget: {par['budget_600mb']['peak_mb']:.0f} MB "
              f"({par['budget_600mb']['s']:.1f} s), all {par['budget_600mb']['ok']} decoded")

        # 3. estimate vs measured, one decode at a time, unbudgeted
        rows = {}
        for name, (path, max_side) in kinds(tmp).items():
            m = decode_peak(path, max_side, 0)
            est = decode_cost(path, max_side) / MIB
            rows[name] = {"max_side": max_side, "estimate_mb": est, "measured_mb": m["peak_mb"],
                          "measured_over_estimate": m["peak_mb"] / est, "shape": m["shape"], "reason": m["reason"]}
            print(f"  {name:22s} max_side={str(max_side):5s} estimate {est:7.1f} MB  measured {m['peak_mb']:7.1f} MB"
                  f"  ratio {m['peak_mb'] / est:.2f}")
        result["estimate_vs_measured"] = rows
        result["max_measured_over_estimate"] = max(r["measured_over_estimate"] for r in rows.values())

    # 4. throughput
    refs = sorted(p for p in args.images.iterdir() if is_image_file(p))[: args.n]
    result["throughput"] = throughput(refs, args.max_side, args.rounds)
    t = result["throughput"]
    print(f"decode throughput ({t['images']} references, max_side {t['max_side']}, {t['workers']} threads): "
          f"{t['img_per_s']['with_budget']:.1f} img/s with the budget, "
          f"{t['img_per_s']['without_budget']:.1f} without -> ratio {t['ratio_with_over_without']:.3f} "
          f"(median of rounds {t['ratio_median_of_rounds']:.3f}); one budget hold costs "
          f"{t['budget_hold_us']:.1f} us = {100 * t['budget_hold_share_of_decode']:.3f} % of a decode")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
