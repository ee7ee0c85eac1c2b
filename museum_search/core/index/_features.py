"""The local features of an index's references as stored with it (flat arrays, no pickle): what
verification matches a query photo against (:mod:`museum_search.core.verification._spatial` computes and matches them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: keypoints (M, 2) float32 and their descriptors (M, D)
Features = tuple[np.ndarray, np.ndarray]
#: the arrays of :class:`LocalFeatures`, one data file each in an index
LOCAL_PARTS = ("offsets", "points", "descriptors", "sizes")


@dataclass
class LocalFeatures:
    """Local features of every reference of an index, stored with its generation (flat arrays).

    Row ``i``'s keypoints are ``points[offsets[i]:offsets[i+1]]`` and its descriptors the same
    slice of ``descriptors``; ``sizes[i]`` is its resized (width, height), (0, 0) when the file
    could not be read.
    """

    settings: dict[str, Any]  # feature, max_side, max_keypoints
    offsets: np.ndarray  # (N + 1,) int64
    points: np.ndarray  # (M, 2) float32
    descriptors: np.ndarray  # (M, D) uint8 (SIFT, ORB) or float16 (XFeat)
    sizes: np.ndarray  # (N, 2) float32
    #: what verification set aside as shared by several objects when these were made, for the
    #: calibration that follows (:class:`museum_search.core.verification._shared.SetAside`); in
    #: memory only: never saved, and not carried by ``subset`` or ``concat``
    set_aside: Any = field(default=None, repr=False, compare=False)
    #: (|d|², Σd) of every byte descriptor, int32 (:meth:`byte_terms`), computed at the first ask
    _terms: Any = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.sizes)

    def get(self, row: int) -> tuple[Features, tuple[float, float]] | None:
        w, h = (float(v) for v in self.sizes[row])
        if w <= 0 or h <= 0:
            return None
        a, b = int(self.offsets[row]), int(self.offsets[row + 1])
        return (np.asarray(self.points[a:b]), np.asarray(self.descriptors[a:b])), (w, h)

    def byte_terms(self, row: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(squared norms, sums) of row ``row``'s byte descriptors (SIFT's): what matching them in
        8-bit integers needs of each (:func:`museum_search.core.verification._spatial._int8_keys`),
        computed once for every row, not again for each photo; None for other descriptors."""
        if self.descriptors.dtype != np.uint8:
            return None
        terms = self._terms
        if terms is None:
            squares, sums = np.empty(len(self.descriptors), np.int32), np.empty(len(self.descriptors), np.int32)
            for a in range(0, len(self.descriptors), 65536):  # in blocks: the array may be mapped from disk
                block = np.asarray(self.descriptors[a:a + 65536], np.float32)  # sums exact in float32 (< 2**24)
                squares[a:a + len(block)] = np.einsum("ij,ij->i", block, block)
                sums[a:a + len(block)] = block.sum(axis=1)
            terms = self._terms = (squares, sums)
        a, b = int(self.offsets[row]), int(self.offsets[row + 1])
        return terms[0][a:b], terms[1][a:b]

    def subset(self, rows: Sequence[int]) -> "LocalFeatures":
        return LocalFeatures.from_list([self.get(int(r)) for r in rows], self.settings, self.descriptors.shape[1],
                                       self.descriptors.dtype)

    @staticmethod
    def from_list(entries: Sequence[tuple[Features, tuple[float, float]] | None], settings: dict[str, Any],
                  dim: int, dtype: Any = np.uint8) -> "LocalFeatures":
        counts = [0 if e is None else len(e[0][0]) for e in entries]
        offsets = np.zeros(len(entries) + 1, np.int64)
        offsets[1:] = np.cumsum(counts)
        pts = [e[0][0] for e in entries if e is not None]
        desc = [e[0][1] for e in entries if e is not None]
        sizes = np.array([(0.0, 0.0) if e is None else e[1] for e in entries], np.float32).reshape(-1, 2)
        return LocalFeatures(
            dict(settings), offsets,
            np.concatenate(pts).astype(np.float32) if pts else np.empty((0, 2), np.float32),
            np.concatenate(desc).astype(dtype) if desc else np.empty((0, dim), dtype),
            sizes)

    @staticmethod
    def concat(parts: Sequence["LocalFeatures"]) -> "LocalFeatures":
        entries: list = []
        for p in parts:
            entries.extend(p.get(i) for i in range(len(p)))
        return LocalFeatures.from_list(entries, parts[0].settings, parts[0].descriptors.shape[1],
                                       parts[0].descriptors.dtype)
