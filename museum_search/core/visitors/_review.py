"""The staff's review queue (issue 34, item 3): what becomes of a kept visitor's photo.

- **"This is object X"** (:func:`add_views_job`): the photo becomes a new reference view of X, with
  X's catalogue entry, through the incremental update (:func:`museum_search.core.jobs.update_job`'s
  ``added``): seconds, not a rebuild. The photo moves to the visitors folder's ``views/<X>/``, outside
  the collection; or, only when staff choose it (``into_collection``), it is copied into the collection
  folder under a new name its labelling rule gives to X (never over a file; refused for a catalogue).
- **"Not in our collection"** (:func:`mark_unknown`): the photo moves to ``unknown/``; the verdict's
  next refit (the next add, or :func:`refit_job`) asks it as a real unknown view.
- **Discard** (:func:`discard`): the kept file and its record are deleted.

One photo or many at once. Every photo is checked before anything changes; a failed or cancelled add
removes the files it made, and the index stays as it was (the update saves it atomically at its end).
The verdict uses staff-confirmed photos as calibration views from :data:`museum_search.core.jobs.STAFF_VIEWS_MIN`
on (see :mod:`museum_search.core.jobs._calibration`).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Generator, Sequence

from museum_search.core.errors import MuseumSearchError
from museum_search.core.index import Index
from museum_search.core.jobs import BuildReport, check_instance, update_job
from museum_search.core.progress import Progress

#: The statuses of a kept photo (:meth:`VisitorLog.set_status`).
NEW, ADDED, UNKNOWN = "new", "added", "unknown"
VIEWS, UNKNOWN_FOLDER = "views", "unknown"


def add_views_job(index_path: str | Path, log: Any, refs: Sequence[str], instance: str, *,
                  into_collection: bool = False, **update_options: Any) -> Generator[Progress, None, BuildReport]:
    """"This is object ``instance``" for the kept photos ``refs`` (ids or paths) of ``log`` (a
    :class:`VisitorLog`): each becomes a reference view of ``instance`` through the incremental update
    of the index at ``index_path`` (``update_options``: the update's, e.g. ``engine``), then its record
    says "added", with the object and where the photo now lives. Refused before any change: an
    unknown photo, one already added, an object the index does not have (close names suggested)."""
    photos = _reviewable(log, refs)
    yield Progress(0, 0, stage="reading the index")
    index = Index.load(index_path)
    check_instance(index, instance)
    have = {it.path for it in index.items}  # a photo an add stopped after the index was saved: already in
    unknown = _unknown_views(log)
    if into_collection:
        report = yield from update_job(index_path, into_collection=[(p.path, instance) for p in photos],
                                       unknown_views=unknown, **update_options)
        for photo, placed in zip(photos, report.placed):
            log.set_status(photo.id, ADDED, instance=instance, path=Path(placed))
            _remove_kept(photo.path, log.folder)
        return report
    folder = _own_subfolder(log.folder, VIEWS, _folder_name(instance))
    moved: list[tuple[Any, Path]] = []
    try:
        for photo in photos:
            moved.append((photo, _linked(Path(photo.path), folder / Path(photo.path).name)))
        report = yield from update_job(index_path, added=[(dst, instance) for _, dst in moved if str(dst) not in have],
                                       unknown_views=unknown, **update_options)
    except BaseException:  # failed or cancelled: the index is as it was, and so are the photos
        for _, dst in moved:
            if str(dst) not in have:
                dst.unlink(missing_ok=True)
        raise
    for photo, dst in moved:
        log.set_status(photo.id, ADDED, instance=instance, path=dst)
        _remove_kept(photo.path, log.folder, keep=dst)
    return report


def mark_unknown(log: Any, refs: Sequence[str]) -> None:
    """"Not in our collection" for the kept photos ``refs``: each moves to the visitors folder's
    ``unknown/`` and its record says so; the verdict's next refit (:func:`refit_job`, or the next
    :func:`add_views_job`) asks it as a real unknown view."""
    photos = _reviewable(log, refs)
    folder = _own_subfolder(log.folder, UNKNOWN_FOLDER)
    for photo in photos:
        src = Path(photo.path)
        if src.parent == folder:
            continue  # already there
        dst = _linked(src, folder / src.name)
        log.set_status(photo.id, UNKNOWN, path=dst)
        _remove_kept(src, log.folder, keep=dst)


def unknown_job(index_path: str | Path, log: Any, refs: Sequence[str], **update_options: Any
                ) -> Generator[Progress, None, BuildReport]:
    """:func:`mark_unknown` for ``refs``, then the verdict refitted with them (:func:`refit_job`); a
    failed or cancelled refit puts the photos back as they were (kept, not reviewed)."""
    photos = _reviewable(log, refs)
    mark_unknown(log, [p.id for p in photos])
    try:
        return (yield from refit_job(index_path, log, **update_options))
    except BaseException:
        for photo in photos:
            if photo.status == NEW:
                _put_back(log, photo)
        raise


def _put_back(log: Any, photo: Any) -> None:
    """Undo :func:`mark_unknown` of ``photo`` (its record as it was before: new, in ``kept/``)."""
    now = Path(log.photo(photo.id).path)
    if now == Path(photo.path):
        return
    back = _linked(now, Path(photo.path))
    log.set_status(photo.id, NEW, path=back)
    now.unlink(missing_ok=True)


def discard(log: Any, refs: Sequence[str]) -> None:
    """Delete the kept photos ``refs`` and their records. A photo added as a reference view is
    refused (it is part of the index now)."""
    photos = [log.photo(str(r)) for r in refs]
    for photo in photos:
        if photo.status == ADDED:
            raise MuseumSearchError(f"photo {photo.id} is a reference view of {photo.instance} now; nothing was "
                                    "discarded")
    for photo in photos:
        log.discard(photo.id)


def refit_job(index_path: str | Path, log: Any, **update_options: Any) -> Generator[Progress, None, BuildReport]:
    """The incremental update of the index at ``index_path`` with the visitors folder's "not in our
    collection" photos as the verdict's real unknown views (asked only where new)."""
    return (yield from update_job(index_path, unknown_views=_unknown_views(log), **update_options))


def _reviewable(log: Any, refs: Sequence[str]) -> list[Any]:
    """The kept photos ``refs`` (each once), checked: known to ``log``, not added yet, their file there."""
    if not refs:
        raise MuseumSearchError("no photo given: name kept photos by their id or path (review --list lists them)")
    photos, seen = [], set()
    for ref in refs:
        photo = log.photo(str(ref))
        if photo.id in seen:
            continue
        seen.add(photo.id)
        if photo.status == ADDED:
            raise MuseumSearchError(f"photo {photo.id} was already added as a view of {photo.instance}; nothing "
                                    "was changed")
        if not Path(photo.path).is_file():
            raise MuseumSearchError(f"the file of photo {photo.id} is gone ({photo.path}); discard it")
        photos.append(photo)
    return photos


def _unknown_views(log: Any) -> list[str]:
    """The files of the photos staff said are not in the collection."""
    return [str(p.path) for p in log.kept(UNKNOWN) if Path(p.path).is_file()]


def _folder_name(instance: str) -> str:
    """A folder name for ``instance`` (a name any file system takes; the index keeps the instance itself)."""
    name = re.sub(r"[^\w.-]", "_", instance)[:100].lstrip(".")
    return name or "_"


def _own_subfolder(folder: Path, *parts: str) -> Path:
    """``folder``/``parts`` (made if needed), never through a link."""
    path = Path(folder)
    for part in parts:
        path = path / part
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        if path.is_symlink() or not path.is_dir():
            raise MuseumSearchError(f"{path} is not a folder of the visitors folder (a link or a file); move it away")
    return path


def _linked(src: Path, dst: Path) -> Path:
    """``src`` at the new name ``dst`` too (a hard link, else a copy), created exclusively: never
    over a file. The caller removes ``src`` once its record says where the photo lives."""
    if dst.exists() or dst.is_symlink():
        if dst.is_file() and src.exists() and os.path.samefile(src, dst):
            return dst  # a move interrupted after its link: finish it
        raise MuseumSearchError(f"{dst} exists already: nothing is ever written over a file")
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise MuseumSearchError(f"{dst} exists already: nothing is ever written over a file") from None
    except OSError:  # no hard links here: a copy, made exclusively
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        with open(src, "rb") as fin, os.fdopen(os.open(dst, flags, 0o600), "wb") as fout:
            shutil.copyfileobj(fin, fout)
            fout.flush()
            os.fsync(fout.fileno())
    return dst


def _remove_kept(path: str | Path, folder: Path, keep: Path | None = None) -> None:
    """Delete a reviewed photo's old file: only in the visitors folder's ``kept/`` (ours), never ``keep``."""
    path = Path(path)
    if keep is not None and path == keep:
        return
    if path.parent.resolve() == (Path(folder) / "kept").resolve():
        path.unlink(missing_ok=True)
