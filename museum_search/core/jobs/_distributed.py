"""Describing a collection on a Ray cluster (``museum-search index … --ray [ADDRESS]``).

:func:`describe_on_ray` does what :func:`museum_search.core.inference._extract.extract` (and, with
verification, :func:`museum_search.core.verification._spatial.compute_local_features`) do on this
machine, as Ray tasks: the paths are cut into shares of consecutive files, each share is one task,
and the shares' results are merged back in the input order. A build that uses it writes one index
generation at the end, as a local build does; nothing is written when a share fails for good.

- **Ray is optional** (``pip install 'museum-search[cluster]'``): it is imported only here, when
  a Ray build starts (with :func:`importlib.import_module`, so that a frozen build's analysis does
  not pick it up), and a clear :class:`MuseumSearchError` says how to install it when it is missing.
- **Where it runs.** No ``address``: a local Ray instance is started (``ray.init(num_cpus=…)``,
  the workers are processes of this machine) and shut down at the end. An ``address``
  (``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``): the existing cluster is joined and only the
  connection is closed at the end. A Ray connection this process already had is used and kept.
- **The workers read the files by path**: the collection (and a ``--weights`` file) must be on
  storage every worker sees at the same absolute path, and every worker needs museum-search with
  the same network weights installed (a worker whose descriptors would differ, ``BackboneMeta``, is
  refused). A file a worker cannot read is skipped with its reason, as in a local build.
- **Workers**: each task builds the extractor of the configuration on the inference engine the build
  was given (once per worker process: :func:`build_extractor` keeps it), describes its share
  with :func:`extract` and, with verification, computes the share's local features. Tasks return
  plain arrays, lists and dicts (no project objects cross the wire).
- **Failures**: Ray itself re-runs a task whose worker process or node died (``max_retries``); a task
  that raised is submitted again here, up to ``max_retries`` times. A share that still fails stops
  the job with a :class:`MuseumSearchError` naming its first file and the cause.
- **Progress and cancelling**: the generator yields a record with stage :data:`STAGE` as shares
  finish, and a heartbeat while it waits (one record of stage :data:`STARTING` before Ray starts:
  ``ray.init`` runs on the calling thread, a few seconds for a local instance); closing it cancels the outstanding tasks (``ray.cancel``) and shuts down what it started.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

import numpy as np

from museum_search.core import inference as engines
from museum_search.core.errors import MuseumSearchError
from museum_search.core.index import LocalFeatures
from museum_search.core.inference import (
    REGISTRY,
    BackboneConfig,
    BackboneMeta,
    DescriptorExtractor,
    ExtractResult,
    build_extractor,
    check_config,
    extract,
    meta_for,
)
from museum_search.core.progress import HEARTBEAT, Progress, drive
from museum_search.core.verification import SpatialParams, compute_local_features, descriptor_layout, settings_of

#: ``Progress.stage`` of the records while the shares are described.
STAGE = "describing on the Ray cluster"
#: ``Progress.stage`` while Ray starts (a local instance) or the cluster is joined.
STARTING = "starting Ray"
#: What to do when Ray is not installed.
RAY_MISSING = "indexing on a Ray cluster needs Ray: pip install 'museum-search[cluster]'"
#: The largest default share (files per task).
MAX_SHARE = 256


def import_ray():
    """The ``ray`` module, or a :class:`MuseumSearchError` saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise MuseumSearchError(RAY_MISSING) from None


def default_share_size(n: int, workers: int, batch_size: int = 8) -> int:
    """Files per task: about four shares per worker (so that a slow worker holds up little at the
    end), a whole number of batches (the network sees the batches a local run gives it), at most
    :data:`MAX_SHARE` or one batch (a retried share repeats little work)."""
    batch_size = max(1, int(batch_size))
    per = math.ceil(n / max(1, 4 * workers)) if n else 1
    per = min(max(MAX_SHARE // batch_size, 1) * batch_size, per)
    return int(max(1, math.ceil(per / batch_size) * batch_size))


# ---- the task (runs in a Ray worker process) ----------------------------------------------------


def _inject_fault(fault: tuple[str, int, str] | None) -> None:
    """Testing hook: fail the first ``times`` attempts of a share (counted in marker files in
    ``folder``, so that the count survives a worker process that dies). ``kind``: "raise" (an
    application error) or "exit" (the worker process dies)."""
    if not fault:
        return
    kind, times, folder = fault
    for k in range(int(times)):
        try:
            fd = os.open(os.path.join(folder, f"attempt-{k}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue
        os.close(fd)
        if kind == "exit":
            os._exit(1)
        raise RuntimeError(f"injected failure {k + 1} of {times}")


def describe_share(paths: list[str], config: dict, engine: str | None, batch_size: int,
                   spatial: dict | None, fault: tuple[str, int, str] | None = None) -> dict:
    """Describe one share (the body of a Ray task; also callable in-process).

    Returns plain data: ``descriptors`` (n_ok, D) float32, ``ok`` (n_ok,) int64 positions in the
    share, ``skipped`` [(path, reason)], ``meta`` (the extractor's :class:`BackboneMeta` as a dict),
    ``engine``, ``host``, ``seconds``, and with ``spatial`` (SpatialParams fields) ``local``:
    the local features of the described files as arrays (:class:`LocalFeatures` fields).
    """
    _inject_fault(fault)
    t0 = time.perf_counter()
    cfg = dict(config)
    cfg["scales"] = tuple(cfg["scales"])
    extractor = build_extractor(BackboneConfig(**cfg), engine=engine)  # kept per worker process
    res = drive(extract(paths, extractor, batch_size=batch_size))
    out: dict[str, Any] = {
        "descriptors": np.ascontiguousarray(res.descriptors, np.float32),
        "ok": np.asarray(res.ok, np.int64),
        "skipped": [(str(p), str(r)) for p, r in res.skipped],
        "meta": extractor.meta.to_dict(),
        "engine": extractor.engine,
        "host": socket.gethostname(),
        "local": None,
    }
    if spatial is not None:
        local = drive(compute_local_features([paths[i] for i in res.ok], SpatialParams(**spatial)))
        out["local"] = {"settings": dict(local.settings), "offsets": local.offsets, "points": local.points,
                        "descriptors": local.descriptors, "sizes": local.sizes}
    out["seconds"] = time.perf_counter() - t0
    return out


# ---- the driver ---------------------------------------------------------------------------------


def _config_and_meta(what, weights: str | None) -> tuple[BackboneConfig, BackboneMeta]:
    """The configuration the workers build, and the meta their descriptors must have."""
    if isinstance(what, DescriptorExtractor):
        config = getattr(what, "config", None)
        if config is None or weights is not None:
            config = what.meta.config(weights)
        meta = what.meta
    elif isinstance(what, BackboneMeta):
        config, meta = what.config(weights), what
    elif isinstance(what, BackboneConfig) or what is None:
        config = what or BackboneConfig()
        if weights is not None:
            config = BackboneConfig(**{**asdict(config), "weights": weights})
        check_config(config)
        meta = meta_for(REGISTRY[config.name], config)
    else:
        raise TypeError(f"describe_on_ray needs a BackboneConfig, BackboneMeta or extractor, not {type(what)!r}")
    if meta.imported:
        raise MuseumSearchError("this index holds imported descriptors: there is no network to describe photos with")
    if config.weights:
        config = BackboneConfig(**{**asdict(config), "weights": str(Path(config.weights).resolve())})
    return config, meta


def _cause(ray, exc: BaseException) -> tuple[str, bool]:
    """(what went wrong in words, whether it was an application error, which is retried here)."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = getattr(exc, "cause", None)
        if cause is not None and not isinstance(cause, ray.exceptions.RayError):
            text = str(cause).strip().splitlines()
            return f"{type(cause).__name__}: {text[-1] if text else ''}".rstrip(": "), True
        text = str(exc).strip().splitlines()
        return (text[-1] if text else type(exc).__name__), True
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "), False


def _merge_local(parts: list[dict], settings: dict, dim: int, dtype=np.uint8):
    offsets = [np.zeros(1, np.int64)]
    points, descs, sizes = [], [], []
    base = 0
    for p in parts:
        if p["settings"] != settings:
            raise MuseumSearchError(f"a Ray worker computed local features with {p['settings']}, not {settings}: "
                                    "install the same museum-search and OpenCV on every worker")
        off = np.asarray(p["offsets"], np.int64)
        offsets.append(off[1:] + base)
        base += int(off[-1])
        points.append(np.asarray(p["points"], np.float32).reshape(-1, 2))
        descs.append(np.asarray(p["descriptors"], dtype).reshape(-1, dim))
        sizes.append(np.asarray(p["sizes"], np.float32).reshape(-1, 2))
    return LocalFeatures(dict(settings), np.concatenate(offsets),
                         np.concatenate(points) if points else np.empty((0, 2), np.float32),
                         np.concatenate(descs) if descs else np.empty((0, dim), dtype),
                         np.concatenate(sizes) if sizes else np.empty((0, 2), np.float32))


def describe_on_ray(
    paths: Sequence[str | os.PathLike],
    config: BackboneConfig | BackboneMeta | DescriptorExtractor | None = None,
    *,
    address: str | None = None,
    batch_size: int = 8,
    share_size: int | None = None,
    verification: bool = True,
    max_retries: int = 2,
    num_cpus: int | None = None,
    weights: str | None = None,
    engine: str | None = None,
    spatial=None,
    _faults: dict[int, tuple[str, int, str]] | None = None,
) -> Generator[Progress, None, tuple[ExtractResult, Any]]:
    """Describe ``paths`` on Ray; returns ``(ExtractResult, LocalFeatures | None)`` in the input order,
    equal to ``extract(paths, extractor)`` and (with ``verification``) ``compute_local_features`` of
    the described files (``result.ok``), row for row.

    ``config``: what to describe with (a :class:`BackboneConfig`, an index's :class:`BackboneMeta`
    with ``weights`` if it was built with a weights file, or this process's extractor).
    ``address``: None starts a local instance with ``num_cpus`` CPUs (default: all); otherwise the
    cluster to join. ``share_size``: files per task (default :func:`default_share_size`).
    ``engine``: the inference engine on the workers (None or "auto": the default, :func:`engines.default_engine`).
    ``spatial``: the :class:`SpatialParams` of the local features (default: its defaults).
    ``_faults``: testing hook, share number -> (kind, times, folder) (see :func:`_inject_fault`).
    """
    given = [str(p) for p in paths]  # skipped files are named as the caller named them
    files = [os.path.abspath(os.fspath(p)) for p in paths]
    cfg, meta = _config_and_meta(config, weights)
    engine = engines.resolve_engine(engine)
    if max_retries < 0:
        raise MuseumSearchError(f"max_retries must be 0 or more, not {max_retries}")
    local = _LocalLayout.of(spatial) if verification else None
    if not files:
        empty = None if local is None else LocalFeatures.from_list([], local.settings, local.dim, local.dtype)
        return ExtractResult(np.empty((0, meta.dim), np.float32), [], []), empty
    ray = import_ray()

    t0 = time.perf_counter()
    started = False
    inflight: dict[Any, int] = {}  # object ref -> share number
    try:
        if not ray.is_initialized():
            # on this thread: Ray ties the processes it starts to the thread that starts them (they
            # get a kill signal when it ends), so a helper thread cannot do it; a cancel waits for it
            yield Progress(0, 0, stage=STARTING, elapsed=time.perf_counter() - t0)
            started = True
            _start_ray(ray, address, num_cpus)
        workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        shares = _shares(files, share_size or default_share_size(len(files), workers, batch_size))
        submit = _submitter(ray, shares, cfg, engine, batch_size, local, max_retries, _faults)
        parts = yield from _describe_shares(ray, submit, shares, given, meta, max_retries=max_retries,
                                            window=max(2, 2 * workers), inflight=inflight)
        return _merged(shares, parts, meta, local)
    finally:
        _cancel(ray, inflight)
        if started:
            ray.shutdown()


def _shares(files: list[str], size: int) -> list[tuple[int, list[str]]]:
    """``files`` cut into shares of ``size`` consecutive files: (position of the first, the files)."""
    if int(size) < 1:
        raise MuseumSearchError(f"the share size must be 1 or more, not {size}")
    size = int(size)
    return [(lo, files[lo:lo + size]) for lo in range(0, len(files), size)]


@dataclass(frozen=True)
class _LocalLayout:
    """What the workers compute local features with (``params``: :class:`SpatialParams` fields, plain
    data for the wire) and what the merged features hold (settings, descriptor width and type)."""

    params: dict
    settings: dict
    dim: int
    dtype: Any

    @classmethod
    def of(cls, spatial: SpatialParams | None) -> _LocalLayout:
        params = spatial or SpatialParams()
        dim, dtype = descriptor_layout(params)
        return cls({f.name: getattr(params, f.name) for f in fields(params)}, settings_of(params), dim, dtype)


def _submitter(ray, shares: list[tuple[int, list[str]]], cfg: BackboneConfig, engine: str | None,
               batch_size: int, local: _LocalLayout | None, max_retries: int,
               faults: dict[int, tuple[str, int, str]] | None) -> Callable[[int], Any]:
    """``submit(k)``: start the task of share ``k`` (:func:`describe_share`, one CPU; Ray runs it
    again up to ``max_retries`` times when its worker dies) and return its object ref."""
    task = ray.remote(describe_share).options(max_retries=max_retries, retry_exceptions=False, num_cpus=1)
    config_dict = {**asdict(cfg), "scales": list(cfg.scales)}
    sp = None if local is None else local.params

    def submit(k: int) -> Any:
        return task.remote(shares[k][1], config_dict, engine, batch_size, sp, (faults or {}).get(k))

    return submit


def _start_ray(ray, address: str | None, num_cpus: int | None) -> None:
    """Start a local Ray instance with ``num_cpus`` CPUs (``address`` None) or join the cluster at
    ``address``; a :class:`MuseumSearchError` with Ray's first line of explanation when it fails."""
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if address is None:
        kwargs["num_cpus"] = num_cpus
    else:
        kwargs["address"] = address
    try:
        ray.init(**kwargs)
    except Exception as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        first = str(exc).strip().splitlines()
        raise MuseumSearchError(f"cannot start or join {where}: {first[0] if first else type(exc).__name__}"
                                ) from None


def _describe_shares(ray, submit: Callable[[int], Any], shares: list[tuple[int, list[str]]], given: list[str],
                     meta: BackboneMeta, *, max_retries: int, window: int, inflight: dict[Any, int]
                     ) -> Generator[Progress, None, list[dict]]:
    """Run the shares as Ray tasks (``submit(k)``: the object ref of share ``k``'s task), at most
    ``window`` at a time, the first shares first; a share whose task raised is submitted again up
    to ``max_retries`` times. Yields a record as each share finishes (and a heartbeat while none
    does); returns every share's result (:func:`_received`), in share order. ``inflight`` (object
    ref -> share) is the caller's, which cancels what is left in it when the job stops early."""
    attempts = [0] * len(shares)
    results: list[dict | None] = [None] * len(shares)
    todo = list(range(len(shares)))[::-1]  # a stack: the first share on top
    total = len(given)
    done = 0
    t_desc = time.perf_counter()
    while todo or inflight:
        while todo and len(inflight) < window:
            k = todo.pop()
            inflight[submit(k)] = k
            attempts[k] += 1
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=HEARTBEAT)
        if not ready:
            yield Progress(done, total, stage=STAGE, elapsed=time.perf_counter() - t_desc)
            continue
        for ref in ready:
            k = inflight.pop(ref)
            out = _share_result(ray, ref, shares[k][1], attempts[k], max_retries)
            if out is None:
                todo.append(k)
                continue
            lo, files = shares[k]
            results[k] = out = _received(out, meta, lo, files, given)
            done += len(files)
            yield Progress(done, total, given[lo + len(files) - 1], list(out["skipped"]),
                           time.perf_counter() - t_desc, stage=STAGE)
    return cast("list[dict]", results)  # every share is done here (no None left)


def _share_result(ray, ref, files: list[str], attempts: int, max_retries: int) -> dict | None:
    """The result of a finished task, or None when it raised and is to be submitted again (after
    ``attempts`` of at most ``max_retries`` + 1); a :class:`MuseumSearchError` naming the share's
    first file and the cause when it failed for good."""
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        raise
    except ray.exceptions.RayError as exc:
        cause, retry = _cause(ray, exc)
        if retry and attempts <= max_retries:
            return None
        tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
        raise MuseumSearchError(
            f"describing on Ray failed for the share of {len(files)} file(s) starting with "
            f"{files[0]} after {tries}: {cause}") from None


def _received(out: dict, meta: BackboneMeta, lo: int, files: list[str], given: list[str]) -> dict:
    """A share's result (``files``, from position ``lo`` of the input) checked (its worker's network
    is ``meta``), its arrays copied out of the object store, its skipped files named as the caller
    named them (``given``)."""
    got = BackboneMeta.from_dict(out["meta"])
    if got != meta:
        raise MuseumSearchError(
            f"a Ray worker ({out['host']}) describes with {got.summary()} [{got.weights_id}], not "
            f"{meta.summary()} [{meta.weights_id}]: install the same museum-search and weights on "
            "every worker")
    out = {**out, "descriptors": np.array(out["descriptors"], np.float32),  # out of the object store
           "ok": np.array(out["ok"], np.int64)}
    if out["local"] is not None:
        out["local"] = {key: (np.array(v) if isinstance(v, np.ndarray) else v)
                        for key, v in out["local"].items()}
    named = {q: given[lo + i] for i, q in enumerate(files)}
    out["skipped"] = [(named.get(p, p), r) for p, r in out["skipped"]]
    return out


def _merged(shares: list[tuple[int, list[str]]], parts: list[dict], meta: BackboneMeta,
            local: _LocalLayout | None) -> tuple[ExtractResult, Any]:
    """The shares' results as one :class:`ExtractResult` (rows in the input order) and, with
    ``local``, one :class:`LocalFeatures`."""
    descriptors = np.concatenate([r["descriptors"] for r in parts]).reshape(-1, meta.dim)
    ok = [int(lo + i) for (lo, _), r in zip(shares, parts) for i in r["ok"]]
    skipped = [tuple(s) for r in parts for s in r["skipped"]]
    features = None
    if local is not None:
        features = _merge_local([r["local"] for r in parts], local.settings, local.dim, local.dtype)
    return ExtractResult(descriptors, ok, skipped), features


def _cancel(ray, inflight: dict[Any, int]) -> None:
    """Cancel the tasks still running (best effort: a shutdown ends them anyway)."""
    for ref in list(inflight):
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=False)
    inflight.clear()


__all__ = ["MAX_SHARE", "RAY_MISSING", "STAGE", "STARTING", "default_share_size", "describe_on_ray",
           "describe_share", "import_ray"]
