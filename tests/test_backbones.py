"""Backbones, pooling and extraction."""

import numpy as np
import pytest
import torch

from museum_search.core.errors import MuseumSearchError, WeightsUnavailableError
from museum_search.core.inference import _pooling as pooling
from museum_search.core.inference._backbones import REGISTRY, BackboneConfig, BackboneMeta
from museum_search.core.inference._engines import build_extractor
from museum_search.core.inference._extract import extract


def test_pooling_functions_by_hand():
    x = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 8.0]]]])  # (1, 2, 2, 2)
    np.testing.assert_allclose(pooling.gap(x).numpy(), [[2.5, 2.0]])
    np.testing.assert_allclose(pooling.mac(x).numpy(), [[4.0, 8.0]])
    p = 3.0
    expected0 = ((1 + 8 + 27 + 64) / 4) ** (1 / p)
    np.testing.assert_allclose(pooling.gem(x, p=p).numpy()[0, 0], expected0, rtol=1e-5)
    # GeM with p=1 is GAP, large p tends to MAC
    np.testing.assert_allclose(pooling.gem(x + 1, p=1.0).numpy(), pooling.gap(x + 1).numpy(), rtol=1e-5)
    assert abs(pooling.gem(x + 1, p=50.0)[0, 0].item() - 5.0) < 0.2


def test_rmac_regions_cover_map_and_match_cirtorch_counts():
    # square map: 1 + 1 + 4 + 9 regions (whole map first, then levels 1..3)
    assert len(pooling.rmac_regions(10, 10)) == 1 + 4 + 9
    for h, w in [(10, 14), (7, 30), (30, 7)]:
        for top, left, side in pooling.rmac_regions(h, w):
            assert 0 <= top and top + side <= h and 0 <= left and left + side <= w
    x = torch.rand(2, 4, 9, 13)
    v = pooling.rmac(x)
    assert v.shape == (2, 4) and torch.all(v > 0)


def test_every_offline_backbone_gives_unit_descriptors():
    img = np.random.default_rng(0).integers(0, 255, (300, 200, 3), dtype=np.uint8)
    for name in ("mobilenet_v2", "efficientnet_lite0"):
        for head in ("gem", "logits"):
            ext = build_extractor(BackboneConfig(name=name, head=head, size=128), engine="torch")
            d = ext.embed_images([img, img[::-1]])
            assert d.shape == (2, ext.meta.dim)
            np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, atol=1e-5)
    assert build_extractor(BackboneConfig(head="logits"), engine="torch").meta.dim == 1000


def test_logits_head_is_imagenet_classifier():
    """The logits head really is the ImageNet classifier: a flat orange image is not a zebra."""
    ext = build_extractor(BackboneConfig(head="logits"), engine="torch")
    assert ext.meta.input_policy == "fixed" and ext.meta.size == 224
    img = np.zeros((224, 224, 3), np.uint8)
    img[:] = (255, 140, 0)
    x = torch.from_numpy(ext.preprocess(img)[None])
    with torch.inference_mode():
        logits = ext.model(x)[0]
    assert torch.argmax(logits).item() != 340  # 340 = zebra
    np.testing.assert_allclose(ext.embed([ext.preprocess(img)])[0],
                               (logits / logits.norm()).numpy(), atol=1e-5)


def test_aspect_preserving_input_policy():
    ext = build_extractor(BackboneConfig(size=200), engine="torch")
    x = ext.preprocess(np.zeros((100, 400, 3), np.uint8))
    assert x.shape == (3, 50, 200)


def test_multiscale_differs_from_single_scale():
    img = np.random.default_rng(1).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    a = build_extractor(BackboneConfig(size=128), engine="torch").embed_images([img])
    b = build_extractor(BackboneConfig(size=128, scales=(1.0, 0.5)), engine="torch").embed_images([img])
    assert 0.5 < float(a[0] @ b[0]) < 0.9999


def test_meta_roundtrip():
    meta = build_extractor(BackboneConfig(size=128, head="rmac"), engine="torch").meta
    assert BackboneMeta.from_dict(meta.to_dict()) == meta
    assert "RMAC" in meta.summary()


def test_torchvision_backbone_without_weights_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    with pytest.raises(WeightsUnavailableError) as err:
        build_extractor(BackboneConfig(name="resnet152"), download=False)
    msg = str(err.value)
    assert "--weights" in msg and "internet" in msg and "resnet152" in msg


def test_torchvision_backbone_from_weights_file(tmp_path):
    """A user with a weights file can use the papers' baselines (AlexNet here, random weights)."""
    import torchvision

    torch.manual_seed(0)
    path = tmp_path / "alexnet.pth"
    torch.save(torchvision.models.alexnet(weights=None).state_dict(), path)
    ext = build_extractor(BackboneConfig(name="alexnet", head="logits", weights=str(path)), engine="torch")
    assert ext.meta.weights_id.startswith("file:")
    d = ext.embed_images([np.zeros((64, 64, 3), np.uint8)])
    assert d.shape == (1, 1000)
    # the wrong architecture's file is refused with a message
    with pytest.raises(WeightsUnavailableError, match="do not fit"):
        build_extractor(BackboneConfig(name="vgg16", weights=str(path)))


def test_bad_settings_are_refused():
    with pytest.raises(MuseumSearchError, match="unknown backbone"):
        build_extractor(BackboneConfig(name="nope"))
    with pytest.raises(MuseumSearchError):
        build_extractor(BackboneConfig(size=5))
    assert {"alexnet", "resnet152", "resnet50", "vgg16", "mobilenet_v2",
            "efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"} <= set(REGISTRY)


def test_extract_is_a_generator_with_progress_and_skips(tmp_path, sample_collection):
    files = sorted((sample_collection / "collection").glob("*.jpg"))[:5]
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    paths = files[:2] + [bad] + files[2:]
    ext = build_extractor(BackboneConfig(size=96), engine="torch")
    steps = []
    gen = extract(paths, ext, batch_size=2)
    while True:
        try:
            steps.append(next(gen))
        except StopIteration as stop:
            result = stop.value
            break
    assert [s.done for s in steps] == [2, 5, 6]  # a skipped file does not take a batch slot
    assert steps[-1].total == 6
    assert result.ok == [0, 1, 3, 4, 5]
    assert [p for p, _ in result.skipped] == [str(bad)]
    # same descriptors as describing one by one (batching and threading change nothing)
    single = np.stack([ext.embed_images([__import__("museum_search.core.images", fromlist=["x"]).load_image(
        p, max_side=ext.max_side)])[0] for p in files])
    np.testing.assert_allclose(result.descriptors, single, atol=1e-5)


def test_extract_cancel_stops_early(sample_collection):
    files = sorted((sample_collection / "collection").glob("*.jpg"))[:8]
    gen = extract(files, build_extractor(BackboneConfig(size=96), engine="torch"), batch_size=1)
    assert next(gen).done == 1
    gen.close()  # cancelling: the thread pool is shut down, no exception
    with pytest.raises(StopIteration):
        next(gen)
