"""Batched descriptor extraction as a generator that yields progress.

Decoding and pre-processing run on a thread pool (OpenCV releases the GIL) while the network runs
on the calling thread, so decoding overlaps inference. The generator yields an
:class:`~.progress.Progress` after every batch and returns an :class:`ExtractResult`::

    gen = extract(paths, extractor)
    for progress in gen: ...           # drive a progress bar; stop iterating (gen.close()) to cancel
    result = ...                       # StopIteration.value, or ``result = yield from gen``

Use :func:`museum_search.core.progress.drive` to drive a generator to its end.

Cancelling (closing the generator, Ctrl-C) never waits for a decode that is still running: the
decode threads are daemon threads (:class:`.progress.DecodePool`), left to finish on their own, so
even a read stuck on a failing network share cannot keep the program from stopping.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generator, Sequence

import numpy as np

from museum_search.core.errors import ImageError
from museum_search.core.images import load_image
from museum_search.core.inference._backbones import DescriptorExtractor
from museum_search.core.progress import DecodePool, Progress


@dataclass
class ExtractResult:
    descriptors: np.ndarray  # (n_ok, dim) float32, L2-normalized
    ok: list[int]  # positions in the input list of the described files, in input order
    skipped: list[tuple[str, str]]  # (path, reason) of files that could not be used


#: Query regions as (x0, y0, x1, y1) fractions of the image: the whole photo, then its left,
#: right, top and bottom 60 %, and its central 80 %. A reference's score for a multi-region query is
#: its best score over the regions, so a photo of a wall with two paintings, or with much
#: background, still matches each painting (measured on the paintings' qsd2_w3 set with GeM@256:
#: MP@1 0.80 → 0.90). The centre is where a visitor puts the work: a photo taken at an angle or from
#: afar has wall all round it, which the side regions each keep on three sides (issue 36's visitor
#: protocol, phone-like photos, the right object's cosine against an unknown object's top cosine as
#: a ranking: ROC AUC 0.952 → 0.991 on COIL-100's leave-out, 0.944 → 0.993 on the paintings'; clean
#: photos unchanged; ``bench/bench_visitors.py`` measures the verdict).
QUERY_REGIONS: tuple[tuple[float, float, float, float], ...] = (
    (0.0, 0.0, 1.0, 1.0), (0.0, 0.0, 0.6, 1.0), (0.4, 0.0, 1.0, 1.0), (0.0, 0.0, 1.0, 0.6), (0.0, 0.4, 1.0, 1.0),
    (0.1, 0.1, 0.9, 0.9),
)


def query_crops(image: np.ndarray, regions: bool = True) -> list[np.ndarray]:
    """The query image's regions (see :data:`QUERY_REGIONS`); only the whole image if not ``regions``."""
    if not regions:
        return [image]
    h, w = image.shape[:2]
    return [image[int(round(y0 * h)) : int(round(y1 * h)), int(round(x0 * w)) : int(round(x1 * w))]
            for x0, y0, x1, y1 in QUERY_REGIONS]


def _prepare(extractor: DescriptorExtractor, path: str) -> np.ndarray:
    return extractor.preprocess(load_image(path, max_side=extractor.max_side))


def default_workers() -> int:
    return max(1, min(4, (os.cpu_count() or 2)))


def extract(
    paths: Sequence[str | os.PathLike],
    extractor: DescriptorExtractor,
    batch_size: int = 8,
    workers: int | None = None,
) -> Generator[Progress, None, ExtractResult]:
    """Describe ``paths`` (references) with ``extractor``; unreadable images are skipped with their
    reason. Queries go through :mod:`museum_search.core.answer._pipeline` instead."""
    files = [str(p) for p in paths]
    total = len(files)
    dim = extractor.meta.dim
    out = np.empty((total, dim), np.float32)
    ok: list[int] = []
    skipped: list[tuple[str, str]] = []
    start = time.perf_counter()
    if total == 0:
        return ExtractResult(out[:0], ok, skipped)
    workers = workers or default_workers()
    window = max(batch_size * 2, workers * 2)
    pool = DecodePool(workers, "decode")
    pending: deque[tuple[int, Future]] = deque()
    next_i = 0
    finished = False
    try:
        def fill() -> None:
            nonlocal next_i
            while next_i < total and len(pending) < window:
                pending.append((next_i, pool.submit(_prepare, extractor, files[next_i])))
                next_i += 1

        fill()
        done = 0
        while pending:
            batch_idx: list[int] = []
            batch: list[np.ndarray] = []
            new_skips: list[tuple[str, str]] = []
            while pending and len(batch) < batch_size:
                i, fut = pending.popleft()
                try:
                    batch.append(fut.result())
                    batch_idx.append(i)
                except ImageError as exc:  # decoding refused it (incl. over the decode budget)
                    new_skips.append((files[i], exc.reason))
                except MemoryError:
                    new_skips.append((files[i], "not enough memory to prepare this image; close "
                                      "other programs, or save a smaller copy and use that"))
                except (OSError, ValueError) as exc:
                    new_skips.append((files[i], f"cannot be read: {exc}"))
                done += 1
                fill()
            if batch:
                out[len(ok) : len(ok) + len(batch)] = extractor.embed(batch)
                ok.extend(batch_idx)
            skipped.extend(new_skips)
            yield Progress(done, total, files[done - 1], new_skips, time.perf_counter() - start)
        finished = True
    finally:
        # Left early (cancelled, Ctrl-C, an error): the calls not started are cancelled and the
        # running ones are not waited for (they end on their own; their results are dropped).
        pool.shutdown(wait=finished, cancel_futures=True)
    return ExtractResult(out[: len(ok)].copy() if len(ok) < total else out, ok, skipped)
