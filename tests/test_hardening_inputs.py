"""Hardening against odd inputs: files that are not regular files (FIFOs, sockets, devices) are
never opened as photos (nothing hangs), Ctrl-C works while a decode is stuck, catalogue rows naming
files outside the collection are reported, random bytes named ``.npy`` are called what they are,
and every file left out of an index is listed once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pytest

from museum_search.cli import main as cli_main
from museum_search.core.errors import ImageError, LabelError
from museum_search.core.images import decode_cost, image_size, load_image
from museum_search.core.index._labels import label_collection, read_csv_table
from museum_search.core.index._store import MANIFEST, Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._importing import DescriptorError, open_descriptors
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import DecodePool, drive

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and Unix sockets are POSIX only")

REPO = Path(__file__).resolve().parents[1]
SMALL = BackboneConfig(size=64)
FIFO_REASON = "not a regular file (a FIFO); only image files are indexed"


def _within(seconds: float, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, failing the test (instead of hanging it) if it takes longer."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} still runs after {seconds} s (blocked on a FIFO?)"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _unblock_readers(path: Path) -> None:
    """Give end-of-file to anything blocked opening the FIFO ``path`` (code that opens FIFOs)."""
    for _ in range(20):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody waits to read it (or it is gone)
            return
        os.close(fd)
        time.sleep(0.05)


@pytest.fixture()
def make_fifo():
    """``make_fifo(path)`` creates a FIFO that nobody ever writes to; readers stuck on it are
    released at the end of the test, so that a failing test does not hang the test run."""
    made: list[Path] = []

    def make(path: Path) -> Path:
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for p in made:
        _unblock_readers(p)


@pytest.fixture()
def unix_socket(tmp_path):
    """A listening Unix socket named ``s.jpg``."""
    path = tmp_path / "s.jpg"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    yield path
    s.close()


def _write_photo(path: Path, seed: int = 0, size: int = 96) -> Path:
    rng = np.random.default_rng(seed)
    img = cv2.resize(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), (size, size), interpolation=cv2.INTER_NEAREST)
    assert cv2.imwrite(str(path), img)
    return path


def _counts(pairs) -> Counter:
    return Counter(Path(p).name for p, _ in pairs)


# ---- 1. only regular files are opened -----------------------------------------------------------


@pytest.mark.parametrize("reader", [load_image, image_size, decode_cost])
def test_fifo_socket_and_devices_are_refused_with_the_reason(reader, tmp_path, make_fifo, unix_socket):
    fifo = make_fifo(tmp_path / "x.jpg")
    expected = {
        fifo: "a FIFO",
        unix_socket: "a socket",
        Path("/dev/null"): "a character device",
        Path("/dev/zero"): "a character device",
    }
    for path, kind in expected.items():
        if not path.exists():
            continue
        with pytest.raises(ImageError) as info:
            _within(20, reader, path)
        assert info.value.reason == f"not a regular file ({kind}); only image files are indexed"
        assert info.value.path == str(path)
    # a link to a FIFO is refused the same way; a real photo still loads
    (tmp_path / "link.jpg").symlink_to(fifo)
    with pytest.raises(ImageError, match="a FIFO"):
        _within(20, reader, tmp_path / "link.jpg")
    photo = _write_photo(tmp_path / "ok.png")
    assert _within(20, reader, photo) is not None


def test_a_fifo_catalogue_is_refused_not_waited_on(tmp_path, make_fifo):
    coll = tmp_path / "coll"
    coll.mkdir()
    for i in range(2):
        _write_photo(coll / f"{i}.png", seed=i)
    cat = make_fifo(coll / "catalogue.csv")
    for call in (lambda: read_csv_table(cat), lambda: label_collection(coll, catalogue=cat),
                 lambda: label_collection(coll)):  # found next to the photos: refused, not ignored
        with pytest.raises(LabelError, match=r"catalogue\.csv is not a regular file \(a FIFO\); choose a CSV file"):
            _within(20, call)


def test_build_skips_a_fifo_among_real_photos_and_lists_every_file_once(collection, make_fifo, tmp_path):
    """Core build (labels, describing, local features) of a collection holding a FIFO named like a
    photo, a broken link and catalogue rows that cannot be used, some of them twice."""
    make_fifo(collection / "x.jpg")
    (collection / "gone.jpg").symlink_to(collection / "deleted.jpg")
    photos = sorted(p.name for p in collection.glob("*.jpg") if p.is_file())
    cat = collection / "catalogue.csv"
    with open(cat, "a", encoding="utf-8") as f:
        f.write("x.jpg,fifo\nx.jpg,fifo\ngone.jpg,gone\nghost.jpg,ghost\nghost.jpg,ghost\n")
    report = _within(180, drive, build_index(collection, tmp_path / "idx", SMALL,
                                             LabellingSpec("catalogue", str(cat)), batch_size=2))
    left_out = list(report.skipped) + list(report.labelling.ignored)
    counts = _counts(left_out)
    assert counts == {"x.jpg": 1, "gone.jpg": 1, "ghost.jpg": 1}, left_out
    assert dict((Path(p).name, r) for p, r in left_out)["x.jpg"] == FIFO_REASON
    index = Index.load(tmp_path / "idx")
    assert sorted(it.path for it in index.items) == photos
    assert index.local is not None and len(index.local) == len(photos)
    assert "3 file(s) ignored by the labelling rule" in report.summary()


def test_index_and_query_commands_finish_on_a_fifo(collection, make_fifo, tmp_path):
    """``museum-search index`` with a FIFO in the collection, then ``museum-search query`` given
    the FIFO (and a real photo), as the user runs them: both end, and say why the FIFO is left out."""
    fifo = make_fifo(collection / "x.jpg")
    out = tmp_path / "idx"
    run = [sys.executable, "-m", "museum_search"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        res = subprocess.run([*run, "index", str(collection), "-o", str(out), "--labels", "none", "--size", "64",
                              "--neighbours", "0"], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:  # the process is killed by subprocess.run
        pytest.fail("museum-search index hangs on a FIFO in the collection")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("x.jpg") == 1 and FIFO_REASON in res.stderr, res.stderr
    assert "x.jpg" not in {it.path for it in Index.load(out).items}

    photo = sorted(collection.glob("*-1.jpg"))[0]
    try:
        res = subprocess.run([*run, "query", str(out), str(fifo), str(photo), "--json"],
                             capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("museum-search query hangs on a FIFO")
    assert res.returncode == 0, res.stderr
    assert f"skipped {fifo}: {FIFO_REASON}" in res.stderr
    import json

    answers = json.loads(res.stdout)
    assert [a["query"] for a in answers] == [str(photo)]
    try:
        res = subprocess.run([*run, "query", str(out), str(fifo)], capture_output=True, text=True, timeout=300,
                             env=env, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("museum-search query hangs on a FIFO")
    assert res.returncode == 1 and "none of the query images could be read" in res.stderr, res.stderr


# ---- 2. Ctrl-C while a decode is stuck ------------------------------------------------------------

_STUCK_SCRIPT = textwrap.dedent("""
    import sys, threading
    import museum_search.core.inference._extract as extract
    from museum_search.cli import main

    real = extract._prepare

    def prepare(extractor, path):
        if path.endswith(sys.argv[1]):  # a read that never returns (a dead network share)
            print("stuck", flush=True)
            threading.Event().wait()
        return real(extractor, path)

    extract._prepare = prepare
    raise SystemExit(main(sys.argv[2:]))
""")


@pytest.mark.slow
def test_ctrl_c_while_a_decode_is_stuck_exits_130_and_leaves_nothing(collection, tmp_path):
    stuck = sorted(collection.glob("*.jpg"))[1].name
    out = tmp_path / "new-index"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", _STUCK_SCRIPT, stuck, "index", str(collection), "-o", str(out), "--size", "64",
         "--batch-size", "1", "--catalogue", str(collection / "catalogue.csv")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        seen = _within(300, proc.stdout.readline)  # the decode of `stuck` has begun and will never end
        assert seen.strip() == "stuck", (seen, proc.poll())
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("Ctrl-C did not stop `museum-search index` while a decode was stuck")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    assert "museum-search: cancelled; nothing was changed" in stderr
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())
    assert not (out / MANIFEST).exists()


def test_decode_pool_shutdown_does_not_wait_for_a_stuck_call():
    pool = DecodePool(2, "test")
    release = threading.Event()
    started = threading.Event()

    def stuck():
        started.set()
        release.wait(60)
        return "late"

    try:
        running = pool.submit(stuck)
        assert started.wait(10)
        assert pool.submit(time.sleep, 0).result(10) is None  # the other thread still works
        later = [pool.submit(stuck) for _ in range(3)]
        t0 = time.perf_counter()
        _within(10, pool.shutdown, wait=False, cancel_futures=True)
        assert time.perf_counter() - t0 < 5
        assert sum(f.cancelled() for f in later) >= 2  # not started: cancelled (one may have started)
    finally:
        release.set()
    assert running.result(10) == "late"


# ---- 3. catalogue rows naming files outside the collection -----------------------------------------


def test_catalogue_rows_outside_the_collection_are_reported_once(tmp_path):
    coll = tmp_path / "coll"
    coll.mkdir()
    for name in ("a.png", "b.png", "secret.png"):
        _write_photo(coll / name, seed=len(name))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _write_photo(tmp_path / "secret.png", seed=7)  # next to the collection, not in it
    _write_photo(elsewhere / "far.png", seed=8)
    (coll / "out").symlink_to(elsewhere, target_is_directory=True)  # a folder link leading out
    far = elsewhere / "far.png"
    (coll / "catalogue.csv").write_text(
        "file,instance\n"
        "a.png,A\n"
        "b.png,B\n"
        "secret.png,S\n"
        "../secret.png,OTHER\n"  # not the collection's secret.png, whatever its name
        "../secret.png,OTHER\n"
        f"{far},FAR\n"
        "out/far.png,FAR\n"
        "../nowhere/x.png,X\n"
        f"{coll / 'a.png'},A\n",  # an absolute path inside the collection is fine
        encoding="utf-8",
    )
    lab = label_collection(coll)
    assert lab.rule == "catalogue"
    assert {r.path: r.instance for r in lab.references} == {"a.png": "A", "b.png": "B", "secret.png": "S"}
    outside = [p for p, reason in lab.ignored if reason.startswith("outside the collection")]
    assert sorted(outside) == sorted(["../secret.png", str(far), "out/far.png", "../nowhere/x.png"]), lab.ignored
    assert len(lab.ignored) == len({p for p, _ in lab.ignored}) == 4
    assert all("catalogue.csv names a file that is not in the collection folder" in r for _, r in lab.ignored)
    # the build summary counts them
    report = _within(300, drive, build_index(coll, None, SMALL, LabellingSpec("catalogue"), verification=False))
    assert "4 file(s) ignored by the labelling rule" in report.summary()
    assert sorted(it.path for it in report.index.items) == ["a.png", "b.png", "secret.png"]


def test_subset_and_name_only_catalogues_still_work(tmp_path):
    """What is not outside is not reported as such: names only, the catalogue one folder up."""
    coll = tmp_path / "refs"
    coll.mkdir()
    (coll / "sub").mkdir()
    _write_photo(coll / "sub" / "a.png", seed=1)
    _write_photo(coll / "b.png", seed=2)
    (tmp_path / "catalogue.csv").write_text("file,instance\na.png,A\nrefs/b.png,B\n", encoding="utf-8")
    lab = label_collection(coll)
    assert {r.path: r.instance for r in lab.references} == {"sub/a.png": "A", "b.png": "B"}
    assert lab.ignored == []
    lab = label_collection(coll, files=["sub/a.png"])  # refs/b.png: in the collection, not asked for
    assert [r.path for r in lab.references] == ["sub/a.png"] and lab.ignored == []


# ---- 4. random bytes named .npy ---------------------------------------------------------------------


def test_import_of_random_bytes_says_it_is_not_a_npy_file(tmp_path, capsys):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert data[0] != 0x80 and not data.startswith(b"\x93NUMPY")
    bad = tmp_path / "random.npy"
    bad.write_bytes(data)
    items = tmp_path / "items.csv"
    items.write_text("path,instance\n" + "".join(f"p{i}.jpg,i{i}\n" for i in range(4)), encoding="utf-8")
    out = tmp_path / "new"
    assert cli_main(["import", str(bad), "--items", str(items), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{bad} is not a NumPy .npy file" in err and "nothing was written" in err, err
    assert "pickle" not in err and "Python objects" not in err
    assert not out.exists()
    with pytest.raises(DescriptorError, match=r"is not a NumPy \.npy file \(it is empty\)"):
        (tmp_path / "empty.npy").write_bytes(b"")
        open_descriptors(tmp_path / "empty.npy")


def test_a_fifo_named_npy_is_refused_not_waited_on(tmp_path, make_fifo):
    fifo = make_fifo(tmp_path / "q.npy")
    with pytest.raises(DescriptorError, match=r"q\.npy is not a regular file \(a FIFO\)"):
        _within(20, open_descriptors, fifo)
