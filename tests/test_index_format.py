"""Index format 3: SQLite items, neighbour lists, the approximate index saved with its generation,
sampled checks of large files, and the conversion of format-2 indexes (``museum-search upgrade``)."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from oracles import gallery_ranks

import museum_search.core.index._store as index_mod
from museum_search.cli import main as cli_main
from museum_search.core.answer._search import score_matrix
from museum_search.core.errors import IndexFormatError, MuseumSearchError
from museum_search.core.index._catalogue import Item, ItemStore
from museum_search.core.index._store import MANIFEST, Index, LabellingSpec, _manifest_digest
from museum_search.core.inference._backbones import imported_meta
from museum_search.core.jobs._indexing import derive, upgrade_index
from museum_search.core.progress import drive as run


def _clustered(n_objects: int, views: int, dim: int = 64, noise: float = 0.25, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_objects, dim))
    x = np.repeat(centres, views, axis=0) + noise * rng.standard_normal((n_objects * views, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _items(n: int, views: int) -> list[Item]:
    return [Item(f"obj{i // views}/view{i % views}.jpg", 0, 0.0, f"obj{i // views}",
                 {"title": f"Object {i // views}", "artist": ["Monet", "Degas"][i % 2]}) for i in range(n)]


def _index(tmp_path: Path, n_objects: int = 60, views: int = 4, dim: int = 64, dtype: str = "float32") -> Index:
    desc = _clustered(n_objects, views, dim).astype(dtype)
    root = tmp_path / "photos"
    root.mkdir(exist_ok=True)
    return Index(root, imported_meta(dim), _items(len(desc), views), desc, LabellingSpec("imported"))


def _write_v2(folder: Path, index: Index, with_ranks: bool = True) -> None:
    """A format-2 index as museum-search 0.x wrote it: items in JSON, an N x N gallery-rank matrix."""
    folder.mkdir()
    gen = "20250101T000000-abcdef"
    files = {"descriptors": f"descriptors-{gen}.npy", "items": f"items-{gen}.json"}
    np.save(folder / files["descriptors"], np.asarray(index.descriptors))
    (folder / files["items"]).write_text(json.dumps([asdict(it) for it in index.items]), encoding="utf-8")
    if with_ranks:
        files["gallery_ranks"] = f"gallery_ranks-{gen}.npy"
        np.save(folder / files["gallery_ranks"], gallery_ranks(np.asarray(index.descriptors, np.float32)))
    sha = {k: hashlib.sha256((folder / f).read_bytes()).hexdigest() for k, f in files.items()}
    manifest = {"format": "museum-search-index", "version": 2, "created": 1.0, "updated": 2.0,
                "count": len(index), "dim": index.meta.dim, "dtype": str(index.descriptors.dtype),
                "instances": len(index.instances), "backbone": index.meta.to_dict(),
                "collection": {"root": str(index.root), "relative": os.path.relpath(index.root, folder)},
                "labelling": asdict(index.labelling), "files": files, "sha256": sha,
                "local_features": None, "verdict": {"min_inliers": 12, "min_cosine": 0.7, "source": "test"}}
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_saved_index_has_sqlite_items_and_neighbour_lists(tmp_path):
    idx = _index(tmp_path)
    run(derive(idx, ann="no"))
    idx.save(tmp_path / "idx")
    names = sorted(os.listdir(tmp_path / "idx"))
    kinds = sorted(n.split("-")[0] for n in names if index_mod.DATA_FILE.match(n))
    assert kinds == ["descriptors", "items", "neighbours"]
    assert any(n.endswith(".sqlite") for n in names) and not any(n.endswith(".json") and n != MANIFEST for n in names)
    back = Index.load(tmp_path / "idx")
    assert isinstance(back.items, ItemStore) and list(back.items) == list(idx.items)
    assert isinstance(idx.items, ItemStore)  # a saved index browses its saved catalogue
    np.testing.assert_array_equal(back.labels, idx.labels)
    # the stored lists are the dense gallery ranks' first K_MAX columns, bit for bit
    ranks = gallery_ranks(np.asarray(idx.descriptors))
    nb = back.neighbour_lists(10)
    assert nb.shape == (len(idx), index_mod.K_MAX) and isinstance(nb, np.memmap)
    expected = np.argsort(ranks, axis=1, kind="stable")[:, : index_mod.K_MAX]
    np.testing.assert_array_equal(nb, expected)
    # browsing and filtering are SQL on the saved catalogue, and on an unsaved index too
    assert back.catalogue() is back.items
    assert back.catalogue().match("degas").tolist() == list(range(1, len(idx), 2))
    assert idx.catalogue().match("object 7").tolist() == [r for r, it in enumerate(idx.items)
                                                          if it.instance.startswith("obj7")]


def test_longer_neighbour_lists_are_computed_in_memory_for_a_small_index(tmp_path):
    idx = _index(tmp_path, n_objects=20)
    run(derive(idx, ann="no", neighbours=5))
    idx.save(tmp_path / "idx")
    back = Index.load(tmp_path / "idx")
    assert back.neighbours_stored == 5 and back.has_neighbours(5) and not back.has_neighbours(6)
    nb = back.neighbour_lists(50)  # ICFRR with K_g = 50: computed (K_MAX or more), for this run only
    assert nb.shape[1] >= 50
    assert Index.load(tmp_path / "idx").neighbours_stored == 5  # a reader never writes (issue 33)


def test_large_index_refuses_longer_lists_with_what_to_do(tmp_path, monkeypatch):
    idx = _index(tmp_path, n_objects=20)
    run(derive(idx, ann="no", neighbours=4))
    monkeypatch.setattr(index_mod, "EXACT_NEIGHBOURS_MAX", 10)
    with pytest.raises(MuseumSearchError, match="--neighbours 8"):
        idx.neighbour_lists(8)
    assert idx.neighbour_lists(4).shape[1] == 4


def test_format_2_is_refused_with_the_command_that_converts_it(tmp_path):
    idx = _index(tmp_path)
    _write_v2(tmp_path / "old", idx)
    with pytest.raises(IndexFormatError, match=r"museum-search upgrade .*old"):
        Index.load(tmp_path / "old")


def test_upgrade_converts_in_place_and_keeps_the_descriptors(tmp_path, capsys):
    idx = _index(tmp_path)
    old = tmp_path / "old"
    _write_v2(old, idx)
    (tmp_path / "old-notes.txt").write_text("a user's file beside the index")
    before = sorted(os.listdir(old))
    assert cli_main(["upgrade", str(old)]) == 0
    assert "converted" in capsys.readouterr().out
    new = Index.load(old)
    np.testing.assert_array_equal(np.asarray(new.descriptors), idx.descriptors)
    assert list(new.items) == idx.items and new.verdict["source"] == "test"
    assert new.neighbours_stored == index_mod.K_MAX
    after = set(os.listdir(old))
    assert not (set(before) - {MANIFEST}) & after  # the old generation's files are gone
    assert not any(n.startswith("gallery_ranks") for n in after)
    assert (tmp_path / "old-notes.txt").read_text() == "a user's file beside the index"
    with pytest.raises(MuseumSearchError, match="already"):
        run(upgrade_index(old))


def test_interrupted_upgrade_leaves_the_old_index(tmp_path, monkeypatch):
    idx = _index(tmp_path)
    old = tmp_path / "old"
    _write_v2(old, idx)
    before = {n: (old / n).read_bytes() for n in os.listdir(old)}

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index_mod, "write_store", fail, raising=False)
    import museum_search.core.index._catalogue as cat

    monkeypatch.setattr(cat, "write_store", fail)
    with pytest.raises(MuseumSearchError, match="disk is full"):
        run(upgrade_index(old))
    assert {n: (old / n).read_bytes() for n in os.listdir(old) if n != ".museum-search.lock"} == before


def test_large_files_are_checked_by_size_and_samples_and_fully_on_request(tmp_path, monkeypatch):
    monkeypatch.setattr(index_mod, "FULL_CHECK_BYTES", 4096)
    monkeypatch.setattr(index_mod, "_SAMPLE_BLOCK", 512)
    idx = _index(tmp_path, n_objects=300, dim=128)  # descriptors: 153 kB
    idx.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / MANIFEST).read_text())
    assert "descriptors" in manifest["samples"]
    f = tmp_path / "idx" / manifest["files"]["descriptors"]
    data = bytearray(f.read_bytes())
    # a byte between two sampled blocks: opening does not read it, --check does
    span = len(data) - 512
    between = span * 30 // (index_mod._SAMPLE_BLOCKS - 1) + 512 + 100
    assert between + 1 < span * 31 // (index_mod._SAMPLE_BLOCKS - 1)
    data[between] ^= 0x10
    f.write_bytes(bytes(data))
    Index.load(tmp_path / "idx")
    with pytest.raises(IndexFormatError, match="damaged"):
        Index.load(tmp_path / "idx", verify="full")
    assert cli_main(["info", "--check", str(tmp_path / "idx")]) == 1
    data[200] ^= 0x01  # the first block is always sampled
    f.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="damaged"):
        Index.load(tmp_path / "idx")
    f.write_bytes(bytes(data[:-4]))  # a shorter file
    with pytest.raises(IndexFormatError, match="damaged"):
        Index.load(tmp_path / "idx")


def test_float16_scores_never_convert_the_whole_matrix(tmp_path, monkeypatch):
    from museum_search.core.index import _exact

    monkeypatch.setattr(_exact, "_chunk_rows", lambda dim, itemsize=4, budget=0: 1000)  # 1 MB blocks here
    idx = _index(tmp_path, n_objects=5000, views=4, dim=256, dtype="float16")  # 20,000 x 256
    idx.save(tmp_path / "idx")
    back = Index.load(tmp_path / "idx")
    q = np.asarray(idx.descriptors[:3], np.float32)
    tracemalloc.start()
    s = score_matrix(back, q)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    whole = len(idx) * 256 * 4
    assert peak < whole / 2, (peak, whole)
    np.testing.assert_allclose(s, q @ np.asarray(idx.descriptors, np.float32).T, atol=1e-5)


def test_approximate_index_is_saved_with_its_generation_and_searched(tmp_path):
    idx = _index(tmp_path, n_objects=1000, views=4, dim=64, dtype="float16")
    run(derive(idx, ann="yes", neighbours=8))
    assert idx.ann is not None
    idx.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / MANIFEST).read_text())
    assert manifest["files"]["ann"].endswith(".faiss") and manifest["ann"]
    back = Index.load(tmp_path / "idx")
    assert back.ann is not None and back.ann.ntotal == len(idx)
    q = np.asarray(back.descriptors[::97], np.float32)
    exact = score_matrix(back, q, "exact")
    approx = score_matrix(back, q, "ann")
    found = np.isfinite(approx)
    assert found.sum(axis=1).min() >= 10 and found.mean() < 0.5  # a shortlist, not everything
    np.testing.assert_allclose(approx[found], exact[found], atol=1e-6)  # shortlist scores are exact
    assert (approx.argmax(axis=1) == exact.argmax(axis=1)).all()
    # a second save makes a new generation; the old ANN file goes with the old generation
    first = manifest["files"]["ann"]
    back.save()
    assert not (tmp_path / "idx" / first).exists()
    assert (tmp_path / "idx" / json.loads((tmp_path / "idx" / MANIFEST).read_text())["files"]["ann"]).is_file()


def test_search_mode_ann_on_an_index_without_one_says_what_to_do(tmp_path):
    from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings

    idx = _index(tmp_path)
    with pytest.raises(MuseumSearchError, match="approximate"):
        QueryPipeline.for_descriptors(idx, QuerySettings(search="ann"))
    assert QueryPipeline.for_descriptors(idx, QuerySettings(search="auto")).search_mode == "exact"


def test_query_expansion_on_a_gallery_too_large_for_memory_is_refused(tmp_path, monkeypatch):
    import museum_search.core.answer._rerank as rerank
    from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, descriptor_query

    idx = _index(tmp_path)
    q = [descriptor_query(np.asarray(idx.descriptors[0]), "row 0")]
    for name in ("aqe", "dba"):
        assert QueryPipeline.for_descriptors(idx, QuerySettings(rerank=name)).answer(q)[0].results
    monkeypatch.setattr(rerank, "EXPANSION_MAX_BYTES", len(idx) * 64 * 4 - 1)
    for name in ("aqe", "dba"):
        with pytest.raises(MuseumSearchError, match="ICFRR"):
            QueryPipeline.for_descriptors(idx, QuerySettings(rerank=name)).answer(q)
