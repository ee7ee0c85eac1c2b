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
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Generator

import numpy as np

from .backbones import BackboneConfig, BackboneMeta, Extractor, build_extractor
from .errors import IndexFormatError, MuseumSearchError
from .extract import ExtractProgress, extract
from .labels import Labelling, label_collection

log = logging.getLogger(__name__)

FORMAT = "museum-search-index"
VERSION = 1
MANIFEST = "manifest.json"


@dataclass
class Item:
    path: str  # POSIX path relative to the collection root
    size: int
    mtime: float
    instance: str
    metadata: dict[str, str] = field(default_factory=dict)


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
                except OSError as exc:
                    log.warning("gallery ranks not saved with the index %s: %s", self.path, exc)
        return self._gallery_ranks

    # ---- persistence ---------------------------------------------------------------------
    def save(self, path: str | Path | None = None, dtype: str | None = None) -> Path:
        """Write atomically to ``path`` (default: where it was loaded from)."""
        target = Path(path) if path else self.path
        if target is None:
            raise MuseumSearchError("no path given to save the index to")
        dtype = dtype or str(np.asarray(self.descriptors[:0]).dtype)
        if dtype not in ("float32", "float16"):
            raise MuseumSearchError(f"descriptor dtype must be float32 or float16, not {dtype}")
        target.mkdir(parents=True, exist_ok=True)
        old_files = _manifest_files(target)
        gen = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        files = {"descriptors": f"descriptors-{gen}.npy", "items": f"items-{gen}.json"}
        if self._gallery_ranks is not None:
            files["gallery_ranks"] = f"gallery_ranks-{gen}.npy"
        written: list[Path] = []
        try:
            digests = {}
            digests["descriptors"] = _write_npy(target / files["descriptors"], np.asarray(self.descriptors, dtype=dtype))
            written.append(target / files["descriptors"])
            items_blob = json.dumps([asdict(it) for it in self.items], ensure_ascii=False, indent=0).encode("utf-8")
            digests["items"] = _write_bytes(target / files["items"], items_blob)
            written.append(target / files["items"])
            if "gallery_ranks" in files:
                digests["gallery_ranks"] = _write_npy(target / files["gallery_ranks"], np.asarray(self._gallery_ranks))
                written.append(target / files["gallery_ranks"])
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
            }
            tmp = target / f"{MANIFEST}.{gen}.tmp"
            _write_bytes(tmp, json.dumps(manifest, ensure_ascii=False, indent=2).encode("utf-8"))
            os.replace(tmp, target / MANIFEST)  # the commit point
            _fsync_dir(target)
        except BaseException:
            for p in written:
                p.unlink(missing_ok=True)
            (target / f"{MANIFEST}.{gen}.tmp").unlink(missing_ok=True)
            raise
        # Remove the previous generation, and stray files of a save that was killed earlier.
        keep = set(files.values())
        for f in target.iterdir():
            stray = f.name.startswith(("descriptors-", "items-", "gallery_ranks-", f"{MANIFEST}."))
            if (f.name in old_files or stray) and f.name not in keep and f.is_file():
                f.unlink(missing_ok=True)
        self.path = target
        self.updated = manifest["updated"]
        return target

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
            raise IndexFormatError(
                f"index {path} has format version {manifest.get('version')}, this program reads "
                f"version {VERSION}; {hint}"
            )
        try:
            meta = BackboneMeta.from_dict(manifest["backbone"])
            files = manifest["files"]
            digests = manifest.get("sha256", {})
            count, dim = int(manifest["count"]), int(manifest["dim"])
            for key in ("descriptors", "items"):
                f = path / files[key]
                if not f.is_file():
                    raise IndexFormatError(f"index {path} is missing its file {files[key]}; {hint}")
                if verify and key in digests and _sha256(f) != digests[key]:
                    raise IndexFormatError(f"index file {files[key]} in {path} is damaged (checksum mismatch); {hint}")
            desc = np.load(path / files["descriptors"], mmap_mode="r" if mmap else None, allow_pickle=False)
            raw_items = json.loads((path / files["items"]).read_text(encoding="utf-8"))
            items = [Item(str(d["path"]), int(d["size"]), float(d["mtime"]), str(d["instance"]),
                          {str(k): str(v) for k, v in (d.get("metadata") or {}).items()}) for d in raw_items]
            ranks = None
            if "gallery_ranks" in files and (path / files["gallery_ranks"]).is_file():
                f = path / files["gallery_ranks"]
                if verify and "gallery_ranks" in digests and _sha256(f) != digests["gallery_ranks"]:
                    log.warning("gallery ranks of %s are damaged; they will be recomputed", path)
                else:
                    ranks = np.load(f, mmap_mode="r" if mmap else None, allow_pickle=False)
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
        return cls(root, meta, items, desc, labelling, manifest.get("created"), manifest.get("updated"), ranks, path)

    # ---- compatibility -------------------------------------------------------------------
    def check_compatible(self, meta: BackboneMeta) -> None:
        """Refuse descriptors made with other settings than this index's."""
        if meta != self.meta:
            raise MuseumSearchError(
                f"query descriptors ({meta.describe()}, weights {meta.weights_id}) do not match the "
                f"index ({self.meta.describe()}, weights {self.meta.weights_id}); describe queries with "
                f"the index's own settings"
            )


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


def build_index(
    collection: str | Path,
    out: str | Path | None,
    config: BackboneConfig | None = None,
    labelling: LabellingSpec | None = None,
    *,
    extractor: Extractor | None = None,
    batch_size: int = 8,
    dtype: str = "float32",
) -> Generator[ExtractProgress, None, BuildReport]:
    """Index every labelled image of ``collection``; saves atomically to ``out`` (if given) at the end.

    Cancelling (closing the generator) before the end leaves any index at ``out`` untouched.
    """
    root = Path(collection)
    if not root.is_dir():
        raise MuseumSearchError(f"collection folder not found: {root}")
    labelling = labelling or LabellingSpec()
    lab = label_collection(root, rule=labelling.rule, catalogue=labelling.catalogue, regex=labelling.regex)
    if not lab.references:
        raise MuseumSearchError(f"no images to index in {root} (supported: JPEG, PNG, TIFF, WebP, BMP)")
    extractor = extractor or build_extractor(config)
    refs = lab.references
    res = yield from extract([root / r.path for r in refs], extractor, batch_size=batch_size)
    items = []
    for i in res.ok:
        size, mtime = _stat(root, refs[i].path)
        items.append(Item(refs[i].path, size, mtime, refs[i].instance, dict(refs[i].metadata)))
    if not items:
        raise MuseumSearchError(f"none of the {len(refs)} images in {root} could be read")
    catalogue = str(Path(labelling.catalogue).resolve()) if labelling.catalogue else None
    spec = LabellingSpec(lab.rule if labelling.rule == "auto" else labelling.rule, catalogue, labelling.regex)
    index = Index(root, extractor.meta, items, res.descriptors.astype(dtype), spec)
    if out is not None:
        index.save(out, dtype=dtype)
    return BuildReport(index, lab, res.skipped, added=len(items))


def update_index(
    index: Index,
    *,
    extractor: Extractor | None = None,
    weights: str | None = None,
    batch_size: int = 8,
) -> Generator[ExtractProgress, None, BuildReport]:
    """Re-index new and changed files, drop deleted ones, refresh labels; saves atomically."""
    from .backbones import extractor_for_meta

    root = index.root
    if not root.is_dir():
        raise MuseumSearchError(f"the collection folder of this index is gone: {root}")
    spec = index.labelling
    lab = label_collection(root, rule=spec.rule, catalogue=spec.catalogue, regex=spec.regex)
    # Unchanged items keep their row order (so stored gallery ranks stay valid); new and changed
    # files are appended.
    current = {}
    for ref in lab.references:
        current[ref.path] = (ref, *_stat(root, ref.path))
    keep_pos: list[int] = []
    keep_items: list[Item] = []
    for i, it in enumerate(index.items):
        cur = current.get(it.path)
        if cur is not None and cur[1] == it.size and cur[2] == it.mtime:
            ref = cur[0]
            keep_pos.append(i)
            keep_items.append(Item(ref.path, it.size, it.mtime, ref.instance, dict(ref.metadata)))
    kept_paths = {it.path for it in keep_items}
    todo = [v for p, v in current.items() if p not in kept_paths]
    skipped: list[tuple[str, str]] = []
    new_desc = np.empty((0, index.meta.dim), np.float32)
    new_items: list[Item] = []
    if todo:
        extractor = extractor or extractor_for_meta(index.meta, weights)
        index.check_compatible(extractor.meta)
        res = yield from extract([root / r.path for r, _, _ in todo], extractor, batch_size=batch_size)
        skipped = res.skipped
        new_desc = res.descriptors
        for i in res.ok:
            ref, size, mtime = todo[i]
            new_items.append(Item(ref.path, size, mtime, ref.instance, dict(ref.metadata)))
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
    if index.path is not None:
        updated.save(index.path)
    removed = sum(1 for it in index.items if it.path not in current)
    return BuildReport(updated, lab, skipped, added=len(new_items), removed=removed, unchanged=len(keep_items))


# ---- file helpers --------------------------------------------------------------------------


def _manifest_files(path: Path) -> list[str]:
    try:
        return list(json.loads((path / MANIFEST).read_text(encoding="utf-8"))["files"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_bytes(path: Path, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return hashlib.sha256(data).hexdigest()


def _write_npy(path: Path, array: np.ndarray) -> str:
    with open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    return _sha256(path)


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
