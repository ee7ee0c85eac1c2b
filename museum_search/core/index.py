"""The on-disk index of a collection: items, labels, metadata, descriptor matrix, gallery ranks.

Format (a folder, no pickle anywhere)::

    INDEX/
      manifest.json                 format name and version, backbone meta, counts, times, labelling
                                    rule, collection root, the data file names and their SHA-256
      descriptors-<gen>.npy         (N, dim) float32 (or float16 on request), L2-normalized rows
      items-<gen>.json              [{"path", "size", "mtime", "instance", "metadata"}], one per row
      gallery_ranks-<gen>.npy       optional (N, N) 1-based gallery–gallery ranks (ICFRR)

Saving is atomic: the data files of a new generation are written and fsynced under new names,
then ``manifest.json`` is replaced in one ``os.replace``; only then are the old generation's files
removed. A process killed at any point leaves either the old or the new index complete.

The writer never deletes or overwrites a file it did not create:

* an index is only written to a new folder, an empty one, or an existing museum-search index, never
  to the collection itself or a folder that contains it (:func:`check_output_folder`);
* the only files it removes are the ones named in the previous manifest of that index, and the ones
  named in its own journal of a save that was interrupted (``.museum-search-pending.json``); new
  files are created exclusively (``O_EXCL``), so an existing file is never overwritten;
* one writer at a time: ``.museum-search.lock`` in the index folder is locked with ``flock`` for the
  whole of a build, update or save; a second writer fails at once ("being written by process N").
  Readers never take the lock.

The manifest carries a SHA-256 of its own content (``manifest_sha256``), so a hand-edited backbone
setting is refused instead of silently changing scores, and its data-file names must be plain names
of this index's own generations, inside the index folder.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Generator

import numpy as np

from .backbones import BackboneConfig, BackboneMeta, Extractor, build_extractor
from .errors import (
    IndexFormatError,
    IndexLockedError,
    MuseumSearchError,
    OutputFolderError,
)
from .extract import ExtractProgress, extract
from .labels import Labelling, label_collection

log = logging.getLogger(__name__)

FORMAT = "museum-search-index"
VERSION = 2  # 2: manifest checksum, plain data-file names, item content hashes
MANIFEST = "manifest.json"
LOCK = ".museum-search.lock"
JOURNAL = ".museum-search-pending.json"
#: The data files of one generation: ``<kind>-<YYYYmmddTHHMMSS>-<6 hex>.<ext>``.
DATA_FILE = re.compile(r"^[a-z_]+-\d{8}T\d{6}-[0-9a-f]{6}\.(npy|json|npz|bin)$")
_OWN_FILES = (MANIFEST, LOCK, JOURNAL)
_LOCAL_PARTS = ("offsets", "points", "descriptors", "sizes")  # reference local features


@dataclass
class Item:
    path: str  # POSIX path relative to the collection root
    size: int
    mtime: float
    instance: str
    metadata: dict[str, str] = field(default_factory=dict)
    sha256: str = ""  # content hash of the file when it was described ("" if unknown)


@dataclass
class LabellingSpec:
    """How the collection was labelled, so ``update`` can label new files the same way."""

    rule: str = "auto"
    catalogue: str | None = None
    regex: str | None = None


class Index:
    """Descriptors of a collection's reference images with their labels and metadata."""

    def __init__(
        self,
        root: str | Path,
        meta: BackboneMeta,
        items: list[Item],
        descriptors: np.ndarray,
        labelling: LabellingSpec | None = None,
        created: float | None = None,
        updated: float | None = None,
        gallery_ranks: np.ndarray | None = None,
        path: str | Path | None = None,
        local=None,
        verdict: dict | None = None,
    ):
        if descriptors.shape != (len(items), meta.dim):
            raise IndexFormatError(
                f"descriptor matrix {descriptors.shape} does not match {len(items)} items of {meta.dim}-d"
            )
        self.root = Path(root)
        self.meta = meta
        self.items = items
        self.descriptors = descriptors
        self.labelling = labelling or LabellingSpec()
        self.created = created or time.time()
        self.updated = updated or self.created
        self._gallery_ranks = gallery_ranks
        self.path = Path(path) if path else None
        self._labels: np.ndarray | None = None
        #: reference local features for verification (``rerank.spatial.LocalFeatures``) or None
        self.local = local
        #: the "in the collection" calibration (``verdict.Verdict.to_dict()``) or None
        self.verdict = verdict
        if local is not None and len(local) != len(items):
            raise IndexFormatError(f"local features of {len(local)} references for {len(items)} items")

    # ---- views ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.items)

    @property
    def labels(self) -> np.ndarray:
        """Instance id of every reference, as a numpy array of str (cached)."""
        if self._labels is None:
            self._labels = np.array([it.instance for it in self.items], dtype=object)
        return self._labels

    @property
    def instances(self) -> list[str]:
        return sorted(set(self.labels.tolist()))

    def abspath(self, i: int) -> Path:
        return self.root / self.items[i].path

    def describe(self) -> str:
        return (
            f"{len(self)} references of {len(self.instances)} instances, {self.meta.describe()}, "
            f"collection {self.root}"
        )

    # ---- gallery ranks (ICFRR) -----------------------------------------------------------
    @property
    def has_gallery_ranks(self) -> bool:
        return self._gallery_ranks is not None

    def gallery_ranks(self) -> np.ndarray:
        """(N, N) gallery–gallery ranks, computed on first use and kept (saved with the index)."""
        if self._gallery_ranks is None:
            from .rerank.icfrr import gallery_ranks

            self._gallery_ranks = gallery_ranks(np.asarray(self.descriptors, dtype=np.float32))
            if self.path is not None:  # keep them with the index so they are computed only once
                try:
                    self.save()
                except (OSError, MuseumSearchError) as exc:
                    log.warning("gallery ranks not saved with the index %s: %s", self.path, exc)
        return self._gallery_ranks

    # ---- persistence ---------------------------------------------------------------------
    def store_verdict(self, verdict) -> None:
        """Store a (re-calibrated) :class:`~museum_search.core.verdict.Verdict` in this index's folder;
        on failure the index, in memory and on disk, keeps its previous verdict."""
        previous, self.verdict = self.verdict, verdict.to_dict()
        try:
            self.save()
        except BaseException:
            self.verdict = previous
            raise

    def save(self, path: str | Path | None = None, dtype: str | None = None) -> Path:
        """Write atomically to ``path`` (default: where it was loaded from).

        Refuses a folder that is not a new, empty or museum-search index folder, or that is or holds
        the collection (:class:`OutputFolderError`), and one another process is writing
        (:class:`IndexLockedError`). On any failure (disk full included) the files of the new
        generation are removed and the previous index is left as it was.
        """
        target = Path(path) if path else self.path
        if target is None:
            raise MuseumSearchError("no path given to save the index to")
        dtype = dtype or str(np.asarray(self.descriptors[:0]).dtype)
        if dtype not in ("float32", "float16"):
            raise MuseumSearchError(f"descriptor dtype must be float32 or float16, not {dtype}")
        with writer_lock(target, collection=self.root):
            self._save_locked(target, dtype)
        return target

    def _save_locked(self, target: Path, dtype: str) -> None:
        _clean_journal(target)
        old_files = _manifest_files(target)
        gen = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        files = {"descriptors": f"descriptors-{gen}.npy", "items": f"items-{gen}.json"}
        if self._gallery_ranks is not None:
            files["gallery_ranks"] = f"gallery_ranks-{gen}.npy"
        if self.local is not None:
            for part in _LOCAL_PARTS:
                files[f"local_{part}"] = f"local_{part}-{gen}.npy"
        tmp_name = f"{MANIFEST}.{gen}.tmp"
        # The journal names every file this save may create, before any is created: if the process
        # dies, the next save knows exactly which files are its own leftovers.
        _write_journal(target, [*files.values(), tmp_name])
        created: list[Path] = []
        try:
            digests = {}
            descriptors = np.asarray(self.descriptors, dtype=dtype)
            created.append(target / files["descriptors"])
            digests["descriptors"] = _write_npy(target / files["descriptors"], descriptors)
            items_blob = json.dumps([asdict(it) for it in self.items], ensure_ascii=False, indent=0).encode("utf-8")
            created.append(target / files["items"])
            digests["items"] = _write_bytes(target / files["items"], items_blob)
            if "gallery_ranks" in files:
                created.append(target / files["gallery_ranks"])
                digests["gallery_ranks"] = _write_npy(target / files["gallery_ranks"], np.asarray(self._gallery_ranks))
            if self.local is not None:
                for part in _LOCAL_PARTS:
                    key = f"local_{part}"
                    created.append(target / files[key])
                    digests[key] = _write_npy(target / files[key], np.asarray(getattr(self.local, part)))
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "created": self.created,
                "updated": time.time(),
                "count": len(self.items),
                "dim": self.meta.dim,
                "dtype": dtype,
                "instances": len(self.instances),
                "backbone": self.meta.to_dict(),
                "collection": {
                    "root": str(self.root.resolve()),
                    "relative": os.path.relpath(self.root.resolve(), target.resolve()),
                },
                "labelling": asdict(self.labelling),
                "files": files,
                "sha256": digests,
                "local_features": self.local.settings if self.local is not None else None,
                "verdict": self.verdict,
            }
            manifest["manifest_sha256"] = _manifest_digest(manifest)
            created.append(target / tmp_name)
            _write_bytes(target / tmp_name, json.dumps(manifest, ensure_ascii=False, indent=2).encode("utf-8"))
            os.replace(target / tmp_name, target / MANIFEST)  # the commit point
            created.pop()
            _fsync_dir(target)
        except BaseException as exc:
            for p in created:
                p.unlink(missing_ok=True)
            (target / JOURNAL).unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise MuseumSearchError(
                    f"the disk is full: the index could not be written to {target} ({exc.strerror}); "
                    f"free some space (this index needs about {_size_text(self._nbytes(dtype))}) and "
                    "try again; the previous index, if any, is unchanged"
                ) from None
            if isinstance(exc, OSError):
                raise MuseumSearchError(
                    f"the index could not be written to {target} ({exc.strerror or exc}); the previous "
                    "index, if any, is unchanged"
                ) from None
            raise
        # Remove the previous generation: only files that the previous manifest named.
        keep = set(files.values())
        for name in old_files:
            if name not in keep and DATA_FILE.match(name):
                (target / name).unlink(missing_ok=True)
        (target / JOURNAL).unlink(missing_ok=True)
        self.path = target
        self.updated = manifest["updated"]

    def _nbytes(self, dtype: str) -> int:
        n = len(self.items) * self.meta.dim * np.dtype(dtype).itemsize + 300 * len(self.items)
        if self._gallery_ranks is not None:
            n += int(np.asarray(self._gallery_ranks).nbytes)
        if self.local is not None:
            n += sum(int(np.asarray(getattr(self.local, part)).nbytes) for part in _LOCAL_PARTS)
        return n

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True, verify: bool = True) -> "Index":
        """Load an index; refuses a damaged, foreign or newer-format index with a clear message."""
        path = Path(path)
        mpath = path / MANIFEST
        hint = f"rebuild it with: museum-search index COLLECTION -o {path}"
        if not mpath.is_file():
            raise IndexFormatError(f"{path} is not a museum-search index (no {MANIFEST}); {hint}")
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IndexFormatError(f"index manifest {mpath} is damaged ({exc}); {hint}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise IndexFormatError(f"{path} is not a museum-search index; {hint}")
        if manifest.get("version") != VERSION:
            older = isinstance(manifest.get("version"), int) and manifest["version"] < VERSION
            raise IndexFormatError(
                f"index {path} has format version {manifest.get('version')}, this program reads "
                f"version {VERSION}" + (" (it was written by an older museum-search)" if older else "")
                + f"; {hint}"
            )
        if manifest.get("manifest_sha256") != _manifest_digest(manifest):
            raise IndexFormatError(
                f"index manifest {mpath} has been edited or damaged (its checksum does not match its "
                f"content, e.g. the backbone settings); {hint}"
            )
        try:
            meta = BackboneMeta.from_dict(manifest["backbone"])
            files = manifest["files"]
            digests = manifest.get("sha256", {})
            count, dim = int(manifest["count"]), int(manifest["dim"])
            for key, name in files.items():
                if not isinstance(name, str) or not DATA_FILE.match(name):
                    raise IndexFormatError(
                        f"index {path} names a data file outside its folder or of an unknown form "
                        f"({name!r} for {key}); {hint}"
                    )
            for key in ("descriptors", "items"):
                f = path / files[key]
                if not f.is_file():
                    raise IndexFormatError(f"index {path} is missing its file {files[key]}; {hint}")
                if verify and key in digests and _sha256(f) != digests[key]:
                    raise IndexFormatError(f"index file {files[key]} in {path} is damaged (checksum mismatch); {hint}")
            desc = np.load(path / files["descriptors"], mmap_mode="r" if mmap else None, allow_pickle=False)
            raw_items = json.loads((path / files["items"]).read_text(encoding="utf-8"))
            items = [Item(str(d["path"]), int(d["size"]), float(d["mtime"]), str(d["instance"]),
                          {str(k): str(v) for k, v in (d.get("metadata") or {}).items()},
                          str(d.get("sha256") or "")) for d in raw_items]
            ranks = None
            if "gallery_ranks" in files and (path / files["gallery_ranks"]).is_file():
                f = path / files["gallery_ranks"]
                if verify and "gallery_ranks" in digests and _sha256(f) != digests["gallery_ranks"]:
                    log.warning("gallery ranks of %s are damaged; they will be recomputed", path)
                else:
                    ranks = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
            local = None
            if manifest.get("local_features") and all(f"local_{p}" in files for p in _LOCAL_PARTS):
                from .rerank.spatial import LocalFeatures

                arrays = {}
                for part in _LOCAL_PARTS:
                    f = path / files[f"local_{part}"]
                    if verify and _sha256(f) != digests.get(f"local_{part}"):
                        raise IndexFormatError(f"index file {f.name} in {path} is damaged (checksum mismatch); {hint}")
                    arrays[part] = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
                local = LocalFeatures(dict(manifest["local_features"]), **arrays)
                if len(local) != count or local.offsets.shape != (count + 1,) or \
                        int(local.offsets[-1]) != len(local.points) or len(local.points) != len(local.descriptors):
                    raise IndexFormatError(f"index {path} has inconsistent local features; {hint}")
            verdict = manifest.get("verdict")
            labelling = LabellingSpec(**manifest.get("labelling", {}))
            coll = manifest["collection"]
        except IndexFormatError:
            raise
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise IndexFormatError(f"index {path} is damaged ({type(exc).__name__}: {exc}); {hint}") from None
        if desc.ndim != 2 or desc.shape != (count, dim) or len(items) != count or dim != meta.dim:
            raise IndexFormatError(
                f"index {path} is inconsistent: manifest says {count}×{dim}, descriptors are "
                f"{desc.shape}, {len(items)} items; {hint}"
            )
        if desc.dtype not in (np.float32, np.float16):
            raise IndexFormatError(f"index {path} has descriptors of type {desc.dtype}; {hint}")
        if ranks is not None and ranks.shape != (count, count):
            ranks = None
        root = Path(coll["root"])
        if not root.is_dir():
            alt = (path / coll.get("relative", "")).resolve()
            if alt.is_dir():
                root = alt
        return cls(root, meta, items, desc, labelling, manifest.get("created"), manifest.get("updated"), ranks, path,
                   local=local, verdict=verdict if isinstance(verdict, dict) else None)

    # ---- compatibility -------------------------------------------------------------------
    def check_compatible(self, meta: BackboneMeta) -> None:
        """Refuse descriptors made with other settings than this index's."""
        if meta != self.meta:
            mine, theirs = self.meta.to_dict(), meta.to_dict()
            diff = ", ".join(f"{k}: index {mine.get(k)!r}, query {theirs.get(k)!r}"
                             for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k))
            raise MuseumSearchError(
                f"query descriptors do not match the index ({diff}); describe queries with the "
                f"index's own settings"
            )


# ---- where an index may be written, and by whom ---------------------------------------------


def is_index_folder(path: str | Path) -> bool:
    """True when ``path`` holds a museum-search index (a manifest of this format, even damaged,
    among nothing but the index's own files)."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        return False
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        if isinstance(manifest, dict) and manifest.get("format") == FORMAT:
            return True
    except (OSError, UnicodeDecodeError, ValueError):
        pass
    # A damaged manifest: still an index if every file in the folder is one of an index's own.
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return all(n in _OWN_FILES or DATA_FILE.match(n) or n.startswith(f"{MANIFEST}.") for n in names)


def default_index_folder(collection: str | Path) -> Path:
    """A new folder for the index of ``collection``: ``<collection>-index`` beside it (``-index-2``,
    ``-index-3``... if that name holds anything but an index of this same collection)."""
    root = Path(collection).resolve()
    for n in range(1, 1000):
        cand = root.parent / (f"{root.name}-index" + (f"-{n}" if n > 1 else ""))
        if not cand.exists() or (cand.is_dir() and not os.listdir(cand)):
            return cand
        if is_index_folder(cand) and _indexed_collection(cand) == root:
            return cand
    raise OutputFolderError(f"no free folder name for the index of {root}; choose one with -o")


def _indexed_collection(path: Path) -> Path | None:
    try:
        root = json.loads((path / MANIFEST).read_text(encoding="utf-8"))["collection"]["root"]
        return Path(root).resolve()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_output_folder(out: str | Path, collection: str | Path | None = None) -> None:
    """Refuse a folder the index must not be written to, before any work starts.

    Allowed: a folder that does not exist yet, an empty folder, or an existing museum-search index
    (which is then replaced). Refused: a file; the collection itself or a folder containing it; a
    non-empty folder that is not an index. Nothing is created or changed here.
    """
    out = Path(out)
    hint = ""
    if collection is not None:
        hint = f"; choose a new folder for the index, for example {default_index_folder(collection)}"
    else:
        hint = "; choose a new or empty folder for the index"
    if out.exists() and not out.is_dir():
        raise OutputFolderError(f"{out} is a file, not a folder{hint}")
    if collection is not None:
        coll, target = Path(collection).resolve(), out.resolve()
        if target == coll:
            raise OutputFolderError(f"the index folder {out} is the collection folder itself; the index "
                                    f"must go in a folder of its own{hint}")
        if coll.is_relative_to(target):
            raise OutputFolderError(f"the index folder {out} contains the collection {collection}; the "
                                    f"index must go in a folder of its own{hint}")
    if out.is_dir() and not is_index_folder(out):
        try:
            names = sorted(n for n in os.listdir(out) if n not in (LOCK, JOURNAL))
        except OSError as exc:
            raise OutputFolderError(f"cannot read the folder {out} ({exc.strerror}){hint}") from None
        if names:
            raise OutputFolderError(
                f"{out} is not empty and is not a museum-search index ({len(names)} item(s), e.g. "
                f"{names[0]!r}); nothing was written{hint}"
            )


_held: dict[str, tuple[int, int, int]] = {}  # resolved folder -> (fd, owning thread, depth)
_held_guard = threading.Lock()


@contextmanager
def writer_lock(folder: str | Path, collection: str | Path | None = None):
    """Hold the index's exclusive writer lock (``flock`` on ``.museum-search.lock``) for the block.

    Checks the folder first (:func:`check_output_folder`), creates it if needed and checks that it
    can be written, all before the caller does any work. Re-entrant in the thread that holds it.
    A folder this call created is removed again if the block leaves no index in it.
    """
    folder = Path(folder)
    key = str(folder.resolve())
    me = threading.get_ident()
    with _held_guard:
        held = _held.get(key)
        if held is not None and held[1] == me:
            _held[key] = (held[0], me, held[2] + 1)
            nested = True
        elif held is not None:
            raise IndexLockedError(f"the index {folder} is being written by another job of this program "
                                   f"(process {os.getpid()}); wait for it to finish")
        else:
            nested = False
    if nested:
        try:
            yield folder
        finally:
            with _held_guard:
                fd, owner, depth = _held[key]
                _held[key] = (fd, owner, depth - 1)
        return
    check_output_folder(folder, collection)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputFolderError(f"cannot write to the index folder {folder} ({exc.strerror}); choose a "
                                "folder you can write to") from None
    try:
        _flock(fd, folder)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            raise OutputFolderError(f"cannot write to the index folder {folder} ({exc.strerror}); choose "
                                    "a folder you can write to") from None
        with _held_guard:
            _held[key] = (fd, me, 1)
        try:
            yield folder
        finally:
            with _held_guard:
                _held.pop(key, None)
            if created and not (folder / MANIFEST).exists():
                # Nothing was committed to a folder this call made: leave no trace.
                for name in (LOCK, JOURNAL):
                    (folder / name).unlink(missing_ok=True)
                try:
                    folder.rmdir()
                except OSError:
                    pass
    finally:
        os.close(fd)  # releases the lock


def _flock(fd: int, folder: Path) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; one writer is the user's responsibility there
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        except OSError:
            pid = "?"
        raise IndexLockedError(
            f"the index {folder} is being written by process {pid}; wait for it to finish (or stop "
            "it), then try again"
        ) from None


# ---- building and updating -----------------------------------------------------------------


@dataclass
class BuildReport:
    index: Index
    labelling: Labelling
    skipped: list[tuple[str, str]]  # (path, reason): unreadable images
    added: int = 0
    removed: int = 0
    unchanged: int = 0

    def summary(self) -> str:
        s = (f"{len(self.index)} references of {len(self.index.instances)} instances "
             f"({self.labelling.rule} labels)")
        if self.removed or self.unchanged:
            s += f"; {self.added} added/changed, {self.removed} removed, {self.unchanged} unchanged"
        if self.skipped:
            s += f"; {len(self.skipped)} file(s) skipped"
        if self.labelling.ignored:
            s += f"; {len(self.labelling.ignored)} file(s) ignored by the labelling rule"
        return s


def _stat(root: Path, rel: str) -> tuple[int, float]:
    st = (root / rel).stat()
    return st.st_size, st.st_mtime


def _file_record(root: Path, rel: str) -> tuple[int, float, str]:
    """(size, mtime, sha256) of a described file; OSError if it vanished meanwhile."""
    size, mtime = _stat(root, rel)
    return size, mtime, _sha256(root / rel)


def _unusable_name(rel: str) -> str | None:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
        return f"file name is not valid UTF-8 ({shown}); rename the file"
    return None


#: The stages of :func:`build_index` with verification, in order (``Progress.stage``); each has its
#: own count and ETA. Without verification there is only the first.
BUILD_STAGES = ("describing", "local features", "calibrating")


def build_index(
    collection: str | Path,
    out: str | Path | None,
    config: BackboneConfig | None = None,
    labelling: LabellingSpec | None = None,
    *,
    extractor: Extractor | None = None,
    batch_size: int = 8,
    dtype: str = "float32",
    verification: bool = True,
) -> Generator[ExtractProgress, None, BuildReport]:
    """Index every labelled image of ``collection``; saves atomically to ``out`` (if given) at the end.

    Stages (each yields progress): describing, then with ``verification`` the references' local
    features (for verified answers) and the calibration of the "in the collection" verdict.

    ``out`` is checked (:func:`check_output_folder`) and its writer lock taken before any work
    starts. Cancelling (closing the generator) before the end leaves any index at ``out`` untouched.
    """
    root = Path(collection)
    if not root.is_dir():
        raise MuseumSearchError(f"collection folder not found: {root}")
    if out is None:
        return (yield from _build(root, None, config, labelling, extractor, batch_size, dtype, verification))
    with writer_lock(out, collection=root):
        return (yield from _build(root, Path(out), config, labelling, extractor, batch_size, dtype, verification))


def _build(root, out, config, labelling, extractor, batch_size, dtype, verification):
    labelling = labelling or LabellingSpec()
    lab = label_collection(root, rule=labelling.rule, catalogue=labelling.catalogue, regex=labelling.regex)
    skipped: list[tuple[str, str]] = []
    refs = []
    for r in lab.references:
        reason = _unusable_name(r.path)
        if reason:
            skipped.append((str(root / r.path), reason))
        else:
            refs.append(r)
    if not refs:
        raise MuseumSearchError(f"no images to index in {root} (supported: JPEG, PNG, TIFF, WebP, BMP)")
    extractor = extractor or build_extractor(config)
    res = yield from extract([root / r.path for r in refs], extractor, batch_size=batch_size)
    skipped += res.skipped
    items, rows = [], []
    for row, i in enumerate(res.ok):
        try:
            size, mtime, digest = _file_record(root, refs[i].path)
        except OSError as exc:
            skipped.append((str(root / refs[i].path), f"the file changed or vanished while indexing ({exc.strerror})"))
            continue
        items.append(Item(refs[i].path, size, mtime, refs[i].instance, dict(refs[i].metadata), digest))
        rows.append(row)
    if not items:
        raise MuseumSearchError(f"none of the {len(refs)} images in {root} could be read")
    catalogue = str(Path(labelling.catalogue).resolve()) if labelling.catalogue else None
    spec = LabellingSpec(lab.rule if labelling.rule == "auto" else labelling.rule, catalogue, labelling.regex)
    desc = res.descriptors if len(rows) == len(res.ok) else res.descriptors[rows]
    index = Index(root, extractor.meta, items, desc.astype(dtype), spec)
    if verification:
        yield from _add_verification(index, extractor, [])
    if out is not None:
        index.save(out, dtype=dtype)
    return BuildReport(index, lab, skipped, added=len(items))


def update_index(
    index: Index,
    *,
    extractor: Extractor | None = None,
    weights: str | None = None,
    batch_size: int = 8,
    checksum: bool = False,
) -> Generator[ExtractProgress, None, BuildReport]:
    """Re-index new and changed files, drop deleted ones, refresh labels; saves atomically.

    A file counts as changed when its size or modification time differs, or, with ``checksum``,
    when its content hash differs (a file replaced by another of the same size and time).
    The index's writer lock is held from the start.
    """
    root = index.root
    if index.meta.imported:
        raise MuseumSearchError("this index holds imported descriptors: there is no network here "
                                "to describe new files; import the updated descriptors again (museum-search "
                                "import DESCRIPTORS.npy --items ITEMS.csv -o INDEX)")
    if not root.is_dir():
        raise MuseumSearchError(f"the collection folder of this index is gone: {root}")
    if index.path is None:
        return (yield from _update(index, extractor, weights, batch_size, checksum))
    with writer_lock(index.path, collection=root):
        return (yield from _update(index, extractor, weights, batch_size, checksum))


def _update(index, extractor, weights, batch_size, checksum):
    from .backbones import extractor_for_meta

    root = index.root
    spec = index.labelling
    lab = label_collection(root, rule=spec.rule, catalogue=spec.catalogue, regex=spec.regex)
    # Unchanged items keep their row order (so stored gallery ranks stay valid); new and changed
    # files are appended.
    skipped: list[tuple[str, str]] = []
    current = {}
    for ref in lab.references:
        reason = _unusable_name(ref.path)
        try:
            if reason is None:
                current[ref.path] = (ref, *_stat(root, ref.path))
        except OSError as exc:
            reason = f"the file cannot be read ({exc.strerror}); check the file or the link"
        if reason:
            skipped.append((str(root / ref.path), reason))
    keep_pos: list[int] = []
    keep_items: list[Item] = []
    for i, it in enumerate(index.items):
        cur = current.get(it.path)
        if cur is not None and cur[1] == it.size and cur[2] == it.mtime:
            if checksum:
                try:
                    same = bool(it.sha256) and _sha256(root / it.path) == it.sha256
                except OSError:
                    same = False
                if not same:
                    continue
            ref = cur[0]
            keep_pos.append(i)
            keep_items.append(Item(ref.path, it.size, it.mtime, ref.instance, dict(ref.metadata), it.sha256))
    kept_paths = {it.path for it in keep_items}
    todo = [v for p, v in current.items() if p not in kept_paths]
    new_desc = np.empty((0, index.meta.dim), np.float32)
    new_items: list[Item] = []
    if todo:
        extractor = extractor or extractor_for_meta(index.meta, weights)
        index.check_compatible(extractor.meta)
        res = yield from extract([root / r.path for r, _, _ in todo], extractor, batch_size=batch_size)
        skipped += res.skipped
        rows = []
        for row, i in enumerate(res.ok):
            ref = todo[i][0]
            try:
                size, mtime, digest = _file_record(root, ref.path)
            except OSError as exc:
                skipped.append((str(root / ref.path), f"the file changed or vanished while indexing ({exc.strerror})"))
                continue
            new_items.append(Item(ref.path, size, mtime, ref.instance, dict(ref.metadata), digest))
            rows.append(row)
        new_desc = res.descriptors[rows]
    dtype = np.asarray(index.descriptors[:0]).dtype
    kept_desc = np.asarray(index.descriptors[keep_pos], dtype=np.float32)
    desc = np.concatenate([kept_desc, new_desc]).astype(dtype)
    ranks = None
    if index.has_gallery_ranks:
        from .rerank.icfrr import remove_from_gallery_ranks, update_gallery_ranks

        mask = np.zeros(len(index), bool)
        mask[keep_pos] = True
        r = remove_from_gallery_ranks(np.asarray(index.gallery_ranks()), mask)
        ranks = update_gallery_ranks(r, kept_desc, new_desc) if len(new_items) else r
    updated = Index(root, index.meta, keep_items + new_items, desc, spec, index.created,
                    gallery_ranks=ranks, path=index.path)
    if index.local is not None:  # kept references keep their local features; deleted ones drop theirs
        changed = bool(new_items) or len(keep_items) != len(index)
        yield from _add_verification(updated, extractor, [index.local.subset(keep_pos)],
                                     calibrate=changed or not index.verdict, previous=index.verdict)
    if index.path is not None:
        updated.save(index.path)
    removed = sum(1 for it in index.items if it.path not in current)
    return BuildReport(updated, lab, skipped, added=len(new_items), removed=removed, unchanged=len(keep_items))


def _add_verification(index: Index, extractor, kept: list, calibrate: bool = True, previous: dict | None = None):
    """Local features of the references not in ``kept`` (appended after them), then the verdict's
    calibration (:mod:`.verdict`); both stages yield progress and can be cancelled."""
    from .rerank.spatial import LocalFeatures, SpatialParams, compute_local_features
    from .verdict import calibrate as calibrate_verdict

    have = sum(len(k) for k in kept)
    new = yield from compute_local_features([index.abspath(i) for i in range(have, len(index))], SpatialParams())
    index.local = LocalFeatures.concat([*kept, new]) if kept else new
    if calibrate:
        if extractor is None:
            from .backbones import extractor_for_meta

            extractor = extractor_for_meta(index.meta)
        index.verdict = (yield from calibrate_verdict(index, extractor)).to_dict()
    else:
        index.verdict = previous


# ---- file helpers --------------------------------------------------------------------------


def _manifest_files(path: Path) -> list[str]:
    """The data-file names the current manifest of ``path`` lists (plain generation names only)."""
    try:
        names = json.loads((path / MANIFEST).read_text(encoding="utf-8"))["files"].values()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return [n for n in names if isinstance(n, str) and DATA_FILE.match(n)]


def _manifest_digest(manifest: dict) -> str:
    """SHA-256 of the manifest's content without its own checksum (canonical JSON)."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def _size_text(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _write_journal(path: Path, names: list[str]) -> None:
    with open(path / JOURNAL, "w", encoding="utf-8") as f:  # our own file (a damaged one is ignored)
        json.dump({"pid": os.getpid(), "files": names}, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(path)


def _clean_journal(path: Path) -> None:
    """Remove the files an interrupted save of this index created (named in its journal)."""
    journal = path / JOURNAL
    try:
        names = json.loads(journal.read_text(encoding="utf-8"))["files"]
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):
        names = []
    current = set(_manifest_files(path))
    for name in names if isinstance(names, list) else []:
        if not isinstance(name, str) or name in current:
            continue
        if DATA_FILE.match(name) or (name.startswith(f"{MANIFEST}.") and name.endswith(".tmp") and "/" not in name):
            (path / name).unlink(missing_ok=True)
    journal.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_bytes(path: Path, data: bytes) -> str:
    with open(path, "xb") as f:  # never overwrite a file
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def _write_npy(path: Path, array: np.ndarray) -> str:
    with open(path, "xb") as f:  # never overwrite a file
        _write_array(f, np.ascontiguousarray(array))
        f.flush()
        os.fsync(f.fileno())
    return _sha256(path)


def _write_array(f, array: np.ndarray) -> None:
    """``.npy`` header and data through ``f.write``, so a full disk raises ``ENOSPC`` (``np.save``
    on a real file goes through ``tofile``, which reports a short write without an errno)."""
    if array.dtype.hasobject:
        raise ValueError("object arrays are never written to an index")
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    f.write(memoryview(array.reshape(-1)).cast("B"))


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
