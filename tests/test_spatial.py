"""Geometric verification (SIFT/ORB + ratio test + RANSAC homography)."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from museum_search.core.errors import MuseumSearchError
from museum_search.core.images import load_image
from museum_search.core.index._catalogue import Item
from museum_search.core.index._features import LocalFeatures
from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import BackboneMeta
from museum_search.core.verification import _spatial as spatial
from museum_search.core.verification._spatial import (
    SpatialParams,
    Verifier,
    blend,
    homography_is_plausible,
    verify_pair,
)

# ---- synthetic images ------------------------------------------------------------------------


def textured(seed: int, h: int = 300, w: int = 400) -> np.ndarray:
    """An RGB image with random filled shapes, lines and blurred noise: plenty of SIFT corners."""
    rng = np.random.default_rng(seed)
    img = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), (0, 0), 3)
    for _ in range(60):
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        kind = rng.integers(3)
        x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
        if kind == 0:
            cv2.circle(img, (x, y), int(rng.integers(4, 30)), color, -1)
        elif kind == 1:
            cv2.rectangle(img, (x, y), (x + int(rng.integers(5, 50)), y + int(rng.integers(5, 50))), color, -1)
        else:
            cv2.line(img, (x, y), (int(rng.integers(0, w)), int(rng.integers(0, h))), color, int(rng.integers(1, 4)))
    return cv2.GaussianBlur(img, (3, 3), 0)


H_KNOWN = np.array([[0.9, 0.12, 25.0], [-0.08, 0.95, 15.0], [2e-4, 1e-4, 1.0]])


def warped(img: np.ndarray, H: np.ndarray = H_KNOWN) -> np.ndarray:
    h, w = img.shape[:2]
    return cv2.warpPerspective(img, H, (w, h), borderMode=cv2.BORDER_CONSTANT, borderValue=(128, 128, 128))


@pytest.fixture(scope="module")
def images() -> dict[str, np.ndarray]:
    base = textured(1)
    return {"base": base, "query": warped(base), "other1": textured(2), "other2": textured(3)}


@pytest.fixture(autouse=True)
def _fresh_memory_cache():
    """Each test starts with an empty shared in-memory feature cache."""
    spatial.clear_memory_cache()
    yield
    spatial.clear_memory_cache()


def write_rgb(path: Path, img: np.ndarray) -> None:
    assert cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))


def dummy_meta(dim: int = 4) -> BackboneMeta:
    return BackboneMeta(name="dummy", weights_id="none", head="gem", input_policy="longest_side", size=64,
                        scales=(1.0,), gem_p=3.0, dim=dim, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))


def make_index(root: Path, files: dict[str, np.ndarray], path: Path | None = None) -> Index:
    """An in-memory index of ``files`` (name → RGB image) written to ``root``; dummy descriptors."""
    root.mkdir(parents=True, exist_ok=True)
    items = []
    for name, img in files.items():
        write_rgb(root / name, img)
        st = (root / name).stat()
        items.append(Item(name, st.st_size, st.st_mtime, Path(name).stem))
    desc = np.tile(np.array([1, 0, 0, 0], np.float32), (len(items), 1))
    return Index(root, dummy_meta(), items, desc, path=path)


class CountingExtract:
    """Spy on local feature extraction (query and references alike)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self._orig = spatial.extract_features
        monkeypatch.setattr(spatial, "extract_features", self)

    def __call__(self, *a, **kw):
        self.calls += 1
        return self._orig(*a, **kw)


# ---- verification ----------------------------------------------------------------------------


def test_warped_copy_has_many_inliers_unrelated_image_few(images):
    p = SpatialParams()
    assert verify_pair(images["query"], images["base"], p) > 50
    assert verify_pair(images["query"], images["other1"], p) < 10
    assert verify_pair(images["base"], images["other2"], p) < 10


@pytest.mark.parametrize("size", [(300, 400), (960, 1280)])
def test_a_part_s_features_lie_where_the_photo_s_do(size):
    """:func:`part_features`: a part of a photo looked at alone gives its keypoints in the photo's
    frame (the photo resized to ``max_side``), at the places of the same keypoints of the whole photo,
    whether the photo is smaller than ``max_side`` or twice it (the part then in its own frame)."""
    h, w = size
    photo = textured(7, h, w)
    params = SpatialParams()
    box = (w // 2, h // 4, w, h)
    pts, desc = spatial.part_features(photo, box, params)
    whole_pts, whole_desc = spatial.closer_features(photo, params)
    assert len(pts) > 50
    pairs = cv2.BFMatcher(cv2.NORM_L2).knnMatch(desc.astype(np.float32), whole_desc.astype(np.float32), k=2)
    good = [m for m, n in pairs if m.distance < 0.5 * n.distance]
    assert len(good) > 30
    shift = np.array([whole_pts[m.trainIdx] - pts[m.queryIdx] for m in good])
    assert np.median(np.abs(shift), axis=0).max() < 1.0  # the same places, to a pixel of the frame
    frame = min(1.0, params.max_side / max(h, w))
    assert pts[:, 0].min() >= box[0] * frame - 1 and pts[:, 1].min() >= box[1] * frame - 1


def test_orb_also_verifies(images):
    p = SpatialParams(feature="orb")
    assert p.effective_feature == "orb"
    assert verify_pair(images["query"], images["base"], p) > 30
    assert verify_pair(images["query"], images["other1"], p) < 10


def test_sift_falls_back_to_orb_without_sift(monkeypatch):
    monkeypatch.setattr(spatial, "HAS_SIFT", False)
    assert SpatialParams(feature="sift").effective_feature == "orb"


def test_resizing_keeps_verification(images):
    big = cv2.resize(images["query"], None, fx=3, fy=3, interpolation=cv2.INTER_CUBIC)
    assert verify_pair(big, images["base"], SpatialParams(max_side=640)) > 30


def test_batched_matching_equals_opencv_brute_force(images):
    """The BLAS matcher finds the same ratio-test matches as cv2.BFMatcher (one per reference keypoint)."""
    p = SpatialParams()
    fa = spatial.extract_features(images["query"], p)
    refs = [spatial.extract_features(images[k], p) for k in ("base", "other1", "other2")]
    for (src, dst), fb in zip(spatial.match_features(fa, refs, p), refs):
        best: dict[int, tuple[float, int]] = {}
        for m, n in cv2.BFMatcher(cv2.NORM_L2).knnMatch(fa[1].astype(np.float32), fb[1].astype(np.float32), k=2):
            if m.distance < p.ratio * n.distance and (m.trainIdx not in best or m.distance < best[m.trainIdx][0]):
                best[m.trainIdx] = (m.distance, m.queryIdx)
        expected = {(tuple(fa[0][qi]), tuple(fb[0][ti])) for ti, (_, qi) in best.items()}
        assert {(tuple(a), tuple(b)) for a, b in zip(src, dst)} == expected


@pytest.mark.parametrize("estimator", ["usac", "magsac"])
def test_other_homography_estimators(images, estimator):
    p = SpatialParams(estimator=estimator)
    assert verify_pair(images["query"], images["base"], p) > 50
    assert verify_pair(images["query"], images["other1"], p) < 10


def test_degenerate_homographies_are_rejected():
    assert homography_is_plausible(np.eye(3), 400, 300)
    assert homography_is_plausible(H_KNOWN, 400, 300)
    assert not homography_is_plausible(np.diag([-1.0, 1.0, 1.0]), 400, 300)  # mirror
    assert not homography_is_plausible(np.diag([50.0, 50.0, 1.0]), 400, 300)  # extreme scale
    assert not homography_is_plausible(np.diag([0.01, 0.01, 1.0]), 400, 300)
    assert not homography_is_plausible(np.array([[1, 0, 0], [0, 1, 0], [-0.01, 0, 1.0]]), 400, 300)  # through ∞
    assert not homography_is_plausible(np.full((3, 3), np.nan), 400, 300)


def test_featureless_images_give_zero():
    flat = np.full((200, 200, 3), 127, np.uint8)
    assert verify_pair(flat, flat) == 0
    assert verify_pair(np.zeros((1, 1, 3), np.uint8), textured(5)) == 0


def test_params_are_checked():
    with pytest.raises(MuseumSearchError):
        SpatialParams(feature="surf")
    with pytest.raises(MuseumSearchError):
        SpatialParams(ratio=1.5)
    with pytest.raises(MuseumSearchError):
        SpatialParams(estimator="lmeds")


def test_blend_formula():
    p = SpatialParams(weight=0.5, inlier_cap=50)
    out = blend(np.array([0.2, 0.2, 0.2, 0.2]), np.array([0, 10, 50, 500]), p)
    np.testing.assert_allclose(out, [0.2, 0.3, 0.7, 0.7], rtol=1e-6)


# ---- the verifier --------------------------------------------------------------------------


def test_blend_gates_noise():
    p = SpatialParams(weight=1.0, inlier_cap=50)
    out = blend(np.array([0.5, 0.5, 0.5]), np.array([11, 12, 80]), p, gate=12)
    np.testing.assert_allclose(out, [0.5, 0.74, 1.5], rtol=1e-6)  # below the gate: unchanged


def test_verifier_finds_the_true_reference(tmp_path, images):
    files = {"a_wrong.png": images["other1"], "b_wrong.png": images["other2"], "c_true.png": images["base"],
             "d_rest.png": images["other1"], "e_rest.png": images["other2"]}
    index = make_index(tmp_path / "coll", files)
    rr = Verifier(SpatialParams(top_n=3))
    inl = rr.verify(images["query"], [0, 1, 2], index)
    assert inl.dtype == np.int64 and inl.shape == (3,)
    assert inl[2] > 50 and inl[0] < 10 and inl[1] < 10
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    new = blend(scores, inl, rr.params, gate=12)
    assert int(np.argmax(new)) == 2  # the true reference is now first
    np.testing.assert_array_equal(new[:2], scores[:2])  # noise changes nothing
    assert rr.inliers(images["query"], 2, index) == inl[2]
    assert rr.inliers(images["query"], 0, index) == inl[0]


def test_unreadable_reference_counts_as_zero(tmp_path, images, caplog):
    index = make_index(tmp_path / "coll", {"broken.png": images["base"], "good.png": images["base"],
                                          "gone.png": images["base"]})
    (tmp_path / "coll" / "broken.png").write_bytes(b"not an image at all")
    (tmp_path / "coll" / "gone.png").unlink()
    inl = Verifier().verify(images["query"], [0, 1, 2], index)
    assert inl[0] == 0 and inl[2] == 0 and inl[1] > 50
    assert "broken.png" in caplog.text and "gone.png" in caplog.text
    # warned once per file version, not once per query or per verifier
    caplog.clear()
    rr = Verifier()
    for _ in range(3):
        rr.verify(images["query"], [0, 1, 2], index)
    Verifier().verify(images["query"], [0, 1, 2], index)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


# ---- caches ----------------------------------------------------------------------------------


def test_disk_cache_is_reused_and_invalidated(tmp_path, images, monkeypatch):
    spy = CountingExtract(monkeypatch)
    idx_dir = tmp_path / "index"
    index = make_index(tmp_path / "coll", {"a.png": images["other1"], "b.png": images["base"]}, path=idx_dir)
    q = images["query"]

    first = Verifier().verify(q, [0, 1], index)
    assert spy.calls == 1 + 2  # the query and both references
    cache_files = sorted(idx_dir.glob("spatial-*/*.npz"))
    assert len(cache_files) == 2
    assert not list(idx_dir.glob("spatial-*/*.tmp"))
    with np.load(cache_files[0], allow_pickle=False) as z:
        assert z["pts"].dtype == np.float32 and z["pts"].shape[1] == 2

    # with an empty memory, the references are read from disk
    spatial.clear_memory_cache()
    spy.calls = 0
    rr = Verifier()
    again = rr.verify(q, [0, 1], index)
    assert spy.calls == 1  # only the query
    assert rr.stats["disk_hits"] == 2
    np.testing.assert_array_equal(first, again)

    # then from memory, shared by every verifier (a pipeline is rebuilt for each search)
    spy.calls = 0
    rr = Verifier()
    rr.verify(q, [0, 1], index)
    assert spy.calls == 1 and rr.stats["memory_hits"] == 2 and rr.stats["disk_hits"] == 0

    # change reference b: both caches must notice, and its new content must be verified
    write_rgb(tmp_path / "coll" / "b.png", images["other2"])
    st = (tmp_path / "coll" / "b.png").stat()
    os.utime(tmp_path / "coll" / "b.png", ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    spy.calls = 0
    changed = rr.verify(q, [0, 1], index)
    assert spy.calls == 1 + 1  # the query and b
    assert first[1] > 50 and changed[1] < 10  # b no longer matches
    spatial.clear_memory_cache()
    spy.calls = 0
    Verifier().verify(q, [0, 1], index)
    assert spy.calls == 1  # the rewritten disk entry is fresh again


def test_corrupt_cache_entry_is_recomputed(tmp_path, images, monkeypatch):
    idx_dir = tmp_path / "index"
    index = make_index(tmp_path / "coll", {"b.png": images["base"]}, path=idx_dir)
    first = Verifier().verify(images["query"], [0], index)
    (entry,) = idx_dir.glob("spatial-*/*.npz")
    entry.write_bytes(b"garbage")
    spatial.clear_memory_cache()
    spy = CountingExtract(monkeypatch)
    again = Verifier().verify(images["query"], [0], index)
    assert spy.calls == 2
    np.testing.assert_array_equal(first, again)
    with np.load(entry, allow_pickle=False) as z:  # rewritten
        assert "desc" in z.files


def test_unwritable_cache_folder_is_not_fatal(tmp_path, images, caplog):
    blocker = tmp_path / "index"
    blocker.write_bytes(b"a file where the index folder should be")  # mkdir of the cache fails
    index = make_index(tmp_path / "coll", {"b.png": images["base"]}, path=blocker)
    assert Verifier().verify(images["query"], [0], index)[0] > 50  # verified all the same
    assert "cache" in caplog.text


def test_no_disk_cache_without_index_folder(tmp_path, images):
    index = make_index(tmp_path / "coll", {"b.png": images["base"]})
    Verifier().verify(images["query"], [0], index)
    assert not list(tmp_path.rglob("*.npz"))


# ---- real photos -----------------------------------------------------------------------------


def _ground_truth(shared_data: Path) -> dict[str, str]:
    with open(shared_data / "paintings" / "queries" / "qsd1_w1" / "ground_truth.csv", newline="") as f:
        return {r["query"]: r["instance"] for r in csv.DictReader(f)}


def _rgb(path: Path) -> np.ndarray:
    return load_image(path)


@pytest.mark.data
def test_real_query_matches_its_painting_only(shared_data):
    gt = _ground_truth(shared_data)
    paint = shared_data / "paintings"
    query = "00002.jpg"
    q = _rgb(paint / "queries" / "qsd1_w1" / query)
    true = gt[query]
    wrong = "bbdd_00000" if true != "bbdd_00000" else "bbdd_00001"
    assert verify_pair(q, _rgb(paint / "references" / f"{true}.jpg")) > 20
    assert verify_pair(q, _rgb(paint / "references" / f"{wrong}.jpg")) < 10


@pytest.mark.data
def test_real_verification_picks_the_true_painting(shared_data):
    gt = _ground_truth(shared_data)
    paint = shared_data / "paintings"
    query = "00002.jpg"
    true = gt[query]
    names = [n for n in ("bbdd_00000", "bbdd_00001", "bbdd_00003") if n != true][:2] + [true]
    items = [Item(f"{n}.jpg", 0, 0.0, n) for n in names]
    index = Index(paint / "references", dummy_meta(), items, np.zeros((3, 4), np.float32))
    inl = Verifier().verify(_rgb(paint / "queries" / "qsd1_w1" / query), [0, 1, 2], index)
    assert int(np.argmax(inl)) == 2 and inl[2] > 20


def test_outline_overlap():
    from museum_search.core.verification._spatial import outline_overlap

    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], np.float32)
    assert outline_overlap(square, square) == pytest.approx(1.0)
    assert outline_overlap(square, square + [5, 0]) == pytest.approx(1 / 3)  # 50 shared of 150
    assert outline_overlap(square, square + [20, 0]) == 0.0  # two paintings side by side


def _sift_like(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 128) uint8 descriptors shaped like OpenCV's SIFT ones: non-negative, norm about 512."""
    d = rng.gamma(0.6, 1.0, (n, 128))
    d = np.minimum(d / np.linalg.norm(d, axis=1, keepdims=True), 0.2)
    d = d / np.linalg.norm(d, axis=1, keepdims=True) * 512
    return np.clip(np.rint(d), 0, 255).astype(np.uint8)


def test_int8_matching_gives_the_float_matches_ties_included():
    """The 8-bit product finds exactly the float32 product's matches, ties and exact copies
    included; descriptors whose keys would not fit in int32 go to the float32 product."""
    rng = np.random.default_rng(5)
    qa = _sift_like(rng, 300)
    pa = rng.uniform(0, 600, (300, 2)).astype(np.float32)
    refs = []
    for n in (2, 3, 57, 400, 1024):  # 1024: the most a place of 10 bits holds
        db = _sift_like(rng, n)
        db[: n // 3] = qa[rng.integers(0, 300, n // 3)]  # copies of the photo's keypoints: distance 0
        db[n // 3: n // 2] = db[: n // 2 - n // 3]  # duplicates in the reference: tied distances
        refs.append((rng.uniform(0, 600, (n, 2)).astype(np.float32), db))
    refs.append((np.empty((1, 2), np.float32), _sift_like(rng, 1)))  # too few keypoints
    fast = spatial._match_sift_int8((pa, qa), refs, 0.8)
    assert fast is not None, "ONNX Runtime's 8-bit product is a dependency: it must run here"
    slow = spatial._match_sift_float((pa, qa), refs, 0.8)
    # the stored features' terms, computed once for the index (one row's left to the matching)
    local = LocalFeatures.from_list([(r, (600.0, 600.0)) for r in refs], {}, 128)
    terms = [local.byte_terms(j) for j in range(len(refs))]
    np.testing.assert_array_equal(terms[3][0], np.einsum("ij,ij->i", refs[3][1].astype(np.int64),
                                                         refs[3][1].astype(np.int64)))
    np.testing.assert_array_equal(terms[3][1], refs[3][1].astype(np.int64).sum(axis=1))
    terms[2] = None
    stored = spatial._match_sift_int8((pa, qa), refs, 0.8, terms)
    for (a1, b1), (a2, b2), (a3, b3) in zip(fast, slow, stored):
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(b1, b2)
        np.testing.assert_array_equal(a3, a2)
        np.testing.assert_array_equal(b3, b2)
    assert sum(len(a) for a, _ in fast) > 50  # the copies not duplicated in their reference matched
    full = np.full((1000, 128), 255, np.uint8)  # no SIFT descriptor: keys beyond int32
    pf = rng.uniform(0, 600, (1000, 2)).astype(np.float32)
    assert spatial._match_sift_int8((pa, qa), [(pf, full)], 0.8) is None
    full_terms = LocalFeatures.from_list([((pf, full), (600.0, 600.0))], {}, 128).byte_terms(0)
    assert spatial._match_sift_int8((pa, qa), [(pf, full)], 0.8, [full_terms]) is None
    (got,) = spatial.match_features((pa, qa), [(pf, full)], SpatialParams())  # the float32 product
    (want,) = spatial._match_sift_float((pa, qa), [(pf, full)], 0.8)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.data
def test_int8_matching_equals_float_on_real_paintings(shared_data):
    paint = shared_data / "paintings"
    p = SpatialParams()
    refs = [spatial.extract_features(_rgb(f), p) for f in sorted((paint / "references").glob("*.jpg"))[:20]]
    for q in sorted((paint / "queries" / "qsd1_w1").glob("*.jpg"))[:3]:
        fa = spatial.extract_features(_rgb(q), p)
        fast = spatial._match_sift_int8(fa, refs, p.ratio)
        assert fast is not None
        for (a1, b1), (a2, b2) in zip(fast, spatial._match_sift_float(fa, refs, p.ratio)):
            np.testing.assert_array_equal(a1, a2)
            np.testing.assert_array_equal(b1, b2)


def test_query_features_at_a_smaller_side_are_placed_in_the_verify_frame(images):
    big = cv2.resize(images["query"], None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)  # 800 px wide
    p = SpatialParams(max_side=640)
    same = spatial.query_features(big, p)
    np.testing.assert_array_equal(same[0], spatial.extract_features(big, p)[0])
    small = spatial.query_features(big, SpatialParams(max_side=640, query_side=320))
    assert small[0][:, 0].max() > 400 and small[0][:, 0].max() < 640  # the 640 frame, not the 320 one
    ref = spatial.extract_features(images["base"], p)
    size = spatial._resized_size(images["base"], 640)
    assert spatial.verify_features(small, ref, p, size) > 30


def test_new_sift_indexes_store_the_query_side_and_older_ones_keep_max_side():
    """The side a photo's SIFT features are computed at is part of what an index is calibrated with:
    new indexes record it, an index without it (built before it existed) queries at ``max_side``."""
    p = spatial.params_for("sift")
    assert p.query_side == spatial.QUERY_SIDE["sift"] < p.max_side
    settings = spatial.settings_of(p)
    assert settings["query_side"] == spatial.QUERY_SIDE["sift"]
    assert spatial.params_of_settings(settings).query_side == spatial.QUERY_SIDE["sift"]
    old = {k: v for k, v in settings.items() if k != "query_side"}
    assert spatial.params_of_settings(old).query_side is None
    assert (p.photo_side, spatial.params_of_settings(old).photo_side) == (spatial.QUERY_SIDE["sift"], p.max_side)
    assert "query_side" not in spatial.settings_of(spatial.params_of_settings(old))  # an update keeps it so
    # the stored reference features are the same features whatever the query side
    assert spatial.same_features(settings, old) and spatial.same_features(old, settings)
    assert not spatial.same_features(settings, {**old, "max_side": 480})
    assert not spatial.same_features(settings, None) and spatial.same_features(None, None)
    # XFeat computes the photo's features at max_side: it records no query side
    assert spatial.params_for("xfeat").query_side is None


def test_the_query_pipeline_and_the_calibration_use_the_index_s_query_side(sample_index):
    from museum_search.core.answer._pipeline import QueryPipeline

    stored = sample_index.local.settings
    assert stored["query_side"] == spatial.QUERY_SIDE["sift"]
    pipe = QueryPipeline(sample_index)
    assert pipe.verification.params.query_side == stored["query_side"]
    # the stored reference features are used, not computed again for the query side's settings
    before = pipe.verification.verifier.stats["computed"]
    pipe.verification.verifier.reference_features(sample_index, 0)
    assert pipe.verification.verifier.stats["computed"] == before



def test_the_calibration_queries_its_views_at_the_index_s_query_side(sample_index, monkeypatch):
    import museum_search.core.verification._shortlist as verification
    from museum_search.core.jobs._calibration import calibrate
    from museum_search.core.progress import drive

    sides = []
    real = verification.query_features

    def spy(image, params=None):
        sides.append(params.query_side)
        return real(image, params)

    monkeypatch.setattr(verification, "query_features", spy)
    verdict = drive(calibrate(sample_index, views=4))
    assert verdict.min_inliers >= 1
    assert sides and set(sides) == {spatial.QUERY_SIDE["sift"]}
