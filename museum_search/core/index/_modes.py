"""Search modes: ``--search exact|ann|auto`` turned into "exact" or "ann" (:func:`resolve_mode`).

``auto`` uses the approximate index when its build measured it faster than exact search and at the
target recall; for an index built before that measurement, from :data:`AUTO_MIN_REFERENCES`
references (measured by ``bench/bench_ann_threshold.py``).
"""

from __future__ import annotations

from museum_search.core.errors import MuseumSearchError
from museum_search.core.index._approximate import AnnIndex

__all__ = ["AUTO_MIN_REFERENCES", "SEARCH_MODES", "resolve_mode"]

SEARCH_MODES = ("exact", "ann", "auto")

#: ``--search auto`` uses the approximate index from this many references on (when the index has
#: one), and the index builds one from this size. Measured by ``bench/bench_ann_threshold.py``
#: (bench/results/ann_threshold.json: clustered 1280-d float16 descriptors, memory-mapped, one
#: query at a time, a shared 2-core machine, one run). p50 per query, exact / ann (recall@10):
#:     10,000:  49 ms /  4.8 ms (1.000)       100,000: 224 ms / 8.3 ms (1.000)
#:     30,000:  86 ms /  7.9 ms (1.000)       300,000: 714 ms / 8.0 ms (0.986)
#: The rule: the smallest measured size where exact search is at least 3 times slower than ann
#: *and* slow enough to notice (>= 100 ms), with recall@10 >= 0.95. Below it exact search answers
#: in under 0.1 s with no approximation and no index to build (ann is 10x faster from 10k on, but
#: there it saves tens of milliseconds); from 100k it is 27x faster (89x at 300k). With float32
#: descriptors exact search is faster (no conversion), so this errs on the exact side for them.
AUTO_MIN_REFERENCES = 100_000


def resolve_mode(mode: str, n: int, has_ann: bool | AnnIndex | None) -> str:
    """"exact" or "ann" for ``--search mode`` on an index of ``n`` references. ``has_ann``: its
    approximate index (:class:`AnnIndex`), or whether it has one (True/False/None).

    ``auto``: "ann" when the approximate index was tuned at build time (:class:`AnnTuning`) and
    measured there both faster than the exact search and at the target recall; with an index
    built before that measurement existed (or given only as True), the old rule: "ann" iff it has
    one and ``n >= AUTO_MIN_REFERENCES``."""
    if mode not in SEARCH_MODES:
        raise MuseumSearchError(f"unknown search mode {mode!r}: use one of {', '.join(SEARCH_MODES)}")
    if mode == "exact":
        return "exact"
    present = has_ann is not None and has_ann is not False
    if mode == "ann":
        if not present:
            raise MuseumSearchError(
                f"this index ({n:,} references) has no approximate (ANN) index: search it with --search exact "
                "(or auto), or build one: rebuild it with `museum-search index ... --ann yes`, or update it "
                "with `museum-search update INDEX --ann yes`")
        return "ann"
    if not present:
        return "exact"
    tuning = has_ann.params.tuning if isinstance(has_ann, AnnIndex) else None
    if tuning is not None:
        return "ann" if tuning.meets_target and tuning.faster else "exact"
    return "ann" if int(n) >= AUTO_MIN_REFERENCES else "exact"
