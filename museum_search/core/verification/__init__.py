"""Verification of a query photo's shortlist: local features (SIFT, XFeat), matching, the
geometric check (a homography), the evidence a verdict judges, and the matched region of a reference.

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

from museum_search.core.verification._shared import (
    leaving_out,
    without_shared_features,
)
from museum_search.core.verification._shortlist import (
    APART,
    DEEP,
    DISTINCT,
    SURE,
    MatchedArea,
    Verification,
    apart,
    cosine_margin,
    matched_area,
)
from museum_search.core.verification._spatial import (
    MATCHERS,
    MIN_MATCHES,
    Matches,
    SpatialParams,
    compute_local_features,
    default_matcher,
    descriptor_layout,
    normalised_light,
    params_for,
    params_of_index,
    params_of_settings,
    prepare,
    resolve_matcher,
    settings_of,
)
from museum_search.core.verification._xfeat import (
    XFeatUnavailable,
)
from museum_search.core.verification._xfeat import (
    available as xfeat_available,
)

__all__ = [
    "APART",
    "DEEP",
    "DISTINCT",
    "MATCHERS",
    "MIN_MATCHES",
    "MatchedArea",
    "Matches",
    "SURE",
    "SpatialParams",
    "Verification",
    "XFeatUnavailable",
    "apart",
    "compute_local_features",
    "cosine_margin",
    "default_matcher",
    "descriptor_layout",
    "leaving_out",
    "matched_area",
    "normalised_light",
    "params_for",
    "params_of_index",
    "params_of_settings",
    "prepare",
    "resolve_matcher",
    "settings_of",
    "without_shared_features",
    "xfeat_available",
]
