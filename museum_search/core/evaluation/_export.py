"""A run as exported, and run again: what the Evaluation tab's and ``evaluate``'s JSON and CSV hold.

The JSON of a run (:func:`run_document`, :func:`write_run_json`) is the report's
(:func:`museum_search.core.evaluation._reports.report_dict`: summary, 95 % intervals, one record per query with its verdict)
plus a ``"run"`` section, a :class:`RunSpec`: everything needed to answer the same queries the same
way again,

* ``index``: its folder, its id (:func:`index_id`: a digest of the data files that decide the
  answers, as recorded in its manifest: the descriptors, the items and the local features; it does
  not change when the verdict is re-calibrated or the neighbour lists are stored), its size and
  backbone, and ``ann_id`` (:func:`ann_id`: a digest of its approximate index's parameters, tuning
  included, and of its file; "none" without one): a rebuilt approximate index (other ``nprobe``,
  ``shortlist`` or training) gives other answers with the same descriptors;
* ``query_set``: where the labelled queries are (:class:`QuerySetSource`: the folder or CSV, the
  layout and expression asked for, or the descriptors and ground truth of queries given as
  descriptors), their number and id (:func:`queryset_id`);
* ``settings``: every field of the frozen :class:`~museum_search.core.answer._pipeline.QuerySettings` and
  :class:`~museum_search.core.answer._rerank.RerankOptions` (:func:`settings_dict`), the verdict the
  answers were judged with (its rule, thresholds and model: re-running uses it even if the index
  was re-calibrated since), and ``resolved``: what the pipeline chose (K_q/K_g suggested from the
  collection, exact or approximate search);
* ``batch_size``, the inference ``engine`` and ``weights``, the program's ``version``.

``museum-search evaluate --settings RUN.json`` reads it back (:func:`read_run`), checks the index
and the query set are the ones of the run (:meth:`RunSpec.check_index`,
:meth:`RunSpec.check_queryset`: a clear error otherwise, nothing is written) and evaluates again
with the search the run resolved (``auto`` is not resolved again: another machine or a rebuilt
approximate index could choose otherwise; :meth:`RunSpec.settings_for`, :meth:`RunSpec.notes`);
:func:`same_numbers` compares the two summaries. The approximate index is checked when the run used
it; a run exported before ``ann_id`` existed runs again with a note that it could not be checked.

The CSV (:func:`write_run_csv`) has one line per query: its metrics, the top result (its
``top1_rank_score`` is what the ranking sorted by: the cosine, or the re-ranker's score, plus the
verification bonus of a verified reference, so it can exceed 1; ``top1_cosine`` is the cosine),
the verdict (``in_collection``, ``reason``, ``inliers``, ``confidence``), and the run's settings in
columns of their own (:data:`CSV_RUN_COLUMNS`, the same on every line) so a spreadsheet of several
runs tells them apart. Only the JSON can be run again (the verdict's model does not fit a column).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from museum_search import __version__
from museum_search.core import inference as engines
from museum_search.core.answer import QuerySettings, RerankOptions, Verdict, icfrr_k_g, suggest_params
from museum_search.core.errors import MuseumSearchError
from museum_search.core.evaluation._metrics import METRICS, QUERY_METRICS, SUMMARY_METRICS, current_keys
from museum_search.core.evaluation._querysets import QuerySet, load_queryset
from museum_search.core.evaluation._reports import atomic_write, report_dict, write_csv
from museum_search.core.evaluation._runner import EvalReport
from museum_search.core.index import Index, read_manifest

#: ``run.format`` of an exported run, and its version.
FORMAT = "museum-search evaluation run"
VERSION = 1
#: The data files of an index whose content decides the answers (manifest ``sha256`` keys; the
#: local features are all the ``local_*`` files).
ANSWER_FILES = ("descriptors", "items")
#: :func:`ann_id` of an index without an approximate index.
NO_ANN = "none"
#: The summary's numbers a re-run must give again (:func:`same_numbers`): the means, the figures
#: over the answers (GAP and its companion), the counts.
REPRODUCED = (*SUMMARY_METRICS,
              *(k for m in METRICS.values() if m.summary and not m.mean for k in (m.key, m.companion) if k),
              "queries", "open_set_queries", "unknown_instance_queries", "skipped_queries")
#: Figures of the summary a run exported before they existed does not have (not compared then).
NEWER = ("all_objects", "extra_objects")
#: The per-query figures a re-run must give again.
REPRODUCED_PER_QUERY = (*QUERY_METRICS, "in_collection", "reason", "inliers", "confidence")
#: The CSV's columns of the run (after :data:`museum_search.core.evaluation._reports.CSV_QUERY_COLUMNS`), the same on every line.
CSV_RUN_COLUMNS = ("run", "index_id", "ann_id", "index_path", "query_set", "layout", "regex", "rerank", "k_q", "k_g",
                   "beta", "iterations", "icfrr_mode", "qe_n", "qe_alpha", "verify", "verify_top", "search",
                   "regions", "per_instance", "rivals_anywhere", "verdict", "batch_size", "engine")
#: What the JSON says about ``top``/``top1_rank_score`` (the score is not a cosine).
RANK_SCORE_NOTE = ("top1_rank_score: what the final ranking sorted by: the cosine (or, with a re-ranker, "
                   "its score: ICFRR's grows with each iteration), plus for a verified reference "
                   "weight x min(inliers, cap) / cap; it can exceed 1. top1_cosine / cosine: the "
                   "descriptors' cosine similarity of the top result.")


# ---- identities ------------------------------------------------------------------------------


def _digest(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def index_id(index: Index) -> str | None:
    """The id of the index's content that decides the answers: a digest of its manifest's SHA-256
    of the descriptors, the items and the local features. Re-calibrating the verdict or storing
    neighbour lists keeps it; adding, changing or removing a reference changes it. None for an
    index that was never saved (no manifest)."""
    if index.path is None:
        return None
    try:
        sha = read_manifest(Path(index.path)).get("sha256") or {}
    except MuseumSearchError:
        return None
    kept = {k: v for k, v in sha.items() if k in ANSWER_FILES or k.startswith("local_")}
    return _digest(kept) if kept else None


def ann_id(index: Index) -> str | None:
    """The id of the index's approximate-search part: a digest of its manifest's ``ann`` parameters
    (``nprobe``, ``shortlist``, the tuning measured at build time...) and the SHA-256 of its file;
    :data:`NO_ANN` when it has none; None for an index never saved (no manifest). Cheap: both are
    read from the manifest, the file is not hashed again."""
    if index.path is None:
        return None
    try:
        manifest = read_manifest(Path(index.path))
    except MuseumSearchError:
        return None
    params, sha = manifest.get("ann"), (manifest.get("sha256") or {}).get("ann")
    if not params or "ann" not in (manifest.get("files") or {}):
        return NO_ANN
    return _digest({"params": params, "sha256": sha})


def _ann_text(params: dict[str, Any] | None) -> str:
    """An approximate index's parameters in words, for the messages of a re-run."""
    if not params:
        return "no approximate index"
    tuned = "tuned" if params.get("tuning") else "not tuned"
    return f"nprobe {params.get('nprobe')}, shortlist {params.get('shortlist')}, {params.get('nlist')} cells, {tuned}"


def _ann_params(index: Index) -> dict[str, Any] | None:
    """The manifest's ``ann`` parameters of ``index`` (None: none, or not saved)."""
    if index.path is None:
        return None
    try:
        params = read_manifest(Path(index.path)).get("ann")
    except MuseumSearchError:
        return None
    return dict(params) if isinstance(params, dict) else None


def queryset_id(queryset: QuerySet) -> str:
    """A digest of the queries (path relative to the query set's folder) and their ground truth."""
    def rel(path: str) -> str:
        try:
            return Path(path).relative_to(queryset.root).as_posix()
        except ValueError:
            return path

    return _digest([[rel(q.path), sorted(q.relevant)] for q in queryset.queries])


@dataclass(frozen=True)
class QuerySetSource:
    """Where a run's labelled queries come from: ``path`` (a folder, or a ground_truth.csv) loaded
    with ``layout`` and ``regex``; or, for queries given as descriptors, ``descriptors`` (Q.npy)
    with ``path`` their ground truth CSV."""

    path: str
    layout: str = "auto"
    regex: str | None = None
    descriptors: str | None = None

    @property
    def name(self) -> str:
        """A short name for run names: the folder's name (the CSV's folder for a ground truth)."""
        p = Path(self.descriptors or self.path)
        return p.parent.name if p.suffix.lower() == ".csv" else p.name

    def load(self) -> QuerySet:
        """The query set again (photos; queries given as descriptors are loaded by the caller, which
        knows the index: ``importing.descriptor_queryset``)."""
        if self.descriptors is not None:
            raise MuseumSearchError("queries given as descriptors are loaded with the index "
                                    "(importing.descriptor_queryset)")
        if not Path(self.path).exists():
            raise MuseumSearchError(f"the run's query set is not at {self.path} any more; give its new place "
                                    "(museum-search evaluate --settings RUN.json INDEX QUERIES)")
        return load_queryset(self.path, self.layout, regex=self.regex)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QuerySetSource":
        return cls(str(d["path"]), str(d.get("layout") or "auto"), d.get("regex"), d.get("descriptors"))


# ---- settings ----------------------------------------------------------------------------------


def verdict_dict(verdict: Verdict) -> dict[str, Any]:
    """The verdict's rule, thresholds and model (its calibration evidence left out: it only refits)."""
    d = verdict.to_dict()
    d.pop("evidence", None)
    return d


def settings_dict(settings: QuerySettings, verdict: Verdict | None = None) -> dict[str, Any]:
    """Every field of ``settings`` (the re-rankers' options as a dict) but the engine (the run's own
    ``engine``, :class:`RunSpec`); ``verdict``: the verdict the answers were judged with (default: the
    settings' own; None: the index's)."""
    out: dict[str, Any] = {}
    for f in fields(QuerySettings):
        if f.name == "engine":
            continue
        value = getattr(settings, f.name)
        if f.name == "options":
            value = asdict(value)
        elif f.name == "rerank":
            value = list(value)
        elif f.name == "verdict":
            v = verdict if verdict is not None else value
            value = None if v is None else verdict_dict(v)
        out[f.name] = value
    return out


def settings_from_dict(d: dict[str, Any]) -> QuerySettings:
    """:func:`settings_dict` read back; an unknown or missing setting is an error that says so."""
    try:
        known = {f.name for f in fields(QuerySettings)}
        unknown = set(d) - known
        if unknown:
            raise MuseumSearchError(f"settings this version does not know: {', '.join(sorted(unknown))} "
                                    "(the run was exported by a newer museum-search)")
        opts = dict(d.get("options") or {})
        o_known = {f.name for f in fields(RerankOptions)}
        if set(opts) - o_known:
            raise MuseumSearchError("re-ranking options this version does not know: "
                                    + ", ".join(sorted(set(opts) - o_known)))
        kw = {k: v for k, v in d.items() if k not in ("options", "verdict")}
        verdict = Verdict.from_dict(d["verdict"]) if d.get("verdict") else None
        return QuerySettings(**kw, options=RerankOptions(**opts), verdict=verdict)
    except (TypeError, ValueError, AttributeError) as exc:
        raise MuseumSearchError(f"the run's settings cannot be read ({exc})") from None


def resolved(settings: QuerySettings, index: Index, search_mode: str = "") -> dict[str, Any]:
    """What the pipeline chose where the settings leave it open: ICFRR's K_q/K_g (suggested from
    the collection when not set) and the search ("exact" or "ann")."""
    out: dict[str, Any] = {"search": search_mode or settings.search}
    if "icfrr" in settings.rerank:
        o = settings.options
        base = suggest_params(list(index.labels)) if o.k_q is None or o.k_g is None else None
        out["k_q"] = o.k_q if o.k_q is not None else base.k_q if base else None
        out["k_g"] = icfrr_k_g(index.labels, o)
    return out


# ---- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSpec:
    """Everything needed to evaluate a run again (see the module docstring)."""

    name: str
    index_path: str | None
    index_id: str | None
    references: int
    instances: int
    backbone: str
    query_set: QuerySetSource
    queries: int
    queryset_id: str
    settings: QuerySettings  # its verdict: the one the answers were judged with
    resolved: dict[str, Any]
    batch_size: int = 8
    engine: str | None = None
    weights: str | None = None
    version: str = __version__
    #: :func:`ann_id` of the run's index; None: not recorded (a run exported before it existed)
    ann_id: str | None = None
    #: the run's approximate index's parameters (the manifest's ``ann``), for the messages
    ann_params: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "name": self.name, "program": f"museum-search {self.version}",
                "index": {"path": self.index_path, "id": self.index_id, "references": self.references,
                          "instances": self.instances, "backbone": self.backbone, "ann_id": self.ann_id,
                          "ann": self.ann_params},
                "query_set": {**self.query_set.to_dict(), "queries": self.queries, "id": self.queryset_id},
                "settings": settings_dict(self.settings), "resolved": dict(self.resolved),
                "batch_size": self.batch_size, "engine": self.engine, "weights": self.weights}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise MuseumSearchError("not an exported evaluation run (no \"run\" section of format "
                                    f"{FORMAT!r}); export the run again from this version's Evaluation tab "
                                    "or evaluate --json")
        version = d.get("version", 0)
        if not isinstance(version, int) or isinstance(version, bool):
            raise MuseumSearchError(f"the run's format version is damaged ({version!r}, not a number); export "
                                    "the run again")
        if version > VERSION:
            raise MuseumSearchError(f"the run was exported in format {d.get('version')}, newer than this "
                                    f"program's ({VERSION}); update museum-search")
        try:
            ix, qs = d["index"], d["query_set"]
            return cls(str(d.get("name") or ""), ix.get("path"), ix.get("id"), int(ix["references"]),
                       int(ix["instances"]), str(ix.get("backbone") or ""), QuerySetSource.from_dict(qs),
                       int(qs["queries"]), str(qs["id"]), settings_from_dict(d["settings"]),
                       dict(d.get("resolved") or {}), int(d.get("batch_size") or 8), d.get("engine"),
                       d.get("weights"), str(d.get("program", "")).removeprefix("museum-search ") or __version__,
                       ann_id=None if ix.get("ann_id") is None else str(ix["ann_id"]),
                       ann_params=dict(ix["ann"]) if isinstance(ix.get("ann"), dict) else None)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MuseumSearchError(f"the run's section is incomplete or damaged ({type(exc).__name__}: {exc})"
                                    ) from None

    # ---- checks before running again ----------------------------------------------------------
    def check_index(self, index: Index) -> None:
        """Raise, saying what to do, unless ``index`` has the content the run was evaluated on."""
        where = index.path or index.root
        if self.index_id is None:
            raise MuseumSearchError("the run was made on an index that was not saved; it cannot be run again")
        now = index_id(index)
        if now != self.index_id:
            then = f"{self.references:,} references of {self.instances:,} instances"
            size = f"{len(index):,} references of {len(index.instances):,} instances"
            raise MuseumSearchError(
                f"the index {where} is not the one the run was evaluated on ({then} then, {size} now; "
                "its descriptors, items or local features differ). Give the run's index folder "
                f"({self.index_path}), or evaluate this index with the same settings anew")
        if self.search != "ann":
            return  # the exact search: the approximate index does not decide the scores
        if index.ann is None:
            raise MuseumSearchError(
                f"the run used the approximate search, and the index {where} has no approximate index now "
                "(or faiss is not installed here); give the run's index folder "
                f"({self.index_path}), or evaluate this index with the same settings anew")
        if self.ann_id is not None and ann_id(index) != self.ann_id:
            raise MuseumSearchError(
                f"the index {where} is not the one the run was evaluated on: the run used the approximate "
                f"search and its approximate index differs ({_ann_text(self.ann_params)} then, "
                f"{_ann_text(_ann_params(index))} now, or the index file was rebuilt), which gives other answers. "
                f"Give the run's index folder ({self.index_path}), or evaluate this index with the same "
                "settings anew")

    @property
    def search(self) -> str:
        """The search the run used: "exact" or "ann" as it resolved (what ``auto`` chose then), or
        the settings' when the run did not record it."""
        mode = self.resolved.get("search")
        return str(mode) if mode in ("exact", "ann") else self.settings.search

    def notes(self) -> list[str]:
        """What a user is told before the run is evaluated again: the search it resolved to when it
        asked for ``auto``, and an approximate index that could not be checked (an older export)."""
        out = []
        if self.settings.search == "auto" and self.search != "auto":
            out.append(f"the run's search \"auto\" chose the {'approximate' if self.search == 'ann' else 'exact'} "
                       f"search then; it runs again with --search {self.search} (auto could choose otherwise here)")
        if self.search == "ann" and self.ann_id is None:
            out.append("the run was exported before museum-search recorded the approximate index; it is not "
                       "checked, and a rebuilt one (other nprobe, shortlist or training) gives other answers")
        return out

    def check_queryset(self, queryset: QuerySet) -> None:
        """Raise, saying what to do, unless ``queryset`` holds the run's queries and ground truth."""
        if queryset_id(queryset) != self.queryset_id:
            raise MuseumSearchError(
                f"the query set at {queryset.root} changed since the run: its queries or their ground truth "
                f"differ ({self.queries:,} queries then, {len(queryset.queries):,} now); give the run's query set "
                f"({self.query_set.path})")

    def settings_for(self, index: Index) -> QuerySettings:
        """The run's settings for ``index``: its search as it resolved (:attr:`search`: ``auto`` is
        not resolved again); its verdict left to the index (None) when the index's own is the same,
        so the run is named as it was; else the run's verdict, kept."""
        settings = replace(self.settings, search=self.search)  # as resolved (see notes)
        own = verdict_dict(Verdict.of_index(index))
        if settings.verdict is not None and verdict_dict(settings.verdict) == own:
            return replace(settings, verdict=None)
        return settings


def run_spec(report: EvalReport, index: Index, source: QuerySetSource, queryset: QuerySet, *, name: str = "",
             batch_size: int = 8, weights: str | None = None) -> RunSpec:
    """The :class:`RunSpec` of ``report``, evaluated on ``index`` with ``queryset`` loaded from
    ``source`` (the verdict: the one the answers were judged with)."""
    settings = report.settings
    if source.layout == "auto" and source.descriptors is None:
        source = replace(source, layout=queryset.layout)  # as detected: loaded the same way again
    if settings is None:
        raise MuseumSearchError("this report has no settings (made by hand); it cannot be exported to run again")
    if report.verdict is not None:
        settings = replace(settings, verdict=report.verdict)
    return RunSpec(name, None if index.path is None else str(Path(index.path).resolve()), index_id(index), len(index),
                   len(index.instances), index.meta.summary(), source, len(queryset.queries), queryset_id(queryset),
                   settings, resolved(report.settings or settings, index, report.search_mode), int(batch_size),
                   report.engine or engines.resolve_engine(settings.engine), weights, ann_id=ann_id(index),
                   ann_params=_ann_params(index))


def run_document(report: EvalReport, index: Index, spec: RunSpec, rankings: bool = False,
                 seed: int = 0) -> dict[str, Any]:
    """The JSON document of a run: :func:`museum_search.core.evaluation._reports.report_dict` with ``summary.run`` (its name),
    ``summary.rerank`` (the pipeline with its parameters) and the ``run`` section (:class:`RunSpec`)."""
    doc = report_dict(report, index, rankings=rankings, seed=seed)
    summary = doc["summary"]
    if spec.name:
        summary["run"] = spec.name
    summary["rerank"] = spec.settings.label()
    summary["notes"] = {"top": "the top 5 results' instances", "score": RANK_SCORE_NOTE}
    return {"run": spec.to_dict(), **doc}


def write_run_json(path: str | os.PathLike, report: EvalReport, index: Index, spec: RunSpec,
                   rankings: bool = False, seed: int = 0) -> dict[str, Any]:
    """Write :func:`run_document` to ``path`` (atomically); returns it."""
    doc = run_document(report, index, spec, rankings=rankings, seed=seed)
    atomic_write(Path(path), json.dumps(doc, ensure_ascii=False, indent=1))
    return doc


def csv_run_values(spec: RunSpec) -> dict[str, Any]:
    """The run's columns of the CSV (:data:`CSV_RUN_COLUMNS`) and their values."""
    s, o = spec.settings, spec.settings.options
    r = spec.resolved
    verdict = s.verdict.rule(s.verify) if s.verdict is not None else "the index's"
    values = [spec.name, spec.index_id, spec.ann_id or "", spec.index_path, spec.query_set.descriptors or spec.query_set.path,
              spec.query_set.layout, spec.query_set.regex, "+".join(s.rerank) or "none",
              r.get("k_q", o.k_q), r.get("k_g", o.k_g), o.beta, o.iterations, o.icfrr_mode, o.qe_n, o.qe_alpha,
              s.verify, s.verify_top, r.get("search", s.search), s.regions, s.per_instance, s.rivals_anywhere,
              verdict, spec.batch_size, spec.engine]
    return dict(zip(CSV_RUN_COLUMNS, values, strict=True))


def write_run_csv(path: str | os.PathLike, report: EvalReport, index: Index, spec: RunSpec) -> None:
    """One line per query (:data:`museum_search.core.evaluation._reports.CSV_QUERY_COLUMNS`), then the run's :data:`CSV_RUN_COLUMNS`."""
    write_csv(report, index, Path(path), csv_run_values(spec))


def read_run(path: str | os.PathLike) -> tuple[RunSpec, dict[str, Any]]:
    """The :class:`RunSpec` of an exported run's JSON, and the whole document, its queries with
    today's per-query keys (an export written before they were unified says ``ap``, ``mnro``...:
    :func:`museum_search.core.evaluation._metrics.current_keys`), so :func:`same_numbers` compares it with a run of today."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MuseumSearchError(f"cannot read the run {p}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise MuseumSearchError(f"{p} is not a JSON file ({exc}); give the JSON a run was exported to") from None
    if not isinstance(doc, dict) or "run" not in doc:
        raise MuseumSearchError(f"{p} has no \"run\" section: it was exported by an older version or is not "
                                "an evaluation run; export the run again (Evaluation tab or evaluate --json)")
    spec = RunSpec.from_dict(doc["run"])
    if isinstance(doc.get("queries"), list):
        doc["queries"] = [current_keys(q) if isinstance(q, dict) else q for q in doc["queries"]]
    return spec, doc


def _queries_by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A run document's queries by their path relative to the query set's folder, so a query set
    given again at another place (``evaluate --settings RUN.json INDEX QUERIES``) has the same names."""
    where = Path(str(((doc.get("run") or {}).get("query_set") or {}).get("path") or "."))
    root = where.parent if where.suffix.lower() == ".csv" else where
    out = {}
    for q in doc.get("queries", []):
        name = str(q["query"])
        try:
            name = Path(name).relative_to(root).as_posix()
        except ValueError:  # a query given as a descriptor ("row 3"), or outside the folder
            pass
        out[name] = q
    return out


def same_numbers(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The differences between two run documents (:func:`run_document`) in the summary's numbers
    (:data:`REPRODUCED`) and every query's figures (:data:`REPRODUCED_PER_QUERY`); empty when the
    second gives exactly the numbers of the first."""
    diffs = []
    a, b = old.get("summary", {}), new.get("summary", {})
    for key in REPRODUCED:
        if key in NEWER and key not in a:
            continue  # a run exported before the figure existed
        if a.get(key) != b.get(key):
            diffs.append(f"{key}: {a.get(key)} then, {b.get(key)} now")
    qa, qb = _queries_by_name(old), _queries_by_name(new)
    if set(qa) != set(qb):
        added, gone = sorted(set(qb) - set(qa)), sorted(set(qa) - set(qb))
        diffs.append(f"the query set changed: {len(qa)} queries then, {len(qb)} now"
                     + "".join(f"; {what}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"
                               for what, names in (("new", added), ("gone", gone)) if names))
    for name in sorted(set(qa) & set(qb)):
        for key in REPRODUCED_PER_QUERY:
            if qa[name].get(key) != qb[name].get(key):
                diffs.append(f"{Path(name).name} {key}: {qa[name].get(key)} then, {qb[name].get(key)} now")
    return diffs
