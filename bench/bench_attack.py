"""Can one phone (or eight) deny ``museum-search serve`` to everyone? (issue 33, item 1)

Starts ``museum-search serve`` on an index (default: the bundled sample, built into a temporary
folder) and measures an honest client that sends a photo, waits for the answer and sends the next,
for ``--seconds`` each: alone, then while attackers hold the service's limits:

- **slow bodies**: uploads whose body stops after a few bytes (from 1 address with as many as its
  share allows, and from 8 addresses), then trickled (one byte a second);
- **idle heads**: connections that send half a request head and wait (16 per address: one address's
  share, from 8 addresses; and from 40 addresses, beyond the server's connection cap).

Reports the honest client's answers/s, p50 and p95 latency and the statuses it got, per scenario.
``--code DIR`` serves from another checkout (e.g. a worktree of the code before issue 33, for the
before figures) with this machine's packages. Writes ``bench/results/attack.json`` (``--out``).

Usage: ``python bench/bench_attack.py [--index INDEX] [--code DIR] [--seconds 15] [--workers 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
PHOTO = REPO / "resources" / "sample" / "queries" / "q02.jpg"
SLOW_HEAD = (b"POST /api/identify HTTP/1.1\r\nHost: museum\r\nContent-Type: multipart/form-data; boundary=xyz\r\n"
             b"Content-Length: 100000\r\n\r\n--xyz\r\n")
IDLE_HEAD = b"GET / HTTP/1.1\r\nHo"
#: (name, kind, attacker addresses, connections per address)
SCENARIOS = (
    ("slow bodies: 1 address x 4", "slow", 1, 4),
    ("slow bodies: 1 address x 12 (over its share)", "slow", 1, 12),
    ("slow bodies: 8 addresses x 4", "slow", 8, 4),
    ("idle heads: 8 addresses x 16", "idle", 8, 16),
    ("idle heads: 40 addresses x 16 (over the 512 cap)", "idle", 40, 16),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def honest(url: str, seconds: float) -> dict:
    """One honest client for ``seconds``: its answers per second, p50 / p95 (ms) and statuses."""
    photo = PHOTO.read_bytes()
    latencies: list[float] = []
    codes: dict[str, int] = {}
    end = time.monotonic() + seconds
    with httpx.Client(timeout=60) as client:
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                status = str(client.post(url + "/api/identify", files={"photo": ("q.jpg", photo)}).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            codes[status] = codes.get(status, 0) + 1
            if status == "200":
                latencies.append(time.perf_counter() - t0)
            else:
                time.sleep(0.2)  # a refused client waits a little, as the phone page does
    q = statistics.quantiles(latencies, n=20) if len(latencies) >= 2 else [float("nan")] * 19
    return {"answers_per_s": round(len(latencies) / seconds, 2),
            "p50_ms": round(statistics.median(latencies) * 1000) if latencies else None,
            "p95_ms": round(q[18] * 1000) if latencies else None, "statuses": codes}


class Attack:
    """``per`` connections from each of ``n`` loopback addresses (127.0.1.x), reopened when the
    server closes one; slow bodies trickle a byte a second."""

    def __init__(self, port: int, kind: str, n: int, per: int):
        self.port, self.kind, self.n, self.per = port, kind, n, per
        self.stop = threading.Event()
        self.opened = 0
        self.threads = [threading.Thread(target=self._hold, args=(f"127.0.1.{i + 1}",), daemon=True)
                        for i in range(n) for _ in range(per)]

    def __enter__(self) -> "Attack":
        for t in self.threads:
            t.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def _hold(self, address: str) -> None:
        while not self.stop.is_set():
            try:
                with socket.socket() as s:
                    s.bind((address, 0))
                    s.settimeout(2)
                    s.connect(("127.0.0.1", self.port))
                    self.opened += 1
                    s.sendall(SLOW_HEAD if self.kind == "slow" else IDLE_HEAD)
                    while not self.stop.wait(1.0):
                        if self.kind == "slow":
                            s.sendall(b"x")
                        elif _closed(s):
                            break
            except OSError:
                self.stop.wait(0.5)


def _closed(s: socket.socket) -> bool:
    try:
        s.setblocking(False)
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def serve(index: Path, port: int, workers: int, code: Path, extra: tuple | list = ()) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(code))
    proc = subprocess.Popen([sys.executable, "-m", "museum_search", "serve", str(index), "--port", str(port),
                             "--workers", str(workers), *extra], cwd=code, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"serve exited with {proc.returncode}")
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("serve did not answer /healthz within 2 minutes")


def sample_index(folder: Path) -> Path:
    out = folder / "index"
    subprocess.run([sys.executable, "-m", "museum_search", "index", str(REPO / "resources" / "sample" / "collection"),
                    "-o", str(out)], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=Path, default=None, help="index to serve (default: the sample, built now)")
    ap.add_argument("--code", type=Path, default=REPO, help="checkout to serve from (default: this one)")
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds per scenario")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "attack.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        index = args.index or sample_index(Path(tmp))
        port = free_port()
        proc = serve(index, port, args.workers, args.code.resolve())
        url = f"http://127.0.0.1:{port}"
        try:
            honest(url, 3)  # warm-up
            rows = {"alone": honest(url, args.seconds)}
            print(f"{'alone':<50} {rows['alone']}")
            for name, kind, n, per in SCENARIOS:
                with Attack(port, kind, n, per) as attack:
                    rows[name] = honest(url, args.seconds)
                    rows[name]["attacker_connections_opened"] = attack.opened
                print(f"{name:<50} {rows[name]}")
                time.sleep(2)
        finally:
            proc.terminate()
            proc.wait(20)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.code, capture_output=True,
                            text=True).stdout.strip() or str(args.code)
    args.out.write_text(json.dumps({"code": commit, "workers": args.workers, "seconds": args.seconds,
                                    "load": os.getloadavg(), "scenarios": rows}, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
