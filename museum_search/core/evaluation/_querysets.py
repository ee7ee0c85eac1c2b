"""Labelled query sets for evaluation.

Layouts:

- ``clicide``: ``test/<label>-<k>.JPG`` under the CLICIDE root (or the ``test/`` folder itself);
  wall images are dropped.
- ``garofou``: ``TEST_I/<F>_<NNN>_<VV>.jpg`` under the GaRoFou root (or the ``TEST_I/`` folder itself).
- ``folder``: one subfolder per instance.
- ``csv``: a ``ground_truth.csv`` with ``query,instance[,grade]``; several rows for one query = several
  relevant instances; an empty instance = an open-set query (its object is not in the collection);
  ``grade``/``relevance`` 0..3 for graded relevance (default 1).
- ``regex``: a regular expression with a group ``instance`` searched in the relative path.
- ``descriptors``: queries given as descriptors, rows of an array, with a ground truth like the
  CSV's whose query column names rows (:func:`museum_search.core.jobs._importing.descriptor_queryset`).

Filename rules are those of :mod:`museum_search.core.index._labels`, so queries and references agree.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable

import numpy as np

from museum_search.core.errors import LabelError
from museum_search.core.index import (
    CATALOGUE_INSTANCE_COLUMNS,
    CLICIDE_QUERY_FOLDER,
    GAROFOU_QUERY_FOLDER,
    HIDDEN_REASON,
    compile_regex,
    detect_name_rule,
    find_column,
    is_folder_layout,
    is_hidden_path,
    label_file,
    normalize_relpath,
    read_csv_table,
    scan_images,
    split_unusable,
    summarize_ignored,
)

log = logging.getLogger(__name__)

LAYOUTS = ("auto", "clicide", "garofou", "folder", "csv", "regex")

LAYOUT_NAMES = {
    "clicide": "CLICIDE layout",
    "garofou": "GaRoFou layout",
    "folder": "Folder-per-instance layout",
    "csv": "CSV ground truth",
    "regex": "Regular expression",
    "descriptors": "Query descriptors",
}

GROUND_TRUTH_NAME = "ground_truth.csv"
QUERY_COLUMNS = ("query", "file", "path", "filename", "image")
GRADE_COLUMNS = ("grade", "relevance")
MAX_GRADE = 3
_GRADE = re.compile(r"^(\d+)(?:\.0*)?$")


@dataclass(frozen=True)
class LabelledQuery:
    path: str  # absolute path of the query image (``row N`` for a query given as a descriptor)
    relevant: frozenset[str]  # instance ids; empty = open-set query
    grades: dict[str, int] = field(default_factory=dict, hash=False)  # 1..3 per relevant instance
    row: int | None = None  # a query given as a descriptor: its row in ``QuerySet.descriptors``

    @property
    def is_open_set(self) -> bool:
        return not self.relevant


@dataclass
class QuerySet:
    layout: str
    root: str
    queries: list[LabelledQuery]
    ignored: list[tuple[str, str]]  # (path relative to root, reason)
    #: queries given as descriptors: (N, D) L2-normalized rows, ``LabelledQuery.row`` of each (else None)
    descriptors: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_open_set(self) -> int:
        """Queries with no relevant instance (their object is not in the collection)."""
        return sum(1 for q in self.queries if not q.relevant)

    @property
    def n_instances(self) -> int:
        """Distinct instances relevant to at least one query."""
        return len(self.instances)

    @property
    def instances(self) -> set[str]:
        return {i for q in self.queries for i in q.relevant}

    @property
    def n_multi(self) -> int:
        """Queries with more than one relevant instance."""
        return sum(1 for q in self.queries if len(q.relevant) > 1)

    def unknown_instances(self, instances: Iterable[str]) -> list[str]:
        """Sorted instances named by the ground truth that are not in ``instances`` (the index's).

        Unlike open-set queries (ground truth explicitly empty), these are likely typos in the
        ground truth or a query set meant for another index.
        """
        keep = set(instances)
        return sorted(self.instances - keep)

    def n_unknown_queries(self, instances: Iterable[str]) -> int:
        """Queries naming at least one instance that is not in ``instances``."""
        keep = set(instances)
        return sum(1 for q in self.queries if q.relevant - keep)

    def unknown_instances_note(self, instances: Iterable[str], limit: int = 5) -> str | None:
        """The warning for the user when the ground truth names instances not in ``instances``
        (see :func:`unknown_instances_note`), else None."""
        keep = set(instances)
        names = self.unknown_instances(keep)
        if not names:
            return None
        excluded = sum(1 for q in self.queries if q.relevant and not q.relevant & keep)
        return unknown_instances_note(self.n_unknown_queries(keep), names, excluded, limit)

    def restricted_to(self, instances: Iterable[str]) -> QuerySet:
        """A copy where instances not in ``instances`` (the collection) are no longer relevant.

        Queries left without a relevant instance look like open-set queries; use
        :meth:`unknown_instances` to tell them apart (the runner reports them separately).
        """
        keep = set(instances)
        queries = [
            LabelledQuery(
                q.path,
                frozenset(q.relevant & keep),
                {i: g for i, g in q.grades.items() if i in keep},
                q.row,
            )
            for q in self.queries
        ]
        return QuerySet(self.layout, self.root, queries, list(self.ignored), self.descriptors)

    def summary(self) -> str:
        """One line, e.g. ``ground_truth.csv: 30 queries over 33 instances (9 with several relevant instances)``."""
        n, k = len(self.queries), self.n_instances
        name = LAYOUT_NAMES.get(self.layout, self.layout)
        text = f"{name}: {n:,} quer{'ies' if n != 1 else 'y'} over {k:,} instance{'s' if k != 1 else ''}"
        notes = []
        if self.n_multi:
            notes.append(f"{self.n_multi:,} with several relevant instances")
        if self.n_open_set:
            notes.append(f"{self.n_open_set:,} open-set (object not in the collection)")
        if self.ignored:
            notes.append(summarize_ignored(self.ignored))
        if notes:
            text += f" ({'; '.join(notes)})"
        return text


def unknown_instances_note(n_queries: int, names: list[str], excluded: int | None = None, limit: int = 5) -> str:
    """One line for the user about ground-truth instances missing from the index, e.g.
    ``3 queries name 2 instances not in this index: guernica, monna — check the ground truth or
    the index (not averaged: 2 queries)``; ``limit`` names are shown, then a count of the others."""
    shown = ", ".join(names[:limit])
    if len(names) > limit:
        shown += f"… (+{len(names) - limit:,} more)"
    q = "query names" if n_queries == 1 else "queries name"
    text = (f"{n_queries:,} {q} {len(names):,} instance{'s' if len(names) != 1 else ''} not in this index: "
            f"{shown} — check the ground truth or the index")
    if excluded:
        text += f" (not averaged: {excluded:,} quer{'ies' if excluded != 1 else 'y'})"
    return text


# --------------------------------------------------------------------------- helpers


def _subfolder(path: Path, name: str, files: list[str] | None) -> str | None:
    """The actual spelling of the first-level folder ``name`` (case-insensitive) in path or files."""
    if files is not None:
        for f in files:
            parts = PurePosixPath(f).parts
            if len(parts) > 1 and parts[0].lower() == name.lower():
                return parts[0]
        return None
    if path.is_dir():
        for child in sorted(path.iterdir()):
            if child.is_dir() and child.name.lower() == name.lower():
                return child.name
    return None


def _list(path: Path, files: list[str] | None, sub: str | None) -> tuple[Path, list[str], list[tuple[str, str]]]:
    """Query root, its usable image files (relative POSIX paths) and the unusable ones with a reason
    (name not UTF-8, broken link...); ``sub`` is a subfolder holding them."""
    root = path / sub if sub else path
    if files is None:
        return (root, *scan_images(root))
    if sub is not None:
        prefix = sub + "/"
        files = [f[len(prefix):] for f in files if f.startswith(prefix)]
    return (root, *split_unusable(root, files))


def _name_rule(rels: list[str]) -> str | None:
    return detect_name_rule(r for r in rels if not is_hidden_path(r))


def _detect(path: Path, files: list[str] | None) -> str:
    if (path.is_file() and path.suffix.lower() == ".csv") or (path / GROUND_TRUTH_NAME).is_file():
        return "csv"
    if path.name.lower() == GAROFOU_QUERY_FOLDER.lower() or _subfolder(path, GAROFOU_QUERY_FOLDER, files):
        return "garofou"
    test = _subfolder(path, CLICIDE_QUERY_FOLDER, files)
    if test is not None and _name_rule(_list(path, files, test)[1]) == "clicide":
        return "clicide"
    rels = _list(path, files, None)[1]
    rule = _name_rule(rels)
    if rule is not None:
        return rule
    if is_folder_layout(r for r in rels if not is_hidden_path(r)):
        return "folder"
    raise LabelError(
        f"Could not recognise the query set layout of {path}: put a {GROUND_TRUTH_NAME} with query,instance "
        "columns in the folder, use one subfolder per instance, or choose a layout (or a regex)."
    )


def _read_ground_truth(
    csv_path: Path, rels: list[str], unusable: Iterable[str] = ()
) -> tuple[dict[str, dict[str, int]], list[tuple[str, str]]]:
    """Per query file (relative path): {instance: grade} (empty = open-set), plus ignored entries.

    ``unusable``: query files already ignored with their reason (not reported again).
    """
    by_rel = set(rels)
    by_name: dict[str, list[str]] = {}
    for rel in rels:
        by_name.setdefault(PurePosixPath(rel).name, []).append(rel)

    def resolve(cell: str, line: int) -> tuple[str, str | None]:
        entry = normalize_relpath(cell)
        rel = entry if entry in by_rel else None
        if rel is None and len(by_name.get(PurePosixPath(entry).name, [])) == 1:
            rel = by_name[PurePosixPath(entry).name][0]
        return entry, rel

    return read_ground_truth_rows(csv_path, rels, resolve, unusable)


def read_ground_truth_rows(
    csv_path: Path, names: list[str], resolve: Callable[[str, int], tuple[str, str | None]],
    unusable: Iterable[str] = (),
) -> tuple[dict[str, dict[str, int]], list[tuple[str, str]]]:
    """Per query name: {instance: grade} (empty = open-set), plus ignored entries, of a ground truth
    ``query,instance[,grade]`` over the queries ``names``.

    ``resolve(cell, line)``: (the query cell as shown, the name of the query it designates, or None
    when there is no such query: ignored) or an error; ``unusable``: entries already ignored.
    """
    header, rows, lines = read_csv_table(csv_path)
    q_col = find_column(header, QUERY_COLUMNS)
    i_col = find_column(header, CATALOGUE_INSTANCE_COLUMNS)
    g_col = find_column(header, GRADE_COLUMNS)
    if q_col is None or i_col is None:
        missing = "'query' column" if q_col is None else "'instance' column"
        raise LabelError(
            f"{csv_path} has no {missing} (columns: {', '.join(header)}). "
            "Use a header like query,instance (optionally grade)."
        )
    truth: dict[str, dict[str, int]] = {}
    ignored: list[tuple[str, str]] = []
    missing_files: set[str] = set(unusable)
    for line, row in zip(lines, rows):
        if not row.get(q_col, ""):
            continue
        entry, rel = resolve(row[q_col], line)
        if not entry:
            continue
        if rel is None:
            if entry not in missing_files:
                missing_files.add(entry)
                ignored.append((entry, f"listed in {csv_path.name} but no such image"))
            continue
        grades = truth.setdefault(rel, {})
        instance = row.get(i_col, "")
        if not instance:
            continue  # open-set row: the query exists, its object is not in the collection
        grade = 1
        raw = row.get(g_col, "") if g_col else ""
        if raw:
            m = _GRADE.match(raw)
            grade = int(m.group(1)) if m else -1
            if not 0 <= grade <= MAX_GRADE:
                raise LabelError(
                    f"{csv_path} line {line}: {g_col} {raw!r} is not a whole number from 0 to {MAX_GRADE}; "
                    "fix the value (0 = not relevant, 1 = relevant, 3 = highly relevant)."
                )
        grades[instance] = max(grade, grades.get(instance, 0))
    for name in names:
        if name not in truth:
            ignored.append((name, f"not listed in {csv_path.name}"))
    return truth, ignored


# --------------------------------------------------------------------------- entry point


def load_queryset(
    path: str | os.PathLike,
    layout: str = "auto",
    regex: str | re.Pattern | None = None,
    files: Iterable[str] | None = None,
) -> QuerySet:
    """Load the labelled queries at ``path`` (a folder, or a ground_truth.csv file).

    ``files``: relative paths (to ``path``) of the query images instead of walking the folder.
    ``layout="auto"`` uses ``regex`` when given, else detects the layout; ``QuerySet.layout`` says which.
    """
    if layout not in LAYOUTS:
        raise LabelError(f"Unknown query set layout {layout!r}; choose one of {', '.join(LAYOUTS)}.")
    path = Path(path)
    file_list = None if files is None else sorted({normalize_relpath(f) for f in files} - {""})
    if file_list is None and not path.exists():
        raise LabelError(f"Query set not found: {path}. Choose a folder of query photos.")
    if layout == "auto":
        layout = "regex" if regex is not None else _detect(path, file_list)
        log.info("query set %s: detected layout %s", path, layout)

    csv_path = None
    if layout == "csv":
        csv_path = path if path.suffix.lower() == ".csv" else path / GROUND_TRUTH_NAME
        if not csv_path.is_file():
            raise LabelError(
                f"{csv_path} not found. Put a {GROUND_TRUTH_NAME} (query,instance) next to the query photos."
            )
        path = csv_path.parent
        root, rels, unusable = _list(path, file_list, None)
    elif layout in ("clicide", "garofou"):
        folder = CLICIDE_QUERY_FOLDER if layout == "clicide" else GAROFOU_QUERY_FOLDER
        sub = None if path.name.lower() == folder.lower() else _subfolder(path, folder, file_list)
        root, rels, unusable = _list(path, file_list, sub)
    else:
        root, rels, unusable = _list(path, file_list, None)

    ignored = list(unusable) + [(r, HIDDEN_REASON) for r in rels if is_hidden_path(r)]
    rels = [r for r in rels if not is_hidden_path(r)]
    if not rels:
        example = (f" ({len(unusable):,} unusable file{'s' if len(unusable) != 1 else ''}, e.g. "
                   f"{unusable[0][0]}: {unusable[0][1]})" if unusable else "")
        raise LabelError(
            f"No query images found in {root}{example}. Choose the folder that holds the query photos."
        )

    def absolute(rel: str) -> str:
        return os.path.abspath(root / rel)

    queries: list[LabelledQuery] = []
    if layout == "csv":
        assert csv_path is not None  # set above for the csv layout
        truth, more = _read_ground_truth(csv_path, rels, [p for p, _ in unusable])
        ignored.extend(more)
        for rel, grades in truth.items():
            relevant = {i: g for i, g in grades.items() if g > 0}
            queries.append(LabelledQuery(absolute(rel), frozenset(relevant), relevant))
    else:
        pattern = compile_regex(regex) if layout == "regex" else None
        for rel in rels:
            instance, reason = label_file(layout, rel, pattern)
            if instance is None:
                assert reason is not None  # label_file gives a reason for every file it ignores
                ignored.append((rel, reason))
            else:
                queries.append(LabelledQuery(absolute(rel), frozenset({instance}), {instance: 1}))

    if not queries:
        example = f" (e.g. {ignored[0][0]}: {ignored[0][1]})" if ignored else ""
        raise LabelError(
            f"No query in {root} could be labelled with the {layout} layout{example}. "
            "Choose another layout or fix the file names/ground truth."
        )
    queries.sort(key=lambda q: q.path)
    ignored.sort()
    return QuerySet(layout=layout, root=os.path.abspath(root), queries=queries, ignored=ignored)
