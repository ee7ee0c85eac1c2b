"""Kept visitors' photos under a flood (issue 34, "Privacy"): does each limit hold, what is written, how fast?

1. **The issue's attack, through ``serve``**: one client sends ``--uploads`` (95) photos of about
   15 MB each (a 12-megapixel phone photo of fine detail) as fast as the server answers, with
   ``--keep all`` and the default limits. Reported: bytes written into the visitors folder,
   photos kept, seconds. ``--old DIR`` runs the same flood against another checkout's ``serve
   --keep-missed`` (the code before issue 34, which wrote each upload byte for byte).
2. **Each limit alone, in process** (``VisitorLog.record`` with the photo's pixels, as the kiosk and
   serve call it; a simulated clock): the byte quota, the day's count, the per-client hourly
   share and the retention period, each under 2,000 records of a 1600-px photo. Reported: records,
   photos on disk, bytes on disk against the limit, ms per record.

Writes ``bench/results/keep_flood.json``. About 2-4 minutes on 2 cores.

Usage: ``python bench/bench_keep_flood.py [--uploads 95] [--old DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import cv2
import httpx
import numpy as np

from museum_search.core.answer import Answer, Result
from museum_search.core.visitors import KeepPolicy, VisitorLog

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attack import free_port, sample_index, serve

START = datetime(2026, 11, 28, 9, 0)


def big_photo() -> bytes:
    """A 4000 x 3000 JPEG of fine detail (noise over a gradient) at quality 97: about 15 MB."""
    rng = np.random.default_rng(15)
    img = (np.linspace(0, 160, 4000)[None, :, None] + rng.integers(0, 96, (3000, 4000, 3))).astype(np.uint8)
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 97])[1].tobytes()


def folder_bytes(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in (".jpg", ".png", ".webp", ".bin")]
    return len(files), sum(p.stat().st_size for p in files)


def serve_flood(index: Path, code: Path, uploads: int, photo: bytes, old: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "visitors"
        port = free_port()
        extra = ["--keep-missed", str(folder)] if old else ["--keep", "all", "--visitors", str(folder)]
        proc = serve(index, port, 2, code, extra)
        codes: dict[str, int] = {}
        t0 = time.perf_counter()
        try:
            with httpx.Client(timeout=120) as c:
                for _ in range(uploads):
                    r = c.post(f"http://127.0.0.1:{port}/api/identify", files={"photo": ("big.jpg", photo)})
                    codes[str(r.status_code)] = codes.get(str(r.status_code), 0) + 1
        finally:
            seconds = time.perf_counter() - t0
            proc.terminate()
            proc.wait(30)
        files, size = folder_bytes(folder) if folder.exists() else (0, 0)
        return {"uploads": uploads, "upload_bytes": len(photo), "statuses": codes, "seconds": round(seconds, 1),
                "files_written": files, "bytes_written": size}


def miss() -> Answer:
    top = Result(1, 0, 0.5, 0.5, 3, "x.jpg", "/c/x.jpg", "x")
    return Answer("q.jpg", [top], False, "not verified", np.zeros(1), np.zeros(1), {0: 3}, confidence=0.1)


def limit_flood(index: Path, name: str, policy: KeepPolicy, n: int, clock, clients: int = 1) -> dict:
    """``n`` records of a 1600-px photo under ``policy``; ``clock(i)`` the time of record ``i``."""
    img = np.random.default_rng(1).integers(0, 255, (1200, 1600, 3), np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "visitors"
        with VisitorLog.open(index, policy, folder=folder) as log:
            t0 = time.perf_counter()
            kept = sum(log.record(miss(), source="phone", image=img, when=clock(i), client=f"10.0.0.{i % clients}")
                       is not None for i in range(n))
            seconds = time.perf_counter() - t0
            files, size = folder_bytes(folder)
            counted = log.stats().total
    return {"limit": name, "policy": policy.to_dict(), "records": n, "counted": counted, "kept_at_record": kept,
            "photos_on_disk": files, "bytes_on_disk": size, "ms_per_record": round(1000 * seconds / n, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=95)
    ap.add_argument("--old", type=Path, default=None, help="a checkout whose serve has --keep-missed DIR")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "keep_flood.json")
    args = ap.parse_args()
    out: dict = {"load_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        index = sample_index(Path(tmp))
        photo = big_photo()
        print(f"flood photo: {len(photo) / 1e6:.1f} MB", flush=True)
        out["serve"] = serve_flood(index, REPO, args.uploads, photo, old=False)
        print("serve --keep all:", out["serve"], flush=True)
        if args.old is not None:
            out["serve_before"] = serve_flood(index, args.old.resolve(), args.uploads, photo, old=True)
            print("before (--keep-missed):", out["serve_before"], flush=True)
        n = 2000
        out["limits"] = [
            limit_flood(index, "quota 20 MB", KeepPolicy(keep="all", quota_mb=20, per_day=100_000,
                                                          per_client_per_hour=100_000), n, lambda i: START),
            limit_flood(index, "100 a day", KeepPolicy(keep="all", per_day=100, per_client_per_hour=100_000), n,
                        lambda i: START + timedelta(minutes=i // 200)),
            limit_flood(index, "20 per client per hour (10 clients)", KeepPolicy(keep="all", per_day=100_000), n,
                        lambda i: START + timedelta(seconds=i), clients=10),
            limit_flood(index, "retention 2 days (100 a day over 20 days)",
                        KeepPolicy(keep="all", retention_days=2, per_day=100, per_client_per_hour=100_000), n,
                        lambda i: START + timedelta(hours=i * 24 / 100)),
        ]
        for row in out["limits"]:
            print(row, flush=True)
    out["load_end"] = os.getloadavg()
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
