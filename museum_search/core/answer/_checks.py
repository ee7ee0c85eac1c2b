"""Every setting of a query checked against its meaning, once, for every view: the command line's
options, a run's ``--settings`` JSON, the app's settings and the web service all build a
:class:`museum_search.core.answer.QuerySettings`, whose construction calls :func:`check_settings`.

A value that would run but mean nothing (``k = -5``: every answer "the collection is empty"; one
weight for four verdict features: numpy broadcasting) or fail deep inside (a verdict feature the
program does not know: a ``KeyError`` at the first answer) is refused with a
:class:`SettingsError` naming the field, its value and what it may be."""

from __future__ import annotations

import math
from typing import Any

from museum_search.core.answer._verdict import FEATURES
from museum_search.core.errors import SettingsError

#: The largest count a setting may ask for (results, references verified, neighbours, iterations):
#: beyond any collection this program serves, and far below what would exhaust memory.
MAX_COUNT = 1_000_000
SEARCH_MODES = ("auto", "exact", "ann")
ICFRR_MODES = ("paper", "reference")


def _count(field: str, value: Any, least: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise SettingsError(field, f"{what} must be a whole number from {least} to {MAX_COUNT:,}, not {value!r}")


def _number(field: str, value: Any, low: float, high: float, what: str) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low <= value <= high:
        raise SettingsError(field, f"{what} must be a number from {low:g} to {high:g}, not {value!r}")


def check_options(o: Any, field: str = "options") -> None:
    """The re-rankers' options (:class:`museum_search.core.answer.RerankOptions`)."""
    for name, what in (("k_q", "ICFRR's K_q (query neighbours)"), ("k_g", "ICFRR's K_g (reference neighbours)")):
        value = getattr(o, name)
        if value is not None:
            _count(f"{field}.{name}", value, 1, what)
    _number(f"{field}.beta", o.beta, 0.0, 10.0, "ICFRR's beta (the weight of each update)")
    _count(f"{field}.iterations", o.iterations, 1, "ICFRR's number of iterations")
    if o.icfrr_mode not in ICFRR_MODES:
        raise SettingsError(f"{field}.icfrr_mode", f"must be one of {', '.join(ICFRR_MODES)}, not {o.icfrr_mode!r}")
    _count(f"{field}.qe_n", o.qe_n, 1, "the neighbours of query expansion (aQE/DBA n)")
    _number(f"{field}.qe_alpha", o.qe_alpha, 0.0, 100.0, "the weight exponent of query expansion (alpha)")


def check_model(m: Any, field: str) -> None:
    """A verdict's model (:class:`museum_search.core.answer._verdict.Model`): known features, one
    mean, scale and weight per feature, each weight of its feature's sign, finite numbers."""
    names = list(m.features)
    unknown = [n for n in names if n not in FEATURES]
    if not names or unknown or len(set(names)) != len(names):
        raise SettingsError(f"{field}.features", f"must name each of {', '.join(FEATURES)} at most once, "
                                                 f"not {names!r}")
    for part in ("mean", "scale", "weights"):
        values = list(getattr(m, part))
        if len(values) != len(names):
            raise SettingsError(f"{field}.{part}", f"{len(values)} value(s) for {len(names)} feature(s) "
                                                   f"({', '.join(names)}): one per feature")
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise SettingsError(f"{field}.{part}", f"must be finite numbers, not {values!r}")
    if any(s <= 0 for s in m.scale):
        raise SettingsError(f"{field}.scale", f"each feature's scale must be above 0, not {list(m.scale)!r}")
    for name, w in zip(names, m.weights):
        if w * FEATURES[name] < 0:
            raise SettingsError(f"{field}.weights", f"the weight of {name} must be "
                                                    f"{'at least' if FEATURES[name] > 0 else 'at most'} 0, not {w}")
    _number(f"{field}.bias", m.bias, -1e6, 1e6, "the model's bias")
    _number(f"{field}.threshold", m.threshold, 0.0, 1.0, "the model's threshold (a probability)")


def check_verdict(v: Any, field: str = "verdict") -> None:
    """The "in the collection" verdict (:class:`museum_search.core.answer.Verdict`)."""
    _count(f"{field}.min_inliers", v.min_inliers, 0, "the matching points an answer needs")
    _number(f"{field}.min_cosine_verified", v.min_cosine_verified, -1.0, 1.0, "a cosine")
    _number(f"{field}.min_cosine", v.min_cosine, -1.0, 1.0, "a cosine")
    for name in ("model_verified", "model_cosine"):
        model = getattr(v, name)
        if model is not None:
            check_model(model, f"{field}.{name}")


def check_settings(s: Any) -> None:
    """A query's settings (:class:`museum_search.core.answer.QuerySettings`), the re-rankers'
    options and the verdict included; :class:`SettingsError` names the first field out of range."""
    _count("k", s.k, 1, "the number of results")
    _count("verify_top", s.verify_top, 0, "the number of references verified")
    _count("deep", s.deep, 0, "the number of references a second look verifies")
    if s.search not in SEARCH_MODES:
        raise SettingsError("search", f"must be one of {', '.join(SEARCH_MODES)}, not {s.search!r}")
    for name in ("per_instance", "regions", "verify", "rivals_anywhere"):
        if not isinstance(getattr(s, name), bool):
            raise SettingsError(name, f"must be true or false, not {getattr(s, name)!r}")
    check_options(s.options)
    if s.verdict is not None:
        check_verdict(s.verdict)
