"""Instance labels (and optional metadata) of the reference images of a collection folder.

A *labelling rule* turns the relative path of each reference image into an instance id:

- ``catalogue``: a CSV ``file,instance,...`` (further columns are metadata such as artist and title);
- ``folder``: one first-level subfolder per instance;
- ``clicide``: CLICIDE names ``<label>-<k>.JPG`` (``<room>wall-<k>.JPG`` wall images are dropped);
- ``garofou``: GaRoFou names ``<floor>_<NNN>_<VV>.jpg`` → ``<floor>_<NNN>`` (references under ``TRAIN_I/``);
- ``regex``: a user regular expression with a named group ``instance`` (or a first group);
- ``none``: an unlabelled collection, each image is its own instance (label = file stem).

``auto`` picks one of them from what is on disk. The filename rules here are shared with
``museum_search.core.evaluation._querysets`` so that references and queries are labelled the same way.
"""

from __future__ import annotations

import csv
import errno
import logging
import os
import posixpath
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from museum_search.core.errors import LabelError
from museum_search.core.images import (
    SUPPORTED_EXTENSIONS,
    NotRegularFileError,
    file_kind,
    is_image_file,
    not_regular_reason,
    open_regular,
)

log = logging.getLogger(__name__)

RULES = ("auto", "catalogue", "folder", "clicide", "garofou", "regex", "none")

RULE_NAMES = {
    "catalogue": "Catalogue",
    "folder": "Folder-per-instance layout",
    "clicide": "CLICIDE layout",
    "garofou": "GaRoFou layout",
    "regex": "Regular expression",
    "none": "Unlabelled collection",
}

#: CLICIDE: ``<room number><letters>-<k>.JPG``, e.g. ``10A-0.JPG``; ``10wall-3.JPG`` is a wall image.
CLICIDE_REGEX = r"^(?P<instance>\d+[A-Za-z]+\d*)-(?P<view>\d+)\.[A-Za-z0-9]+$"
#: GaRoFou: ``<floor letter>_<object NNN>_<view VV>.jpg``, instance = ``<floor>_<object>``.
GAROFOU_REGEX = r"^(?P<instance>[A-Z]_\d{3})_(?P<view>\d{2})\.[A-Za-z0-9]+$"
#: COIL-100: ``objN__A.jpg`` (N = object 1..100, A = turntable angle); use with ``rule="regex"``.
COIL100_REGEX = r"(?:^|/)obj(?P<instance>\d+)__(?P<angle>\d+)\.[A-Za-z0-9]+$"

_CLICIDE = re.compile(CLICIDE_REGEX)
_GAROFOU = re.compile(GAROFOU_REGEX)

WALL_REASON = "wall image without an object (CLICIDE convention)"
HIDDEN_REASON = "hidden file (e.g. macOS ._ metadata), not a photo"
# Files no labelling rule can use (the path beside the reason is printable, see printable_path).
NON_UTF8_FILE_REASON = "file name is not valid UTF-8 (bytes shown as \\xNN); rename the file"
NON_UTF8_FOLDER_REASON = "folder name is not valid UTF-8 (bytes shown as \\xNN); rename the folder"
BROKEN_LINK_REASON = "broken symbolic link: its target does not exist; fix or remove the link"
LOOPING_LINK_REASON = "broken symbolic link: it loops back on itself; fix or remove the link"
FOLDER_REASON = "this is a folder, not an image file"
#: A catalogue row naming a file outside the collection folder (``../x.jpg``, an absolute path, a
#: path through a symbolic link that leads out): only images inside the collection are indexed.
OUTSIDE_REASON = ("outside the collection: {catalogue} names a file that is not in the collection folder; "
                  "move the image into the collection or fix the row")

#: Share of file names that must follow a dataset naming scheme for ``auto`` to choose it.
DETECT_SHARE = 0.9

CATALOGUE_NAMES = ("catalogue.csv", "catalog.csv")
CATALOGUE_FILE_COLUMNS = ("file", "path", "filename")
CATALOGUE_INSTANCE_COLUMNS = ("instance", "label")

#: First-level folders of a collection that hold query photos, never references (lower case).
QUERY_FOLDERS = frozenset({"queries", "test", "test_i"})
CLICIDE_QUERY_FOLDER = "test"
GAROFOU_QUERY_FOLDER = "TEST_I"
GAROFOU_REFERENCE_FOLDER = "TRAIN_I"


@dataclass(frozen=True)
class Reference:
    path: str  # POSIX path relative to the collection root
    instance: str
    metadata: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass
class Labelling:
    rule: str
    references: list[Reference]
    ignored: list[tuple[str, str]]  # (relative path, reason)

    @property
    def instances(self) -> list[str]:
        """Sorted distinct instance ids."""
        return sorted({r.instance for r in self.references})

    @property
    def n_instances(self) -> int:
        return len({r.instance for r in self.references})


# --------------------------------------------------------------------------- filename rules


def clicide_label(name: str) -> str | None:
    """The CLICIDE label of a file name (``10A-0.JPG`` → ``10A``; walls give ``10wall``), else None."""
    m = _CLICIDE.match(PurePosixPath(name).name)
    return m.group("instance") if m else None


def is_clicide_wall(label: str) -> bool:
    """True for CLICIDE wall labels (``<room>wall``): images of a wall without an object."""
    return label.lower().endswith("wall")


def garofou_label(name: str) -> str | None:
    """The GaRoFou instance of a file name (``A_001_02.jpg`` → ``A_001``), else None."""
    m = _GAROFOU.match(PurePosixPath(name).name)
    return m.group("instance") if m else None


def compile_regex(regex: str | re.Pattern | None) -> re.Pattern:
    """Compile a user regex for the ``regex`` rule; LabelError if unusable."""
    if regex is None or (isinstance(regex, str) and not regex.strip()):
        raise LabelError(
            "The regex rule needs a regular expression with a group named 'instance', "
            r"e.g. obj(?P<instance>\d+)__ ; enter one or choose another labelling rule."
        )
    if isinstance(regex, re.Pattern):
        pattern = regex
    else:
        try:
            pattern = re.compile(regex)
        except re.error as exc:
            raise LabelError(
                f"Invalid regular expression {regex!r}: {exc}. Fix it, e.g. obj(?P<instance>\\d+)__ ."
            ) from exc
    if pattern.groups == 0:
        raise LabelError(
            f"The regular expression {pattern.pattern!r} has no group: put the instance part in "
            r"(?P<instance>...) or in parentheses, e.g. obj(?P<instance>\d+)__ ."
        )
    return pattern


def regex_label(pattern: re.Pattern, relpath: str) -> str | None:
    """The instance matched by ``pattern`` (searched in the POSIX relative path), else None."""
    m = pattern.search(relpath)
    if not m:
        return None
    value = m.group("instance") if "instance" in pattern.groupindex else m.group(1)
    return value or None


def folder_label(relpath: str) -> str | None:
    """The first-level folder of a relative path (folder-per-instance), None for a loose file."""
    parts = PurePosixPath(relpath).parts
    return parts[0] if len(parts) > 1 else None


def label_file(rule: str, relpath: str, pattern: re.Pattern | None = None) -> tuple[str, None] | tuple[None, str]:
    """Apply a filename rule (``folder``, ``clicide``, ``garofou``, ``regex``, ``none``) to one path.

    Returns ``(instance, None)`` or ``(None, reason the file is ignored)``.
    """
    if rule == "none":
        return PurePosixPath(relpath).stem, None
    if rule == "folder":
        label = folder_label(relpath)
        return (label, None) if label else (None, "not in a subfolder (folder-per-instance layout)")
    if rule == "clicide":
        label = clicide_label(relpath)
        if label is None:
            return None, "name does not follow CLICIDE <label>-<k>.JPG"
        if is_clicide_wall(label):
            return None, WALL_REASON
        return label, None
    if rule == "garofou":
        label = garofou_label(relpath)
        return (label, None) if label else (None, "name does not follow GaRoFou <F>_<NNN>_<VV>.jpg")
    if rule == "regex":
        if pattern is None:
            raise LabelError("The regex rule needs a regular expression; enter one.")
        label = regex_label(pattern, relpath)
        return (label, None) if label else (None, f"does not match the regular expression {pattern.pattern!r}")
    raise LabelError(f"Unknown labelling rule {rule!r}; choose one of {', '.join(RULES)}.")


def detect_name_rule(relpaths: Iterable[str]) -> str | None:
    """``garofou`` or ``clicide`` if at least 90 % of the file names follow that scheme, else None."""
    names = [PurePosixPath(p).name for p in relpaths]
    if not names:
        return None
    for rule, matcher in (("garofou", garofou_label), ("clicide", clicide_label)):
        if sum(matcher(n) is not None for n in names) >= DETECT_SHARE * len(names):
            return rule
    return None


def is_folder_layout(relpaths: Iterable[str]) -> bool:
    """True if every file is in a subfolder and there are at least two subfolders."""
    folders = set()
    for p in relpaths:
        label = folder_label(p)
        if label is None:
            return False
        folders.add(label)
    return len(folders) >= 2


# --------------------------------------------------------------------------- listing files


def is_hidden_path(relpath: str) -> bool:
    """True if any part of the relative path starts with a dot (``._x.jpg``, ``.cache/x.jpg``)."""
    return any(part.startswith(".") for part in PurePosixPath(relpath).parts)


def normalize_relpath(path: str | os.PathLike) -> str:
    """A relative path as normalized POSIX text (backslashes accepted)."""
    text = os.fspath(path).replace("\\", "/")
    text = posixpath.normpath(text)
    return "" if text == "." else text.lstrip("/")


def is_utf8_path(path: str) -> bool:
    """False for a name holding bytes that are not UTF-8 (Python keeps them as lone surrogates)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_path(path: str) -> str:
    """``path`` as text that can be shown, logged and written as UTF-8: bytes that are not UTF-8
    (surrogate-escaped by Python, e.g. ``b"bad\\xff.jpg"``) appear as ``\\xff``."""
    if is_utf8_path(path):
        return path
    try:
        return os.fsencode(path).decode("utf-8", "backslashreplace")
    except UnicodeError:  # a lone surrogate that is not an escaped byte
        return path.encode("utf-8", "backslashreplace").decode("utf-8")


def file_problem(root: str | os.PathLike, relpath: str) -> str | None:
    """Why the image file ``relpath`` of ``root`` is unusable whatever the labelling rule, else None.

    A name that is not UTF-8 cannot be stored in an index or a report; a dangling or looping
    symbolic link cannot be read (or even stat'ed); a FIFO, socket or device named like a photo
    is not a regular file (reading it would block or never end). Links to existing files are fine.
    """
    if not is_utf8_path(relpath):
        return NON_UTF8_FILE_REASON if not is_utf8_path(PurePosixPath(relpath).name) else NON_UTF8_FOLDER_REASON
    full = os.path.join(root, relpath)
    try:
        st = os.stat(full)
    except OSError as exc:
        if not os.path.islink(full):
            return None  # vanished meanwhile, or unreadable: the reader reports it
        if exc.errno == errno.ELOOP:
            return LOOPING_LINK_REASON
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return BROKEN_LINK_REASON
        return f"broken symbolic link ({exc.strerror or exc}); fix or remove the link"
    kind = file_kind(st.st_mode)
    if kind is None:
        return None
    return FOLDER_REASON if kind == "a folder" else not_regular_reason(kind)


def split_unusable(root: str | os.PathLike, relpaths: Iterable[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """``relpaths`` without the unusable files (:func:`file_problem`), and those as (printable path, reason)."""
    ok: list[str] = []
    bad: list[tuple[str, str]] = []
    for rel in relpaths:
        reason = file_problem(root, rel)
        if reason is None:
            ok.append(rel)
        else:
            bad.append((printable_path(rel), reason))
    return ok, bad


def scan_images(
    root: str | os.PathLike, exclude_first_level: Iterable[str] = ()
) -> tuple[list[str], list[tuple[str, str]]]:
    """Image files under ``root``, recursively: (sorted usable POSIX relative paths, ignored).

    ``ignored``: (printable relative path, reason) for image files no rule can use (name not UTF-8,
    broken or looping symbolic link, not a regular file, see :func:`file_problem`) and for
    subfolders that cannot be read.
    First-level folders whose lower-cased name is in ``exclude_first_level`` are skipped.
    Hidden folders are skipped; hidden files are listed (callers report them as ignored).
    """
    root = Path(root)
    if not root.is_dir():
        raise LabelError(f"Folder not found: {root}. Choose an existing folder of photos.")
    excluded = {e.lower() for e in exclude_first_level}
    unreadable: list[tuple[str, str]] = []

    def on_error(exc: OSError) -> None:
        where = exc.filename if exc.filename is not None else root
        rel = normalize_relpath(os.path.relpath(where, root)) if str(where) != str(root) else ""
        if not rel:
            raise LabelError(f"Cannot read the folder {root}: {exc.strerror or exc}. Check its permissions.")
        reason = f"folder cannot be read ({exc.strerror or exc}); check its permissions"
        unreadable.append((printable_path(rel), reason))

    found = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=on_error):
        rel_dir = Path(dirpath).relative_to(root)
        top = rel_dir == Path(".")
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and not (top and d.lower() in excluded)
        )
        for name in filenames:
            if is_image_file(name):
                found.append((rel_dir / name).as_posix() if not top else name)
    ok, bad = split_unusable(root, sorted(found))
    return ok, sorted(bad + unreadable)


def _in_query_folder(relpath: str) -> bool:
    parts = PurePosixPath(relpath).parts
    return len(parts) > 1 and parts[0].lower() in QUERY_FOLDERS


def _collection_files(root: Path, files: Iterable[str] | None) -> tuple[list[str], list[tuple[str, str]]]:
    """Usable reference files (relative paths) and the ignored ones with their reason."""
    if files is None:
        return scan_images(root, QUERY_FOLDERS)
    rels = sorted({normalize_relpath(f) for f in files} - {""})
    return split_unusable(root, [p for p in rels if not _in_query_folder(p)])


# --------------------------------------------------------------------------- catalogue


def find_catalogue(root: str | os.PathLike) -> Path | None:
    """``<root>/catalogue.csv`` or ``<root>/../catalogue.csv`` if one exists.

    One that is not a regular file (a FIFO...) is returned too: reading it is then refused with
    the reason (:func:`read_csv_table`), rather than the catalogue being ignored without a word."""
    root = Path(root)
    for folder in (root, root.parent):
        for name in CATALOGUE_NAMES:
            candidate = folder / name
            if candidate.exists() and not candidate.is_dir():
                return candidate
    return None


def find_column(header: Iterable[str], names: Iterable[str]) -> str | None:
    """The first header entry equal (case- and space-insensitively) to one of ``names``."""
    lookup = {h.strip().lower(): h for h in header if h is not None}
    for name in names:
        if name in lookup:
            return lookup[name]
    return None


def read_csv_table(path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]], list[int]]:
    """Header, rows and the line (in the file) where each row starts, of a small CSV.

    UTF-8 with or without BOM; ``,`` ``;`` or tab separated (the most frequent in the first line).
    Quoted cells may hold the delimiter and line breaks (kept, as ``\\n``); cells are stripped,
    missing cells are empty, cells beyond the header are dropped, blank lines are skipped.
    Only a regular file is read: a FIFO, socket or device is refused (never waited on).
    """
    path = Path(path)
    line = 0
    try:
        with open(open_regular(path), encoding="utf-8-sig", newline="") as f:
            first = f.readline()
            delimiter = max((",", ";", "\t"), key=first.count) if first.strip() else ","
            f.seek(0)
            reader = csv.reader(f, delimiter=delimiter)
            header = [h.strip() for h in next(reader, [])]
            if not header:
                raise LabelError(f"{path} is empty; it needs a header line and one row per image.")
            rows: list[dict[str, str]] = []
            lines: list[int] = []
            while True:
                line = reader.line_num + 1
                row = next(reader, None)
                if row is None:
                    break
                if row:
                    rows.append({h: _cell(row[i]) if i < len(row) else "" for i, h in enumerate(header)})
                    lines.append(line)
    except UnicodeDecodeError as exc:
        raise LabelError(f"{path} is not UTF-8 text ({exc}); save it as UTF-8 CSV.") from exc
    except csv.Error as exc:
        raise LabelError(f"{path} line {line}: {exc}; save it again as a CSV file.") from exc
    except NotRegularFileError as exc:
        raise LabelError(f"{path} is not a regular file ({exc.kind}); choose a CSV file.") from None
    except FileNotFoundError as exc:
        raise LabelError(f"File not found: {path}. Choose an existing CSV file.") from exc
    except OSError as exc:
        raise LabelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    return header, rows, lines


def _cell(value: str) -> str:
    return value.replace("\r\n", "\n").replace("\r", "\n").strip()


def _label_catalogue(
    root: Path, catalogue: Path, rels: list[str], unusable: Iterable[str] = ()
) -> tuple[list[Reference], list[tuple[str, str]]]:
    """References listed in ``catalogue``; ``unusable``: files already ignored (not reported again)."""
    header, rows, lines = read_csv_table(catalogue)
    file_col, inst_col, meta_cols = _catalogue_columns(catalogue, header)
    places = _EntryPlaces(root, catalogue, rels)
    already = set(unusable)
    entries: dict[str, tuple[str, dict[str, str]]] = {}
    ignored: dict[str, str] = {}  # path → reason: each file listed once, with its first reason
    for line, row in zip(lines, rows):
        entry = row.get(file_col, "")
        if not entry:
            continue
        rel = places.resolve(entry)
        if rel is None:
            rel = _unmatched_entry(places, entry, already, catalogue, ignored)
            if rel is None:
                continue
        instance = row.get(inst_col, "")
        metadata = {c: row[c] for c in meta_cols if row.get(c)}
        if rel in entries and entries[rel][0] != instance:
            raise LabelError(
                f"{catalogue} line {line}: {entry} is listed twice with different instances "
                f"({entries[rel][0]!r} and {instance!r}); keep one row per image."
            )
        entries[rel] = (instance, metadata)
    refs = _catalogue_references(rels, entries, catalogue, ignored)
    return refs, list(ignored.items())


def _catalogue_columns(catalogue: Path, header: list[str]) -> tuple[str, str, list[str]]:
    """The catalogue's file column, instance column and the other (metadata) columns; LabelError
    when the file or instance column is missing."""
    file_col = find_column(header, CATALOGUE_FILE_COLUMNS)
    inst_col = find_column(header, CATALOGUE_INSTANCE_COLUMNS)
    if file_col is None or inst_col is None:
        missing = "file column (file, path or filename)" if file_col is None else "'instance' column"
        raise LabelError(
            f"Catalogue {catalogue} has no {missing} (columns: {', '.join(header)}). "
            "Use a header like file,instance,artist,title."
        )
    return file_col, inst_col, [h for h in header if h not in (file_col, inst_col)]


def _within(path: str, base: str) -> str | None:
    """``path`` (absolute) relative to ``base`` if it is inside it, else None."""
    try:
        rel = os.path.relpath(path, base)
    except ValueError:  # another drive on Windows
        return None
    rel = normalize_relpath(rel)
    return None if not rel or rel == ".." or rel.startswith("../") else rel


def _spelled(entry: str) -> str:
    """A catalogue entry as a normalized path (POSIX separators; absolute or ``../`` kept)."""
    return posixpath.normpath(entry.replace("\\", "/"))


def _is_absolute(entry: str) -> bool:
    return os.path.isabs(entry) or entry.replace("\\", "/").startswith("/")


class _EntryPlaces:
    """Which of the collection's files ``rels`` a catalogue entry names: relative to the collection or
    to the catalogue's folder, or absolute (lexically; links are followed only by :meth:`on_disk`)."""

    def __init__(self, root: Path, catalogue: Path, rels: list[str]):
        self.by_rel = set(rels)
        self.by_name: dict[str, list[str]] = {}
        for known in rels:
            self.by_name.setdefault(PurePosixPath(known).name, []).append(known)
        self.root_abs = os.path.abspath(root)
        self.root_real = os.path.realpath(root)
        self.cat_dir = os.path.abspath(catalogue.parent)
        self.cat_real = os.path.realpath(catalogue.parent)

    def places(self, entry: str) -> list[str]:
        """Where on disk the entry may be: relative to the collection or to the catalogue's folder."""
        if _is_absolute(entry):
            return [os.path.normpath(entry)]
        e = os.path.normpath(_spelled(entry))
        return list(dict.fromkeys([os.path.join(self.root_abs, e), os.path.join(self.cat_dir, e),
                                   os.path.join(self.cat_real, e)]))

    def candidates(self, entry: str) -> list[str]:
        """Relative paths in the collection the entry may name (lexically, links not followed)."""
        found = []
        if not _is_absolute(entry):
            e = normalize_relpath(entry)
            if e and e != ".." and not e.startswith("../"):
                found.append(e)
        for place in self.places(entry):
            for base in (self.root_abs, self.root_real):
                rel = _within(os.path.normpath(place), base)
                if rel is not None:
                    found.append(rel)
        return list(dict.fromkeys(found))

    def resolve(self, entry: str) -> str | None:
        e = normalize_relpath(entry)
        if e in self.by_rel and not _is_absolute(entry):  # the usual case, without os.path work
            return e
        for c in self.candidates(entry):
            if c in self.by_rel:
                return c
        return None

    def by_file_name(self, entry: str) -> str | None:
        same_name = self.by_name.get(PurePosixPath(_spelled(entry)).name, [])
        return same_name[0] if len(same_name) == 1 else None

    def on_disk(self, entry: str) -> bool | None:
        """True: the entry names a file inside the collection; False: one outside it (a ``../``
        or absolute path, or a path through a symbolic link leading out); None: no such file."""
        inside = None
        for place in self.places(entry):
            if os.path.exists(place):
                if _within(os.path.realpath(place), self.root_real) is not None:
                    return True
                inside = False
        return inside


def _unmatched_entry(places: _EntryPlaces, entry: str, already: set[str], catalogue: Path,
                     ignored: dict[str, str]) -> str | None:
    """The file of the collection that a catalogue entry naming none by its path stands for: the one
    file of its file name (e.g. a catalogue listing names only, or made on another computer), else
    None, the entry's reason added to ``ignored`` unless it needs none (an unusable file, already
    reported; a file of the collection not among those to label)."""
    if any(c in already for c in places.candidates(entry)):
        return None  # an unusable file (e.g. a broken link), already reported with its reason
    outside = OUTSIDE_REASON.format(catalogue=catalogue.name)
    where = places.on_disk(entry)
    if where is True:
        return None  # in the collection but not among the files to label (a subset was asked for)
    if where is False:
        ignored.setdefault(printable_path(_spelled(entry)), outside)
        return None
    rel = places.by_file_name(entry)
    if rel is None:
        if not places.candidates(entry):  # a ../ or absolute path that is not in the collection
            ignored.setdefault(printable_path(_spelled(entry)), outside)
        else:
            reason = f"listed in {catalogue.name} but no such image in the collection"
            ignored.setdefault(printable_path(normalize_relpath(entry)), reason)
    return rel


def _catalogue_references(rels: list[str], entries: dict[str, tuple[str, dict[str, str]]], catalogue: Path,
                          ignored: dict[str, str]) -> list[Reference]:
    """The references of ``rels`` the catalogue gives an instance; the others added to ``ignored``."""
    refs = []
    for rel in rels:
        if rel not in entries:
            ignored.setdefault(rel, f"not in {catalogue.name}")
        elif not entries[rel][0]:
            ignored.setdefault(rel, f"no instance in {catalogue.name}")
        else:
            instance, metadata = entries[rel]
            refs.append(Reference(rel, instance, metadata))
    return refs


# --------------------------------------------------------------------------- entry points


def label_collection(
    root: str | os.PathLike,
    rule: str = "auto",
    catalogue: str | os.PathLike | None = None,
    regex: str | re.Pattern | None = None,
    files: Iterable[str] | None = None,
) -> Labelling:
    """Label the reference images of the collection folder ``root``.

    ``files``: relative paths to label instead of walking ``root`` for image files.
    ``rule="auto"`` uses ``catalogue``/``regex`` when given, else a catalogue found next to the
    collection, else the folder, GaRoFou or CLICIDE layout, else ``none``.
    Query folders (``queries/``, ``test/``, ``TEST_I/`` at the first level) are never references.
    """
    if rule not in RULES:
        raise LabelError(f"Unknown labelling rule {rule!r}; choose one of {', '.join(RULES)}.")
    root = Path(root)
    rels, unusable = _collection_files(root, files)
    if not rels:
        example = (f" ({len(unusable):,} unusable file{'s' if len(unusable) != 1 else ''}, e.g. "
                   f"{unusable[0][0]}: {unusable[0][1]})" if unusable else "")
        raise LabelError(
            f"No images found in {root} (outside query folders){example}. Choose the folder of reference "
            f"photos ({', '.join(sorted(SUPPORTED_EXTENSIONS))})."
        )
    unusable_paths = [p for p, _ in unusable]
    ignored = list(unusable) + [(p, HIDDEN_REASON) for p in rels if is_hidden_path(p)]
    rels = [p for p in rels if not is_hidden_path(p)]

    cat_path = Path(catalogue) if catalogue is not None else None
    if rule == "auto":
        if cat_path is not None:
            rule = "catalogue"
        elif regex is not None:
            rule = "regex"
        else:
            cat_path = find_catalogue(root)
            if cat_path is not None:
                refs, more = _label_catalogue(root, cat_path, rels, unusable_paths)
                if refs:
                    log.info("labelling %s: using catalogue %s", root, cat_path)
                    return _labelling("catalogue", refs, ignored + more)
                log.warning("catalogue %s lists none of the images of %s: not used", cat_path, root)
            rule = "folder" if is_folder_layout(rels) else detect_name_rule(rels) or "none"
        log.info("labelling %s: detected rule %s", root, rule)

    if rule == "catalogue":
        if cat_path is None:
            cat_path = find_catalogue(root)
        if cat_path is None or not cat_path.exists():
            where = cat_path or f"{root / 'catalogue.csv'} or {root.parent / 'catalogue.csv'}"
            raise LabelError(f"Catalogue not found: {where}. Choose a CSV file with file,instance columns.")
        refs, more = _label_catalogue(root, cat_path, rels, unusable_paths)
        ignored.extend(more)
    else:
        pattern = compile_regex(regex) if rule == "regex" else None
        if rule == "garofou" and any(PurePosixPath(p).parts[0] == GAROFOU_REFERENCE_FOLDER for p in rels):
            for p in rels:
                if PurePosixPath(p).parts[0] != GAROFOU_REFERENCE_FOLDER:
                    ignored.append((p, f"outside {GAROFOU_REFERENCE_FOLDER}/ (GaRoFou references)"))
            rels = [p for p in rels if PurePosixPath(p).parts[0] == GAROFOU_REFERENCE_FOLDER]
        refs = []
        for rel in rels:
            labelled = label_file(rule, rel, pattern)
            if labelled[0] is None:
                ignored.append((rel, labelled[1]))  # (None, reason)
            else:
                refs.append(Reference(rel, labelled[0], {}))  # (instance, None)

    if not refs:
        example = f" (e.g. {ignored[0][0]}: {ignored[0][1]})" if ignored else ""
        raise LabelError(
            f"No reference of {root} could be labelled with the {rule} rule{example}. "
            "Choose another labelling rule or fix the file names/catalogue."
        )
    return _labelling(rule, refs, ignored)


def _labelling(rule: str, refs: list[Reference], ignored: list[tuple[str, str]]) -> Labelling:
    """The result; a file is listed once in ``ignored`` (with the first reason found for it)."""
    once: dict[str, str] = {}
    for path, reason in ignored:
        once.setdefault(path, reason)
    return Labelling(rule=rule, references=sorted(refs, key=lambda r: r.path), ignored=sorted(once.items()))


def summarize_ignored(ignored: Iterable[tuple[str, str]]) -> str:
    """``"207 wall images dropped; 3 not in catalogue.csv"``-style summary, most frequent first."""
    counts = Counter(reason for _, reason in ignored)
    parts = []
    for reason, n in counts.most_common():
        if reason == WALL_REASON:
            parts.append(f"{n:,} wall image{'s' if n != 1 else ''} dropped")
        else:
            parts.append(f"{n:,} ignored: {reason}")
    return "; ".join(parts)


def labelling_summary(labelling: Labelling) -> str:
    """One line for the user, e.g. ``CLICIDE layout: 3,245 references of 464 instances (207 wall images dropped)``."""
    n, k = len(labelling.references), labelling.n_instances
    name = RULE_NAMES.get(labelling.rule, labelling.rule)
    text = (
        f"{name}: {n:,} reference{'s' if n != 1 else ''} of {k:,} instance{'s' if k != 1 else ''}"
        if labelling.rule != "none"
        else f"{name}: {n:,} reference{'s' if n != 1 else ''}, each its own instance"
    )
    if labelling.ignored:
        text += f" ({summarize_ignored(labelling.ignored)})"
    return text
