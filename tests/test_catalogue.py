"""Items and catalogue metadata in SQLite (core/catalogue.py): the sequence, full-text filtering."""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest

from museum_search.core.errors import IndexFormatError
from museum_search.core.index._catalogue import Item, ItemStore, fts_query, write_store


def _items(n: int = 300) -> list[Item]:
    artists = ["Claude Monet", "Edgar Degas", "Berthe Morisot", "Gustave Caillebotte"]
    out = []
    for i in range(n):
        meta = {"title": f"Study {i} of the Seine", "artist": artists[i % 4]}
        if i % 7 == 0:
            meta["museum"] = "Musée d'Orsày"
        if i % 50 == 0:
            meta = {}
        out.append(Item(f"room {i % 3}/photo_{i:05d}.jpg", 1000 + i, 1.5 * i, f"obj{i // 3}", meta, f"{i:064x}"))
    return out


def _python_filter(items: list[Item], words: list[str]) -> list[int]:
    """What the full-text filter must find: every word starts a word of the item (any field)."""
    import re
    import unicodedata

    def fold(s: str) -> str:
        return "".join(c for c in unicodedata.normalize("NFKD", s.lower()) if not unicodedata.combining(c))

    rows = []
    for r, it in enumerate(items):
        tokens = re.findall(r"\w+", fold(" ".join([it.instance, it.path, *it.metadata.values()])))
        if all(any(t.startswith(fold(w)) for t in tokens) for w in words):
            rows.append(r)
    return rows


@pytest.fixture()
def store(tmp_path):
    items = _items()
    write_store(tmp_path / "items.sqlite", items)
    s = ItemStore(tmp_path / "items.sqlite")
    yield items, s
    s.close()


def test_store_is_the_sequence_of_items(store):
    items, s = store
    assert len(s) == len(items)
    assert s[0] == items[0] and s[123] == items[123] and s[-1] == items[-1]
    assert list(s) == items
    assert s[10:13] == items[10:13]
    assert s.rows([5, 2, 299]) == [items[5], items[2], items[299]]
    np.testing.assert_array_equal(s.instances(), np.array([it.instance for it in items], dtype=object))
    assert s.fields == ["title", "artist", "museum"]
    assert s.row_of(items[42].path) == 42 and s.row_of("nope.jpg") is None
    with pytest.raises(IndexError):
        s[len(items)]


@pytest.mark.parametrize("text", ["monet", "Degas seine", "ORSAY", "orsày", "photo_0012", "obj4", "room 2 study 1"])
def test_match_equals_a_python_filter(store, text):
    items, s = store
    assert s.match(text).tolist() == _python_filter(items, text.split())


def test_field_restricted_search(store):
    items, s = store
    got = s.match("artist:morisot").tolist()
    assert got == [r for r, it in enumerate(items) if it.metadata.get("artist") == "Berthe Morisot"]
    # "monet" restricted to the title matches nothing; a field name that does not exist is plain text
    assert s.match("title:monet").tolist() == []
    assert s.match("nosuchfield:x").tolist() == _python_filter(items, ["nosuchfield", "x"])


def test_user_text_cannot_inject_fts_syntax(store):
    _, s = store
    for text in ['"', "monet OR", "NEAR(", "a AND", "*", "-degas", "title:", "^x", "'; DROP TABLE items; --"]:
        rows = s.match(text)
        assert rows is None or isinstance(rows, np.ndarray)  # no exception, no SQL error
    assert s.match("   ") is None and fts_query("") is None
    assert len(s) == 300  # nothing changed


def test_file_is_opened_read_only_and_nothing_is_created_beside_it(store, tmp_path):
    _, s = store
    assert sorted(os.listdir(tmp_path)) == ["items.sqlite"]
    s.match("monet")
    s.instances()
    with pytest.raises(sqlite3.OperationalError):
        s._conn.execute("DELETE FROM items")
    assert sorted(os.listdir(tmp_path)) == ["items.sqlite"]


def test_existing_file_is_never_overwritten(tmp_path):
    f = tmp_path / "items.sqlite"
    f.write_text("a user's file")
    with pytest.raises(FileExistsError):
        write_store(f, _items(3))
    assert f.read_text() == "a user's file"


def test_damaged_file_is_refused(tmp_path):
    f = tmp_path / "items.sqlite"
    f.write_bytes(b"not a database at all" * 100)
    with pytest.raises(IndexFormatError):
        ItemStore(f)


def test_in_memory_store_for_an_unsaved_index():
    items = _items(40)
    s = ItemStore.in_memory(items)
    assert len(s) == 40 and s.path is None and s[7] == items[7]
    assert s.match("caillebotte").tolist() == _python_filter(items, ["caillebotte"])


def test_threads_share_one_store(store):
    from concurrent.futures import ThreadPoolExecutor

    items, s = store
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: s[i], range(len(items))))
    assert got == items
