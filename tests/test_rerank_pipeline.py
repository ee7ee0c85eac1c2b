"""The re-ranking pipeline: names, combinations, and advice for collections ICFRR cannot help."""

import numpy as np
import pytest

from museum_search.core.answer._rerank import RerankOptions, build_rerankers, icfrr_advice, parse_names
from museum_search.core.errors import MuseumSearchError


def test_parse_names():
    assert parse_names("dba, icfrr") == ["dba", "icfrr"]
    with pytest.raises(MuseumSearchError, match="unknown re-ranker"):
        parse_names("spatial")  # verification is a step of the query pipeline, not a re-ranker
    assert parse_names("none") == [] and parse_names("") == []
    with pytest.raises(MuseumSearchError):
        parse_names("icfrr,icfrr")
    with pytest.raises(MuseumSearchError, match="unknown re-ranker"):
        parse_names("magic")


def test_icfrr_advice_only_for_few_photos_per_object():
    assert icfrr_advice(["a", "b", "c", "d"]) is not None  # one photo per object
    assert icfrr_advice(["a", "a", "b", "b"]) is not None  # two: suggested K = 1
    assert icfrr_advice(["a"] * 4 + ["b"] * 4) is None  # four: suggested K = 2


def test_icfrr_after_another_reranker_uses_its_scores(sample_index):
    q = np.asarray(sample_index.descriptors[:2], dtype=np.float32)
    scores = q @ np.asarray(sample_index.descriptors, dtype=np.float32).T
    out = build_rerankers("dba,icfrr", RerankOptions()).apply(sample_index, scores, q)
    assert out.shape == scores.shape and np.all(np.isfinite(out))
    # a query that is a reference's own photo still gets its object first
    labels = sample_index.labels
    assert list(labels[np.argmax(out, axis=1)]) == list(labels[[0, 1]])
