"""ICFRR on COIL-100 (../shared/data/coil100): references every 20°, queries at 10°/130°/250°.

With ~18 references per object this is the set where re-ranking has something to work with:
ICFRR (paper rule, K_q/K_g from the collection, beta 0.5) must raise MAP over plain search.
"""

import re

import pytest

from museum_search.core.answer._icfrr import suggest_params
from museum_search.core.answer._pipeline import QuerySettings
from museum_search.core.answer._rerank import RerankOptions
from museum_search.core.evaluation._querysets import load_queryset
from museum_search.core.evaluation._runner import run_evaluation
from museum_search.core.index._labels import COIL100_REGEX
from museum_search.core.index._store import LabellingSpec
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.jobs._indexing import build_index
from museum_search.core.progress import drive as run

pytestmark = [pytest.mark.data, pytest.mark.slow]
ANGLE = re.compile(r"__(\d+)\.")
SIZE = 224  # COIL images are 128 px; 224 is the backbone's native input scale


@pytest.fixture(scope="module")
def coil(shared_data, tmp_path_factory):
    root = shared_data / "coil100"
    names = sorted(p.name for p in root.glob("*.jpg"))
    refs = [n for n in names if int(ANGLE.search(n).group(1)) % 20 == 0]
    queries = [n for n in names if int(ANGLE.search(n).group(1)) in (10, 130, 250)]
    # the references are a subset of the folder: index them from a folder of links
    ref_dir = tmp_path_factory.mktemp("coil_refs")
    for n in refs:
        (ref_dir / n).symlink_to(root / n)
    index = run(build_index(ref_dir, None, BackboneConfig(size=SIZE), LabellingSpec("regex", regex=COIL100_REGEX))).index
    qs = load_queryset(root, layout="regex", regex=COIL100_REGEX, files=queries)
    return index, qs


def test_protocol_counts(coil):
    index, qs = coil
    assert len(index) == 1793 and len(index.instances) == 100
    assert len(qs.queries) == 299


def test_icfrr_raises_map(coil):
    index, qs = coil
    plain = QuerySettings(regions=False, verify=False)  # the papers' protocol: plain search
    base = run_evaluation(index, qs, plain)
    params = suggest_params(index.labels)
    icfrr = run_evaluation(index, qs, QuerySettings(regions=False, verify=False, rerank="icfrr"))
    print(f"COIL-100 MAP {base.summary['map']:.4f} -> ICFRR {icfrr.summary['map']:.4f} "
          f"(K_q={params.k_q}, K_g={params.k_g}, beta={params.beta}); MP@1 {base.summary['mp@1']:.4f} -> "
          f"{icfrr.summary['mp@1']:.4f}")
    assert icfrr.summary["map"] > base.summary["map"] + 0.01
    # the reference mode of the public code agrees with the paper after one iteration only
    one_paper = run_evaluation(index, qs, QuerySettings(regions=False, verify=False, rerank="icfrr",
                                                        options=RerankOptions(iterations=1)))
    one_ref = run_evaluation(index, qs, QuerySettings(regions=False, verify=False, rerank="icfrr",
                                                      options=RerankOptions(iterations=1, icfrr_mode="reference")))
    assert one_paper.summary["map"] == pytest.approx(one_ref.summary["map"], abs=1e-12)


def test_verification_does_not_hurt_3d_objects(coil):
    """A homography does not hold between most views of a 3D object 20° apart, and near-identical
    objects (two boxes of one brand) verify alike: verification must not make results worse.
    Lifting whole verified objects (their unverified views with them) makes them better."""
    index, qs = coil
    default = run_evaluation(index, qs)  # no flags: regions, verification, calibrated verdict
    unverified = run_evaluation(index, qs, QuerySettings(verify=False))
    d, u = default.summary, unverified.summary
    print(f"COIL-100 default pipeline MAP {d['map']:.4f} MP@1 {d['mp@1']:.4f}; verification off MAP "
          f"{u['map']:.4f} MP@1 {u['mp@1']:.4f}; verdict {d['verdict']}")
    # measured (bench_recognition): MAP 0.9013 -> 0.918 with verification, MP@1 1.000 both
    assert d["map"] >= u["map"] and d["mp@1"] >= u["mp@1"] and d["amnro"] <= u["amnro"]


def test_the_photo_s_centre_finds_objects_photographed_as_visitors_do(coil):
    """COIL-100's photos at 10° as a visitor's phone takes them (at an angle on a wall, out of focus,
    dim, noisy: :mod:`museum_search.core.conditions`): each has wall all round its object, which each
    of the photo's side regions keeps on three sides. The central 80 % (the sixth of
    ``QUERY_REGIONS``) brings the right object's best cosine above the others' more often, and by
    more, than the five other regions alone (the global descriptor only, no verification)."""
    import numpy as np

    from museum_search.core.answer._pipeline import QueryPipeline, query_from_array
    from museum_search.core.conditions import degrade, photo_seed
    from museum_search.core.images import load_image
    from museum_search.core.inference._extract import QUERY_REGIONS
    from museum_search.core.verification import cosine_margin

    index, qs = coil
    assert QUERY_REGIONS[-1] == (0.1, 0.1, 0.9, 0.9) and len(QUERY_REGIONS) == 6
    pipe = QueryPipeline(index, QuerySettings(verify=False))
    photos = [q for q in qs.queries if ANGLE.search(q.path).group(1) == "10"]
    assert len(photos) == 100
    imgs = [degrade(load_image(q.path), "phone", photo_seed("phone", q.path.rsplit("/", 1)[-1])) for q in photos]
    desc = np.concatenate([pipe.embed([query_from_array(im, "x") for im in imgs[i:i + 20]]) for i in range(0, 100, 20)])
    assert desc.shape[:2] == (100, 6)
    ref = np.asarray(index.descriptors, np.float32)
    labels = np.asarray(index.labels)

    def right_and_margin(regions: np.ndarray, instance: str) -> tuple[bool, float]:
        cos = (regions @ ref.T).max(axis=0)
        margin = cosine_margin(labels, instance, float(cos[labels == instance].max()), cos, np.ones(len(cos), bool))
        return margin > 0, margin

    five = [right_and_margin(d[:5], next(iter(q.relevant))) for d, q in zip(desc, photos)]
    six = [right_and_margin(d, next(iter(q.relevant))) for d, q in zip(desc, photos)]
    first5, first6 = sum(r for r, _ in five), sum(r for r, _ in six)
    print(f"phone-like COIL photos, the right object first by the global descriptor: {first5} of 100 with five "
          f"regions, {first6} with six; median margin {np.median([m for _, m in five]):.3f} -> "
          f"{np.median([m for _, m in six]):.3f}")
    assert first6 > first5
    assert np.median([m for _, m in six]) > np.median([m for _, m in five])
