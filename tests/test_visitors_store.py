"""The visitor log (issue 34, items 1-2): a kept photo carries nothing but its pixels; the quota,
the day's count, the retention period and the per-client rate each hold; counts equal what was
asked; the folder is the program's own; a kill -9 at any moment loses nothing that committed."""

from __future__ import annotations

import io
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from museum_search.core.answer import Answer, Result, query_from_bytes
from museum_search.core.errors import MuseumSearchError
from museum_search.core.visitors import KeepPolicy, VisitorLog, VisitorStats, visitors_folder

DAY = datetime(2026, 11, 28, 9, 15)


def answer(instance: str | None, confidence: float, inliers: int = 40) -> Answer:
    """A real Answer as the pipeline makes it: ``instance`` recognised with ``confidence`` (None:
    not in the collection, its best candidate "obj_x")."""
    top = Result(1, 0, 0.9, 0.8, inliers, f"{instance or 'obj_x'}.jpg", f"/c/{instance or 'obj_x'}.jpg",
                 instance or "obj_x")
    other = Result(2, 1, 0.5, 0.5, 3, "obj_y.jpg", "/c/obj_y.jpg", "obj_y")
    return Answer("q.jpg", [top, other], instance is not None, "verified: 40 matching points" if instance
                  else "not verified", np.zeros(2), np.zeros(2), {0: inliers}, confidence=confidence)


def phone_jpeg(side: int = 2000, seed: int = 0, exif: bool = True, trailer: bytes = b"") -> bytes:
    """A phone-like JPEG: noise-textured pixels, an EXIF block with a GPS position, and ``trailer``
    appended after the image's end."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 255, (side * 3 // 4, side, 3), np.uint8))
    out = io.BytesIO()
    if exif:
        e = Image.Exif()
        e[0x010F] = "PhoneMaker"  # Make
        e[0x0110] = "VisitorPhone 12"  # Model
        gps = {1: "N", 2: (48.0, 51.0, 24.0), 3: "E", 4: (2.0, 21.0, 3.0)}  # GPSLatitude / GPSLongitude
        e[0x8825] = gps
        img.save(out, "JPEG", quality=92, exif=e.tobytes())
    else:
        img.save(out, "JPEG", quality=92)
    return out.getvalue() + trailer


@pytest.fixture()
def index(sample_index, tmp_path) -> Path:
    return sample_index.path


def test_a_kept_photo_has_no_exif_gps_or_appended_bytes(index, tmp_path):
    data = phone_jpeg(trailer=b"SECRET-TRAILER-BYTES")
    assert b"Exif" in data and b"PhoneMaker" in data and data.endswith(b"SECRET-TRAILER-BYTES")
    query = query_from_bytes(data, "phone.jpg")  # decoded as the pipeline decodes an upload
    with VisitorLog.open(index, KeepPolicy(keep="all"), folder=tmp_path / "v") as log:
        kept = log.record(answer(None, 0.1), source="phone", language="fr-FR", image=query.image, when=DAY)
        assert kept is not None and kept.source == "phone" and kept.language == "fr"
        stored = kept.path.read_bytes()
        assert log.photo(kept.id) == kept and log.photo(str(kept.path)) == kept
    for leak in (b"Exif", b"PhoneMaker", b"VisitorPhone", b"GPS", b"SECRET"):
        assert leak not in stored
    assert stored.endswith(b"\xff\xd9")  # nothing after the image's end
    decoded = cv2.imdecode(np.frombuffer(stored, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape[:2] == query.image.shape[:2]
    assert kept.candidates[0]["instance"] == "obj_x" and kept.candidates[1]["inliers"] == 3


def test_what_is_kept_follows_the_policy(index, tmp_path):
    img = np.full((300, 400, 3), 90, np.uint8)
    cases = {"none": [], "unsure": ["missed", "might"], "all": ["missed", "might", "sure"]}
    for mode, want in cases.items():
        with VisitorLog.open(index, KeepPolicy(keep=mode), folder=tmp_path / mode) as log:
            for name, a in (("missed", answer(None, 0.2)), ("might", answer("a", 0.6)), ("sure", answer("a", 0.99))):
                kept = log.record(a, source="kiosk", image=img, when=DAY)
                assert (kept is not None) == (name in want), (mode, name)
            assert log.stats().total == 3


def test_quota_day_count_retention_and_client_rate_each_hold(index, tmp_path):
    big = cv2.imdecode(np.frombuffer(phone_jpeg(3000, exif=False), np.uint8), cv2.IMREAD_COLOR)[..., ::-1]
    miss = answer(None, 0.1)
    # the byte quota: kept bytes never pass it, the answers are still counted
    with VisitorLog.open(index, KeepPolicy(keep="all", quota_mb=3), folder=tmp_path / "quota") as log:
        kept = [log.record(miss, source="phone", image=big, when=DAY) for _ in range(12)]
        stored = sum(p.stat().st_size for p in (tmp_path / "quota" / "kept").glob("*.jpg"))
        assert 0 < stored <= 3_000_000 and 1 <= sum(k is not None for k in kept) < 12
        assert log.stats().total == 12
    # the day's count, then the next day
    with VisitorLog.open(index, KeepPolicy(keep="all", per_day=3), folder=tmp_path / "day") as log:
        small = big[::8, ::8]
        assert sum(log.record(miss, source="kiosk", image=small, when=DAY) is not None for _ in range(5)) == 3
        assert log.record(miss, source="kiosk", image=small, when=DAY + timedelta(days=1)) is not None
    # one client's hourly share, another client's, and the next hour
    with VisitorLog.open(index, KeepPolicy(keep="all", per_client_per_hour=2), folder=tmp_path / "rate") as log:
        assert sum(log.record(miss, source="phone", image=small, when=DAY, client="10.0.0.7") is not None
                   for _ in range(5)) == 2
        assert log.record(miss, source="phone", image=small, when=DAY, client="10.0.0.8") is not None
        assert log.record(miss, source="phone", image=small, when=DAY + timedelta(hours=1, minutes=1),
                          client="10.0.0.7") is not None
    assert b"10.0.0" not in (tmp_path / "rate" / "visitors.sqlite").read_bytes()
    # retention: a photo waiting for review goes when its period ends, whoever opens the log then
    folder = tmp_path / "retention"
    with VisitorLog.open(index, KeepPolicy(keep="all", retention_days=2), folder=folder) as log:
        old = log.record(miss, source="kiosk", image=small, when=DAY)
        reviewed = log.record(miss, source="kiosk", image=small, when=DAY)
        log.set_status(reviewed.id, "unknown")
        log.record(miss, source="kiosk", image=small, when=DAY + timedelta(days=1))
        assert {p.id for p in log.kept()} >= {old.id}
        log.record(miss, source="kiosk", image=small, when=DAY + timedelta(days=2, hours=1))
        assert old.id not in {p.id for p in log.kept(None)} and not old.path.exists()
        assert reviewed.id in {p.id for p in log.kept("unknown")}  # reviewed photos are the staff's
    with VisitorLog.open(index, KeepPolicy(retention_days=1), folder=folder) as log:  # another policy opens it
        log.record(miss, source="kiosk", when=DAY + timedelta(days=2, hours=12))
        assert len(log.kept()) == 2  # a day and a half old, but kept under 2 days: not this opener's 1


def test_counts_after_a_scripted_day_equal_the_questions(index, tmp_path):
    rng = random.Random(1)
    asked = []
    with VisitorLog.open(index, KeepPolicy(), folder=tmp_path / "v") as log:
        for hour in range(9, 18):
            for _ in range(rng.randint(0, 12)):
                source, lang = rng.choice(["kiosk", "phone"]), rng.choice(["en", "fr", "de", ""])
                inst = rng.choice(["a", "b", "c", None])
                conf = rng.choice([0.99, 0.85, 0.6]) if inst else 0.2
                log.record(answer(inst, conf), source=source, language=lang, when=DAY.replace(hour=hour, minute=rng.randint(0, 59)))
                asked.append((hour, source, lang, inst, conf))
        stats = log.stats()
    assert stats.total == len(asked) and stats.not_recognised == sum(a[3] is None for a in asked)
    assert stats.per_hour == [(f"2026-11-28T{h:02d}:00", sum(a[0] == h for a in asked)) for h in range(9, 18)
                              if any(a[0] == h for a in asked)]
    assert stats.per_day == [("2026-11-28", len(asked), stats.not_recognised)]
    assert stats.share_not_recognised_per_day == [("2026-11-28", stats.not_recognised / len(asked))]
    assert dict(stats.top_objects) == {i: sum(a[3] == i for a in asked) for i in "abc" if any(a[3] == i for a in asked)}
    assert stats.sources == {s: sum(a[1] == s for a in asked) for s in {a[1] for a in asked}}
    assert stats.languages == {lang: sum(a[2] == lang for a in asked) for lang in {a[2] for a in asked}}
    assert stats.bands["sure"] == sum(a[4] == 0.99 and a[3] is not None for a in asked)
    csv_path = stats.to_csv(tmp_path / "counts.csv")
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "hour,instance,verdict,band,language,source,n"
    assert sum(int(line.rsplit(",", 1)[1]) for line in lines[1:]) == len(asked)
    with pytest.raises(MuseumSearchError, match="exists already"):
        stats.to_csv(csv_path)  # never over a file without the user's word
    assert isinstance(stats, VisitorStats) and stats.to_dict()["total"] == len(asked)


def test_the_folder_is_the_programs_own(index, tmp_path, sample_index):
    assert visitors_folder(index) == index.with_name(index.name + "-visitors")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(MuseumSearchError, match="not made by museum-search"):
        VisitorLog.open(index, KeepPolicy(), folder=theirs)
    assert [p.name for p in theirs.iterdir()] == ["notes.txt"]
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(MuseumSearchError, match="symbolic link"):
        VisitorLog.open(index, KeepPolicy(), folder=link / "v")
    for inside in (index / "visitors", Path(sample_index.root) / "visitors"):
        with pytest.raises(MuseumSearchError, match="inside"):
            VisitorLog.open(index, KeepPolicy(), folder=inside)
        assert not inside.exists()
    with pytest.raises(MuseumSearchError, match="keep must be one of"):
        KeepPolicy(keep="some")
    with pytest.raises(MuseumSearchError, match="retention_days"):
        KeepPolicy(retention_days=0)


RECORDER = """
import sys, numpy as np
from datetime import datetime
from museum_search.core.visitors import KeepPolicy, VisitorLog
sys.path.insert(0, sys.argv[3])
from test_visitors_store import answer
img = np.random.default_rng(int(sys.argv[4])).integers(0, 255, (480, 640, 3), np.uint8)
with VisitorLog.open(sys.argv[1], KeepPolicy(keep="all", per_day=1_000_000, quota_mb=10_000),
                     folder=sys.argv[2]) as log:
    print("ready", flush=True)
    while True:
        log.record(answer(None, 0.1), source="kiosk", image=img)
"""


@pytest.mark.slow
def test_a_kill_9_at_any_moment_loses_nothing_that_committed(index, tmp_path):
    folder = tmp_path / "v"
    rng = random.Random(34)
    for k in range(6):
        proc = subprocess.Popen([sys.executable, "-c", RECORDER, str(index), str(folder),
                                 str(Path(__file__).parent), str(k)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.8))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    with VisitorLog.open(index, KeepPolicy(keep="all"), folder=folder) as log:  # tidies what the kills left
        kept = log.kept()
        assert len(kept) == log.stats().total > 0  # each photo and its count commit together
    files = sorted(p.name for p in (folder / "kept").iterdir())
    assert files == sorted(p.path.name for p in kept)  # no half-written file, no file without a record
    for p in kept:
        assert cv2.imdecode(np.frombuffer(p.path.read_bytes(), np.uint8), cv2.IMREAD_COLOR) is not None
    with sqlite3.connect(folder / "visitors.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


WRITER = """
import sys, numpy as np
from datetime import datetime
from museum_search.core.visitors import KeepPolicy, VisitorLog
sys.path.insert(0, sys.argv[3])
from test_visitors_store import answer
img = np.random.default_rng(int(sys.argv[4])).integers(0, 255, (480, 640, 3), np.uint8)
n = 0
with VisitorLog.open(sys.argv[1], KeepPolicy(keep="all", per_day=int(sys.argv[5]), quota_mb=10_000),
                     folder=sys.argv[2]) as log:
    print("ready", flush=True)
    for _ in range(int(sys.argv[6])):
        log.record(answer(None, 0.1), source="phone", image=img, when=datetime(2026, 11, 28, 10))
        n += 1
print("done", n, flush=True)
"""


@pytest.mark.slow
def test_two_processes_and_a_reader_share_one_log(index, tmp_path):
    """serve and the app (or two serve processes) record into one log while the Visitors tab opens
    it again and again: the day's count holds across processes (checked under the write lock), and
    an opener's tidying never takes a file another process is writing (each record completes)."""
    folder, per_day, each = tmp_path / "v", 25, 40
    VisitorLog.open(index, KeepPolicy(), folder=folder).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(index), str(folder), str(Path(__file__).parent),
                               str(k), str(per_day), str(each)], stdout=subprocess.PIPE, text=True)
             for k in range(2)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    while any(p.poll() is None for p in procs):  # a reader opening the log while they write
        VisitorLog.open(index, KeepPolicy(), folder=folder, create=False).close()
    outs = [p.stdout.read() for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and all(o.strip() == f"done {each}" for o in outs), outs
    with VisitorLog.open(index, KeepPolicy(), folder=folder) as log:
        assert log.stats().total == 2 * each
        kept = log.kept()
        assert len(kept) == per_day  # not one more: the two processes' checks do not overlap
    assert sorted(p.name for p in (folder / "kept").iterdir()) == sorted(p.path.name for p in kept)


def test_clients_are_forgotten_after_an_hour_and_languages_read_either_way(index, tmp_path):
    """The per-client share lives in memory: addresses with no photo kept in the last hour are
    forgotten (a flood from many addresses does not fill memory); "fr_FR" counts as "fr"."""
    small = np.full((120, 160, 3), 70, np.uint8)
    with VisitorLog.open(index, KeepPolicy(keep="all", per_client_per_hour=1), folder=tmp_path / "v") as log:
        for k in range(50):
            assert log.record(answer(None, 0.1), source="phone", image=small, when=DAY, client=f"10.1.0.{k}")
        assert len(log._clients) == 50
        log.record(answer(None, 0.1), source="phone", language="fr_FR", image=small,
                   when=DAY + timedelta(hours=2), client="10.2.0.1")
        assert list(log._clients) == ["10.2.0.1"]
        assert log.stats().languages == {"": 50, "fr": 1}
