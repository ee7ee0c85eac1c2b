"""Describing on a Ray cluster (core/distributed.py): a local Ray instance with 2 workers gives what
a local build gives, skips what it skips, retries a failed share, and fails clearly.

One Ray instance serves the module (``cluster``), except the first test, where describe_on_ray
starts and stops its own.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from museum_search.core.errors import MuseumSearchError
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.inference._engines import build_extractor
from museum_search.core.inference._extract import extract
from museum_search.core.jobs._distributed import RAY_MISSING, STAGE, describe_on_ray
from museum_search.core.progress import drive
from museum_search.core.verification._spatial import SpatialParams, compute_local_features

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_module():
    import ray  # a dev install has it (museum-search[dev] includes the cluster extra): never skipped

    return ray


@pytest.fixture(scope="module")
def cluster(ray_module):
    """A local Ray instance with 2 CPUs for the module's tests (describe_on_ray uses it and leaves it)."""
    started = not ray_module.is_initialized()
    if started:
        ray_module.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray_module
    if started:
        ray_module.shutdown()


@pytest.fixture(scope="module")
def extractor():
    return build_extractor(BackboneConfig())


@pytest.fixture(scope="module")
def sample_paths(sample_collection) -> list[str]:
    return [str(p) for p in sorted((sample_collection / "collection").glob("*.jpg"))]


@pytest.fixture(scope="module")
def local_build(sample_paths, extractor):
    """What a local build computes: descriptors, then the described files' local features."""
    res = drive(extract(sample_paths, extractor))
    local = drive(compute_local_features([sample_paths[i] for i in res.ok], SpatialParams()))
    return res, local


def assert_same(res, ref, local=None, ref_local=None):
    assert res.ok == ref.ok
    assert res.skipped == ref.skipped
    assert res.descriptors.shape == ref.descriptors.shape and res.descriptors.dtype == np.float32
    cos = np.sum(res.descriptors * ref.descriptors, axis=1) / (
        np.linalg.norm(res.descriptors, axis=1) * np.linalg.norm(ref.descriptors, axis=1))
    assert cos.min() >= 0.9999, cos.min()
    if ref_local is not None:
        assert local is not None and local.settings == ref_local.settings and len(local) == len(res.ok)
        for name in ("offsets", "points", "descriptors", "sizes"):
            np.testing.assert_array_equal(getattr(local, name), getattr(ref_local, name))


def test_own_local_instance_started_and_shut_down(ray_module, sample_paths, extractor, local_build):
    """No address and no Ray running: a local instance with 2 CPUs is started, the shares are
    described by its workers, merged in input order with their local features, and Ray is shut down."""
    if ray_module.is_initialized():
        pytest.skip("Ray is already running in this process")
    records = []
    res, local = drive(describe_on_ray(sample_paths, extractor, num_cpus=2, share_size=8), records.append)
    assert not ray_module.is_initialized()
    assert_same(res, *local_build[:1], local, local_build[1])
    stages = [r.stage for r in records]
    assert stages[0] == "starting Ray" and stages[-1] == STAGE
    assert records[-1].done == records[-1].total == len(sample_paths)
    dones = [r.done for r in records if r.stage == STAGE]
    steps = set(np.diff([0, *dones])) - {0}  # a whole share at a time, in whatever order they finish
    assert dones == sorted(dones) and steps <= {8, len(sample_paths) % 8}


def test_two_workers_give_the_local_build(cluster, sample_paths, extractor, local_build):
    """Another share size (shares not aligned with batches), the config instead of the extractor."""
    res, local = drive(describe_on_ray(sample_paths, BackboneConfig(), share_size=5))
    assert cluster.is_initialized()  # not ours: left running
    assert_same(res, local_build[0], local, local_build[1])
    res, local = drive(describe_on_ray(sample_paths, extractor.meta, verification=False))
    assert local is None
    assert_same(res, local_build[0])


def test_unreadable_files_are_skipped_with_their_reason(cluster, tmp_path, sample_paths, extractor):
    coll = tmp_path / "coll"
    coll.mkdir()
    paths = []
    for p in sample_paths[:6]:
        paths.append(coll / Path(p).name)
        shutil.copy2(p, paths[-1])
    (coll / "truncated.jpg").write_bytes(Path(sample_paths[0]).read_bytes()[:300])
    (coll / "not-an-image.jpg").write_text("hello", encoding="utf-8")
    paths[2:2] = [coll / "truncated.jpg"]
    paths.append(coll / "not-an-image.jpg")
    paths.append(coll / "vanished.jpg")
    ref = drive(extract(paths, extractor))
    ref_local = drive(compute_local_features([paths[i] for i in ref.ok], SpatialParams()))
    assert len(ref.skipped) == 3  # what the local build does with them
    res, local = drive(describe_on_ray(paths, extractor, share_size=3))
    assert_same(res, ref, local, ref_local)
    assert [p for p, _ in res.skipped] == [str(coll / n) for n in ("truncated.jpg", "not-an-image.jpg", "vanished.jpg")]
    assert all(reason for _, reason in res.skipped)


def test_a_share_that_fails_is_retried(cluster, tmp_path, sample_paths, extractor, local_build):
    """Share 1 raises on its first attempt, share 3 on its first two: both are submitted again and
    the result is the local build's."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    paths = sample_paths[:24]
    res, _ = drive(describe_on_ray(paths, extractor, share_size=4, verification=False, max_retries=2,
                                   _faults={1: ("raise", 1, str(one)), 3: ("raise", 2, str(two))}))
    assert sorted(f.name for f in one.iterdir()) == ["attempt-0"]  # the failure did happen
    assert sorted(f.name for f in two.iterdir()) == ["attempt-0", "attempt-1"]
    ref = local_build[0]
    n = len([i for i in ref.ok if i < 24])
    assert res.ok == ref.ok[:n]
    assert np.sum(res.descriptors * ref.descriptors[:n], axis=1).min() >= 0.9999


def test_a_worker_that_dies_is_replaced_and_its_share_run_again(cluster, tmp_path, sample_paths, extractor,
                                                               local_build):
    marks = tmp_path / "marks"
    marks.mkdir()
    paths = sample_paths[:12]
    res, local = drive(describe_on_ray(paths, extractor, share_size=4, max_retries=1,
                                       _faults={0: ("exit", 1, str(marks))}))
    assert (marks / "attempt-0").exists()
    ref, ref_local = local_build
    n = len([i for i in ref.ok if i < 12])
    assert res.ok == ref.ok[:n]
    assert np.sum(res.descriptors * ref.descriptors[:n], axis=1).min() >= 0.9999
    np.testing.assert_array_equal(local.offsets, ref_local.offsets[: n + 1])


def test_a_share_that_keeps_failing_stops_with_a_clear_error(cluster, tmp_path, sample_paths, extractor):
    marks = tmp_path / "marks"
    marks.mkdir()
    paths = sample_paths[:12]
    with pytest.raises(MuseumSearchError) as err:
        drive(describe_on_ray(paths, extractor, share_size=4, verification=False, max_retries=1,
                              _faults={2: ("raise", 99, str(marks))}))
    msg = str(err.value)
    assert paths[8] in msg and "after 2 attempts" in msg and "RuntimeError: injected failure" in msg
    assert len(list(marks.iterdir())) == 2  # the first attempt and one retry


def test_workers_with_other_weights_are_refused(cluster, sample_paths, extractor):
    """Descriptors that would differ from the index's (another weights file on the workers) are not merged."""
    from dataclasses import replace

    meta = replace(extractor.meta, weights_id="file:0123456789abcdef")
    with pytest.raises(MuseumSearchError, match="install the same museum-search and weights on every worker"):
        drive(describe_on_ray(sample_paths[:4], meta, verification=False))


def test_closing_cancels_and_the_cluster_stays_usable(cluster, sample_paths, extractor, local_build):
    gen = describe_on_ray(sample_paths, extractor, share_size=2)
    first = next(gen)
    assert first.stage == STAGE
    t0 = time.perf_counter()
    gen.close()
    assert time.perf_counter() - t0 < 5
    res, _ = drive(describe_on_ray(sample_paths[:4], extractor, verification=False))
    assert res.ok == [0, 1, 2, 3]


def test_ray_missing_says_how_to_install_it(monkeypatch, sample_paths, extractor):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails
    with pytest.raises(MuseumSearchError) as err:
        drive(describe_on_ray(sample_paths, extractor))
    assert str(err.value) == RAY_MISSING == "indexing on a Ray cluster needs Ray: pip install 'museum-search[cluster]'"


@pytest.mark.data
def test_paintings_on_ray_match_the_local_descriptors(cluster, shared_data, extractor):
    refs = sorted((shared_data / "paintings" / "references").glob("*.jpg"))[:30]
    assert refs
    ref = drive(extract(refs, extractor))
    ref_local = drive(compute_local_features([refs[i] for i in ref.ok], SpatialParams()))
    res, local = drive(describe_on_ray(refs, extractor))
    assert_same(res, ref, local, ref_local)


def test_cli_index_on_ray_is_the_plain_index(cluster, sample_collection, tmp_path, capsys):
    """`museum-search index … --ray` writes the index a plain `index` writes: same items, descriptors,
    local features and verdict, in one generation."""
    from museum_search.cli import main
    from museum_search.core.index._store import Index

    coll = sample_collection / "collection"
    assert main(["index", str(coll), "-o", str(tmp_path / "plain")]) == 0
    assert main(["index", str(coll), "-o", str(tmp_path / "ray"), "--ray"]) == 0
    assert cluster.is_initialized()  # the cluster this process had is kept
    plain, on_ray = Index.load(tmp_path / "plain"), Index.load(tmp_path / "ray")
    assert list(on_ray.items) == list(plain.items) and on_ray.meta == plain.meta
    cos = np.sum(np.asarray(on_ray.descriptors) * np.asarray(plain.descriptors), axis=1)
    assert cos.min() >= 0.9999, cos.min()
    for name in ("offsets", "points", "descriptors", "sizes"):
        np.testing.assert_array_equal(getattr(on_ray.local, name), getattr(plain.local, name))
    assert on_ray.verdict == plain.verdict
    np.testing.assert_array_equal(on_ray.neighbour_lists(5)[:, :5], plain.neighbour_lists(5)[:, :5])
