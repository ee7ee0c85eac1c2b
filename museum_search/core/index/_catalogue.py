"""The items of an index and their catalogue metadata, in SQLite (standard library ``sqlite3``).

One file per index generation, ``items-<gen>.sqlite``, written once and never changed::

    items(row INTEGER PRIMARY KEY, path, size, mtime, instance, sha256, metadata)   -- metadata: JSON
    fields(position INTEGER PRIMARY KEY, name)                                      -- metadata fields
    catalogue                                                                       -- FTS5, rowid = row

So opening an index of a million references reads no large file: an :class:`ItemStore` answers
``store[row]`` with one indexed lookup (a small cache keeps the rows just shown), counts with one
query, and filters with a full-text query (:meth:`ItemStore.match`). Readers open the file
read-only and *immutable* (no lock, no journal: nothing is ever created beside it), so any number
of processes can read it while a writer prepares the next generation.

Full-text search: the FTS5 table has one column for the instance, one for the file path and one
per metadata field (title, artist, …), tokenized by ``unicode61`` with diacritics removed (a search
for "Orsay" finds "Orsày"). :func:`fts_query` turns what a user types into a safe FTS5 query: every
word must match the start of a word of the item (prefix search), in any column, and ``field:word``
restricts a word to one field (``artist:monet``).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import overload

import numpy as np

from museum_search.core.errors import IndexFormatError

SCHEMA_VERSION = 1
_CACHE_ROWS = 4096
_BATCH = 20_000
_FIXED = ("instance", "path")  # the FTS columns every catalogue has, before the metadata fields
_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass
class Item:
    """One reference photo of an index: its file, its object and its catalogue metadata."""

    path: str  # POSIX path relative to the collection root
    size: int
    mtime: float
    instance: str
    metadata: dict[str, str] = field(default_factory=dict)
    sha256: str = ""  # content hash of the file when it was described ("" if unknown)


def _column_names(fields: Sequence[str]) -> list[str]:
    """FTS column names: ``instance``, ``path``, then ``f0``, ``f1``… for the metadata fields (field
    names are free text: a CSV header may hold anything)."""
    return [*_FIXED, *(f"f{i}" for i in range(len(fields)))]


def write_store(path: str | os.PathLike, items: Iterable[Item]) -> None:
    """Write ``items`` (in row order) to a new SQLite file at ``path``, created exclusively (an
    existing file is never overwritten). The caller fsyncs and hashes it (it is an index data file)."""
    path = Path(path)
    items = list(items) if not isinstance(items, Sequence) else items
    fields: dict[str, int] = {}
    for it in items:
        for k in it.metadata:
            if k not in fields:
                fields[k] = len(fields)
    with open(path, "xb"):  # claim the name: O_EXCL
        pass
    conn = sqlite3.connect(str(path), isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=OFF")  # a new file of a generation not yet committed: no journal
        conn.execute("PRAGMA synchronous=OFF")  # the caller fsyncs the finished file
        conn.execute("PRAGMA page_size=8192")
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE info(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO info VALUES ('schema', ?), ('count', ?)", (str(SCHEMA_VERSION), str(len(items))))
        conn.execute("CREATE TABLE items(row INTEGER PRIMARY KEY, path TEXT NOT NULL, size INTEGER NOT NULL, "
                     "mtime REAL NOT NULL, instance TEXT NOT NULL, sha256 TEXT NOT NULL, metadata TEXT NOT NULL)")
        conn.execute("CREATE TABLE fields(position INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        conn.executemany("INSERT INTO fields VALUES (?, ?)", [(i, k) for k, i in fields.items()])
        cols = _column_names(list(fields))
        conn.execute(f"CREATE VIRTUAL TABLE catalogue USING fts5({', '.join(cols)}, content='', "
                     "tokenize='unicode61 remove_diacritics 2')")
        order = list(fields)
        marks = ", ".join("?" * (len(cols) + 1))
        for a in range(0, len(items), _BATCH):
            chunk = items[a : a + _BATCH]
            conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?, ?)", [
                (a + i, it.path, int(it.size), float(it.mtime), it.instance, it.sha256 or "",
                 json.dumps(it.metadata, ensure_ascii=False, separators=(",", ":")) if it.metadata else "")
                for i, it in enumerate(chunk)])
            conn.executemany(f"INSERT INTO catalogue(rowid, {', '.join(cols)}) VALUES ({marks})", [
                (a + i, it.instance, it.path, *(it.metadata.get(k, "") for k in order))
                for i, it in enumerate(chunk)])
        conn.execute("COMMIT")
    finally:
        conn.close()


def fts_query(text: str, fields: Sequence[str] = ()) -> str | None:
    """An FTS5 query for what a user typed (None: nothing to search for).

    Every word must match the start of a word of the item, in any column; ``field:word`` (a metadata
    field's name, or ``instance``/``path``) restricts the word to that field. Quotes and FTS5
    operators typed by the user are taken as plain text."""
    by_name = {name.lower(): col for name, col in zip([*_FIXED, *fields], _column_names(fields))}
    terms = []
    for token in text.split():
        column = None
        if ":" in token:
            head, _, rest = token.partition(":")
            if head.lower() in by_name and rest:
                column, token = by_name[head.lower()], rest
        words = _WORD.findall(token)
        if not words:
            continue
        phrase = " ".join(f'"{w}"' for w in words) + "*"  # a phrase; its last word is a prefix
        terms.append(f"{column} : ({phrase})" if column else f"({phrase})")
    return " AND ".join(terms) if terms else None


class ItemStore(Sequence[Item]):
    """The items of an index as a read-only sequence backed by an SQLite file (see the module doc).

    Thread-safe (one connection, one lock): the GUI reads it from its view and its workers."""

    def __init__(self, path: str | os.PathLike | None, *, sha256: str | None = None, hint: str = "",
                 _conn: sqlite3.Connection | None = None):
        """``sha256``: the file's checksum from the manifest, checked in full when SQLite reports an
        error, to say whether the file is damaged; ``hint``: how to rebuild the index, for messages."""
        self.path = Path(path) if path is not None else None
        self._sha256 = sha256
        self._hint = hint
        self._lock = threading.Lock()
        if _conn is None:
            if path is None:
                raise TypeError("ItemStore needs a path or a connection")
            uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
            try:
                _conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
                schema = dict(_conn.execute("SELECT key, value FROM info").fetchall())
            except sqlite3.Error as exc:
                raise self._damaged(exc) from None
            if schema.get("schema") != str(SCHEMA_VERSION):
                raise IndexFormatError(f"the item catalogue {path} has schema {schema.get('schema')}, this "
                                       f"program reads {SCHEMA_VERSION}{self._tail()}")
        self._conn = _conn
        self._cache: OrderedDict[int, Item] = OrderedDict()
        self._len = int(self._query("SELECT count(*) FROM items")[0][0])
        self.fields: list[str] = [r[0] for r in self._query("SELECT name FROM fields ORDER BY position")]
        self._instances: np.ndarray | None = None

    def _tail(self) -> str:
        return f"; {self._hint}" if self._hint else ""

    def _damaged(self, exc: object) -> IndexFormatError:
        """The message for an SQLite error (or unreadable metadata) in this catalogue: the file's full
        checksum says whether it is damaged."""
        where = f"the item catalogue {self.path}" if self.path is not None else "the item catalogue"
        if self.path is not None and self._sha256:
            try:
                h = sha256()
                with open(self.path, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 22), b""):
                        h.update(chunk)
                intact = h.hexdigest() == self._sha256
            except OSError:
                intact = False
            if not intact:
                return IndexFormatError(f"{where} is damaged (its checksum does not match; SQLite says: {exc})"
                                        f"{self._tail()}")
        return IndexFormatError(f"{where} cannot be read ({exc}){self._tail()}")

    def _query(self, sql: str, args: Sequence = (), lock: bool = True) -> list:
        """All rows of one query; an SQLite error becomes :meth:`_damaged`'s message."""
        try:
            if not lock:
                return self._conn.execute(sql, args).fetchall()
            with self._lock:
                return self._conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if "fts5" in str(exc).lower() and "syntax" in str(exc).lower():
                raise
            raise self._damaged(exc) from None
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def _item(self, row: int, values) -> Item:
        try:
            return _item(values)
        except (ValueError, TypeError) as exc:
            raise IndexFormatError(f"the item catalogue {self.path} is damaged: the metadata of row {row} is "
                                   f"not valid JSON ({exc}){self._tail()}") from None

    @classmethod
    def in_memory(cls, items: Sequence[Item]) -> "ItemStore":
        """A store of ``items`` in memory (an index that is not saved yet), for the same queries."""
        with tempfile.TemporaryDirectory(prefix="museum-search-catalogue-") as tmp:
            f = Path(tmp) / "items.sqlite"
            write_store(f, items)
            disk = sqlite3.connect(str(f))
            mem = sqlite3.connect(":memory:", check_same_thread=False)
            try:
                disk.backup(mem)
            finally:
                disk.close()
        return cls(None, _conn=mem)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---- the sequence ----------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> Item: ...
    @overload
    def __getitem__(self, i: slice) -> list[Item]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.rows(range(*i.indices(self._len)))
        i = int(i)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"item {i} of {self._len}")
        with self._lock:
            it = self._cache.get(i)
            if it is not None:
                self._cache.move_to_end(i)
                return it
            found = self._query("SELECT path, size, mtime, instance, sha256, metadata FROM items WHERE row = ?",
                                (i,), lock=False)
            if not found:
                raise self._damaged(f"row {i} of {self._len} is missing")
            it = self._item(i, found[0])
            self._cache[i] = it
            if len(self._cache) > _CACHE_ROWS:
                self._cache.popitem(last=False)
            return it

    def __iter__(self) -> Iterator[Item]:
        for a in range(0, self._len, _BATCH):
            yield from self.rows(range(a, min(self._len, a + _BATCH)))

    def rows(self, rows: Iterable[int]) -> list[Item]:
        """The items of ``rows`` (in that order), in one query per batch."""
        rows = [int(r) for r in rows]
        out: dict[int, Item] = {}
        for a in range(0, len(rows), 900):  # SQLite's default limit of bound parameters is 999+
            part = rows[a : a + 900]
            q = (f"SELECT row, path, size, mtime, instance, sha256, metadata FROM items WHERE row IN "
                 f"({', '.join('?' * len(part))})")
            for r in self._query(q, part):
                out[r[0]] = self._item(r[0], r[1:])
        missing = [r for r in rows if r not in out]
        if missing:
            raise IndexError(f"item {missing[0]} of {self._len}")
        return [out[r] for r in rows]

    # ---- columns and queries -----------------------------------------------------------------
    def instances(self) -> np.ndarray:
        """(N,) object array of every row's instance (one query; kept)."""
        if self._instances is None:
            vals = [r[0] for r in self._query("SELECT instance FROM items ORDER BY row")]
            self._instances = np.array(vals, dtype=object)
        return self._instances

    def paths(self) -> list[str]:
        return [r[0] for r in self._query("SELECT path FROM items ORDER BY row")]

    def row_of(self, path: str) -> int | None:
        """The row of the item with this collection-relative path (None if there is none); a scan
        of the table (no index on paths: nothing on a hot path asks for it)."""
        found = self._query("SELECT row FROM items WHERE path = ? LIMIT 1", (path,))
        return None if not found else int(found[0][0])

    def match(self, text: str, limit: int | None = None) -> np.ndarray | None:
        """Rows (ascending) of the items that match ``text`` (:func:`fts_query`); None when ``text``
        has nothing to search for (every row matches)."""
        q = fts_query(text, self.fields)
        if q is None:
            return None
        sql = "SELECT rowid FROM catalogue WHERE catalogue MATCH ? ORDER BY rowid"
        args: list = [q]
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        try:
            rows = [r[0] for r in self._query(sql, args)]
        except sqlite3.OperationalError:  # a query FTS5 cannot parse (should not happen): no match
            rows = []
        return np.array(rows, dtype=np.int64)


def _item(row) -> Item:
    path, size, mtime, instance, sha, meta = row
    return Item(path, int(size), float(mtime), instance, json.loads(meta) if meta else {}, sha or "")
