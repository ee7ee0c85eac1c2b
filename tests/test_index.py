"""Index: build, atomic save, interrupted save, refusal of damaged indexes, update."""

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

from museum_search.core.errors import IndexFormatError, MuseumSearchError
from museum_search.core.index._store import JOURNAL, LOCK, MANIFEST, Index, LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index, update_index
from museum_search.core.progress import drive as run

SMALL = BackboneConfig(size=96)


def _build(collection, out, config=SMALL):
    return run(build_index(collection, out, config, LabellingSpec("catalogue", str(collection / "catalogue.csv"))))


def test_build_save_load_roundtrip(collection, tmp_path):
    out = tmp_path / "idx"
    report = _build(collection, out)
    idx = Index.load(out)
    n = len(list(collection.glob("*.jpg")))
    assert len(idx) == n == len(report.index)
    assert idx.descriptors.shape == (n, 1280)
    assert isinstance(idx.descriptors, np.memmap)  # loaded memory-mapped
    np.testing.assert_allclose(np.linalg.norm(idx.descriptors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(idx.descriptors), report.index.descriptors)
    assert idx.meta == report.index.meta and idx.meta.size == 96
    assert len(idx.instances) == 3
    assert all(it.metadata.get("title") for it in idx.items)  # catalogue metadata kept
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["format"] == "museum-search-index" and manifest["count"] == n
    assert manifest["backbone"]["name"] == "mobilenet_v2"
    # no pickle anywhere: every data file loads with allow_pickle=False / json
    for f in manifest["files"].values():
        assert (out / f).is_file()


def test_float16_storage(collection, tmp_path):
    out = tmp_path / "idx16"
    run(build_index(collection, out, SMALL, LabellingSpec("catalogue", str(collection / "catalogue.csv")),
                    dtype="float16"))
    idx = Index.load(out)
    assert idx.descriptors.dtype == np.float16
    ref = _build(collection, None).index.descriptors
    np.testing.assert_allclose(np.asarray(idx.descriptors, np.float32), ref, atol=2e-3)


def test_interrupted_save_keeps_old_index(collection, tmp_path, monkeypatch):
    out = tmp_path / "idx"
    old = _build(collection, out).index
    before = sorted(p.name for p in out.iterdir())
    new = _build(collection, None, BackboneConfig(size=64)).index

    import museum_search.core.index._store as index_mod

    def crash(*a, **k):
        raise KeyboardInterrupt  # the process is stopped just before the commit point

    monkeypatch.setattr(index_mod.os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        new.save(out)
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == before  # partial files cleaned up
    again = Index.load(out)
    assert again.meta.size == old.meta.size == 96
    np.testing.assert_array_equal(np.asarray(again.descriptors), old.descriptors)


def test_killed_process_mid_save_leaves_old_index(collection, tmp_path):
    """SIGKILL a real process while it writes a new generation: the old index stays usable."""
    out = tmp_path / "idx"
    old = _build(collection, out).index
    script = textwrap.dedent(f"""
        import time, numpy as np
        import museum_search.core.index._store as m
        idx = m.Index.load({str(out)!r}, mmap=False)
        real = m._write_npy
        def slow(path, arr, dtype):
            h = real(path, arr, dtype)
            print("wrote", path, flush=True)
            time.sleep(60)
            return h
        m._write_npy = slow
        idx.descriptors = np.zeros_like(idx.descriptors)
        idx.save()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("wrote"), line
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    again = Index.load(out)
    np.testing.assert_array_equal(np.asarray(again.descriptors), old.descriptors)
    manifest = json.loads((out / MANIFEST).read_text())
    strays = {p.name for p in out.iterdir()} - set(manifest["files"].values()) - {MANIFEST, LOCK, JOURNAL}
    assert strays and all(name.startswith("descriptors-") for name in strays)
    assert (out / JOURNAL).is_file()  # the killed save's journal names its files
    # a file of the user's with a generation-like name, named in no manifest or journal, is kept
    (out / "descriptors-20200101T000000-abcdef.npy").write_bytes(b"mine")
    # the next save removes the stray files of the killed process, and nothing else
    again.save()
    manifest = json.loads((out / MANIFEST).read_text())
    assert {p.name for p in out.iterdir()} == set(manifest["files"].values()) | {
        MANIFEST, LOCK, "descriptors-20200101T000000-abcdef.npy"}


@pytest.mark.parametrize("damage", ["no_manifest", "bad_json", "other_format", "future_version",
                                    "truncated_npy", "checksum", "missing_items", "shape"])
def test_damaged_index_is_refused(collection, tmp_path, damage):
    out = tmp_path / "idx"
    _build(collection, out)
    manifest = json.loads((out / MANIFEST).read_text())
    desc = out / manifest["files"]["descriptors"]
    if damage == "no_manifest":
        (out / MANIFEST).unlink()
    elif damage == "bad_json":
        (out / MANIFEST).write_text("{not json")
    elif damage == "other_format":
        manifest["format"] = "something-else"
        (out / MANIFEST).write_text(json.dumps(manifest))
    elif damage == "future_version":
        manifest["version"] = 99
        (out / MANIFEST).write_text(json.dumps(manifest))
    elif damage == "truncated_npy":
        data = desc.read_bytes()
        desc.write_bytes(data[: len(data) // 2])
    elif damage == "checksum":
        data = bytearray(desc.read_bytes())
        data[-5] ^= 0xFF
        desc.write_bytes(bytes(data))
    elif damage == "missing_items":
        (out / manifest["files"]["items"]).unlink()
    elif damage == "shape":  # a consistent manifest (checksum recomputed) that does not fit its data
        from museum_search.core.index._store import _manifest_digest

        manifest["count"] = manifest["count"] + 1
        manifest["manifest_sha256"] = _manifest_digest(manifest)
        (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError) as err:
        Index.load(out)
    msg = str(err.value)
    assert "rebuild" in msg  # says what to do


def test_update_adds_changes_and_removes(collection, tmp_path):
    out = tmp_path / "idx"
    idx = _build(collection, out).index
    n = len(idx)
    files = sorted(collection.glob("*.jpg"))
    # delete one, "change" one (new content + mtime), add one under a catalogued name
    files[0].unlink()
    shutil.copy2(files[2], files[1])
    os.utime(files[1], (time.time() + 10, time.time() + 10))
    extra = collection / "extra-1.jpg"
    shutil.copy2(files[3], extra)
    with open(collection / "catalogue.csv", "a", encoding="utf-8") as f:
        f.write("extra-1.jpg,extra,Extra object,Nobody,2026,Added later\n")
    loaded = Index.load(out)
    report = run(update_index(loaded))
    assert (report.added, report.removed, report.unchanged) == (2, 1, n - 2)
    up = Index.load(out)
    assert len(up) == n
    paths = [it.path for it in up.items]
    assert files[0].name not in paths and "extra-1.jpg" in paths
    # the changed file's descriptor now equals the one of the file it was overwritten with
    row_changed = paths.index(files[1].name)
    row_src = paths.index(files[2].name)
    np.testing.assert_allclose(up.descriptors[row_changed], up.descriptors[row_src], atol=1e-5)
    assert up.items[paths.index("extra-1.jpg")].metadata["title"] == "Extra object"
    # a second update finds nothing to do
    report2 = run(update_index(Index.load(out)))
    assert (report2.added, report2.removed) == (0, 0)


def test_update_keeps_neighbour_lists_consistent(collection, tmp_path):
    from oracles import gallery_ranks

    out = tmp_path / "idx"
    _build(collection, out)
    n = len(Index.load(out))
    assert Index.load(out).neighbours_stored == n - 1  # K_MAX capped at N - 1
    files = sorted(collection.glob("*.jpg"))
    files[0].unlink()
    shutil.copy2(files[2], collection / "copy.jpg")
    with open(collection / "catalogue.csv", "a", encoding="utf-8") as f:
        f.write("copy.jpg,copy,,,,\n")
    run(update_index(Index.load(out)))
    up = Index.load(out)
    ranks = gallery_ranks(np.asarray(up.descriptors, np.float32))
    nb = up.neighbour_lists(len(up) - 1)
    # column p holds the reference of gallery rank p + 1: the dense ranks, without an N x N matrix
    assert nb.shape == (len(up), len(up) - 1)
    for i in range(len(up)):
        np.testing.assert_array_equal(ranks[i, nb[i]], np.arange(1, len(up)))


def test_build_skips_bad_files_with_reasons(collection, tmp_path):
    (collection / "empty.jpg").write_bytes(b"")
    (collection / "notes.jpg").write_text("not an image")
    report = run(build_index(collection, tmp_path / "idx", SMALL, LabellingSpec("none")))
    skipped = dict((Path(p).name, why) for p, why in report.skipped)
    assert set(skipped) == {"empty.jpg", "notes.jpg"}
    assert "empty" in skipped["empty.jpg"]
    assert len(report.index) == len(list(collection.glob("*.jpg"))) - 2


def test_cancel_build_leaves_previous_index(collection, tmp_path):
    out = tmp_path / "idx"
    old = _build(collection, out).index
    gen = build_index(collection, out, BackboneConfig(size=64),
                      LabellingSpec("catalogue", str(collection / "catalogue.csv")), batch_size=1)
    first = next(gen)
    assert first.done == 1
    gen.close()  # cancel
    assert Index.load(out).meta.size == old.meta.size


def test_empty_collection_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MuseumSearchError):
        run(build_index(tmp_path / "empty", None, SMALL))


def test_query_with_other_settings_is_refused(collection):
    from museum_search.core.inference._engines import build_extractor

    idx = _build(collection, None).index
    with pytest.raises(MuseumSearchError, match="do not match"):
        idx.check_compatible(build_extractor(BackboneConfig(size=128), engine="torch").meta)


def test_update_summary_counts_what_left_the_index_and_why(collection, tmp_path):
    """Issue 23, item 7: the count of an index went from 21 to 20 while its update said "0 removed".
    Every reference that leaves the index is counted as removed, with its reason (deleted, no longer
    readable, left out by the labelling rule), the summary says the size before, and a file that
    cannot be read is said to be left out of the index (the collection's 21 files, the index's 20)."""
    files = sorted(collection.glob("*.jpg"))
    broken_from_start = files[0]
    broken_from_start.write_bytes(b"not a photo " * 40)  # catalogued, never readable
    out = tmp_path / "idx"
    built = run(build_index(collection, out, SMALL, LabellingSpec("catalogue", str(collection / "catalogue.csv")),
                            verification=False))  # fast: the counts do not depend on verification
    n = len(built.index)
    assert n == len(files) - 1 and built.before is None
    assert built.summary().endswith("; 1 file(s) skipped: they cannot be read and are not in the index")

    # nothing changed: the unreadable file is skipped again, nothing is removed, the numbers add up
    again = run(update_index(Index.load(out)))
    assert (again.added, again.removed, again.unchanged, again.before, len(again.index)) == (0, 0, n, n, n)
    assert f"0 added/changed, 0 removed, {n} unchanged (of {n} before)" in again.summary()
    assert [p for p, _ in again.skipped] == [str(broken_from_start)]

    # one indexed photo becomes unreadable, one is deleted, one is taken out of the catalogue
    unreadable, deleted, uncatalogued = files[1], files[2], files[3]
    unreadable.write_bytes(b"\x00" * 500)
    deleted.unlink()
    lines = (collection / "catalogue.csv").read_text(encoding="utf-8").splitlines()
    (collection / "catalogue.csv").write_text(
        "\n".join(line for line in lines if not line.startswith(uncatalogued.name + ",")) + "\n", encoding="utf-8")
    report = run(update_index(Index.load(out)))
    after = Index.load(out)
    assert len(after) == len(report.index) == n - 3
    assert (report.added, report.removed, report.unchanged, report.before) == (0, 3, n - 3, n)
    assert report.unchanged + report.added == len(after) and report.before == report.unchanged + report.removed
    why = dict(report.removed_files)
    assert set(why) == {str(unreadable), str(deleted), str(uncatalogued)}
    assert why[str(deleted)] == "deleted from the collection"
    assert why[str(unreadable)].startswith("dropped: ") and why[str(unreadable)] == "dropped: " + dict(report.skipped)[str(unreadable)]
    assert why[str(uncatalogued)] == "dropped: " + dict(report.labelling.ignored)[uncatalogued.name]
    assert f"0 added/changed, 3 removed, {n - 3} unchanged (of {n} before)" in report.summary()
    assert "2 file(s) skipped: they cannot be read and are not in the index" in report.summary()
    assert {p for p, _ in report.skipped} == {str(broken_from_start), str(unreadable)}  # each once
    assert len(report.skipped) == 2


def test_update_that_only_removes_recalibrates_with_the_index_weights(collection, tmp_path, monkeypatch):
    """An update with no new photo still refits the verdict, which asks the network: it is loaded with the
    weights file the update was given (before, that path loaded the network without it)."""
    from museum_search.core.jobs import _indexing

    out = tmp_path / "idx"
    _build(collection, out)
    sorted(collection.glob("*.jpg"))[0].unlink()
    real, asked = _indexing.extractor_for_meta, []

    def spy(meta, weights=None, engine=None):
        asked.append(weights)
        return real(meta, None, engine=engine)  # the test's weights file is a name only

    monkeypatch.setattr(_indexing, "extractor_for_meta", spy)
    report = run(update_index(Index.load(out), weights="/museum/weights/mobilenet.pth"))
    assert (report.added, report.removed) == (0, 1)
    assert asked and set(asked) == {"/museum/weights/mobilenet.pth"}
