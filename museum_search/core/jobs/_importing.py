"""Bring your own descriptors: an index of descriptors computed elsewhere, and queries given as
descriptors, searched, re-ranked, answered and evaluated by the same core as photos.

    museum-search import DESCRIPTORS.npy --items ITEMS.csv -o INDEX [--float16] [--root DIR]
    museum-search import MORE.npy --items MORE.csv -o INDEX --append
    museum-search query INDEX --descriptors Q.npy [-k K] [--json]
    museum-search evaluate INDEX --descriptors Q.npy --ground-truth GT.csv

Formats:

* ``DESCRIPTORS.npy`` / ``Q.npy``: one 2-D numeric array (``numpy.save``), one row per reference
  (or query). Pickles and object arrays are refused and never loaded (``allow_pickle=False``), as
  are NaN or infinite values and rows of zero length. Every row is L2-normalized here (in float64),
  so dot products are cosines, as for the descriptors this program computes. Query descriptors
  must have the index's dimension, and be computed the same way as the index's.
* ``ITEMS.csv``: a header ``path,instance[,metadata…]`` (``file``/``filename`` and ``label`` are
  accepted too), one row per descriptor row, in the same order. Paths are relative to ``--root``
  (default: the folder of ITEMS.csv) or absolute; the files need not exist: thumbnails are shown
  for the ones that do. Further columns (title, artist…) are metadata.
* ``GT.csv``: ``query,instance[,grade]`` where ``query`` is a row of Q.npy, ``row N`` or ``N``
  (0-based); several rows for one query name several relevant instances, an empty instance makes
  an open-set query (its object is not in the collection). Rows of Q.npy not listed are left out.

An imported index records the backbone ``imported`` with the dimension
(:func:`museum_search.core.inference._backbones.imported_meta`): a photo query is refused ("this index holds imported
descriptors: query it with --descriptors"). It is written like a built index: one atomic
generation, the same writer lock and output-folder checks (:mod:`museum_search.core.index._store`), and nothing is written
when an input is refused. Answers to queries given as descriptors are not verified (there is no
photo to match): the verdict uses the cosine (:meth:`museum_search.core.answer._pipeline.QueryPipeline.for_descriptors`).
"""

from __future__ import annotations

import os
import posixpath
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generator

import numpy as np

from museum_search.core.answer import QueryImage, descriptor_query
from museum_search.core.errors import LabelError, MuseumSearchError
from museum_search.core.evaluation import LabelledQuery, QuerySet, read_ground_truth_rows
from museum_search.core.images import NotRegularFileError, open_regular
from museum_search.core.index import (
    CATALOGUE_FILE_COLUMNS,
    CATALOGUE_INSTANCE_COLUMNS,
    K_MAX,
    Index,
    Item,
    LabellingSpec,
    check_output_folder,
    find_column,
    normalize_relpath,
    read_csv_table,
    writer_lock,
)
from museum_search.core.inference import imported_meta
from museum_search.core.jobs._indexing import derive, update_derived
from museum_search.core.progress import Progress, drive

#: The labelling rule recorded in an imported index (its labels come from ITEMS.csv).
RULE = "imported"
#: Stage of :func:`import_index` (``Progress.stage``).
CHECKING = "checking and normalizing the descriptors"
#: Elements converted at a time (float64): bounds the memory of a check to about 32 MB.
_CHUNK = 1 << 22
#: A row whose length differs from 1 by more than this is counted as "not normalized" in the report.
_UNIT = 1e-3


class DescriptorError(MuseumSearchError):
    """A descriptor array cannot be used (not a numeric 2-D array, NaN, zero rows, wrong dimension…)."""


#: The first bytes of every ``.npy`` file (``numpy.lib.format.MAGIC_PREFIX``).
NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def _is_pickle(head: bytes) -> bool:
    """True if ``head`` starts like a pickle (protocol 2 or later: PROTO opcode, protocol number),
    which is what ``numpy.save`` of an object without ``.npy`` format, or ``pickle.dump``, writes."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


# ---- descriptor arrays -------------------------------------------------------------------------


def open_descriptors(path: str | os.PathLike, what: str = "descriptors") -> np.ndarray:
    """The array of a ``.npy`` file, memory-mapped (not checked yet: see :func:`check_descriptors`).

    Never unpickles: a pickle, an object array or a ``.npz`` archive is refused with the reason, as
    is a file that is not a ``.npy`` file at all (it does not start with the ``.npy`` signature),
    and one that is not a regular file (a FIFO, a device: never waited on)."""
    path = Path(path)
    hint = "save one numeric array with numpy.save(FILE, array)"
    try:
        with open(open_regular(path), "rb") as f:
            head = f.read(len(NPY_MAGIC))
    except NotRegularFileError as exc:
        raise DescriptorError(f"{path} is not a regular file ({exc.kind}); {what} must be a .npy file: "
                              f"{hint}") from None
    except FileNotFoundError:
        raise DescriptorError(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise DescriptorError(f"{path} cannot be read ({exc.strerror or exc}); check the file and its "
                              "access rights") from None
    if head != NPY_MAGIC:
        if head.startswith(_ZIP_MAGIC) or zipfile.is_zipfile(path):
            raise DescriptorError(f"{path} is a .npz archive, not one array; {hint}")
        if _is_pickle(head):
            raise DescriptorError(f"{path} holds Python objects (a pickle), which are never loaded (they can "
                                  f"run code); {hint}")
        what_it_is = "it is empty" if not head else "it does not start with the .npy signature \\x93NUMPY"
        raise DescriptorError(f"{path} is not a NumPy .npy file ({what_it_is}); {hint}")
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        text = str(exc)
        if "pickle" in text.lower() or "object" in text.lower():
            raise DescriptorError(f"{path} holds Python objects (a pickle or an object array), which are never "
                                  f"loaded (they can run code); {hint}") from None
        raise DescriptorError(f"{path} is not a valid NumPy .npy file ({text}); {hint}") from None
    except (OSError, EOFError) as exc:
        raise DescriptorError(f"{path} cannot be read as a NumPy .npy array ({exc}); {hint}") from None
    except Exception as exc:  # a damaged header: numpy's parser raises SyntaxError, TokenError, TypeError...
        raise DescriptorError(f"{path} is not a valid NumPy .npy file (its header cannot be read: "
                              f"{type(exc).__name__}); {hint}") from None
    if not isinstance(array, np.ndarray):  # np.load only returns arrays here, but be explicit
        raise DescriptorError(f"{path} is not one NumPy array; {hint}")
    return array


def check_shape(array: np.ndarray, name: str, dim: int | None = None) -> None:
    """Refuse an array that is not a non-empty 2-D numeric array (of ``dim`` columns)."""
    if array.dtype.hasobject:
        raise DescriptorError(f"{name} is an array of Python objects ({array.dtype}); save a numeric array")
    if array.dtype.kind not in "fiu":
        raise DescriptorError(f"{name} has values of type {array.dtype}; descriptors must be numbers "
                              "(float32, float16, float64 or integers)")
    if array.ndim != 2:
        raise DescriptorError(f"{name} must be a 2-D array (one row per descriptor), not of shape "
                              f"{tuple(array.shape)}")
    n, d = array.shape
    if n == 0 or d == 0:
        raise DescriptorError(f"{name} is empty (shape {tuple(array.shape)})")
    if dim is not None and d != dim:
        raise DescriptorError(f"{name} holds {d}-d descriptors, the index holds {dim}-d descriptors; compute "
                              "the queries the same way as the index's descriptors")


def normalized(array: np.ndarray, name: str, dtype: str = "float32"
               ) -> Generator[Progress, None, tuple[np.ndarray, int]]:
    """(L2-normalized copy of ``array`` in ``dtype``, rows that were not of unit length), in chunks
    (yields progress); refuses a NaN or infinite value and a row of zero length, naming the row."""
    check_shape(array, name)
    n, d = array.shape
    out = np.empty((n, d), dtype=dtype)
    step = max(1, _CHUNK // d)
    off_unit = 0
    for lo in range(0, n, step):
        x = np.asarray(array[lo:lo + step], dtype=np.float64)
        finite = np.isfinite(x).all(axis=1)
        if not finite.all():
            row = lo + int(np.flatnonzero(~finite)[0])
            raise DescriptorError(f"{name}: row {row} holds NaN or infinite values; fix or remove such rows")
        norms = np.sqrt(np.einsum("ij,ij->i", x, x))
        bad = ~(norms > 0) | ~np.isfinite(norms)
        if bad.any():
            row = lo + int(np.flatnonzero(bad)[0])
            why = "all zeros" if norms[bad][0] == 0 else "too large to normalize"
            raise DescriptorError(f"{name}: row {row} cannot be L2-normalized (it is {why}); fix or remove it")
        off_unit += int((np.abs(norms - 1.0) > _UNIT).sum())
        out[lo:lo + step] = x / norms[:, None]
        yield Progress(min(n, lo + step), n, name, stage=CHECKING)
    return out, off_unit


def check_descriptors(array: np.ndarray, name: str = "descriptors", dim: int | None = None,
                      dtype: str = "float32") -> np.ndarray:
    """An L2-normalized ``dtype`` copy of a 2-D numeric array (of ``dim`` columns), or a
    :class:`DescriptorError` saying what is wrong (see :func:`normalized`)."""
    array = np.asarray(array)
    check_shape(array, name, dim)
    return drive(normalized(array, name, dtype))[0]


def load_descriptors(path: str | os.PathLike, dim: int | None = None, what: str = "query descriptors") -> np.ndarray:
    """The checked, L2-normalized float32 rows of a ``.npy`` file (see :func:`check_descriptors`)."""
    return check_descriptors(open_descriptors(path, what), str(path), dim)


def descriptor_queries(path: str | os.PathLike, index: Index) -> list[QueryImage]:
    """The rows of ``path`` as queries of ``index``, named ``row 0``, ``row 1``…"""
    rows = load_descriptors(path, index.meta.dim)
    return [descriptor_query(v, f"row {i}") for i, v in enumerate(rows)]


# ---- labelled queries ----------------------------------------------------------------------------


def descriptor_queryset(path: str | os.PathLike, ground_truth: str | os.PathLike, index: Index) -> QuerySet:
    """The labelled queries of ``ground_truth`` (``query,instance[,grade]``, query ``row N`` or
    ``N``) given by the rows of ``path``, in row order. A row number that is not a row of the array
    is an error (naming the line); rows not listed are left out (``QuerySet.ignored``)."""
    rows = load_descriptors(path, index.meta.dim)
    csv_path = Path(ground_truth)
    if not csv_path.exists():
        raise LabelError(f"ground truth not found: {csv_path}; it needs a header query,instance")
    names = [f"row {i}" for i in range(len(rows))]

    def resolve(entry: str, line: int) -> tuple[str, str]:
        text = entry.strip().lower()
        text = text[3:].strip() if text.startswith("row") else text
        if not text.isdigit():
            raise LabelError(f"{csv_path} line {line}: query {entry!r} is not a row of {Path(path).name}; "
                             "write row N or N (N counted from 0)")
        if int(text) >= len(rows):
            raise LabelError(f"{csv_path} line {line}: {entry!r} but {Path(path).name} has {len(rows):,} rows "
                             f"(row 0 to row {len(rows) - 1})")
        return entry.strip(), names[int(text)]

    truth, ignored = read_ground_truth_rows(csv_path, names, resolve)
    queries = []
    for i, name in enumerate(names):
        if name in truth:
            relevant = {k: g for k, g in truth[name].items() if g > 0}
            queries.append(LabelledQuery(name, frozenset(relevant), relevant, row=i))
    if not queries:
        raise LabelError(f"{csv_path} names none of the {len(rows):,} rows of {Path(path).name}")
    return QuerySet("descriptors", str(csv_path.resolve().parent), queries, ignored, descriptors=rows)


# ---- importing -----------------------------------------------------------------------------------


@dataclass
class ImportReport:
    index: Index
    missing: list[str]  # items whose file is not found under the root
    not_unit: int  # rows that were not L2-normalized (their length differed from 1 by > 0.001)
    notices: list[str] = field(default_factory=list)  # what the user should know (missing files...)
    #: the references added (``import --append``: only their files are looked for); None: all of them
    added: int | None = None

    def summary(self) -> str:
        ix = self.index
        dtype = np.asarray(ix.descriptors[:0]).dtype
        looked, new = (len(ix), "") if self.added is None else (self.added, "new ")
        return (f"{len(ix):,} references of {len(ix.instances):,} instances, {ix.meta.dim}-d {dtype}, "
                f"L2-normalized ({self.not_unit:,} row(s) were not of unit length); "
                f"{looked - len(self.missing):,} of {looked:,} {new}files found under {ix.root}")


def read_items(items_csv: str | os.PathLike, root: str | os.PathLike | None = None
               ) -> tuple[Path, list[Item], list[str]]:
    """(root, items, paths of the items whose file is not found) of an ITEMS.csv (see the module
    docstring). Size and time are recorded for the files found (no content hash: none is read)."""
    items_csv = Path(items_csv)
    if not items_csv.exists():
        raise LabelError(f"items file not found: {items_csv}; it needs a header path,instance[,metadata...]")
    root = Path(root) if root is not None else items_csv.resolve().parent
    header, rows, lines = read_csv_table(items_csv)
    path_col = find_column(header, CATALOGUE_FILE_COLUMNS)
    inst_col = find_column(header, CATALOGUE_INSTANCE_COLUMNS)
    if path_col is None or inst_col is None:
        what = "path column (path, file or filename)" if path_col is None else "instance column"
        raise LabelError(f"{items_csv} has no {what} (columns: {', '.join(header)}); use a header like "
                         "path,instance,title,artist")
    meta_cols = [h for h in header if h not in (path_col, inst_col)]
    base = str(root)
    items: list[Item] = []
    seen: dict[str, int] = {}
    missing: list[str] = []
    for line, row in zip(lines, rows):
        raw, instance = row.get(path_col, ""), row.get(inst_col, "")
        if not raw or not instance:
            raise LabelError(f"{items_csv} line {line}: no {'path' if not raw else 'instance'}; every row needs both "
                             "(one row per descriptor row, in the same order)")
        rel = posixpath.normpath(raw.replace("\\", "/")) if os.path.isabs(raw) else normalize_relpath(raw)
        if rel in seen:
            raise LabelError(f"{items_csv} line {line}: {raw} is listed twice (also line {seen[rel]}); one row per "
                             "reference photo")
        seen[rel] = line
        size, mtime = 0, 0.0
        try:
            st = os.stat(os.path.join(base, rel))  # not pathlib: a million rows
            size, mtime = st.st_size, st.st_mtime
        except (OSError, ValueError):
            missing.append(rel)
        items.append(Item(rel, size, mtime, instance, {c: row[c] for c in meta_cols if row.get(c)}))
    if not items:
        raise LabelError(f"{items_csv} lists no items; it needs one row per descriptor row")
    return root, items, missing


def _rows_of_items(descriptors: str | os.PathLike | np.ndarray, name: str, items_csv: Path, n_items: int,
                   dtype: str, dim: int | None = None) -> Generator[Progress, None, tuple[np.ndarray, int]]:
    """The descriptors (a ``.npy`` path or an array), checked (2-D, numeric, ``dim`` columns, one row
    per item of ``items_csv``) and L2-normalized in ``dtype``: ``(rows, how many were not of unit
    length)``; a refusal says that nothing was written."""
    try:
        array = descriptors if isinstance(descriptors, np.ndarray) else open_descriptors(descriptors)
        check_shape(array, name, dim)
        if len(array) != n_items:
            raise DescriptorError(f"{name} has {len(array):,} rows but {items_csv.name} lists {n_items:,} items "
                                  "(one row per descriptor row, in the same order)")
        return (yield from normalized(array, name, dtype))
    except DescriptorError as exc:
        raise DescriptorError(f"{exc}; nothing was written") from None


def import_index(descriptors: str | os.PathLike | np.ndarray, items_csv: str | os.PathLike,
                 out: str | os.PathLike, *, float16: bool = False, root: str | os.PathLike | None = None,
                 ann: str = "auto", neighbours: int = K_MAX) -> Generator[Progress, None, ImportReport]:
    """Write an index of descriptors computed elsewhere (a ``.npy`` file or an array) labelled by
    ``items_csv`` to ``out`` (see the module docstring); yields progress while it checks them.

    Every input is checked before anything is written: the output folder (as ``index`` checks it:
    a new or empty folder, or a museum-search index, never the collection), the items, and the
    array (2-D, numeric, one row per item, finite, no zero row). What the index derives from the
    descriptors is then computed (:func:`.index.derive`: ``neighbours`` lists, and the approximate
    index per ``ann``), and the index is saved as one atomic generation under the writer lock; a
    refused input or a cancel leaves ``out`` untouched.
    """
    items_csv = Path(items_csv)
    name = str(descriptors) if not isinstance(descriptors, np.ndarray) else "the descriptor array"
    root, items, missing = read_items(items_csv, root)
    check_output_folder(out, root)
    dtype = "float16" if float16 else "float32"
    desc, not_unit = yield from _rows_of_items(descriptors, name, items_csv, len(items), dtype)
    spec = LabellingSpec(RULE, str(items_csv.resolve()))
    index = Index(root, imported_meta(desc.shape[1]), items, desc, spec)
    with writer_lock(out, collection=root):
        yield from derive(index, ann=ann, neighbours=neighbours)
        index.save(out, dtype=dtype)
    notices = []
    if missing:
        notices.append(f"{len(missing):,} of {len(items):,} files were not found under {root} (e.g. "
                       f"{missing[0]}): they have no thumbnails")
    notices.append("answers of this index are not verified (it is queried with --descriptors, without a photo "
                   "to match): the verdict uses the cosine")
    return ImportReport(index, missing, not_unit, notices)


def append_to_index(descriptors: str | os.PathLike | np.ndarray, items_csv: str | os.PathLike,
                    index_dir: str | os.PathLike, *, root: str | os.PathLike | None = None,
                    ann: str = "auto") -> Generator[Progress, None, ImportReport]:
    """Add descriptors computed elsewhere, labelled by ``items_csv``, to the imported index in
    ``index_dir`` (``import --append``), without building it again: its approximate index gets the
    new references (:meth:`museum_search.core.index.AnnIndex.updated`, not trained again) and only the neighbour lists
    the new references enter are computed again (:func:`museum_search.core.jobs._indexing.update_derived`).

    The items' paths are relative to the index's own root (``root``, if given, must be it); a path
    the index already holds, a row count that differs from the items, a dimension that differs from
    the index's, or an index of photos is refused and nothing is written. The rows are stored in
    the index's dtype; the save is one atomic generation under the writer lock.
    """
    index = Index.load(Path(index_dir))
    if not index.meta.imported:
        raise MuseumSearchError(f"{index_dir} is an index of photos: put the new photos in its collection folder "
                                "and run `museum-search update`; --append adds to an imported index")
    if root is not None and Path(root).resolve() != Path(index.root).resolve():
        raise MuseumSearchError(f"the references of {index_dir} are relative to {index.root}; leave out --root (or "
                                "give that folder) and list the new paths relative to it, or absolute")
    items_csv = Path(items_csv)
    name = str(descriptors) if not isinstance(descriptors, np.ndarray) else "the descriptor array"
    _, items, missing = read_items(items_csv, index.root)
    held = {it.path for it in index.items}
    again = [it.path for it in items if it.path in held]
    if again:
        raise LabelError(f"{items_csv} lists {len(again):,} path(s) the index already holds (e.g. {again[0]}); "
                         "to replace references, import the whole collection again; nothing was written")
    dtype = str(np.asarray(index.descriptors[:0]).dtype)
    desc, not_unit = yield from _rows_of_items(descriptors, name, items_csv, len(items), dtype, index.meta.dim)
    assert index.path is not None  # loaded from a folder
    with writer_lock(index.path, collection=index.root):
        combined = np.concatenate([np.asarray(index.descriptors), desc]).astype(dtype, copy=False)
        updated = Index(index.root, index.meta, [*index.items, *items], combined, index.labelling, index.created,
                        path=index.path, verdict=index.verdict)
        yield from update_derived(updated, index, list(range(len(index))), ann)
        updated.save(index.path)
    notices = []
    if missing:
        notices.append(f"{len(missing):,} of the {len(items):,} new files were not found under {index.root} (e.g. "
                       f"{missing[0]}): they have no thumbnails")
    return ImportReport(updated, missing, not_unit, notices, added=len(items))
