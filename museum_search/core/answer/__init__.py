"""The answer to a query: the query pipeline (describe, search, re-rank, verify), the re-rankers
(ICFRR, αQE, DBA), the verdict (calibrated; confidence and wording) every view shows, and how every
view presents it (the confidence band, the outline in the photo's pixels).

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

from museum_search.core.answer._icfrr import (
    suggest_params,
)
from museum_search.core.answer._pipeline import (
    DESCRIPTORS_NOT_VERIFIED,
    Answer,
    FoundObject,
    QueryImage,
    QueryPipeline,
    QuerySettings,
    RegionError,
    Result,
    check_region,
    descriptor_query,
    load_query,
    parse_region,
    query_from_array,
    query_from_bytes,
)
from museum_search.core.answer._presentation import (
    CONFIDENCE_BANDS,
    confidence_band,
    in_photo,
    outline_in_photo,
)
from museum_search.core.answer._rerank import (
    RerankOptions,
    icfrr_advice,
    icfrr_k_g,
)
from museum_search.core.answer._verdict import (
    NOISE_INLIERS,
    REAL_VIEWS,
    Evidence,
    Verdict,
    fit_verdict,
    open_set_figures,
    operating_points,
    recalibrated,
)
from museum_search.core.answer._whitening import (
    FOLDS,
    Whitening,
    fit_whitening,
    fold_whitenings,
)

__all__ = [
    "Answer",
    "CONFIDENCE_BANDS",
    "DESCRIPTORS_NOT_VERIFIED",
    "Evidence",
    "FOLDS",
    "FoundObject",
    "NOISE_INLIERS",
    "QueryImage",
    "QueryPipeline",
    "QuerySettings",
    "REAL_VIEWS",
    "RegionError",
    "RerankOptions",
    "Result",
    "Verdict",
    "Whitening",
    "check_region",
    "confidence_band",
    "descriptor_query",
    "fit_verdict",
    "fit_whitening",
    "fold_whitenings",
    "icfrr_advice",
    "icfrr_k_g",
    "in_photo",
    "load_query",
    "open_set_figures",
    "operating_points",
    "outline_in_photo",
    "parse_region",
    "query_from_array",
    "query_from_bytes",
    "recalibrated",
    "suggest_params",
]
