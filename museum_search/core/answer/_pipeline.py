"""The query pipeline: the one path from a photo to an answer.

    decode → describe (regions) → global scores → re-rankers → verification → ranking → verdict

The CLI ``query``, the Search tab, the kiosk, ``evaluate``, the Evaluation tab and the ICFRR sweep
all call :class:`QueryPipeline`; none keeps a copy, so a photo gets the same answer wherever it is
asked about.

* **decode**: a file is decoded at most :data:`VERIFY_SIDE` px on its longest side
  (:func:`load_query`); a camera frame or a pasted image is shrunk the same way
  (:func:`query_from_array`). That image is what verification and the views see.
* **describe**: the image is shrunk to the backbone's input size, then cut into its regions
  (``extract.QUERY_REGIONS``: the whole photo, its left/right/top/bottom 60 % and its central 80 %) and each region
  is described; a reference's *cosine* is its best dot product over the regions. A query given as
  a descriptor (:func:`descriptor_query`, computed elsewhere: ``query --descriptors``) skips this
  step, and verification, which needs a photo (:meth:`QueryPipeline.for_descriptors`).
* **global scores**: the best-region cosine of every reference (``settings.search`` "exact"), or of
  the candidates the index's approximate search proposes, scored exactly, the others -inf ("ann",
  which ``auto`` chooses for a large index that has an approximate index: :func:`museum_search.core.index.resolve_mode`).
* **re-rankers**: ICFRR, αQE or DBA (``settings.rerank``) change the global scores.
* **verification** (on by default): the best ``verify_top`` references by global score are matched
  with the photo (the index's matcher, SIFT or XFeat, and a RANSAC homography, :mod:`museum_search.core.verification._spatial`),
  using the reference features stored with the index; a photo whose first look is unsure is looked
  at again, closer and deeper, with the best of each half of the photo too
  (:meth:`QueryPipeline._half_rows`). The photo's own local features are computed
  once (:meth:`museum_search.core.verification._shortlist.Verification.features`), on a thread while the network describes the
  photo; matching is exact, in 8-bit integers (:func:`museum_search.core.verification._spatial._match_sift`). An object with a photo of at least the verdict's ``min_inliers`` gets the
  bonus ``min(inliers, 50) / 50`` on each of its shortlisted photos (:func:`museum_search.core.verification._shortlist.object_inliers`: objects
  verified alike share one level); fewer inliers are noise and change nothing.
* **ranking**: :func:`.ranking.order` and :func:`.ranking.per_instance` (by score, ties by row);
  then, within each object, its verified photos by their matching points, most first, in the places
  the object holds (:func:`.ranking.lead_within`): the order of the objects is the score's, and the
  photo shown first (the only one with ``per_instance``) is the one with the most matching points.
* **verdict**: from the top result's evidence (:class:`museum_search.core.answer._verdict.Verdict`, a model calibrated per
  index): its cosine, its margin over the best other object, the inliers of its object's best photo
  and the most inliers any other object got on the same part of the photo; it gives the answer's
  confidence and the reason in words. A verified close-up (the photo shows at most half of the
  reference's area: a detail of a work whose reference shows its frame and wall) is compared with
  the part of the reference it shows as well, described once more (:meth:`QueryPipeline._part_cosine`).
* **objects** (:meth:`QueryPipeline.objects_in`): every collection object in the photo, the top
  result first when it is accepted; then each other object of the verified shortlist with at least
  ``min_inliers`` whose outline lies apart from those found (a work beside another is a second
  object, not a rival: :meth:`museum_search.core.verification._shortlist.Verification.rival`),
  judged by the verdict on its own part of the photo (described again); then the part of the photo
  beside the objects found, when it is large, looked at alone (:meth:`QueryPipeline._beside`: its own
  shortlist and its own local features). Outlines are given in the photo's own pixels
  (:meth:`QueryImage.to_photo`).

A **region query** asks about a part of the photo only (:func:`load_query`, :func:`query_from_bytes`
with ``region``, :meth:`QueryImage.cropped`): the part is cut once, when the photo is decoded (at the
resolution that gives the part :data:`VERIFY_SIDE` px), and what is found is reported in the whole
photo's pixels.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import cv2
import numpy as np

from museum_search.core.answer._checks import check_settings
from museum_search.core.answer._presentation import outline_in_photo
from museum_search.core.answer._rerank import RerankOptions, build_rerankers
from museum_search.core.answer._search import Result, ranking_scores, score_matrix
from museum_search.core.answer._verdict import Evidence, Verdict
from museum_search.core.answer._whitening import Whitening
from museum_search.core.errors import ImageError, MuseumSearchError
from museum_search.core.images import decode_image, encoded_image_size, image_size, load_image
from museum_search.core.index import Features, Index, candidate_scores, resolve_mode
from museum_search.core.inference import (
    ENGINES,
    DescriptorExtractor,
    NoNetwork,
    extractor_for_meta,
    query_crops,
    resolve_engine,
)
from museum_search.core.ranking import lead_within, order, per_instance
from museum_search.core.verification import (
    DEEP,
    Matches,
    SpatialParams,
    Verification,
    apart,
    cosine_margin,
    params_of_index,
)

log = logging.getLogger(__name__)

#: The second look (:meth:`QueryPipeline._half_rows`) verifies the best this many references of
#: each half of the photo too.
HALF_TOP = 20
#: The objects found in a photo leave a part of it free when at least this share of its longer side
#: lies beside them; that part is looked at alone (:meth:`QueryPipeline._beside`).
BESIDE = 0.4
#: Longest side of the decoded query photo: what verification and the views use.
VERIFY_SIDE = SpatialParams().max_side
#: The smallest part of a photo (px of the decoded photo, each side) a further object in it is
#: described on (:meth:`QueryPipeline.objects_in`).
MIN_PART = 16
#: Up to this many references, the whitened margin (:meth:`QueryPipeline._whitened`) compares every
#: reference (their whitened descriptors kept in memory: 2 KB each); a larger index compares the ones
#: its search scored.
WHITEN_ALL = 20_000
#: Why the answers to queries given as descriptors are not verified.
DESCRIPTORS_NOT_VERIFIED = ("queries given as descriptors have no photo to match: verification is skipped "
                            "and the verdict uses the cosine (not verified)")


@dataclass(frozen=True)
class QuerySettings:
    """What a user can change about how a photo is answered. Frozen and hashable: a pipeline is
    built from one and never changed (:func:`dataclasses.replace` makes another)."""

    k: int = 5  # results shown
    per_instance: bool = False  # one result per object
    regions: bool = True  # describe the photo's regions (False: the whole image, the papers' protocol)
    #: global re-rankers applied in order: icfrr, aqe, dba. A comma-separated string or any sequence
    #: is accepted and normalised once to a tuple of lower-case names.
    rerank: tuple[str, ...] = ()
    options: RerankOptions = field(default_factory=RerankOptions)
    verify: bool = True  # geometric verification of the shortlist
    verify_top: int = 20  # how many references are verified
    #: how many references a second, closer look verifies when the first is unsure (0: no second
    #: look; :data:`museum_search.core.verification.DEEP`)
    deep: int = DEEP
    verdict: Verdict | None = None  # None: the index's own calibration
    search: str = "auto"  # exact, ann (approximate, large indexes) or auto (by size: .ann.resolve_mode)
    #: count a strong rival wherever it matches in the photo (calibration: a synthetic view shows
    #: one object, so any strong rival matches what objects share); False: only where the answer does not
    rivals_anywhere: bool = False
    #: what runs the network: "onnx" or "torch"; None (or "auto", normalised to None): the default,
    #: ``$MUSEUM_SEARCH_ENGINE`` or ONNX Runtime where it is installed (:func:`.inference.default_engine`)
    engine: str | None = None

    def __post_init__(self) -> None:
        engine = None if self.engine is None else str(self.engine).strip().lower()
        if engine is not None and engine != "auto" and engine not in ENGINES:
            raise MuseumSearchError(f"unknown inference engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        object.__setattr__(self, "engine", None if engine == "auto" else engine)
        spec = self.rerank
        names = [s.strip().lower() for s in (spec.split(",") if isinstance(spec, str) else spec or ())]
        names = [n for n in names if n and n != "none"]
        if "spatial" in names:  # the old re-ranker name of verification, which is now its own step
            names.remove("spatial")
            if not self.verify:
                raise MuseumSearchError("'spatial' asks for verification, which is turned off (--no-verify)")
        object.__setattr__(self, "rerank", tuple(names))
        check_settings(self)  # every field against its meaning (SettingsError names the field)

    def label(self) -> str:
        """:meth:`summary` with the re-rankers' parameters, e.g.
        ``icfrr, verified (top 20) (K 2/2, β 0.50, 5 it)`` (a run's name)."""
        o, names = self.options, self.rerank
        params = []
        if "icfrr" in names:
            params.append(f"K {o.k_q or 'auto'}/{o.k_g or 'auto'}, β {o.beta:.2f}, {o.iterations} it"
                          + ("" if o.icfrr_mode == "paper" else ", reference"))
        if "aqe" in names or "dba" in names:
            params.append(f"n {o.qe_n}, α {o.qe_alpha:g}")
        text = self.summary() if self.rerank else f"no re-ranking, {self.summary()}"
        return text + (f" ({'; '.join(params)})" if params else "")

    def summary(self) -> str:
        parts = ["+".join(self.rerank)] if self.rerank else []
        parts.append(f"verified (top {self.verify_top})" if self.verify else "not verified")
        if self.search == "ann":
            parts.append("approximate search")
        if not self.regions:
            parts.append("whole image")
        return ", ".join(parts)


class RegionError(MuseumSearchError):
    """A region of a photo that cannot be asked about (outside the photo, empty, not x,y,w,h)."""


#: A part of a photo: (x, y, width, height) in the photo's pixels, from its top-left corner.
Region = tuple[float, float, float, float]


def parse_region(text: str) -> Region:
    """``"x,y,w,h"`` (the photo's pixels; ``query --region``, ``/api/identify``'s ``region``) as a
    :data:`Region`; raises :class:`RegionError` saying what to give. It is checked against the
    photo when the photo is known (:func:`check_region`)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 4 or not all(np.isfinite(values)):
        raise RegionError(f"region {text!r} is not x,y,w,h: give four numbers in the photo's pixels, "
                          "e.g. 120,80,400,300 (left, top, width, height)")
    x, y, w, h = values
    return (x, y, w, h)


def check_region(region: Region, size: tuple[int, int], name: str = "the photo") -> Region:
    """``region`` if it is a part of a photo of ``size`` (width, height) of a positive size; else
    :class:`RegionError` saying why."""
    x, y, w, h = (float(v) for v in region)
    W, H = size
    if not (w >= 1 and h >= 1):
        raise RegionError(f"region {_region_text(region)} is empty: give a width and a height of at least 1 pixel")
    if x < 0 or y < 0 or x + w > W + 1e-6 or y + h > H + 1e-6:
        raise RegionError(f"region {_region_text(region)} is not inside {name} ({W}×{H} pixels): "
                          f"give x,y,w,h with x + w ≤ {W} and y + h ≤ {H}")
    return (x, y, w, h)


def _region_text(region: Region) -> str:
    return ",".join(f"{float(v):g}" for v in region)


@dataclass
class QueryImage:
    """A query photo as decoded once: RGB uint8, at most :data:`VERIFY_SIDE` px; or a query given
    by its descriptor (``image`` None, see :func:`descriptor_query`).

    ``size``: the photo's own size (width, height: the file's, whose pixels a region and the
    objects' outlines are given in); None: ``image``'s. ``region``: the part of the photo ``image``
    shows (a region query, :meth:`cropped`), None: all of it."""

    name: str
    image: np.ndarray | None
    descriptors: np.ndarray | None = None  # (D,) L2-normalized, for a query given as a descriptor
    size: tuple[int, int] | None = None
    region: Region | None = None

    @property
    def photo_size(self) -> tuple[int, int]:
        """(width, height) of the photo in its own pixels."""
        if self.size is not None:
            return self.size
        assert self.image is not None  # a photo query
        return (int(self.image.shape[1]), int(self.image.shape[0]))

    def to_photo(self, points: np.ndarray) -> np.ndarray:
        """``points`` ((n, 2) x, y) in ``image``'s pixels, in the photo's own pixels (a region
        query's: in the whole photo's)."""
        assert self.image is not None  # a photo query
        h, w = self.image.shape[:2]
        x, y, rw, rh = self.region if self.region is not None else (0.0, 0.0, *map(float, self.photo_size))
        pts = np.asarray(points, np.float64).reshape(-1, 2)
        return pts * np.array([rw / w, rh / h]) + np.array([x, y])

    def cropped(self, region: Region) -> "QueryImage":
        """The query of the part ``region`` (x, y, w, h in the photo's pixels) of this photo: only
        that part is asked about, and what is found is reported in the whole photo's pixels.
        Raises :class:`RegionError` for a region outside the photo or empty."""
        if self.image is None or self.region is not None:
            raise RegionError(f"{self.name}: only the whole of a photo can be cut to a region")
        return _cropped(self.name, self.image, self.photo_size, check_region(region, self.photo_size, self.name))


def _shrink(image: np.ndarray, side: int) -> np.ndarray:
    h, w = image.shape[:2]
    s = side / max(h, w)
    if s >= 1.0:
        return image
    return cv2.resize(image, (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)


def _region_side(size: tuple[int, int], region: Region | None) -> int:
    """The longest side to decode a photo of ``size`` at so that ``region`` of it has about
    :data:`VERIFY_SIDE` px (the whole photo: :data:`VERIFY_SIDE`), never above the photo's own."""
    if region is None:
        return VERIFY_SIDE
    longest = max(size)
    return int(min(longest, np.ceil(VERIFY_SIDE * longest / max(1.0, max(region[2], region[3])))))


def _cropped(name: str, image: np.ndarray, size: tuple[int, int], region: Region) -> QueryImage:
    """The query of ``region`` (checked) of ``image``, the photo of ``size`` decoded at any scale."""
    h, w = image.shape[:2]
    sx, sy = w / size[0], h / size[1]
    x, y, rw, rh = region
    x0, y0 = min(w - 1, int(np.floor(x * sx))), min(h - 1, int(np.floor(y * sy)))
    x1, y1 = max(x0 + 1, min(w, int(np.ceil((x + rw) * sx)))), max(y0 + 1, min(h, int(np.ceil((y + rh) * sy))))
    crop = np.ascontiguousarray(_shrink(image[y0:y1, x0:x1], VERIFY_SIDE))
    # the crop's pixels as cut (whole pixels of the decoded image), in the photo's
    return QueryImage(name, crop, size=size, region=(x0 / sx, y0 / sy, (x1 - x0) / sx, (y1 - y0) / sy))


def load_query(path, region: Region | None = None) -> QueryImage:
    """Decode a query photo file (``region``: only that part of it, x, y, w, h in its pixels);
    raises :class:`ImageError` with the reason, :class:`RegionError` for a region outside it."""
    size = image_size(path)
    if region is None:
        return QueryImage(str(path), load_image(path, max_side=VERIFY_SIDE), size=size)
    region = check_region(region, size, str(path))
    return _cropped(str(path), load_image(path, max_side=_region_side(size, region)), size, region)


def query_from_array(image: np.ndarray, name: str = "camera") -> QueryImage:
    """A camera frame or a pasted image (RGB uint8) as a query."""
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8 or img.size == 0:
        raise ImageError(name, f"not an RGB photo (array of shape {img.shape}, {img.dtype})")
    return QueryImage(name, np.ascontiguousarray(_shrink(img, VERIFY_SIDE)), size=(img.shape[1], img.shape[0]))


def query_from_bytes(data: bytes, name: str = "<pasted>", region: Region | None = None) -> QueryImage:
    """Encoded image bytes (clipboard, drag-and-drop of data, an upload) as a query (``region``:
    only that part of the photo, as :func:`load_query`)."""
    size = encoded_image_size(data, name)
    if region is None:
        return QueryImage(name, decode_image(data, name, max_side=VERIFY_SIDE), size=size)
    region = check_region(region, size, name)
    return _cropped(name, decode_image(data, name, max_side=_region_side(size, region)), size, region)


def descriptor_query(descriptor: np.ndarray, name: str) -> QueryImage:
    """A query given by its (D,) descriptor, computed elsewhere and L2-normalized (see
    :func:`museum_search.core.jobs._importing.check_descriptors`): it has no photo, so it is neither described nor verified."""
    return QueryImage(name, None, np.asarray(descriptor, np.float32).reshape(-1))


@dataclass(frozen=True)
class FoundObject:
    """One collection object found in a photo (:attr:`Answer.objects`): the verdict on its own
    evidence, where it is, and the result shown for it."""

    instance: str
    confidence: float  # the verdict's confidence that this object is in the photo
    reason: str  # the verdict in words
    #: its outline, a polygon in the photo's own pixels ((x, y) corners; a region query's: in the
    #: whole photo's); None when it was accepted without matching points (not verified)
    region: tuple[tuple[float, float], ...] | None
    result: Result  # its reference shown: the photo of it with the most matching points
    inliers: int | None = None  # the matching points of that photo (None: not verified)

    def to_dict(self) -> dict[str, Any]:
        """``{instance, confidence, reason, region}`` (the region rounded to 0.1 px)."""
        region = None if self.region is None else [[round(x, 1), round(y, 1)] for x, y in self.region]
        return {"instance": self.instance, "confidence": round(float(self.confidence), 4),
                "reason": self.reason, "region": region}


@dataclass
class Answer:
    """What the pipeline says about one photo."""

    query: str
    results: list[Result]
    in_collection: bool
    reason: str
    scores: np.ndarray  # (G,) final score of every reference
    cosine: np.ndarray  # (G,) cosine of every reference
    verified_inliers: dict[int, int]  # row → inliers, for the verified shortlist
    ranking: np.ndarray | None = None  # (G,) every row, best first (when asked for)
    rival: int = 0  # most inliers of a verified reference of another object than the top result's
    top_inliers: int | None = None  # the best inliers of a photo of the top result's object (None: not verified)
    margin: float = float("nan")  # the top result's cosine minus the best cosine of another object
    #: the verdict's confidence that the top result is right (:meth:`museum_search.core.answer._verdict.Verdict.judge`); None
    #: only when there is no result
    confidence: float | None = None
    #: the photo's local features when its shortlist was verified (so drawing the matches of a
    #: reference does not extract them again: :meth:`QueryPipeline.matches`)
    features: Features | None = field(default=None, repr=False)
    #: the cosine the verdict judged: that of the top object's best-ranked photo (the photo shown
    #: first is the object's verified photo with the most matching points, which may be another)
    top_cosine: float = float("nan")
    #: every collection object found in the photo: the top result first when it is accepted, then
    #: each other verified object apart from those (:meth:`QueryPipeline.objects_in`); none when
    #: the photo is not in the collection
    objects: list[FoundObject] = field(default_factory=list)
    #: the points the top result's best verified photo could have matched (``Evidence.expected``; 0: not verified)
    expected: int = 0
    #: the whitened cosine and margin of the top result (``Evidence.wcosine``; nan: no whitening)
    wcosine: float = float("nan")
    wmargin: float = float("nan")

    @property
    def top(self) -> Result | None:
        return self.results[0] if self.results else None

    def evidence(self, known: bool, correct: bool) -> Evidence:
        """The top result's evidence, for the verdict's figures (``known``/``correct``: the truth)."""
        top = self.top
        if top is None:
            return Evidence(float("nan"), None, known, correct)
        return Evidence(self.top_cosine, self.top_inliers, known, correct, self.rival, self.margin,
                        self.confidence, expected=self.expected, wcosine=self.wcosine, wmargin=self.wmargin)

    def verdict_text(self) -> str:
        """The verdict's confidence and reason in words, as the views show them."""
        return self.reason if self.confidence is None else f"confidence {self.confidence:.2f}; {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"query": self.query, "in_collection": self.in_collection,
                "confidence": None if self.confidence is None else round(float(self.confidence), 4),
                "reason": self.reason, "inliers": self.top_inliers, "rival_inliers": self.rival if self.verified_inliers else None,
                "results": [r.to_dict() for r in self.results],
                "objects": [o.to_dict() for o in self.objects]}


class QueryPipeline:
    """Answers photos about one index with one set of settings (see the module docstring)."""

    verify_side = VERIFY_SIDE

    def __init__(self, index: Index, settings: QuerySettings | None = None, *,
                 extractor: DescriptorExtractor | None = None, weights: str | None = None):
        self.index = index
        self.settings = settings or QuerySettings()
        #: the network, on ``settings.engine`` (unless ``extractor`` is given: e.g. one shared by pipelines)
        self.extractor = extractor or extractor_for_meta(index.meta, weights, engine=self.settings.engine)
        index.check_compatible(self.extractor.meta)
        self._rerank = build_rerankers(self.settings.rerank, self.settings.options)
        self.verdict = self.settings.verdict or Verdict.of_index(index)
        #: the verification of shortlists, with the index's own matcher and the verdict's gate
        self.verification = Verification(index, params_of_index(index, self.settings.verify_top),
                                         self.verdict.min_inliers, self.settings.rivals_anywhere,
                                         self.settings.deep)
        #: "exact" or "ann": how the global scores are computed (``settings.search`` for this index)
        self.search_mode = resolve_mode(self.settings.search, len(index), index.ann)
        self.timings: dict[str, float] = {}
        self._features_pool: ThreadPoolExecutor | None = None  # computes the photos' local features
        self._codes: np.ndarray | None = None  # the references' instances as integers (_label_codes)
        self._whitenings: dict[int, tuple[np.ndarray, Whitening]] = {}  # (_whitening) by id of the stored array

    @classmethod
    def for_descriptors(cls, index: Index, settings: QuerySettings | None = None) -> "QueryPipeline":
        """The pipeline for queries given as descriptors (:func:`descriptor_query`), on any index of
        their dimension: no network is loaded (a photo is refused) and verification is off, since
        there is no photo to match (:data:`DESCRIPTORS_NOT_VERIFIED`); the re-rankers work as usual."""
        settings = replace(settings or QuerySettings(), verify=False)
        return cls(index, settings, extractor=NoNetwork(index.meta, "this job's queries are descriptors, not photos"))

    @property
    def engine(self) -> str:
        """The engine that runs this pipeline's network: the extractor's ("onnx", or "torch" also where
        ONNX Runtime cannot run it), else (no network: queries given as descriptors) ``settings.engine``'s."""
        engine = getattr(self.extractor, "engine", None)
        return engine if engine in ENGINES else resolve_engine(self.settings.engine)

    def settings_text(self) -> str:
        """:meth:`QuerySettings.summary`, saying when ``auto`` chose the approximate search."""
        text = self.settings.summary()
        if self.search_mode == "ann" and self.settings.search != "ann":
            text += ", approximate search"
        return text

    def warm_up(self) -> None:
        """Answer a synthetic photo once, so that the first visitor's query is not slower than the
        others (lazy initialisation in the engine and OpenCV, the stored reference features read
        from disk)."""
        rng = np.random.default_rng(0)
        img = cv2.GaussianBlur(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8), (0, 0), 3)
        self.answer([QueryImage("warm-up", img)])

    # ---- describe ---------------------------------------------------------------------------
    def inputs(self, query: QueryImage) -> list[np.ndarray]:
        """The network inputs of a photo: its regions at the backbone's size."""
        assert query.image is not None  # a photo query (a descriptor query is not described)
        small = _shrink(query.image, self.extractor.max_side)
        return [self.extractor.preprocess(c) for c in query_crops(small, self.settings.regions)]

    def embed(self, queries: Sequence[QueryImage]) -> np.ndarray:
        """(Q, R, D) region descriptors ((Q, 1, D) for whole-image queries). A query given as a
        descriptor is not described: its descriptor stands for each of the R regions."""
        photos = [q for q in queries if q.descriptors is None]
        if photos:
            inputs = [x for q in photos for x in self.inputs(q)]
            described = self.extractor.embed(inputs).reshape(len(photos), len(inputs) // len(photos), -1)
            if len(photos) == len(queries):
                return described
        out = np.empty((len(queries), described.shape[1] if photos else 1, self.index.meta.dim), np.float32)
        rows = iter(described) if photos else iter(())
        for i, q in enumerate(queries):
            if q.descriptors is not None and q.descriptors.shape != (self.index.meta.dim,):
                raise MuseumSearchError(f"query {q.name} is a {q.descriptors.size}-d descriptor, the index "
                                        f"holds {self.index.meta.dim}-d descriptors")
            out[i] = next(rows) if q.descriptors is None else q.descriptors
        return out

    # ---- answer -----------------------------------------------------------------------------
    def answer(self, queries: Sequence[QueryImage], descriptors: np.ndarray | None = None, *,
               full_ranking: bool = False, exclude: np.ndarray | None = None) -> list[Answer]:
        """Answers for ``queries`` (described here unless ``descriptors`` are given).

        ``exclude``: a boolean mask of references to leave out (calibration: "what if this object
        were not in the collection").
        """
        t0 = time.perf_counter()
        features: list[Future | None] = [None] * len(queries)
        if descriptors is None and self.settings.verify and self.settings.verify_top > 0:
            # the photos' local features are computed while the network describes them
            features = [None if q.image is None else self._pool().submit(self.verification.features, q.image)
                        for q in queries]
        desc = self.embed(queries) if descriptors is None else np.asarray(descriptors, np.float32)
        t1 = time.perf_counter()
        s = self.settings
        if self._rerank or exclude is not None or full_ranking:
            cos = score_matrix(self.index, desc, self.search_mode)
        else:  # the answer needs only the top of each ranking (search.ranking_scores: the same answer)
            cos = ranking_scores(self.index, desc, self.search_mode, objects=s.k + 1,
                                 rows=max(s.k, max(s.verify_top, s.deep) if s.verify else 0))
        scores = cos
        if self._rerank:
            scores = self._rerank.apply(self.index, cos, desc, query_images=[q.image for q in queries],
                                        query_paths=[q.name for q in queries])
        scores = np.array(scores, dtype=np.float32)
        if exclude is not None:
            scores[:, np.asarray(exclude, bool)] = -np.inf
        t2 = time.perf_counter()
        answers = [self._finish(q, scores[i], cos[i], full_ranking, features[i], desc[i], exclude)
                   for i, q in enumerate(queries)]
        t3 = time.perf_counter()
        self.timings = {"describe": t1 - t0, "search": t2 - t1, "verify": t3 - t2}
        return answers

    def _label_codes(self) -> np.ndarray:
        """The instance of every reference as an integer (comparing them over a whole ranking is fast)."""
        if self._codes is None:
            self._codes = np.unique(self.index.labels, return_inverse=True)[1].reshape(-1)
        return self._codes

    def _pool(self) -> ThreadPoolExecutor:
        if self._features_pool is None:
            self._features_pool = ThreadPoolExecutor(1, thread_name_prefix="query-features")
        return self._features_pool

    def _finish(self, query: QueryImage, scores: np.ndarray, cos: np.ndarray, full_ranking: bool,
                features: Future | None = None, descriptor: np.ndarray | None = None,
                exclude: np.ndarray | None = None) -> Answer:
        s = self.settings
        verified: dict[int, int] = {}
        qf = None
        # the references scored: with the approximate search (or references left out), rank only
        # those, not an N-long row (at 1M references: 0.3 ms to find them against 26 ms to rank all)
        finite = np.flatnonzero(np.isfinite(scores))
        live = finite if len(finite) < len(scores) // 2 else None
        if s.verify and s.verify_top > 0 and query.image is not None:
            more = None
            if not self._rerank and descriptor is not None:  # the halves' best rows, if the second look is taken
                def more(image=query.image, sc=scores, co=cos, d=descriptor):
                    return self._half_rows(image, sc, co, d)
            scores, verified, qf = self.verification.shortlist(query.image, scores, s.verify_top,
                                                               None if features is None else features.result(), live,
                                                               more)
            if live is not None:  # the halves may have scored rows the first ranking had not
                live = np.flatnonzero(np.isfinite(scores))
        labels = self.index.labels
        top = _rank(scores, labels, s.k, s.per_instance, live)
        judged_row = int(top[0]) if len(top) else -1  # the verdict judges the top object's best-ranked photo
        shortlist = np.fromiter(verified, np.intp, len(verified))
        shortlist = shortlist[order(scores[shortlist])]
        top = lead_within(top, labels, verified, shortlist)
        results = []
        for rank, row in enumerate(top, start=1):
            row = int(row)
            if not np.isfinite(scores[row]):
                break
            it = self.index.items[row]
            results.append(Result(rank, row, float(scores[row]), float(cos[row]),
                                  verified.get(row) if s.verify else None, it.path,
                                  str(self.index.root / it.path), it.instance, dict(it.metadata)))
        rival, top_inliers, top_cosine, expected = 0, None, float("nan"), 0
        wcosine = wmargin = float("nan")
        if results:
            instance, top_cosine = results[0].instance, float(cos[judged_row])
            part = None
            if qf is not None and judged_row in verified:
                # the object's evidence: the best verified photo of the top result's object
                assert query.image is not None  # qf is only set for a photo (verified above)
                top_inliers, rival, expected = self.verification.top_evidence(query.image, qf, instance, verified)
                part_cosine, part = self._part_cosine(query, qf, instance, verified, descriptor)
                top_cosine = max(top_cosine, part_cosine)
            margin = cosine_margin(labels, instance, top_cosine, cos, np.isfinite(scores))
            if descriptor is not None:
                regions = np.asarray(descriptor, np.float32).reshape(-1, self.index.meta.dim)
                valid = None if exclude is None else ~np.asarray(exclude, bool)
                wcosine, wmargin = self._whitened(regions, instance, valid, scores, part)
            judged = self.verdict.judge(Evidence(top_cosine, top_inliers, True, True, rival, margin, expected=expected,
                                                 wcosine=wcosine, wmargin=wmargin))
            known, reason, confidence = judged.known, judged.reason, judged.confidence
        else:
            known, reason, confidence, margin = False, "the collection is empty", None, float("nan")
        full = lead_within(order(scores), self._label_codes(), verified) if full_ranking else None
        answer = Answer(query.name, results, known, reason, scores, cos, verified, full, rival, top_inliers,
                        margin, confidence, qf, top_cosine, expected=expected, wcosine=wcosine, wmargin=wmargin)
        answer.objects = self.objects_in(query, answer)
        return answer

    def _part_cosine(self, query: QueryImage, qf: Features, instance: str, verified: dict[int, int],
                     descriptor: np.ndarray | None) -> tuple[float, np.ndarray | None]:
        """The cosine between the photo (its best region, ``descriptor``: (R, D)) and the part of the
        top object's best verified reference that it shows, when it shows a part only
        (:meth:`museum_search.core.verification._shortlist.Verification.shown_part`: a close-up) and
        that object is verified (at least the verdict's ``min_inliers``), with that part's (1, D)
        descriptor; (-inf, None) otherwise.

        A close-up of a work is unlike its reference photo as a whole (the frame, the wall, the
        rest of the work), and like the part it shows: the sample's q04, 13 % of its reference,
        has a cosine of 0.67 with the reference and 0.84 with that part; a photo of another work
        in the same frame, matched on the frame, covers most of the reference, and is not asked."""
        labels = self.index.labels
        inliers, row = max((n, r) for r, n in verified.items() if labels[r] == instance)
        if descriptor is None or query.image is None or inliers < self.verdict.min_inliers:
            return float("-inf"), None
        box = self.verification.shown_part(query.image, row, qf)
        if box is None:
            return float("-inf"), None
        try:
            ref = load_image(self.index.abspath(row), max_side=VERIFY_SIDE)
        except (ImageError, OSError) as exc:
            log.debug("the part of %s the photo shows is not described: %s", self.index.items[row].path, exc)
            return float("-inf"), None
        h, w = ref.shape[:2]
        x0, y0, x1, y1 = box
        part = ref[int(y0 * h):int(np.ceil(y1 * h)), int(x0 * w):int(np.ceil(x1 * w))]
        if min(part.shape[:2]) < 2:
            return float("-inf"), None
        d = self._describe([part])
        return float((np.asarray(descriptor, np.float32).reshape(-1, d.shape[-1]) @ d.reshape(-1)).max()), d

    def describe(self, images: Sequence[np.ndarray]) -> np.ndarray:
        """(n, D) descriptors of whole images, each as one region (as a reference is described)."""
        return self._describe(images)

    def _describe(self, crops: Sequence[np.ndarray]) -> np.ndarray:
        """(n, D) descriptors of parts of a photo, each as one region (not cut into the photo's regions)."""
        ex = self.extractor
        return ex.embed([ex.preprocess(_shrink(np.ascontiguousarray(c), ex.max_side)) for c in crops])

    def _whitening(self) -> Whitening | None:
        """The index's learned whitening (:mod:`museum_search.core.answer._whitening`), or None."""
        stored = getattr(self.index, "whitening", None)
        if stored is None:
            return None
        key = id(stored)
        if key not in self._whitenings or self._whitenings[key][0] is not stored:
            if len(self._whitenings) > 8:  # a calibration's folds come and go
                self._whitenings.clear()
            self._whitenings[key] = (stored, Whitening.from_array(stored, self.index.meta.dim))
        return self._whitenings[key][1]

    def _whitened(self, regions: np.ndarray, instance: str, valid: np.ndarray | None, scores: np.ndarray,
                  part: np.ndarray | None = None) -> tuple[float, float]:
        """The whitened cosine of the photo (its ``regions``: (R, D)) with object ``instance`` (its
        best reference, or ``part``, the (1, D) descriptor of the part of one that the photo shows),
        and its margin over the best reference of another object; (nan, nan) without whitening.
        The references compared: the ``valid`` ones (None: all), of an index of at most
        :data:`WHITEN_ALL` references; of a larger one, those scored (finite ``scores``)."""
        w = self._whitening()
        if w is None:
            return float("nan"), float("nan")
        labels = self.index.labels
        rows = None if valid is None else np.flatnonzero(valid)
        if len(labels) > WHITEN_ALL:
            rows = np.flatnonzero(np.isfinite(scores) if valid is None else valid & np.isfinite(scores))
            refs = w.apply(self.index.descriptors[rows])
        else:
            refs = w.references(self.index.descriptors)
            refs = refs if rows is None else refs[rows]
        lab = labels if rows is None else labels[rows]
        q = w.apply(regions)
        s = (q @ refs.T).max(axis=0) if len(refs) else np.empty(0, np.float32)
        own = lab == instance
        best = float(s[own].max()) if own.any() else float("-inf")
        if part is not None:
            best = max(best, float((q @ w.apply(part).T).max()))
        if not np.isfinite(best):
            return float("nan"), float("nan")
        other = s[~own]
        return best, best - float(other.max()) if len(other) else best

    def _half_rows(self, image: np.ndarray, scores: np.ndarray, cos: np.ndarray, descriptor: np.ndarray
                   ) -> np.ndarray:
        """The best :data:`HALF_TOP` references of each half of the photo ``image`` (cut across its
        longer side), which the second look verifies too (:meth:`museum_search.core.verification.Verification.shortlist`):
        on a wall with two works, each work fills one half, while the photo's regions (60 % of
        it) each show some of the other work; qsd2_w3/00012's two paintings, 133rd and 185th by
        their best region, are 12th in their halves. A reference left out of this query (a -inf
        score with a finite cosine) is not proposed; one the first ranking did not score (outside
        the exact prefix or the approximate search's candidates) gets its exact cosine with the
        photo's regions (``descriptor``: (R, D)) in ``cos`` and ``scores``, as if it had."""
        h, w = image.shape[:2]
        halves = [image[:, :w // 2], image[:, w // 2:]] if w >= h else [image[:h // 2], image[h // 2:]]
        if min(halves[0].shape[:2]) < MIN_PART:
            return np.empty(0, np.intp)
        desc = self._describe(halves)
        rows = np.empty(0, np.intp)
        for half in ranking_scores(self.index, desc[:, None], self.search_mode, rows=HALF_TOP, objects=1):
            best = _best_proposed(half, scores, cos)
            rows = np.concatenate([rows, best[~np.isin(best, rows)]])
        fill = np.sort(rows[~np.isfinite(cos[rows])])
        if len(fill):
            regions = np.asarray(descriptor, np.float32).reshape(-1, desc.shape[-1])
            cos[fill] = scores[fill] = candidate_scores(self.index.descriptors, regions, fill).max(axis=0)
        return rows

    # ---- every object in the photo ------------------------------------------------------------
    def objects_in(self, query: QueryImage, answer: Answer) -> list[FoundObject]:
        """Every collection object found in the photo of ``answer``: none when it is not in the
        collection; else its top result (as judged), then each other object of the verified
        shortlist whose best photo has at least the verdict's ``min_inliers`` and lies apart from
        the objects found before (:func:`museum_search.core.verification.apart`: a work beside
        another is a second object, not a rival), judged by the verdict on its own evidence (its
        cosine, its margin over the objects not found, its inliers and its rival on its own part of
        the photo), most matching points first."""
        top = answer.top
        if top is None or not answer.in_collection or answer.confidence is None:
            return []
        first = self.top_matches(query, answer)
        outline = None if first is None else first.outline
        found = [self._found(query, top.instance, answer.confidence, answer.reason, first, answer, top.row)]
        if outline is None or answer.features is None or self.settings.rivals_anywhere:
            # not verified: where the object lies is not known, nor what lies beside it (calibration,
            # rivals anywhere: a view shows one object)
            return found
        assert query.image is not None  # verified: a photo
        image, qf, verified = query.image, answer.features, answer.verified_inliers
        assert first is not None  # it has an outline
        where = [first]  # the matches of the objects found
        for instance, row, inliers in self.verification.further_objects(verified, {top.instance}):
            m = self.verification.matches(image, row, qf)
            if m.outline is None or not all(apart(f, m) for f in where):
                continue
            evidence = self._evidence(query, answer, instance, row, inliers, m, {f.instance for f in found})
            judged = None if evidence is None else self.verdict.judge(evidence)
            if judged is not None and judged.known:
                found.append(self._found(query, instance, judged.confidence, judged.reason, m, answer, row))
                where.append(m)
        return found + self._beside(query, answer, found, where)

    def _free_part(self, image: np.ndarray, where: list[Matches]) -> tuple[int, int, int, int] | None:
        """The part of the photo beside the objects found (``where``: their matches), across the
        photo's longer side: (x0, y0, x1, y1) px of the larger span before or after their outlines,
        when it is at least :data:`BESIDE` of that side; else None."""
        h, w = image.shape[:2]
        axis = 0 if w >= h else 1
        length = (w, h)[axis]
        spans = [c[:, axis] for c in (outline_in_photo(m, (w, h)) for m in where) if c is not None]
        if not spans:
            return None
        lo = max(0, int(np.floor(min(c.min() for c in spans))))
        hi = min(length, int(np.ceil(max(c.max() for c in spans))))
        if max(lo, length - hi) < BESIDE * length:
            return None
        a0, a1 = (0, lo) if lo >= length - hi else (hi, length)
        return (a0, 0, a1, h) if axis == 0 else (0, a0, w, a1)

    def _textured(self, image: np.ndarray, box: tuple[int, int, int, int], qf: Features) -> bool:
        """Whether the photo's local features ``qf`` (its frame: ``image`` at most ``max_side``) have
        at least the gate's count of keypoints in the part ``box`` (px): fewer, and it is a bare wall,
        where no object could be verified (the visitor protocol's paintings from afar have at most 6
        there, qsd2_w3/00012's second work 35; looking at a part alone costs a SIFT of it at full
        size, about twice the first look's)."""
        h, w = image.shape[:2]
        s = min(1.0, self.verification.params.max_side / max(h, w))
        pts = np.asarray(qf[0])
        x0, y0, x1, y1 = (v * s for v in box)
        inside = (pts[:, 0] >= x0) & (pts[:, 0] < x1) & (pts[:, 1] >= y0) & (pts[:, 1] < y1)
        return int(np.count_nonzero(inside)) >= self.verification.gate

    def _beside(self, query: QueryImage, answer: Answer, found: list[FoundObject], where: list[Matches]
                ) -> list[FoundObject]:
        """The further objects in the part of the photo beside those ``found`` (:meth:`_free_part`),
        looked at alone: its best :data:`HALF_TOP` references by its own description (the objects
        found aside), verified with its own local features, when the photo's have keypoints there
        (:meth:`_textured`; :meth:`museum_search.core.verification.Verification.part`: on a wall of two works, the photo's
        keypoints go to the brighter, busier one; qsd2_w3/00012's dark green painting has 0 inliers
        with the photo's and 19 with its half's), each object with at least the gate judged by the
        verdict on its own evidence there, as :meth:`objects_in`'s."""
        assert query.image is not None and answer.features is not None  # verified (objects_in)
        image = query.image
        box = self._free_part(image, where)
        if box is None:
            return []
        x0, y0, x1, y1 = box
        if not self._textured(image, box, answer.features):
            return []
        desc = self._describe([image[y0:y1, x0:x1]])
        cos = ranking_scores(self.index, desc, self.search_mode, rows=HALF_TOP, objects=1)[0]
        names = {f.instance for f in found}
        rows = _best_proposed(cos, answer.scores, answer.cosine, ~np.isin(self.index.labels, sorted(names)))
        shown = self.verification.verifier.last_found()
        out: list[FoundObject] = []
        try:
            qf, inl = self.verification.part(image, box, rows)
            verified = {int(r): int(n) for r, n in zip(rows, inl)}
            for instance, row, inliers in self.verification.further_objects(verified, names):
                m = self.verification.matches(image, row, qf)
                if m.outline is None or not all(apart(f, m) for f in where):
                    continue
                evidence = self._evidence(query, answer, instance, row, inliers, m, names, verified, qf)
                judged = None if evidence is None else self.verdict.judge(evidence)
                if judged is not None and judged.known:
                    out.append(self._found(query, instance, judged.confidence, judged.reason, m, answer, row,
                                           inliers, float(cos[row])))
                    where.append(m)
                    names.add(instance)
        finally:
            self.verification.verifier.restore_found(shown)
        return out

    def _evidence(self, query: QueryImage, answer: Answer, instance: str, row: int, inliers: int, m: Matches,
                  found: set[str], verified: dict[int, int] | None = None, qf: Features | None = None
                  ) -> Evidence | None:
        """The evidence of a further object ``instance`` in the photo (its best verified photo
        ``row``, ``inliers``, its matches ``m``), on its own part of the photo: the part within its
        outline is described, its cosine is the best of its shortlisted photos with that part, its
        margin that over the best object not ``found``; its rival is the most inliers of another
        object on that part (:meth:`museum_search.core.verification.Verification.rival`). None when
        that part is too small to describe. ``verified`` and ``qf``: the shortlist (row → inliers)
        and the features it was verified with, when not the answer's (a part looked at alone)."""
        assert query.image is not None and answer.features is not None
        verified = answer.verified_inliers if verified is None else verified
        qf = answer.features if qf is None else qf
        image = query.image
        h, w = image.shape[:2]
        corners = outline_in_photo(m, (w, h))
        assert corners is not None  # m has an outline (objects_in)
        x0, y0 = np.clip(np.floor(corners.min(axis=0)), 0, [w, h]).astype(int)
        x1, y1 = np.clip(np.ceil(corners.max(axis=0)), 0, [w, h]).astype(int)
        if min(x1 - x0, y1 - y0) < MIN_PART:
            return None
        part = QueryImage(f"{query.name} (part)", np.ascontiguousarray(image[y0:y1, x0:x1]))
        desc = self.embed([part])
        labels = self.index.labels
        mine = np.array(sorted(r for r in verified if labels[r] == instance), np.intp)
        refs = np.asarray(self.index.descriptors[mine], np.float32)
        cosine = float((desc[0] @ refs.T).max())
        cos = ranking_scores(self.index, desc, self.search_mode, rows=max(1, self.settings.verify_top),
                             objects=len(found) + 2)[0]
        valid = np.isfinite(cos) & ~np.isin(labels, sorted(found))
        margin = cosine_margin(labels, instance, cosine, cos, valid)
        rival = self.verification.rival(image, qf, instance, row, inliers, verified)
        wcosine, wmargin = self._whitened(desc[0], instance, ~np.isin(labels, sorted(found)), cos)
        return Evidence(cosine, inliers, True, True, rival, margin, wcosine=wcosine, wmargin=wmargin)

    def _found(self, query: QueryImage, instance: str, confidence: float, reason: str, m: Matches | None,
               answer: Answer, row: int, inliers: int | None = None, cosine: float | None = None) -> FoundObject:
        """The :class:`FoundObject` of ``instance`` shown by reference ``row`` (``m``: its matches;
        ``inliers`` and ``cosine``: its own when not the answer's shortlist's, a part looked at alone)."""
        assert query.image is not None or m is None
        corners = None
        if m is not None and query.image is not None:
            in_image = outline_in_photo(m, (query.image.shape[1], query.image.shape[0]))
            if in_image is not None:
                corners = tuple((float(x), float(y)) for x, y in query.to_photo(in_image))
        result = next((r for r in answer.results if r.row == row), None)
        if result is None:
            it = self.index.items[row]
            score = float(answer.scores[row])
            if not np.isfinite(score):  # scored only in the part looked at alone
                score = float(answer.cosine[row]) if np.isfinite(answer.cosine[row]) else float(cosine or 0.0)
            rank = 1 + int(np.count_nonzero(answer.scores > score))
            result = Result(rank, row, score, float(answer.cosine[row]) if np.isfinite(answer.cosine[row]) else score,
                            answer.verified_inliers.get(row) if inliers is None else inliers,
                            it.path, str(self.index.root / it.path), it.instance, dict(it.metadata))
        shown = answer.verified_inliers.get(row) if inliers is None else inliers
        return FoundObject(instance, float(confidence), reason, corners, result, shown)

    # ---- what a viewer draws ------------------------------------------------------------------
    def matches(self, query: QueryImage, row: int, answer: Answer | None = None) -> Matches:
        """The inlier matches and projected outline of reference ``row`` in the query photo (``answer``:
        this photo's answer, whose local features are then reused)."""
        assert query.image is not None  # a photo query: a descriptor query has no photo to draw on
        return self.verification.matches(query.image, row, answer.features if answer is not None else None)

    def top_matches(self, query: QueryImage, answer: Answer) -> Matches | None:
        """The matches the verdict judged: those of the best verified photo of the top result's
        object (:meth:`museum_search.core.verification._shortlist.Verification.top_evidence`), when it is verified (at least the
        verdict's ``min_inliers``); else None."""
        top = answer.top
        if top is None or answer.top_inliers is None or answer.top_inliers < self.verdict.min_inliers:
            return None
        labels = self.index.labels
        _, row = max((n, r) for r, n in answer.verified_inliers.items() if labels[r] == top.instance)
        return self.matches(query, row, answer)


def _best_proposed(part: np.ndarray, scores: np.ndarray, cos: np.ndarray, keep: np.ndarray | None = None
                   ) -> np.ndarray:
    """The best :data:`HALF_TOP` rows by a part of the photo's scores ``part`` among those this query may
    propose (and ``keep``, when given): not left out of it (a -inf ``scores`` with a finite ``cos``);
    a row its first ranking did not score (both -inf) may be."""
    ok = np.isfinite(part) & (np.isfinite(scores) | ~np.isfinite(cos))
    cand = np.flatnonzero(ok if keep is None else ok & keep)
    return cand[order(part[cand], HALF_TOP)]


def _rank(scores: np.ndarray, labels: np.ndarray, k: int, one_per_instance: bool, live: np.ndarray | None
          ) -> np.ndarray:
    """The best ``k`` rows of ``scores`` (or of its objects), ties by row; ``live``: the only rows
    with a finite score, ascending (the others rank last and are never shown), or None."""
    if live is None:
        return per_instance(scores, labels, k) if one_per_instance else order(scores, k)
    sub = scores[live]  # live is ascending: ties by position are ties by row
    return live[per_instance(sub, labels[live], k) if one_per_instance else order(sub, k)]
