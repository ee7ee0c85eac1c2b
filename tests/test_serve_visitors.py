"""``serve`` and the visitor log (issue 34): each answer is counted anonymously (on by default), a
photo is kept only as the staff's policy says (re-encoded, with its answer, never the address),
within a per-client rate, the page says what is kept, and nothing is lost on kill -9."""

from __future__ import annotations

import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

warnings.filterwarnings("ignore", message=".*httpx.*", category=DeprecationWarning)
from fastapi.testclient import TestClient  # noqa: E402

from museum_search.core.answer import confidence_band  # noqa: E402
from museum_search.core.visitors import KeepPolicy, VisitorLog  # noqa: E402
from museum_search.serve import create_app  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def photo(path: Path) -> dict:
    return {"photo": (path.name, path.read_bytes(), "image/jpeg")}


def sample_queries(sample_collection) -> list[Path]:
    return sorted((sample_collection / "queries").glob("q*.jpg"))


def noise_png(seed: int) -> bytes:
    return cv2.imencode(".png", np.random.default_rng(seed).integers(0, 255, (300, 400, 3), np.uint8))[1].tobytes()


def test_questions_are_counted_and_unsure_photos_kept(sample_index, sample_collection, tmp_path):
    folder = tmp_path / "visitors"
    policy = KeepPolicy(keep="unsure")
    docs, langs = [], []
    with TestClient(create_app(sample_index.path, workers=1, keep=policy, visitors=folder)) as c:
        for i, path in enumerate(sample_queries(sample_collection)):
            lang = ("fr-FR", "de", "en-GB")[i % 3]
            r = c.post("/api/identify", files=photo(path), headers={"Accept-Language": f"{lang},en;q=0.5"})
            assert r.status_code == 200
            docs.append(r.json())
            langs.append(lang.split("-")[0])
        r = c.post("/api/identify?lang=fr", files={"photo": ("noise.png", noise_png(1), "image/png")})
        docs.append(r.json())
        langs.append("fr")
        assert c.get("/api/info?lang=fr").json()["notice"] == policy.notice("fr")
    with VisitorLog.open(sample_index.path, policy, folder=folder) as log:
        stats = log.stats()
        kept = log.kept()
    assert stats.total == len(docs)
    assert stats.not_recognised == sum(not d["in_collection"] for d in docs)
    assert stats.sources == {"phone": len(docs)}
    assert stats.languages == {lang: langs.count(lang) for lang in set(langs)}
    recognised = [d["results"][0]["instance"] for d in docs if d["in_collection"]]
    assert dict(stats.top_objects) == {inst: recognised.count(inst) for inst in set(recognised)}
    unsure = [d for d in docs if not d["in_collection"] or d["confidence_band"] != "sure"]
    assert len(kept) == len(unsure) >= 2
    for k in kept:  # re-encoded from the pixels: a plain JPEG without EXIF, with its answer
        data = k.path.read_bytes()
        assert data[:3] == b"\xff\xd8\xff" and b"Exif" not in data and data.rstrip(b"\x00").endswith(b"\xff\xd9")
        assert cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR) is not None
        assert k.source == "phone" and not k.in_collection or confidence_band(k.confidence) != "sure"
    db = b"".join(p.read_bytes() for p in folder.rglob("*.sqlite*"))
    assert b"testclient" not in db and b"127.0.0.1" not in db  # no address is stored


def test_by_default_questions_are_counted_and_no_photo_is_kept(sample_index, sample_collection, tmp_path):
    folder = tmp_path / "visitors"
    with TestClient(create_app(sample_index.path, workers=1, visitors=folder)) as c:
        assert c.get("/api/info").json()["notice"] is None  # nothing kept: nothing to tell visitors
        for path in sample_queries(sample_collection)[:3]:
            assert c.post("/api/identify", files=photo(path)).status_code == 200
    with VisitorLog.open(sample_index.path, KeepPolicy(), folder=folder) as log:
        assert log.stats().total == 3 and log.kept() == []
    assert not [p for p in folder.rglob("*.jpg")]
    off = tmp_path / "off"
    with TestClient(create_app(sample_index.path, workers=1, keep=KeepPolicy(counting=False), visitors=off)) as c:
        assert c.post("/api/identify", files=photo(sample_queries(sample_collection)[0])).status_code == 200
    assert not off.exists()  # counting off and nothing kept: no folder at all


def test_one_phone_keeps_at_most_its_hourly_share(sample_index, sample_collection, tmp_path):
    folder = tmp_path / "visitors"
    policy = KeepPolicy(keep="all", per_client_per_hour=3)
    with TestClient(create_app(sample_index.path, workers=1, keep=policy, visitors=folder)) as c:
        for i in range(7):
            r = c.post("/api/identify", files={"photo": (f"n{i}.png", noise_png(i), "image/png")})
            assert r.status_code == 200 and r.json()["in_collection"] is False  # answered all the same
    with VisitorLog.open(sample_index.path, policy, folder=folder) as log:
        assert len(log.kept()) == 3 and log.stats().total == 7


def test_serve_help_shows_the_policys_defaults():
    r = subprocess.run([sys.executable, "-m", "museum_search", "serve", "--help"], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, COLUMNS="200"))
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    d = KeepPolicy()
    assert d.keep == "none" and d.counting
    for option, value in (("--quota-mb", f"default {d.quota_mb:g}"), ("--per-day", f"default {d.per_day}"),
                          ("--retention-days", f"default {d.retention_days}"),
                          ("--per-client-per-hour", f"default {d.per_client_per_hour}")):
        after = text.split(option, 2)[-1]
        assert value in after[:200], (option, after[:200])
    r = subprocess.run([sys.executable, "-m", "museum_search", "serve", "x", "--keep", "sometimes"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(index: Path, folder: Path, port: int) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "museum_search", "serve", str(index), "--port", str(port),
                             "--workers", "2", "--keep", "all", "--per-client-per-hour", "100000",
                             "--visitors", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    for _ in range(240):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.5)
    raise AssertionError("serve did not start")


@pytest.mark.slow
def test_kept_photos_counts_and_the_index_survive_kill_9(sample_index, sample_collection, tmp_path):
    """Three times: serve under a flood of uploads (keep all) is killed with SIGKILL at a random
    moment, then started again. Every kept photo has its record and decodes; the counts hold every
    answer a phone received (and at most the few in flight when it died); the index is intact."""
    import httpx

    folder = tmp_path / "visitors"
    photos = [p.read_bytes() for p in sample_queries(sample_collection)[:6]]
    answered = 0
    rng = random.Random(34)
    for _round in range(3):
        port = _free_port()
        proc = _serve(sample_index.path, folder, port)
        stop = threading.Event()
        got = []

        def flood(seed: int, port: int = port, stop: threading.Event = stop, got: list = got) -> None:
            with httpx.Client(timeout=30) as c:
                i = seed
                while not stop.is_set():
                    i += 1
                    try:
                        r = c.post(f"http://127.0.0.1:{port}/api/identify", files={"photo": ("q.jpg", photos[i % 6])})
                    except httpx.HTTPError:
                        return
                    if r.status_code == 200:
                        got.append(1)

        threads = [threading.Thread(target=flood, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(1.0, 4.0))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        stop.set()
        for t in threads:
            t.join(60)
        answered += len(got)
    assert answered >= 3
    with VisitorLog.open(sample_index.path, KeepPolicy(keep="all"), folder=folder) as log:
        kept = log.kept()
        total = log.stats().total
    assert answered <= total <= answered + 3 * 4  # in flight at each kill: at most the admitted requests
    files = {p.resolve() for p in folder.rglob("*.jpg")}
    assert files == {k.path.resolve() for k in kept} and len(kept) == total
    for k in kept:
        assert cv2.imdecode(np.frombuffer(k.path.read_bytes(), np.uint8), cv2.IMREAD_COLOR) is not None
    for p in folder.rglob("*"):
        assert not p.name.endswith(".tmp"), p  # no half-written file is left
    with sqlite3.connect(folder / "visitors.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    r = subprocess.run([sys.executable, "-m", "museum_search", "info", str(sample_index.path), "--check"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
