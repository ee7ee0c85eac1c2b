"""The visitor log of one index (issue 34): anonymous counts per hour and, only where the staff's
:class:`KeepPolicy` asks, kept photos with their answers, in a folder this program owns.

Where: ``<index>-visitors`` beside the index (:func:`visitors_folder`) or a folder staff choose;
never inside the collection or the index, never reached through a symbolic link, and a folder that
exists must carry this program's marker (so a folder of the user's is never written into). Inside:
``visitors.sqlite`` (the counts and the kept photos' records, WAL) and ``kept/<id>.jpg``.

A kept photo is re-encoded from its pixels (JPEG), so no EXIF, GPS position or appended bytes of the
upload survive; no client address is ever stored (the per-client rate limit lives in memory).

Nothing is lost on kill -9: a photo's file is written under a temporary name, synced, linked to its
final name (never over a file) and only then is its record committed, in the same transaction as
the counts. At open, temporary files are removed, and so are files without a record (a photo whose
record never committed was never acknowledged); records whose file vanished are dropped."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from museum_search.core.answer import confidence_band
from museum_search.core.errors import MuseumSearchError
from museum_search.core.index import read_manifest
from museum_search.core.visitors._policy import KeepPolicy, primary_language
from museum_search.core.visitors._stats import VisitorStats, stats_of

#: The file that says a folder is this program's visitor folder.
MARKER = ".museum-search-visitors"
DATABASE = "visitors.sqlite"
KEPT = "kept"
#: A kept photo's longest side (px) and JPEG quality.
KEPT_SIDE, KEPT_QUALITY = 1600, 90
#: The statuses of a kept photo: waiting for review, added as a reference view, confirmed unknown.
STATUSES = ("new", "added", "unknown")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counts (hour TEXT NOT NULL, instance TEXT NOT NULL, verdict TEXT NOT NULL,
    band TEXT NOT NULL, language TEXT NOT NULL, source TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (hour, instance, verdict, band, language, source));
CREATE TABLE IF NOT EXISTS kept (id TEXT PRIMARY KEY, file TEXT NOT NULL, hour TEXT NOT NULL,
    source TEXT NOT NULL, language TEXT NOT NULL, in_collection INTEGER NOT NULL, confidence REAL,
    reason TEXT NOT NULL, candidates TEXT NOT NULL, status TEXT NOT NULL, instance TEXT,
    bytes INTEGER NOT NULL, seq INTEGER NOT NULL, expires TEXT NOT NULL);
"""


def visitors_folder(index_path: str | os.PathLike) -> Path:
    """The default visitor folder of the index at ``index_path``: ``<index>-visitors`` beside it."""
    p = Path(index_path).expanduser().absolute()
    return p.with_name(p.name + "-visitors")


@dataclass(frozen=True)
class KeptPhoto:
    """A kept visitor's photo and the answer it got (no address, the hour only)."""

    id: str
    path: Path
    hour: datetime
    source: str
    language: str
    in_collection: bool
    confidence: float | None
    reason: str
    candidates: list[dict] = field(default_factory=list)  # [{instance, score, cosine, inliers}] best first
    status: str = "new"
    instance: str | None = None  # the staff's answer, once reviewed
    bytes: int = 0


class VisitorLog:
    """The counts and kept photos of one index (the module doc). Safe to share between threads
    (``serve``'s workers) and between processes (SQLite's locking). Open with :meth:`open`."""

    def __init__(self, folder: Path, policy: KeepPolicy, db: sqlite3.Connection):
        self.folder, self.policy = folder, policy
        self._db = db
        self._lock = threading.Lock()
        self._clients: dict[str, deque[float]] = {}
        self._purged = ""  # the hour retention was last applied

    # ---- opening ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, index_path: str | os.PathLike, policy: KeepPolicy | None = None, *,
             folder: str | os.PathLike | None = None, create: bool = True) -> "VisitorLog":
        """The visitor log of the index at ``index_path`` in ``folder`` (default: beside the index),
        made if needed (unless not ``create``: a reader is refused a log that does not exist); refused
        inside the collection or the index, through a link, or in a folder this program did not make.
        Applies the retention period and tidies what a kill left."""
        index_path = Path(index_path).expanduser().absolute()
        root = Path(read_manifest(index_path)["collection"]["root"])
        where = Path(folder).expanduser().absolute() if folder is not None else visitors_folder(index_path)
        _check_place(where, root, index_path, folder is not None)
        if not create and not where.exists():
            raise MuseumSearchError(f"no visitor log at {where}: nothing was counted or kept yet (the kiosk and "
                                    "serve make it; --visitors DIR if they were given another folder)")
        _own(where)
        db = sqlite3.connect(where / DATABASE, timeout=30, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise MuseumSearchError(f"the visitor log {where / DATABASE} is damaged ({exc}); move that folder "
                                    "away (nothing else uses it) and start again") from None
        log = cls(where, policy or KeepPolicy(), db)
        log._tidy()
        log._retain(datetime.now())
        return log

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "VisitorLog":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- recording --------------------------------------------------------------------------------
    def record(self, answer: Any, *, source: str, language: str = "", image: np.ndarray | None = None,
               when: datetime | None = None, client: str | None = None) -> KeptPhoto | None:
        """Counts ``answer`` (if counting) and keeps ``image`` (RGB, the photo as asked) with it when
        the policy wants it and its quota, day count and ``client``'s hourly share allow; the photo
        kept, or None."""
        when = when or datetime.now()
        hour = when.replace(minute=0, second=0, microsecond=0)
        language = primary_language(language)
        with self._lock:
            self._retain(when)
            data = None
            if (image is not None and self.policy.wants(answer) and self._client_allows(client, when)
                    and self._room(0, hour)):  # no JPEG made once the quota or the day is full
                data = _jpeg(image)
            photo = written = None
            try:
                # the room is looked at, the file written and its record committed under SQLite's write
                # lock: another process's record (serve and the app share a log) cannot pass the quota
                # or the day's count between them, nor an opener's tidying take the file being written
                self._db.execute("BEGIN IMMEDIATE")
                if data is not None and self._room(len(data), hour):
                    photo = self._photo_of(answer, hour, source, language, data)
                    written = self._write(photo.path, data)
                if self.policy.counting:
                    self._count(answer, hour, source, language)
                if photo is not None:
                    self._insert(photo)
                self._db.execute("COMMIT")
            except BaseException:
                self._rollback()
                if written is not None:
                    _unlink_own(written, self.folder)
                raise
            if photo is not None and client:
                self._clients.setdefault(client, deque()).append(when.timestamp())
            return photo

    def _client_allows(self, client: str | None, when: datetime) -> bool:
        if not client:
            return True
        times = self._clients.get(client)
        if times is None:
            return True
        while times and times[0] <= when.timestamp() - 3600:
            times.popleft()
        if not times:
            del self._clients[client]
            return True
        return len(times) < self.policy.per_client_per_hour

    def _room(self, size: int, hour: datetime) -> bool:
        used, today = self._db.execute(
            "SELECT COALESCE(SUM(bytes), 0), COALESCE(SUM(hour >= ? AND hour < ?), 0) FROM kept",
            (f"{hour:%Y-%m-%d}T00:00", f"{hour + timedelta(days=1):%Y-%m-%d}T00:00")).fetchone()
        return used + size <= self.policy.quota_bytes and today < self.policy.per_day

    def _photo_of(self, answer: Any, hour: datetime, source: str, language: str, data: bytes) -> KeptPhoto:
        pid = f"{hour:%Y%m%d-%H}-{secrets.token_hex(5)}"
        candidates = [{"instance": r.instance, "score": round(float(r.score), 4), "cosine": round(float(r.cosine), 4),
                       "inliers": None if r.inliers is None else int(r.inliers)} for r in answer.results[:5]]
        conf = None if answer.confidence is None else round(float(answer.confidence), 4)
        return KeptPhoto(pid, self.folder / KEPT / f"{pid}.jpg", hour, source, language, bool(answer.in_collection),
                         conf, str(answer.reason), candidates, "new", None, len(data))

    def _count(self, answer: Any, hour: datetime, source: str, language: str) -> None:
        instance = answer.top.instance if answer.in_collection and answer.top is not None else ""
        verdict = "recognised" if answer.in_collection else "not recognised"
        band = confidence_band(answer.confidence) or "none"
        self._db.execute("INSERT INTO counts VALUES (?, ?, ?, ?, ?, ?, 1) ON CONFLICT DO UPDATE SET n = n + 1",
                         (f"{hour:%Y-%m-%dT%H}:00", instance, verdict, band, language, source))

    def _insert(self, p: KeptPhoto) -> None:
        seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM kept").fetchone()[0]
        # the retention period it was kept under goes with it: whoever opens the log later (the review
        # queue, the app with other settings) deletes it when that period ends, not by its own policy
        expires = p.hour + timedelta(days=self.policy.retention_days)
        self._db.execute("INSERT INTO kept VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (p.id, str(p.path.relative_to(self.folder)), f"{p.hour:%Y-%m-%dT%H}:00", p.source,
                          p.language, int(p.in_collection), p.confidence, p.reason, json.dumps(p.candidates),
                          p.status, p.instance, p.bytes, seq, f"{expires:%Y-%m-%dT%H}:00"))

    def _write(self, path: Path, data: bytes) -> Path:
        folder = _subfolder(self.folder, path.parent.name)
        _write_new(folder, path.name, data)
        return path

    def _rollback(self) -> None:
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.OperationalError:
            pass  # no transaction was open

    # ---- the kept photos --------------------------------------------------------------------------
    def kept(self, status: str | None = "new", limit: int | None = None) -> list[KeptPhoto]:
        """Kept photos with ``status`` (None: all), newest first."""
        sql = "SELECT * FROM kept" + (" WHERE status = ?" if status is not None else "") + " ORDER BY seq DESC"
        args: tuple = (status,) if status is not None else ()
        if limit is not None:
            sql += " LIMIT ?"
            args += (int(limit),)
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [self._row(r) for r in rows]

    def photo(self, ref: str | os.PathLike) -> KeptPhoto:
        """The kept photo ``ref``: its id, or its file's path (or name)."""
        text = str(ref)
        key = Path(text).stem if text.endswith(".jpg") or os.sep in text else text
        with self._lock:
            row = self._db.execute("SELECT * FROM kept WHERE id = ?", (key,)).fetchone()
        if row is None:
            raise MuseumSearchError(f"no kept photo {text} in {self.folder} (museum-search review INDEX --list "
                                    "lists them)")
        return self._row(row)

    def set_status(self, ref: str, status: str, *, instance: str | None = None, path: Path | None = None) -> None:
        """The staff's answer about a kept photo: ``status`` ("new", "added", "unknown"), the object it
        shows, and where its file now lives (a file outside this folder no longer counts in the quota)."""
        if status not in STATUSES:
            raise MuseumSearchError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
        p = self.photo(ref)
        where = Path(path).absolute() if path is not None else p.path
        inside = where.is_relative_to(self.folder)
        file = str(where.relative_to(self.folder)) if inside else str(where)
        size = p.bytes if inside else 0
        with self._lock:
            self._db.execute("UPDATE kept SET status = ?, instance = ?, file = ?, bytes = ? WHERE id = ?",
                             (status, instance, file, size, p.id))

    def discard(self, ref: str) -> None:
        """Deletes the kept photo ``ref``: its file (only inside this folder) and its record."""
        p = self.photo(ref)
        _unlink_own(p.path, self.folder)
        with self._lock:
            self._db.execute("DELETE FROM kept WHERE id = ?", (p.id,))

    def _row(self, r: tuple) -> KeptPhoto:
        pid, file, hour, source, language, in_coll, conf, reason, cands, status, instance, size, _seq, _exp = r
        path = Path(file) if os.path.isabs(file) else self.folder / file
        return KeptPhoto(pid, path, datetime.fromisoformat(hour), source, language, bool(in_coll), conf, reason,
                         json.loads(cands), status, instance, int(size))

    # ---- statistics -------------------------------------------------------------------------------
    def stats(self, days: int | None = None, now: datetime | None = None) -> VisitorStats:
        """What visitors asked (the counts), over the last ``days`` days (None: all)."""
        sql = "SELECT hour, instance, verdict, band, language, source, n FROM counts"
        args: tuple[str, ...] = ()
        if days is not None:
            since = (now or datetime.now()) - timedelta(days=int(days))
            sql, args = sql + " WHERE hour >= ?", (f"{since:%Y-%m-%dT%H}:00",)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY hour", args).fetchall()
        return stats_of(rows)

    # ---- housekeeping -----------------------------------------------------------------------------
    def _retain(self, now: datetime) -> None:
        """Deletes the photos still waiting for review whose retention period (the one they were kept
        under) has ended (looked once per hour of ``now``)."""
        hour = f"{now:%Y-%m-%dT%H}:00"
        if hour == self._purged:
            return
        self._purged = hour
        # clients with no photo kept in the last hour are forgotten (many addresses never fill memory)
        self._clients = {c: t for c, t in self._clients.items() if t and t[-1] > now.timestamp() - 3600}
        old = self._db.execute("SELECT id, file FROM kept WHERE status = 'new' AND expires <= ?", (hour,)).fetchall()
        for pid, file in old:
            _unlink_own(self.folder / file, self.folder)
            self._db.execute("DELETE FROM kept WHERE id = ?", (pid,))

    def _tidy(self) -> None:
        """After a kill: temporary files go, files without a record go, records without a file go.
        Done under SQLite's write lock, which a record holds while it writes its file: a file another
        process is writing (serve while the app opens the log) is never taken for a kill's leftover."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._tidy_files()
            self._db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _tidy_files(self) -> None:
        kept = self.folder / KEPT
        names = {}
        if kept.is_dir() and not kept.is_symlink():
            for f in kept.iterdir():
                if f.name.endswith(".tmp") or (f.suffix == ".jpg" and f.is_file() and not f.is_symlink()):
                    names[f.name] = f
        rows = self._db.execute("SELECT id, file FROM kept").fetchall()
        known = set()
        for pid, file in rows:
            path = Path(file) if os.path.isabs(file) else self.folder / file
            if not path.is_file():
                self._db.execute("DELETE FROM kept WHERE id = ?", (pid,))
            known.add(path.name)
        for name, f in names.items():
            if name not in known:
                _unlink_own(f, self.folder)


def _jpeg(image: np.ndarray) -> bytes:
    """The photo's pixels (RGB or grey, uint8) as a plain JPEG, longest side at most KEPT_SIDE."""
    img = np.asarray(image)
    if img.ndim == 3 and img.shape[2] >= 3:
        img = cv2.cvtColor(np.ascontiguousarray(img[..., :3]), cv2.COLOR_RGB2BGR)
    h, w = img.shape[:2]
    scale = KEPT_SIDE / max(h, w)
    if scale < 1:
        img = cv2.resize(img, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, KEPT_QUALITY])
    if not ok:
        raise MuseumSearchError("the photo could not be encoded as JPEG")
    return buf.tobytes()


def _check_place(where: Path, root: Path, index_path: Path, given: bool) -> None:
    what = "--visitors" if given else "the visitor folder"
    for p in (where, *where.parents):
        if p.is_symlink():
            raise MuseumSearchError(f"{what} {where}: {p} is a symbolic link; give a folder reached without links")
    real = where.resolve()
    for name, other in (("the collection", root), ("the index", index_path)):
        other = other.resolve()
        if real.is_relative_to(other):
            raise MuseumSearchError(f"{what} {where} is inside {name} ({other}); choose a folder outside it "
                                    "(e.g. beside the index)")
    if root.resolve().is_relative_to(real):
        raise MuseumSearchError(f"{what} {where} holds the collection ({root.resolve()}); choose a folder of its own")


def _own(where: Path) -> None:
    """Makes ``where`` (exclusively, with the marker), or checks it is ours."""
    if where.exists():
        marker = where / MARKER
        if not where.is_dir() or not marker.is_file() or marker.is_symlink():
            raise MuseumSearchError(f"{where} was not made by museum-search (it has no {MARKER}); choose another "
                                    "folder, or an empty path, for the visitor log")
        return
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(where, 0o700)
        fd = os.open(where / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("museum-search visitor log: counts and kept photos; deleting this folder deletes them.\n")
    except FileExistsError:
        raise MuseumSearchError(f"{where} appeared while it was being made; try again") from None
    except OSError as exc:
        raise MuseumSearchError(f"the visitor folder {where} cannot be made ({exc.strerror}); give a folder "
                                "that can be written (--visitors DIR)") from None


def _subfolder(folder: Path, name: str) -> Path:
    sub = folder / name
    try:
        os.mkdir(sub, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(sub)
    if not stat.S_ISDIR(st.st_mode):
        raise MuseumSearchError(f"{sub} is not a folder (a link or a file); the visitor log writes only into its "
                                "own folders")
    return sub


def _write_new(folder: Path, name: str, data: bytes) -> None:
    """``data`` as the new file ``folder/name``: written under a temporary name, synced, then linked
    to its name (which must not exist: nothing is ever written over), never through a link."""
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        finally:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _unlink_own(path: Path, folder: Path) -> None:
    """Deletes ``path`` only when it is a file (not a link) inside ``folder``."""
    path = Path(path)
    if not path.absolute().is_relative_to(folder):
        return
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass

