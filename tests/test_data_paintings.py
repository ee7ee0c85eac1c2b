"""Accuracy on the real paintings collection (../shared/data/paintings).

The default pipeline must beat the papers' "IM" baseline (ImageNet logits of the image scaled to
224×224) in MP@1 over the three query sets. The measured values are printed (run with -s) and
written to bench/results/paintings_accuracy.json by bench/bench_accuracy.py.
"""

import json

import numpy as np
import pytest

from museum_search.core.backbones import BackboneConfig
from museum_search.core.evaluation.querysets import load_queryset
from museum_search.core.evaluation.runner import run_evaluation
from museum_search.core.extract import run
from museum_search.core.index import build_index

pytestmark = [pytest.mark.data, pytest.mark.slow]
QUERY_SETS = ("qsd1_w1", "qsd1_w3", "qsd2_w3")


@pytest.fixture(scope="module")
def paintings_indexes(shared_data, tmp_path_factory):
    out = {}
    for name, cfg in (("default", BackboneConfig()), ("im", BackboneConfig(head="logits"))):
        path = tmp_path_factory.mktemp("paintings") / name
        out[name] = (run(build_index(shared_data / "paintings" / "references", path, cfg)).index, path)
    return out


def _mp1(index, shared_data, query_regions=True):
    values = {}
    for qs in QUERY_SETS:
        rep = run_evaluation(index, load_queryset(shared_data / "paintings" / "queries" / qs),
                             query_regions=query_regions)
        assert rep.summary["queries"] == 30 and rep.summary["open_set_queries"] == 0
        values[qs] = rep.summary["mp@1"]
    values["all"] = float(np.mean([values[q] for q in QUERY_SETS]))
    return values


def test_default_pipeline_beats_im_baseline(paintings_indexes, shared_data):
    default = _mp1(paintings_indexes["default"][0], shared_data)
    whole = _mp1(paintings_indexes["default"][0], shared_data, query_regions=False)
    im = _mp1(paintings_indexes["im"][0], shared_data, query_regions=False)  # the papers' protocol
    print("MP@1 default", default, "default whole-image", whole, "IM", im)
    assert default["all"] > im["all"]
    assert default["all"] >= whole["all"]  # query regions help (gallery-wall photos of qsd2_w3)
    assert default["all"] >= 0.95  # measured 0.967 (README); the aim
    assert default["qsd1_w1"] >= 0.95


def test_cli_evaluate_reports_the_same_mp1(paintings_indexes, shared_data, tmp_path):
    from museum_search.cli import main

    index, path = paintings_indexes["default"]
    qs = shared_data / "paintings" / "queries" / "qsd1_w1"
    out = tmp_path / "run.json"
    assert main(["evaluate", str(path), str(qs), "--json", str(out), "--rankings"]) == 0
    doc = json.loads(out.read_text())
    expected = run_evaluation(index, load_queryset(qs)).summary
    assert doc["summary"]["mp@1"] == pytest.approx(expected["mp@1"], abs=1e-6)
    assert doc["summary"]["map"] == pytest.approx(expected["map"], abs=1e-6)
    assert doc["summary"]["queries"] == 30
    assert len(doc["queries"]) == 30 and len(doc["queries"][0]["ranking"]) == 287
    q0 = doc["queries"][0]
    assert {"query", "relevant", "p@1", "ap", "mnro"} <= set(q0)
