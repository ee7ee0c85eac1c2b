"""The index of a collection on disk (the data model and the format; the workflows that write one
are :mod:`museum_search.core.jobs._indexing`): descriptors: descriptors, items and metadata, neighbour lists, ANN index.

Format 3 (a folder, no pickle anywhere)::

    INDEX/
      manifest.json                 format name and version, backbone meta, counts, times, labelling
                                    rule, collection root, the data file names, their sizes and SHA-256
      descriptors-<gen>.npy         (N, dim) float32 (or float16 on request), L2-normalized rows;
                                    memory-mapped when loaded, never converted whole
      items-<gen>.sqlite            items, catalogue metadata and their full-text index
                                    (:mod:`museum_search.core.index._catalogue`): opening an index parses no large file
      neighbours-<gen>.npy          (N, K_max) int32: each reference's nearest other references, best
                                    first (what ICFRR reads its gallery ranks from, no N x N matrix)
      ann-<gen>.faiss               optional approximate-search index (:mod:`._approximate`), for large indexes
      local_*-<gen>.npy             optional reference local features (verification)
      whitening-<gen>.npy           optional (k + 1, dim) float32: the verdict's learned whitening (mean, then matrix)

Format 2 (items in JSON, an N x N gallery-rank matrix) is refused with the command that converts it
(:func:`upgrade_index`, ``museum-search upgrade INDEX``: the descriptors are kept).

Saving is atomic: the data files of a new generation are written and fsynced under new names,
then ``manifest.json`` is replaced in one ``os.replace`` (the commit); only then are the old
generation's files removed. A process killed at any point leaves either the old or the new index
complete. The commit is a point of no return: SIGINT, SIGTERM and SIGHUP wait until the manifest is
replaced and the folder synced, nothing of the new generation is removed after it, and an interrupt
after it says the index was saved (:class:`InterruptedAfterCommit`). The journal of a save names the
files it creates and the files of the generation it replaces, so whichever side of the commit a
kill lands on, the next writer removes exactly the leftovers. Readers that open an index while a
writer switches generations read the manifest again and retry (:meth:`Index.load`).

The writer never deletes or overwrites a file it did not create:

* an index is only written to a new folder, an empty one, or an existing museum-search index, never
  to the collection itself or a folder that contains it (:func:`check_output_folder`);
* the only files it removes are the ones named in the previous manifest of that index, and the ones
  named in its own journal of a save that was interrupted (``.museum-search-pending.json``); new
  files are created exclusively (``O_EXCL``), so an existing file is never overwritten;
* one writer at a time: ``.museum-search.lock`` in the index folder is locked with ``flock`` for the
  whole of a build, update or save; a second writer fails at once ("being written by process N",
  the holder read from the kernel's lock table). Readers never take the lock;
* nothing in the folder is followed through a link: the lock and the journal are created with
  ``O_EXCL | O_NOFOLLOW`` (or opened with ``O_NOFOLLOW``), never truncated, and refused when they are
  a link or not a regular file; a data file that is a link is refused by name.

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
import signal
import sqlite3
import stat
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Generator, Literal, Sequence

import numpy as np

from museum_search.core.errors import (
    IndexFormatError,
    IndexLockedError,
    MuseumSearchError,
    OutputFolderError,
)
from museum_search.core.images import open_regular
from museum_search.core.index import _approximate, _exact, _neighbours
from museum_search.core.index._catalogue import Item, ItemStore, write_store
from museum_search.core.index._features import LOCAL_PARTS, LocalFeatures
from museum_search.core.inference import IMPORTED, BackboneMeta
from museum_search.core.progress import drive

log = logging.getLogger(__name__)

FORMAT = "museum-search-index"
VERSION = 3  # 2: manifest checksum, plain data-file names, item content hashes; 3: SQLite items, neighbour lists, ANN
UPGRADABLE = (2,)  # older versions upgrade_index() converts
MANIFEST = "manifest.json"
LOCK = ".museum-search.lock"
JOURNAL = ".museum-search-pending.json"
#: The data files of one generation: ``<kind>-<YYYYmmddTHHMMSS>-<6 hex>.<ext>``.
DATA_FILE = re.compile(r"^[a-z_]+-\d{8}T\d{6}-[0-9a-f]{6}\.(npy|json|npz|bin|sqlite|faiss)$")
_OWN_FILES = (MANIFEST, LOCK, JOURNAL)
#: Neighbours of each reference stored with an index (ICFRR reads its gallery ranks from them: any
#: K_g up to this works on any index; a smaller index computes more when asked).
K_MAX = 32
#: Up to this many references, longer neighbour lists are computed when ICFRR asks for them (exact:
#: seconds); a larger index is rebuilt with ``--neighbours K``.
EXACT_NEIGHBOURS_MAX = 20_000
#: Data files up to this size are checked byte for byte when an index is opened; larger ones by
#: size and a sampled digest (``museum-search info --check`` reads every byte).
FULL_CHECK_BYTES = 256 << 20
_SAMPLE_BLOCKS, _SAMPLE_BLOCK = 64, 1 << 16
_WRITE_ROWS = 1 << 15  # rows of a float16 <-> float32 conversion at a time


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
        items: Sequence[Item],
        descriptors: np.ndarray,
        labelling: LabellingSpec | None = None,
        created: float | None = None,
        updated: float | None = None,
        neighbours: np.ndarray | None = None,
        path: str | Path | None = None,
        local=None,
        verdict: dict | None = None,
        ann=None,
        whitening: np.ndarray | None = None,
    ):
        if descriptors.shape != (len(items), meta.dim):
            raise IndexFormatError(
                f"descriptor matrix {descriptors.shape} does not match {len(items)} items of {meta.dim}-d"
            )
        self.root = Path(root)
        self.meta = meta
        #: a list of :class:`Item`, or a :class:`museum_search.core.index._catalogue.ItemStore` (SQLite) for a loaded index
        self.items = items
        self.descriptors = descriptors
        self.labelling = labelling or LabellingSpec()
        self.created = created or time.time()
        self.updated = updated or self.created
        #: (N, K_max) nearest other references of each one, best first (None: not computed)
        self._neighbours: np.ndarray | None = None
        self.neighbours = neighbours  # checked against the items (the setter)
        #: the approximate-search index (:class:`._approximate.AnnIndex`) or None
        self.ann = ann
        self.path = Path(path) if path else None
        self._labels: np.ndarray | None = None
        self._instances: list[str] | None = None
        self._catalogue = None
        #: reference local features for verification (``rerank.spatial.LocalFeatures``) or None
        self.local = local
        #: the "in the collection" calibration (``verdict.Verdict.to_dict()``) or None
        self.verdict = verdict
        #: the verdict's learned whitening of the descriptors, (k + 1, D) float32: the mean, then the
        #: matrix (:class:`museum_search.core.answer._whitening.Whitening`), or None
        self.whitening = whitening
        #: data files found damaged when the index was opened and left out (the neighbour lists:
        #: computed again when needed), each "file: what is wrong"; ``info --check`` reports them
        self.damaged: list[str] = []
        if local is not None and len(local) != len(items):
            raise IndexFormatError(f"local features of {len(local)} references for {len(items)} items")

    # ---- views ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.items)

    @property
    def labels(self) -> np.ndarray:
        """Instance id of every reference, as a numpy array of str (cached)."""
        if self._labels is None:
            if isinstance(self.items, ItemStore):
                self._labels = self.items.instances()
            else:
                self._labels = np.array([it.instance for it in self.items], dtype=object)
        return self._labels

    @property
    def instances(self) -> list[str]:
        """The instance names, sorted (computed once)."""
        if self._instances is None:
            self._instances = sorted(set(self.labels.tolist()))
        return self._instances

    def abspath(self, i: int) -> Path:
        return self.root / self.items[i].path

    def catalogue(self):
        """The items as a :class:`museum_search.core.index._catalogue.ItemStore`: the SQLite file of a saved index, or one
        made in memory for an index not saved yet (browsing and full-text filtering are SQL)."""
        if isinstance(self.items, ItemStore):
            return self.items
        if self._catalogue is None or len(self._catalogue) != len(self.items):
            self._catalogue = ItemStore.in_memory(self.items)
        return self._catalogue

    def summary(self) -> str:
        return (
            f"{len(self)} references of {len(self.instances)} instances, {self.meta.summary()}, "
            f"collection {self.root}"
        )

    # ---- neighbour lists (ICFRR) ---------------------------------------------------------
    @property
    def neighbours(self) -> np.ndarray | None:
        """The stored (N, K) neighbour lists, or None (see :meth:`neighbour_lists`)."""
        return self._neighbours

    @neighbours.setter
    def neighbours(self, lists: np.ndarray | None) -> None:
        if lists is not None and (lists.ndim != 2 or lists.shape[0] != len(self.items)):
            raise IndexFormatError(f"neighbour lists of shape {lists.shape} for {len(self.items)} items")
        self._neighbours = lists

    @property
    def neighbours_stored(self) -> int:
        """How many neighbours of each reference are stored (0: none)."""
        return 0 if self._neighbours is None else int(self._neighbours.shape[1])

    def has_neighbours(self, k: int) -> bool:
        """True when the nearest ``k`` neighbours of each reference are at hand (no computation)."""
        return self._neighbours is not None and self._neighbours.shape[1] >= min(int(k), max(len(self) - 1, 0))

    def neighbour_lists(self, k: int) -> np.ndarray:
        """(N, >= min(k, N - 1)) int32: each reference's nearest other references, best first, with
        the arithmetic and tie rule of :func:`museum_search.core.answer._icfrr.gallery_ranks` (the reference at column
        ``p`` has gallery rank ``p + 1``).

        The stored lists when they are long enough; else, for an index of up to
        :data:`EXACT_NEIGHBOURS_MAX` references, they are computed (exactly, at least
        :data:`K_MAX` of them) and kept in memory, never written (a query or an evaluation only
        reads the index: a warning says that ``update`` stores them); a larger index refuses with
        what to do."""
        k = int(k)
        if self.has_neighbours(k):
            assert self._neighbours is not None  # has_neighbours says so
            return self._neighbours
        if len(self) > EXACT_NEIGHBOURS_MAX:
            raise MuseumSearchError(
                f"ICFRR with K_g = {k} needs the {k} nearest neighbours of each reference; this index of "
                f"{len(self):,} references stores {self.neighbours_stored}. Use K_g <= {self.neighbours_stored}, "
                f"or rebuild the index with --neighbours {k}")
        self._neighbours = drive(self.iter_neighbours(max(k, K_MAX)))
        if self.path is not None:
            store = f"museum-search update {self.path}" + (f" --neighbours {k}" if k > K_MAX else "")
            log.warning("the neighbour lists ICFRR needs (K_g = %d) were computed for this run only, not stored "
                        "in the index; %s stores them", k, store)
        return self._neighbours

    def iter_neighbours(self, k: int = 0) -> Generator[Any, None, np.ndarray]:
        """Compute the neighbour lists (``k`` each, default :data:`K_MAX`) as a progress generator;
        with the approximate index when there is one (a large index), else exactly."""
        return (yield from _neighbours.neighbour_lists(self.descriptors, int(k or K_MAX), ann=self.ann))

    # ---- persistence ---------------------------------------------------------------------
    def store_verdict(self, verdict) -> None:
        """Store a (re-calibrated) :class:`~museum_search.core.answer._verdict.Verdict` in this index's folder;
        on failure the index, in memory and on disk, keeps its previous verdict."""
        previous, self.verdict = self.verdict, verdict.to_dict()
        try:
            self.save()
        except BaseException:
            self.verdict = previous
            raise

    def save(self, path: str | os.PathLike | None = None, dtype: str | None = None) -> Path:
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
        files = self._generation_files(gen)
        tmp_name = f"{MANIFEST}.{gen}.tmp"
        keep = set(files.values())
        old_files = [n for n in old_files if n not in keep]
        # The journal names every file this save may create, before any is created, and every file
        # of the generation it replaces: if the process dies, the next save knows exactly which
        # files are its own leftovers (the new ones before the commit, the old ones after it).
        created: list[Path] = []
        _write_journal(target, [*files.values(), tmp_name, *old_files])
        try:
            digests, sizes, samples = self._write_data_files(target, files, dtype, created)
            manifest = self._manifest(target, files, dtype, digests, sizes, samples)
            manifest["manifest_sha256"] = _manifest_digest(manifest)
            created.append(target / tmp_name)
            _write_bytes(target / tmp_name, json.dumps(manifest, ensure_ascii=False, indent=2).encode("utf-8"))
        except BaseException as exc:
            for p in created:
                p.unlink(missing_ok=True)
            (target / JOURNAL).unlink(missing_ok=True)
            failure = self._write_failure(exc, target, dtype)
            if failure is None:
                raise
            raise failure from None
        self._commit(target, tmp_name, created, old_files, keep, manifest)
        if not isinstance(self.items, ItemStore):  # browse and filter the saved catalogue from now on
            self.items = ItemStore(target / files["items"], sha256=digests["items"], hint=_rebuild_hint(target, manifest))

    def _generation_files(self, gen: str) -> dict[str, str]:
        """The data files of a new generation ``gen``, by kind (:data:`DATA_FILE` names)."""
        files = {"descriptors": f"descriptors-{gen}.npy", "items": f"items-{gen}.sqlite"}
        if self._neighbours is not None:
            files["neighbours"] = f"neighbours-{gen}.npy"
        if self.ann is not None:
            files["ann"] = f"ann-{gen}.faiss"
        if self.whitening is not None:
            files["whitening"] = f"whitening-{gen}.npy"
        if self.local is not None:
            for part in LOCAL_PARTS:
                files[f"local_{part}"] = f"local_{part}-{gen}.npy"
        return files

    def _write_data_files(self, target: Path, files: dict[str, str], dtype: str, created: list[Path]
                          ) -> tuple[dict[str, str], dict[str, int], dict[str, str]]:
        """Write the data files ``files`` into ``target``, each added to ``created`` before it is
        written, then synced: (SHA-256 digests, sizes, sampled digests of those over
        :data:`FULL_CHECK_BYTES`), by kind."""
        digests: dict[str, str] = {}
        sizes: dict[str, int] = {}
        samples: dict[str, str] = {}

        def write(key: str, how: Callable[[Path], object]) -> None:
            f = target / files[key]
            created.append(f)
            how(f)
            _fsync_file(f)
            digests[key], sizes[key] = file_sha256(f), f.stat().st_size
            if sizes[key] > FULL_CHECK_BYTES:
                samples[key] = _sample_digest(f)

        write("descriptors", lambda f: _write_npy(f, self.descriptors, dtype))
        write("items", lambda f: write_store(f, self.items))
        neighbours, ann, local, whitening = self._neighbours, self.ann, self.local, self.whitening
        if whitening is not None:
            write("whitening", lambda f: _write_npy(f, np.asarray(whitening, np.float32), "float32"))
        if neighbours is not None:
            write("neighbours", lambda f: _write_npy(f, neighbours, "int32"))
        if ann is not None:
            write("ann", lambda f: _write_bytes(f, ann.to_bytes()))
        if local is not None:
            for part in LOCAL_PARTS:
                write(f"local_{part}", partial(_write_npy_as_is, array=getattr(local, part)))
        return digests, sizes, samples

    def _manifest(self, target: Path, files: dict[str, str], dtype: str, digests: dict[str, str],
                  sizes: dict[str, int], samples: dict[str, str]) -> dict[str, Any]:
        """The manifest of a generation of this index written into ``target`` (without its own digest)."""
        return {
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
            "sizes": sizes,
            "samples": samples,
            "neighbours": self.neighbours_stored or None,
            "ann": self.ann.params.to_dict() if self.ann is not None else None,
            "local_features": self.local.settings if self.local is not None else None,
            "verdict": self.verdict,
        }

    def _write_failure(self, exc: BaseException, target: Path, dtype: str) -> MuseumSearchError | None:
        """What to tell of ``exc``, raised while a generation was written into ``target`` (its files
        removed): a full disk or another write error said plainly; None: ``exc`` itself."""
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return MuseumSearchError(
                f"the disk is full: the index could not be written to {target} ({exc.strerror}); "
                f"free some space (this index needs about {_size_text(self._nbytes(dtype))}) and "
                "try again; the previous index, if any, is unchanged"
            )
        if isinstance(exc, (OSError, sqlite3.Error)):
            return MuseumSearchError(
                f"the index could not be written to {target} ({getattr(exc, 'strerror', None) or exc}); "
                "the previous index, if any, is unchanged"
            )
        return None

    def _commit(self, target: Path, tmp_name: str, created: list[Path], old_files: list[str], keep: set[str],
                manifest: dict[str, Any]) -> None:
        """Make the written generation (its manifest ``tmp_name``, the files ``created``) the index in
        ``target``, then remove the previous generation's files ``old_files``."""
        # The commit: a point of no return. Signals wait until the manifest is replaced and the
        # folder synced; from then on nothing of the new generation is ever removed.
        try:
            with _signals_deferred():
                try:
                    os.replace(target / tmp_name, target / MANIFEST)
                except BaseException:
                    (target / tmp_name).unlink(missing_ok=True)
                    for p in created[:-1]:
                        p.unlink(missing_ok=True)
                    (target / JOURNAL).unlink(missing_ok=True)
                    raise
                _committed.append(target)
                _fsync_dir(target)
            self.path = target
            self.updated = manifest["updated"]
            # Remove the previous generation: the files the previous manifest named (the journal
            # names them too, so a writer after a kill here finishes the job).
            for name in old_files:
                if name not in keep:
                    _remove_own(target / name)
            (target / JOURNAL).unlink(missing_ok=True)
        except KeyboardInterrupt:
            raise InterruptedAfterCommit(target) from None

    def _nbytes(self, dtype: str) -> int:
        n = len(self.items) * self.meta.dim * np.dtype(dtype).itemsize + 300 * len(self.items)
        if self._neighbours is not None:
            n += int(self._neighbours.size) * 4
        if self.local is not None:
            n += sum(int(np.asarray(getattr(self.local, part)).nbytes) for part in LOCAL_PARTS)
        return n

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True, verify: bool | str = True) -> "Index":
        """Load an index; refuses a damaged, foreign, older or newer-format index with a clear message.

        ``verify``: True checks the SHA-256 of every data file up to :data:`FULL_CHECK_BYTES`, and the
        size and a sampled digest of larger ones (so opening a million references does not read 2.5 GB);
        ``"full"`` checks every byte of every file; False checks nothing.
        """
        path = Path(path)
        failed: dict[str, IndexFormatError] = {}  # manifest digest -> how loading that generation failed
        while True:
            manifest = read_manifest(path)
            _check_version(path, manifest)
            digest = str(manifest.get("manifest_sha256"))
            try:
                return cls.from_manifest(path, manifest, mmap, verify)
            except IndexFormatError as exc:
                # A writer may have switched generations while this reader opened the files (the old
                # ones are removed after the commit): read the manifest again and retry; the same
                # generation failing twice is a damaged index.
                if digest in failed:
                    raise
                failed[digest] = exc
                if len(failed) > 20:  # a writer committing faster than a reader can open: say so
                    raise IndexFormatError(f"index {path} changed 20 times while it was being opened; "
                                           "try again when the writer has finished") from None

    @classmethod
    def from_manifest(cls, path: Path, manifest: dict, mmap: bool, verify: bool | str) -> "Index":
        hint = _rebuild_hint(path, manifest)
        try:
            meta = BackboneMeta.from_dict(manifest["backbone"])
            data = _DataFiles(path, manifest, verify, hint, "r" if mmap else None)
            count, dim = int(manifest["count"]), int(manifest["dim"])
            data.check_names()
            desc = data.npy("descriptors")
            items = data.items()
            neighbours = data.neighbours()
            ann = data.ann()
            local = data.local(count)
            whitening = data.npy("whitening") if "whitening" in data.files else None
            verdict = manifest.get("verdict")
            labelling = LabellingSpec(**manifest.get("labelling", {}))
            coll = manifest["collection"]
        except IndexFormatError:
            raise
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise IndexFormatError(f"index {path} is damaged ({type(exc).__name__}: {exc}); {hint}") from None
        checked = _check_loaded(path, hint, count, dim, meta, desc, items, neighbours, ann)
        if whitening is not None and (whitening.ndim != 2 or whitening.shape[1] != dim or whitening.dtype.kind != "f"
                                      or not 2 <= whitening.shape[0] <= dim + 1
                                      or not np.all(np.isfinite(whitening))):
            raise IndexFormatError(f"index {path} is damaged (its whitening has shape {whitening.shape}, "
                                   f"not (k + 1, {dim}) finite numbers); {hint}")
        if neighbours is not None and checked is None:
            data.damaged.append(f"{data.files['neighbours']}: the neighbour lists have the wrong shape or type")
        index = cls(_collection_root(path, coll), meta, items, desc, labelling, manifest.get("created"),
                    manifest.get("updated"), checked, path, local=local,
                    verdict=verdict if isinstance(verdict, dict) else None, ann=ann,
                    whitening=None if whitening is None else np.array(whitening, np.float32))
        index.damaged = data.damaged
        return index

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
        if is_index_folder(cand) and indexed_collection(cand) == root:
            return cand
    raise OutputFolderError(f"no free folder name for the index of {root}; choose one with -o")


def indexed_collection(path: Path) -> Path | None:
    try:
        root = json.loads((path / MANIFEST).read_text(encoding="utf-8"))["collection"]["root"]
        return Path(root).resolve()
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_output_folder(out: str | os.PathLike, collection: str | Path | None = None) -> None:
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
            names = sorted(os.listdir(out))
        except OSError as exc:
            raise OutputFolderError(f"cannot read the folder {out} ({exc.strerror}){hint}") from None
        if names and not _only_own_leftovers(out, names):
            raise OutputFolderError(
                f"{out} is not empty and is not a museum-search index ({len(names)} item(s), e.g. "
                f"{names[0]!r}); nothing was written{hint}"
            )


def _only_own_leftovers(folder: Path, names: list[str]) -> bool:
    """Whether ``folder`` (no manifest) holds nothing but what an interrupted first build of this
    program left: its lock file (a regular file, empty or with a process number), its journal, and
    the files that journal names (generation data files, a temporary manifest)."""
    own: set[str] = set()
    for name in (LOCK, JOURNAL):
        if name in names:
            try:
                st = os.lstat(folder / name)
            except OSError:
                return False
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or (name == LOCK and st.st_size > 32):
                return False
            own.add(name)
    if JOURNAL in own:
        try:
            listed = _journal_names(folder)
        except OutputFolderError:
            return False
        own.update(n for n in listed if _is_own_name(n))
    return all(n in own for n in names)


_held: dict[str, tuple[int, int, int]] = {}  # resolved folder -> (fd, owning thread, depth)
_held_guard = threading.Lock()


@contextmanager
def writer_lock(folder: str | os.PathLike, collection: str | Path | None = None):
    """Hold the index's exclusive writer lock (``flock`` on ``.museum-search.lock``) for the block.

    Checks the folder first (:func:`check_output_folder`), creates it if needed and checks that it
    can be written, all before the caller does any work. Re-entrant in the thread that holds it.
    A folder this call created is removed again if the block leaves no index in it; a folder that
    holds only the leftovers of an interrupted first build (:func:`_only_own_leftovers`) is cleaned.

    The lock file is never followed through a link and never truncated or written: it is opened
    with ``O_NOFOLLOW`` and refused unless it is a regular file of its own (one link); the holder's
    process number is read from the kernel's lock table (``/proc/locks``), not from the file.
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
    except OSError as exc:
        raise OutputFolderError(f"cannot write to the index folder {folder} ({exc.strerror}); choose a "
                                "folder you can write to") from None
    fd = _open_lock(folder)
    try:
        _flock(fd, folder)
        if not (folder / MANIFEST).exists():
            _clean_journal(folder)  # the leftovers of an interrupted first build (checked above)
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


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _open_lock(folder: Path) -> int:
    """A descriptor of ``folder``'s lock file, created (exclusively, empty) or opened without
    following a link; refused if it is a link, not a regular file, or a hard link to another file."""
    path = folder / LOCK
    hint = (f"; it is not a file this program made: remove it (rm {path}) or choose another folder "
            "for the index")
    try:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
        except FileExistsError:
            if not stat.S_ISREG(os.lstat(path).st_mode):  # a link, a FIFO, a device: never opened
                raise OSError(errno.ELOOP if path.is_symlink() else errno.ENXIO, "not a regular file") from None
            fd = os.open(path, os.O_RDWR | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP or path.is_symlink():
            raise OutputFolderError(f"the lock file {path} is a symbolic link{hint}") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO, errno.EWOULDBLOCK):
            raise OutputFolderError(f"the lock file {path} is not a regular file{hint}") from None
        raise OutputFolderError(f"cannot write to the index folder {folder} ({exc.strerror}); choose a "
                                "folder you can write to") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "is not a regular file" if not stat.S_ISREG(st.st_mode) else "is a hard link to another file"
        raise OutputFolderError(f"the lock file {path} {what}{hint}")
    return fd


def _flock(fd: int, folder: Path) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; one writer is the user's responsibility there
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _lock_holder(fd) or "?"
        raise IndexLockedError(
            f"the index {folder} is being written by process {pid}; wait for it to finish (or stop "
            "it), then try again"
        ) from None


def _lock_holder(fd: int) -> str | None:
    """The process number holding a ``flock`` on ``fd``'s file, from ``/proc/locks`` (Linux)."""
    st = os.fstat(fd)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if "->" in parts:  # a waiter, not the holder
                    continue
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == dev:
                    return parts[4]
    except OSError:
        pass
    return None


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
    """Write the journal of a save: every file name it may create and every file of the generation it
    replaces. Whatever a kill interrupts, :func:`_clean_journal` then removes exactly the names not in
    the manifest in force: the new files before the commit, the old ones after it. Created
    exclusively, never through a link."""
    blob = json.dumps({"pid": os.getpid(), "files": names}).encode("utf-8")
    try:
        fd = os.open(path / JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
    except FileExistsError:
        raise OutputFolderError(f"the journal {path / JOURNAL} appeared while this program was writing the "
                                "index (another program is using the folder?); nothing was changed") from None
    try:
        try:
            os.write(fd, blob)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(path)
    except BaseException:  # a Ctrl-C (or a failure) as it is written: no stray journal beside "nothing changed"
        (path / JOURNAL).unlink(missing_ok=True)
        raise


def _is_own_name(name: object) -> bool:
    """A file name a save of this program creates: a generation data file or a temporary manifest."""
    return isinstance(name, str) and "/" not in name and (
        bool(DATA_FILE.match(name)) or (name.startswith(f"{MANIFEST}.") and name.endswith(".tmp")))


def _journal_names(path: Path) -> list[str]:
    """The names listed in ``path``'s journal ([] if there is none, or it is not readable JSON);
    :class:`OutputFolderError` if the journal is a link or not a regular file."""
    journal = path / JOURNAL
    try:
        fd = os.open(journal, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ELOOP or journal.is_symlink():
            raise OutputFolderError(f"the journal {journal} is a symbolic link; it is not a file this program "
                                    f"made: remove it (rm {journal}) or choose another folder") from None
        raise OutputFolderError(f"the journal {journal} cannot be read ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputFolderError(f"the journal {journal} is not a regular file; remove it or choose "
                                    "another folder")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(1 << 20)
    finally:
        os.close(fd)
    try:
        names = json.loads(raw.decode("utf-8"))["files"]
    except (ValueError, KeyError, TypeError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _clean_journal(path: Path) -> None:
    """Finish what an interrupted save of this index left: remove the files its journal names that
    the manifest in force does not (the new generation's before the commit, the old one's after)."""
    names = _journal_names(path)
    journal = path / JOURNAL
    if not names and not os.path.lexists(journal):
        return
    current = set(_manifest_files(path))
    for name in names:
        if name not in current and _is_own_name(name):
            _remove_own(path / name)
    journal.unlink(missing_ok=True)


def _remove_own(f: Path) -> None:
    """Remove a data file of this program's (a link is removed, never followed)."""
    try:
        f.unlink(missing_ok=True)
    except IsADirectoryError:
        log.warning("%s is a folder, not a file of this index's; it is left alone", f)
    except OSError as exc:  # e.g. a file still open elsewhere on Windows: a leftover, not an error
        log.warning("the index file %s could not be removed: %s", f, exc)


# ---- the commit: signals wait -----------------------------------------------------------------

_committed: list[Path] = []  # the indexes saved (committed) by this process, in order


def committed_in_this_process() -> list[Path]:
    """The index folders this process has committed a new generation to (for a view that must say
    "saved" rather than "nothing was changed" after an interrupt)."""
    return list(_committed)


class InterruptedAfterCommit(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) arrived after a new generation was committed: the index is saved."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(f"the index {path} was saved before the interrupt")


_DEFERRED_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextmanager
def _signals_deferred() -> Generator[None, None, None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the block (main thread only: elsewhere Python runs no
    signal handler anyway), then deliver the first that arrived to its own handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    saved = {}
    for sig in _DEFERRED_SIGNALS:
        try:
            saved[sig] = signal.signal(sig, lambda signum, frame: arrived.append(signum))
        except (ValueError, OSError):
            pass
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if arrived:
            signal.raise_signal(arrived[0])


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's content; a collection photo must be a regular file (:func:`.images.open_regular`:
    one swapped for a FIFO is refused, never waited on)."""
    h = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_bytes(path: Path, data: bytes) -> str:
    with open(path, "xb") as f:  # never overwrite a file
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def _write_npy(path: Path, array: np.ndarray, dtype: str) -> None:
    """``array`` as ``dtype`` in a new ``.npy`` file (never overwriting one). The caller fsyncs."""
    with open(path, "xb") as f:  # never overwrite a file
        _write_array(f, array, dtype)


def _write_npy_as_is(path: Path, array: np.ndarray) -> None:
    """``array`` as a .npy file of its own dtype (:func:`_write_npy`)."""
    arr = np.asarray(array)
    _write_npy(path, arr, str(arr.dtype))


def _write_array(f, array: np.ndarray, dtype: str) -> None:
    """``.npy`` header and data through ``f.write``, so a full disk raises ``ENOSPC`` (``np.save``
    on a real file goes through ``tofile``, which reports a short write without an errno); converted
    a block of rows at a time (a memory-mapped float16 matrix is never converted whole)."""
    dt = np.dtype(dtype)
    if array.dtype.hasobject or dt.hasobject:
        raise ValueError("object arrays are never written to an index")
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": array.shape})
    for a in range(0, len(array), _WRITE_ROWS):
        block = np.ascontiguousarray(array[a:a + _WRITE_ROWS], dtype=dt)
        f.write(block.reshape(-1).data.cast("B"))  # .data: the array's memoryview


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sample_digest(path: Path) -> str:
    """SHA-256 of a file's size and of :data:`_SAMPLE_BLOCKS` blocks spread evenly over it (the first
    and the last included): what opening a large index checks (see :data:`FULL_CHECK_BYTES`)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        span = max(size - _SAMPLE_BLOCK, 0)
        for i in range(_SAMPLE_BLOCKS):
            f.seek(span * i // (_SAMPLE_BLOCKS - 1))
            h.update(f.read(_SAMPLE_BLOCK))
    return h.hexdigest()


def _intact(f: Path, key: str, manifest: dict, full: bool) -> bool:
    """Whether data file ``f`` (``key`` in the manifest) is as written: every byte (``full``, or a
    file up to :data:`FULL_CHECK_BYTES`), else its size and sampled digest."""
    size = manifest.get("sizes", {}).get(key)
    sample = manifest.get("samples", {}).get(key)
    if size is not None and f.stat().st_size != size:
        return False
    if not full and sample is not None:
        return _sample_digest(f) == sample
    return file_sha256(f) == manifest.get("sha256", {}).get(key)


def _rebuild_hint(path: Path, manifest: dict | None = None) -> str:
    """How to make the index at ``path`` again: ``import`` for imported descriptors, else ``index``."""
    backbone = (manifest or {}).get("backbone")
    if isinstance(backbone, dict) and backbone.get("name") == IMPORTED:
        return f"import the descriptors again with: museum-search import DESCRIPTORS.npy --items ITEMS.csv -o {path}"
    return f"rebuild it with: museum-search index COLLECTION -o {path}"


def _check_version(path: Path, manifest: dict) -> None:
    """Refuse a manifest of another format version (with the command that converts an older one)."""
    version = manifest.get("version")
    hint = _rebuild_hint(path, manifest)
    if isinstance(version, int) and not isinstance(version, bool) and version in UPGRADABLE:
        raise IndexFormatError(
            f"index {path} has format version {version} (written by an older museum-search); "
            f"convert it with: museum-search upgrade {path} (it keeps the descriptors), or {hint}")
    if not isinstance(version, int) or isinstance(version, bool):
        raise IndexFormatError(f"index manifest {path / MANIFEST} is damaged: its format version is "
                               f"{version!r}, not a number; {hint}")
    if version != VERSION:
        raise IndexFormatError(
            f"index {path} has format version {version}, this program reads version {VERSION}; {hint}")


def _manifest_changed(path: Path, manifest: dict) -> bool:
    """Whether the manifest of ``path`` is no longer ``manifest`` (a writer committed meanwhile)."""
    try:
        return read_manifest(path).get("manifest_sha256") != manifest.get("manifest_sha256")
    except IndexFormatError:
        return True


def _is_regular(f: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(f).st_mode)
    except OSError:
        return False


class _DataFiles:
    """The data files one generation's manifest names in the index folder ``path``, each checked as
    it is opened (:meth:`Index.from_manifest`): ``verify`` as :meth:`Index.load` says, ``mode`` "r"
    to memory-map the arrays. What is missing or damaged raises :class:`IndexFormatError`, but for
    the neighbour lists (recomputed)."""

    def __init__(self, path: Path, manifest: dict, verify: bool | str, hint: str, mode: Literal["r"] | None):
        self.path, self.manifest, self.verify, self.hint, self.mode = path, manifest, verify, hint, mode
        self.files = manifest["files"]
        self.digests = manifest.get("sha256", {})
        self.damaged: list[str] = []  # files left out as damaged (see Index.damaged)

    def check_names(self) -> None:
        """Refuse a name outside the folder or of an unknown form (:data:`DATA_FILE`)."""
        for key, name in self.files.items():
            if not isinstance(name, str) or not DATA_FILE.match(name):
                raise IndexFormatError(
                    f"index {self.path} names a data file outside its folder or of an unknown form "
                    f"({name!r} for {key}); {self.hint}"
                )

    def check(self, key: str) -> Path:
        """The file of ``key``: there, the index's own regular file, intact (``verify``)."""
        path, hint, name = self.path, self.hint, self.files[key]
        f = path / name
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            raise IndexFormatError(f"index {path} is missing its file {name}; {hint}") from None
        if not stat.S_ISREG(st.st_mode):
            what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise IndexFormatError(f"index file {name} in {path} is {what}; an index's data files "
                                   f"are its own regular files; {hint}")
        if self.verify and key in self.digests and not _intact(f, key, self.manifest, self.verify == "full"):
            raise IndexFormatError(f"index file {name} in {path} is damaged (checksum mismatch); {hint}")
        return f

    def npy(self, key: str) -> np.ndarray:
        return _load_npy(self.check(key), self.mode, self.path, self.hint)

    def items(self) -> Sequence[Item]:
        f = self.check("items")
        if self.manifest.get("version") == 2:
            return _items_from_json(f)
        return ItemStore(f, sha256=self.digests.get("items"), hint=self.hint)

    def neighbours(self) -> np.ndarray | None:
        """The stored neighbour lists; None when there are none, or (with a warning: they are
        recomputed) when their file is missing or damaged."""
        if "neighbours" not in self.files:
            return None
        f = self.path / self.files["neighbours"]
        why = "missing, or not a regular file"
        if _is_regular(f):
            why = "damaged (checksum mismatch)"
            if not self.verify or _intact(f, "neighbours", self.manifest, self.verify == "full"):
                try:
                    return _load_npy(f, self.mode, self.path, self.hint)
                except IndexFormatError:  # not checked (verify False): not an array file, a pickle
                    why = "damaged (not a NumPy array of numbers)"
        if _manifest_changed(self.path, self.manifest):  # a writer switched generations: Index.load retries
            raise IndexFormatError(f"index {self.path} is missing its file {self.files['neighbours']}; {self.hint}")
        self.damaged.append(f"{self.files['neighbours']}: {why}")
        log.warning("neighbour lists of %s are missing or damaged; they are computed again when ICFRR needs "
                    "them (museum-search update %s stores them again)", self.path, self.path)
        return None

    def ann(self) -> _approximate.AnnIndex | None:
        """The approximate index (memory-mapped), or None: there is none, or faiss is not installed."""
        if not (self.manifest.get("ann") and "ann" in self.files):
            return None
        f = self.check("ann")
        if _exact.faiss_available():
            return _approximate.AnnIndex.read(f, _approximate.AnnParams.from_dict(self.manifest["ann"]))
        # e.g. the kiosk build, which leaves faiss out
        log.warning("the approximate index of %s is not used (faiss is not installed): every "
                    "search is exact", self.path)
        return None

    def local(self, count: int) -> LocalFeatures | None:
        """The references' local features (``count`` of them, checked), or None."""
        if not (self.manifest.get("local_features") and all(f"local_{p}" in self.files for p in LOCAL_PARTS)):
            return None
        arrays = {part: self.npy(f"local_{part}") for part in LOCAL_PARTS}
        local = LocalFeatures(dict(self.manifest["local_features"]), **arrays)
        if len(local) != count or local.offsets.shape != (count + 1,) or \
                int(local.offsets[-1]) != len(local.points) or len(local.points) != len(local.descriptors):
            raise IndexFormatError(f"index {self.path} has inconsistent local features; {self.hint}")
        return local


def _check_loaded(path: Path, hint: str, count: int, dim: int, meta: BackboneMeta, desc: np.ndarray,
                  items: Sequence[Item], neighbours: np.ndarray | None, ann: Any) -> np.ndarray | None:
    """Refuse (:class:`IndexFormatError`) descriptors, items or an approximate index that disagree
    with the manifest's ``count`` x ``dim``; returns ``neighbours``, or None (with a warning: they
    are recomputed) when their shape or type is wrong."""
    if desc.ndim != 2 or desc.shape != (count, dim) or len(items) != count or dim != meta.dim:
        raise IndexFormatError(
            f"index {path} is inconsistent: manifest says {count}×{dim}, descriptors are "
            f"{desc.shape}, {len(items)} items; {hint}"
        )
    if desc.dtype not in (np.float32, np.float16):
        raise IndexFormatError(f"index {path} has descriptors of type {desc.dtype}; {hint}")
    if neighbours is not None and (neighbours.ndim != 2 or neighbours.shape[0] != count
                                   or neighbours.dtype != np.int32):
        log.warning("neighbour lists of %s have the wrong shape; they are computed again when ICFRR needs them "
                    "(museum-search update %s stores them again)", path, path)
        neighbours = None
    if ann is not None and (ann.ntotal != count or ann.dim != dim):
        raise IndexFormatError(f"index {path} has an approximate index of {ann.ntotal} references for "
                               f"{count}; {hint}")
    return neighbours


def _collection_root(path: Path, collection: dict) -> Path:
    """The collection of the index in ``path``: where the manifest says, else (moved together) the
    same place relative to the index."""
    root = Path(collection["root"])
    if not root.is_dir():
        alt = (path / collection.get("relative", "")).resolve()
        if alt.is_dir():
            root = alt
    return root


def _load_npy(f: Path, mode: Literal["r"] | None, path: Path, hint: str) -> np.ndarray:
    """A data file of the index as an array (memory-mapped with ``mode`` "r"); a file that is not a
    NumPy array file, or holds Python objects, is refused by name (never unpickled)."""
    try:
        with open(f, "rb") as fp:
            magic = fp.read(6)
    except OSError as exc:
        raise IndexFormatError(f"index file {f.name} in {path} cannot be read ({exc.strerror}); {hint}") from None
    if magic != b"\x93NUMPY":
        raise IndexFormatError(f"index file {f.name} in {path} is damaged (it is not a NumPy array file); {hint}")
    try:
        return np.load(f, mmap_mode=mode, allow_pickle=False)
    except ValueError as exc:
        why = "it holds Python objects, which are never loaded" if "pickle" in str(exc).lower() else str(exc)
        raise IndexFormatError(f"index file {f.name} in {path} is damaged ({why}); {hint}") from None
    except (OSError, EOFError):
        raise
    except Exception as exc:  # a damaged header: numpy's parser raises SyntaxError, TokenError, TypeError...
        raise IndexFormatError(f"index file {f.name} in {path} is damaged (its .npy header cannot be read: "
                               f"{type(exc).__name__}); {hint}") from None


def index_version(path: str | Path) -> int | None:
    """The format version of the index at ``path`` (its manifest checked as :meth:`Index.load`
    checks it: :class:`IndexFormatError` if it is not an intact index manifest)."""
    version = read_manifest(Path(path)).get("version")
    return version if isinstance(version, int) else None


def read_manifest(path: Path) -> dict:
    """The manifest of the index at ``path``, refused if missing, foreign, damaged or edited."""
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
    if manifest.get("manifest_sha256") != _manifest_digest(manifest):
        raise IndexFormatError(
            f"index manifest {mpath} has been edited or damaged (its checksum does not match its "
            f"content, e.g. the backbone settings); {hint}"
        )
    return manifest


def _items_from_json(f: Path) -> list[Item]:
    """The items of a format-2 index (one JSON file), for :func:`upgrade_index`."""
    raw = json.loads(f.read_text(encoding="utf-8"))
    return [Item(str(d["path"]), int(d["size"]), float(d["mtime"]), str(d["instance"]),
                 {str(k): str(v) for k, v in (d.get("metadata") or {}).items()},
                 str(d.get("sha256") or "")) for d in raw]


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
