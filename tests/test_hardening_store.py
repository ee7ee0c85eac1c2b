"""The index on disk against hostile folders, unlucky signals and damaged files (issue 19, items 1-4
and 6). Each test reproduces what the trial found on the code before it: a symlinked lock file
emptied a user's file, a Ctrl-C just after the commit destroyed the index, readers failed while a
writer saved, a damaged catalogue gave a traceback, an unreadable photo was dropped uncounted.

Signals are injected at the exact system call with ``strace -e inject=…`` (``-P`` limits it to one
file of the index), never by timing."""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from museum_search.cli import main as cli_main
from museum_search.core.errors import IndexFormatError, OutputFolderError
from museum_search.core.index._catalogue import ItemStore
from museum_search.core.index._store import JOURNAL, LOCK, MANIFEST, Index, LabellingSpec, _manifest_digest
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index, update_index
from museum_search.core.progress import drive as run

SMALL = BackboneConfig(size=64)
REPO = Path(__file__).resolve().parents[1]
STRACE = shutil.which("strace")


def _build(collection, out):
    return run(build_index(collection, out, SMALL, LabellingSpec("catalogue", str(collection / "catalogue.csv"))))


@pytest.fixture()
def built(collection, tmp_path):
    out = tmp_path / "idx"
    _build(collection, out)
    return collection, out


def _cli(capsys, *args) -> tuple[int, str]:
    rc = cli_main([str(a) for a in args])
    return rc, capsys.readouterr().err


def _manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text(encoding="utf-8"))


def _data_files(out: Path) -> set[str]:
    return {p.name for p in out.iterdir()} - {MANIFEST, LOCK, JOURNAL}


def _add_photo(collection: Path) -> str:
    """A new reference photo in the collection (a copy of one with another name, in the catalogue)."""
    src = sorted(collection.glob("*.jpg"))[0]
    dst = collection / f"new-{src.name}"
    shutil.copy2(src, dst)
    lines = (collection / "catalogue.csv").read_text(encoding="utf-8").splitlines()
    row = next(line for line in lines[1:] if line.startswith(src.name + ","))
    lines.append(dst.name + row[len(src.name):])
    (collection / "catalogue.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst.name


def _strace(args: list[str], inject: str, path: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``museum-search ARGS`` under strace, injecting ``inject`` at the first matching system call
    (that touches ``path``: strace 6.1's ``-P`` matches only a call's first path, so not the target of
    a rename; the one rename of an index save is the commit, once the network's export is cached)."""
    if STRACE is None:
        pytest.fail("strace is missing: bash tools/install.sh --dev installs it (Debian package strace)")
    cmd = [STRACE, "-f", "-qq", "-o", os.devnull, *(["-P", str(path)] if path else []), "-e", f"inject={inject}",
           sys.executable, "-m", "museum_search", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))


# ---- 1. never through a link --------------------------------------------------------------------


def test_symlinked_lock_file_never_touches_its_target(built, tmp_path, capsys):
    collection, out = built
    diary = tmp_path / "diary.txt"
    diary.write_text("dear diary\n")
    (out / LOCK).unlink(missing_ok=True)
    (out / LOCK).symlink_to(diary)
    before = _manifest(out)
    rc, err = _cli(capsys, "update", out)
    assert rc == 1 and f"the lock file {out / LOCK} is a symbolic link" in err, err
    assert diary.read_text() == "dear diary\n"
    assert _manifest(out) == before  # nothing was written
    with pytest.raises(OutputFolderError, match="symbolic link"):
        run(update_index(Index.load(out)))
    assert diary.read_text() == "dear diary\n"


def test_symlinked_lock_in_a_new_output_folder_is_refused(collection, tmp_path, capsys):
    target = tmp_path / "list.csv"
    target.write_text("a,b\n1,2\n")
    n = tmp_path / "n"
    n.mkdir()
    (n / LOCK).symlink_to(target)
    rc, err = _cli(capsys, "index", collection, "-o", n, "--size", "64", "--labels", "catalogue",
                   "--catalogue", collection / "catalogue.csv")
    assert rc == 1 and "not empty" in err and LOCK in err, err
    assert target.read_text() == "a,b\n1,2\n"
    assert sorted(p.name for p in n.iterdir()) == [LOCK]


@pytest.mark.parametrize("kind", ["hardlink", "fifo", "folder"])
def test_lock_that_is_not_a_regular_file_of_its_own_is_refused(built, tmp_path, kind):
    collection, out = built
    (out / LOCK).unlink(missing_ok=True)
    other = tmp_path / "other.txt"
    other.write_text("keep me\n")
    if kind == "hardlink":
        os.link(other, out / LOCK)
    elif kind == "fifo":
        os.mkfifo(out / LOCK)
    else:
        (out / LOCK).mkdir()
    with pytest.raises(OutputFolderError, match=str(out / LOCK)):
        run(update_index(Index.load(out)))
    assert other.read_text() == "keep me\n"


def test_lock_file_is_never_truncated(built):
    collection, out = built
    (out / LOCK).write_text("12345\n")  # e.g. written by an older version
    run(update_index(Index.load(out)))
    assert (out / LOCK).read_text() == "12345\n"


def test_symlinked_journal_is_refused_and_its_target_kept(built, tmp_path):
    collection, out = built
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"files": [sorted(_data_files(out))[0]]}))
    (out / JOURNAL).symlink_to(secret)
    before = {p.name for p in out.iterdir()}
    with pytest.raises(OutputFolderError, match="journal .* is a symbolic link"):
        run(update_index(Index.load(out)))
    assert secret.is_file() and {p.name for p in out.iterdir()} == before


def test_symlinked_data_file_is_refused_by_name(built, tmp_path):
    collection, out = built
    name = _manifest(out)["files"]["descriptors"]
    moved = tmp_path / "elsewhere.npy"
    shutil.move(out / name, moved)
    (out / name).symlink_to(moved)
    with pytest.raises(IndexFormatError, match=f"{name} in .* is a symbolic link"):
        Index.load(out)


# ---- 2. the commit is a point of no return ----------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_right_after_the_commit_keeps_the_new_index(built):
    """strace delivers SIGINT as rename(…, manifest.json) starts: the rename (the commit) then runs,
    and before the deferral the interrupt destroyed the index it had just committed."""
    collection, out = built
    new = _add_photo(collection)
    proc = _strace(["update", str(out)], "rename,renameat,renameat2:signal=SIGINT:when=1")
    assert proc.returncode == 130, proc.stderr
    assert "interrupted after the index was saved" in proc.stderr, proc.stderr
    assert "nothing was changed" not in proc.stderr
    index = Index.load(out)
    assert new in {it.path for it in index.items}
    # the old generation's files that remain are removed by the next writer
    run(update_index(index))
    assert _data_files(out) == set(_manifest(out)["files"].values())


@pytest.mark.slow
def test_ctrl_c_while_the_old_generation_is_removed_says_saved(built):
    collection, out = built
    old = _manifest(out)["files"]["descriptors"]
    new = _add_photo(collection)
    proc = _strace(["update", str(out)], "unlink,unlinkat:signal=SIGINT:when=1", out / old)
    assert proc.returncode == 130, proc.stderr
    assert "interrupted after the index was saved" in proc.stderr, proc.stderr
    index = Index.load(out)
    assert new in {it.path for it in index.items}
    assert (out / JOURNAL).exists()  # the removal was not finished ...
    run(update_index(index))  # ... and the next writer finishes it
    assert _data_files(out) == set(_manifest(out)["files"].values()) and not (out / JOURNAL).exists()


@pytest.mark.slow
def test_kill_after_the_commit_leaves_no_orphan_for_good(built):
    collection, out = built
    old = set(_manifest(out)["files"].values())
    new = _add_photo(collection)
    # killed as it starts removing the previous generation (strace delivers a signal on entering a call)
    proc = _strace(["update", str(out)], "unlink,unlinkat:signal=SIGKILL:when=1",
                   out / _manifest(out)["files"]["descriptors"])
    assert proc.returncode == -9, proc.stderr
    index = Index.load(out)  # the new generation, complete
    assert new in {it.path for it in index.items}
    assert old & _data_files(out)  # the kill left the previous generation behind
    run(update_index(index))
    assert _data_files(out) == set(_manifest(out)["files"].values())
    assert not old & _data_files(out)


@pytest.mark.slow
def test_first_build_killed_before_its_commit_can_be_run_again(collection, tmp_path):
    _build(collection, tmp_path / "warm")  # the network's export is cached: the commit is the only rename
    out = tmp_path / "fresh"
    args = ["index", str(collection), "-o", str(out), "--size", "64", "--labels", "catalogue",
            "--catalogue", str(collection / "catalogue.csv")]
    # the rename that would commit fails and the process is killed: only the program's leftovers remain
    proc = _strace(args, "rename,renameat,renameat2:error=EIO:signal=SIGKILL:when=1")
    assert proc.returncode == -9, proc.stderr
    assert not (out / MANIFEST).exists() and (out / JOURNAL).exists() and _data_files(out)
    # the same command again: recognised as this program's own leftovers, cleaned, reused
    rc = cli_main(args)
    assert rc == 0
    assert _data_files(out) == set(_manifest(out)["files"].values())
    assert len(Index.load(out)) == len(list(collection.glob("*.jpg")))


def test_leftovers_with_a_file_of_the_user_are_still_refused(collection, tmp_path):
    out = tmp_path / "fresh"
    out.mkdir()
    (out / JOURNAL).write_text(json.dumps({"pid": 1, "files": ["descriptors-20250101T000000-abcdef.npy"]}))
    (out / "descriptors-20250101T000000-abcdef.npy").write_bytes(b"x")
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputFolderError, match="not empty"):
        _build(collection, out)
    assert (out / "notes.txt").read_text() == "mine"


# ---- 3. readers never see a half-switched index ------------------------------------------------------

WRITER = """
import sys, time
import numpy as np
from museum_search.core.index._store import Index
idx = Index.load(sys.argv[1], mmap=False)
print("ready", flush=True)
for i in range(int(sys.argv[2])):
    idx.descriptors = np.roll(np.asarray(idx.descriptors), 1, axis=0).copy()
    idx.save()
print("done", flush=True)
"""


@pytest.mark.slow
def test_readers_never_fail_while_a_writer_saves(built):
    collection, out = built
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out), "60"], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    loads, failures = 0, []
    try:
        assert proc.stdout.readline().strip() == "ready"
        while proc.poll() is None:
            try:
                index = Index.load(out)
                assert len(index.items) == len(index.descriptors)
            except IndexFormatError as exc:
                failures.append(str(exc))
            loads += 1
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert loads > 100 and not failures, (loads, failures[:3])


# ---- 4. every damaged file is a clear message ------------------------------------------------------


def _damage_catalogue(out: Path) -> Path:
    f = out / _manifest(out)["files"]["items"]
    data = bytearray(f.read_bytes())
    page = 8192
    for a in range(page, len(data), page):  # every page but the first: the tables are unreadable
        data[a:a + page] = os.urandom(min(page, len(data) - a))
    f.write_bytes(bytes(data))
    return f


def test_damaged_catalogue_is_named_not_a_traceback(built, capsys, monkeypatch):
    """As on a 480 MB catalogue, where the damage lies between the sampled blocks: opening checks
    only samples, and the SQLite error that follows is checked against the full checksum."""
    import museum_search.core.index._store as index_mod

    collection, out = built
    f = _damage_catalogue(out)
    monkeypatch.setattr(index_mod, "FULL_CHECK_BYTES", 0)
    monkeypatch.setattr(index_mod, "_intact", lambda *a, **k: True)  # the samples miss the damage
    photo = sorted(collection.glob("*.jpg"))[0]
    for args in (["info", out], ["query", out, photo]):
        rc, err = _cli(capsys, *args)
        assert rc == 1, err
        assert f"the item catalogue {f} is damaged" in err and "rebuild it with: museum-search index" in err, err
        assert "Traceback" not in err and "sqlite3." not in err


def test_metadata_that_is_not_json_names_the_file_and_row(built):
    collection, out = built
    f = out / _manifest(out)["files"]["items"]
    copy = out.parent / "items-copy.sqlite"
    shutil.copy(f, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE items SET metadata = '{bad' WHERE row = 1")
    store = ItemStore(copy, hint="rebuild it")
    with pytest.raises(IndexFormatError, match=r"items-copy.sqlite is damaged: the metadata of row 1 is not valid JSON"):
        store[1]
    with pytest.raises(IndexFormatError, match="row 1"):
        list(store)


def _rewrite_manifest(out: Path, **changes) -> None:
    m = _manifest(out)
    m.update(changes)
    m["manifest_sha256"] = _manifest_digest(m)
    (out / MANIFEST).write_text(json.dumps(m))


def test_version_as_a_string_is_called_damaged(built):
    collection, out = built
    _rewrite_manifest(out, version="3")
    with pytest.raises(IndexFormatError, match="its format version is '3', not a number"):
        Index.load(out)


def test_random_bytes_named_npy_are_not_called_a_pickle(built):
    collection, out = built
    name = _manifest(out)["files"]["descriptors"]
    (out / name).write_bytes(os.urandom(4096))
    with pytest.raises(IndexFormatError) as err:
        Index.load(out, verify=False)
    assert "not a NumPy array file" in str(err.value) and "pickle" not in str(err.value)


def test_rebuild_advice_of_an_imported_index_names_import(tmp_path):
    from museum_search.core.jobs._importing import import_index

    desc = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    np.save(tmp_path / "d.npy", desc)
    (tmp_path / "items.csv").write_text("path,instance\n" + "".join(f"p{i}.jpg,o{i // 2}\n" for i in range(6)))
    out = tmp_path / "imported"
    run(import_index(tmp_path / "d.npy", tmp_path / "items.csv", out))
    (out / _manifest(out)["files"]["descriptors"]).unlink()
    with pytest.raises(IndexFormatError, match="museum-search import DESCRIPTORS.npy") as err:
        Index.load(out)
    assert "museum-search index COLLECTION" not in str(err.value)


# ---- 6. counts tell the truth ------------------------------------------------------------------------


def test_update_counts_an_unreadable_reference_as_removed_and_lists_it(built, capsys):
    collection, out = built
    victim = sorted(collection.glob("*.jpg"))[1]
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[:64] = bytes(64)  # same size, same time: only --checksum sees it; it is no image any more
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    n = len(Index.load(out))
    rc, err = _cli(capsys, "update", out, "--checksum")
    assert rc == 0, err
    assert len(Index.load(out)) == n - 1
    assert f"1 reference(s) removed from the index:\n  {victim}: dropped:" in err, err
    assert err.count(str(victim)) == 2  # once skipped (with its reason), once removed
    report = run(update_index(Index.load(out), checksum=True))
    assert report.removed == 0  # now it is simply not in the index


def test_update_counts_deleted_references(built):
    collection, out = built
    victim = sorted(collection.glob("*.jpg"))[0]
    victim.unlink()
    report = run(update_index(Index.load(out)))
    assert report.removed == 1 and report.removed_files == [(str(collection / victim.name),
                                                             "deleted from the collection")]
    assert "1 removed" in report.summary()


@pytest.mark.slow
def test_ctrl_c_at_the_journals_sync_leaves_no_journal(built):
    """strace delivers SIGINT as the journal is synced (issue 33, case 14): the save stops before any
    data file, says nothing was changed, and no journal stays behind (one did until the next update)."""
    collection, out = built
    before = _manifest(out)
    files = _data_files(out)
    _add_photo(collection)
    proc = _strace(["update", str(out)], "fsync:signal=SIGINT:when=1", out / JOURNAL)
    assert proc.returncode == 130, proc.stderr
    assert "nothing was changed" in proc.stderr, proc.stderr
    assert not (out / JOURNAL).exists()
    assert _manifest(out) == before and _data_files(out) == files
