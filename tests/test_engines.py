"""Inference engines (core/engines.py): ONNX Runtime against PyTorch, the export cache, fallbacks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from museum_search.core.images import load_image
from museum_search.core.inference import _engines as engines
from museum_search.core.inference._backbones import BackboneConfig, Extractor
from museum_search.core.inference._engines import OnnxExtractor, build_extractor


@pytest.fixture(scope="module")
def sample_images(sample_collection):
    return [load_image(p, max_side=512) for p in sorted((sample_collection / "collection").glob("*.jpg"))]


@pytest.fixture()
def fresh_cache(tmp_path, monkeypatch):
    """An empty export cache and no export kept in memory."""
    monkeypatch.setenv("MUSEUM_SEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(engines, "_sessions", {})
    monkeypatch.setattr(engines, "_said", set())
    return tmp_path / "cache" / "onnx"


@pytest.mark.parametrize("config", [
    BackboneConfig(size=160),
    BackboneConfig(size=160, scales=(1.0, 0.707)),
    BackboneConfig(head="logits"),
    BackboneConfig(name="efficientnet_lite0", size=160),  # TF "same" padding, traced per input size
    BackboneConfig(name="efficientnet_lite0", head="mac", size=160),
], ids=["mobilenet-gem", "mobilenet-gem-2-scales", "mobilenet-logits", "lite0-gem", "lite0-mac"])
def test_engines_give_the_same_descriptors(config, sample_images):
    onnx = build_extractor(config, engine="onnx")
    torch_ = build_extractor(config, engine="torch")
    assert isinstance(onnx, OnnxExtractor) and isinstance(torch_, Extractor)
    assert onnx.meta == torch_.meta  # an index built with one is queried with the other
    a, b = onnx.embed_images(sample_images), torch_.embed_images(sample_images)
    cos = np.sum(a * b, axis=1)
    assert cos.min() >= 0.9999, cos.min()
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("config", [BackboneConfig(size=160), BackboneConfig(name="efficientnet_lite0", size=160)],
                         ids=["mobilenet-gem", "lite0-gem"])
def test_half_weight_export_is_half_the_size_and_agrees_with_torch(config, sample_images, tmp_path):
    """The frozen build bundles exports with float16 weights (engines.half_weights): half the bytes, the
    same descriptors as torch to a cosine >= 0.9999 on the sample photos, and loadable from a folder."""
    import onnx

    meta, full = engines.export(config, download=False)
    _, half = engines.export(config, download=False, half=True)
    assert len(half) < 0.55 * len(full)
    types = {i.data_type for i in onnx.load_from_string(half).graph.initializer if len(i.dims) and i.dims[0] >= 32}
    assert onnx.TensorProto.FLOAT16 in types
    torch_ = build_extractor(config, engine="torch")
    out = tmp_path / "onnx"
    path = engines.write_export(out, meta, half, weights="float16", compress=True)  # as the build bundles it
    assert path.name.endswith(".onnx.xz") and engines.export_file(out, meta) == path
    assert path.stat().st_size < 0.95 * len(half)
    assert engines.export_info(out, meta)["weights"] == "float16"
    assert engines.read_export(out, meta) == half
    loaded = OnnxExtractor(meta, engines.read_export(out, meta), out)
    a, b = loaded.embed_images(sample_images), torch_.embed_images(sample_images)
    cos = np.sum(a * b, axis=1)
    assert 0.9999 <= cos.min() < 1.0 - 1e-9, cos.min()  # rounded weights: close to torch, not bit-identical

    # a damaged compressed export is refused like a damaged plain one
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert engines.read_export(out, meta) is None


def test_export_is_cached_checked_and_rebuilt_when_damaged(fresh_cache, sample_images, monkeypatch, caplog):
    config = BackboneConfig(size=128)
    first = build_extractor(config, engine="onnx")
    (model,) = fresh_cache.glob("*.onnx")
    side = json.loads(model.with_suffix(".json").read_text())
    assert side["meta"] == first.meta.to_dict() and len(side["sha256"]) == 64
    expected = first.embed_images(sample_images[:3])

    # a new process (empty memory) loads the export without exporting again
    monkeypatch.setattr(engines, "_sessions", {})
    real_export = engines.export_apart  # the export runs in a child process
    monkeypatch.setattr(engines, "export_apart", lambda *a, **k: pytest.fail("exported again"))
    again = build_extractor(config, engine="onnx")
    np.testing.assert_allclose(again.embed_images(sample_images[:3]), expected, atol=1e-6)

    # a damaged export is never trusted: it is exported again, and the results stay right
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    calls = []
    monkeypatch.setattr(engines, "export_apart", lambda *a, **k: calls.append(1) or real_export(*a, **k))
    monkeypatch.setattr(engines, "_sessions", {})
    with caplog.at_level(logging.WARNING):
        rebuilt = build_extractor(config, engine="onnx")
    assert calls == [1] and "damaged" in caplog.text
    np.testing.assert_allclose(rebuilt.embed_images(sample_images[:3]), expected, atol=1e-5)
    assert json.loads(model.with_suffix(".json").read_text())["sha256"] == side["sha256"]  # same export again
    assert not list(fresh_cache.glob("*.tmp"))


def test_falls_back_to_torch_and_says_so_once(fresh_cache, monkeypatch, caplog):
    with caplog.at_level(logging.WARNING):
        ext = build_extractor(BackboneConfig(head="rmac", size=128), engine="onnx")
        build_extractor(BackboneConfig(head="rmac", size=128), engine="onnx")
    assert isinstance(ext, Extractor)
    assert caplog.text.count("R-MAC") == 1 and "using torch" in caplog.text

    caplog.clear()
    monkeypatch.setattr(engines, "onnx_available", lambda: False)
    with caplog.at_level(logging.WARNING):
        assert isinstance(build_extractor(BackboneConfig(size=96), engine="onnx"), Extractor)
    assert "onnxruntime is not installed" in caplog.text

    caplog.clear()
    monkeypatch.setattr(engines, "onnx_available", lambda: True)

    def broken(*_a, **_k):
        raise RuntimeError("Exporting the operator 'aten::magic' to ONNX opset version 17 is not supported")

    monkeypatch.setattr(engines, "export_apart", broken)
    with caplog.at_level(logging.WARNING):
        assert isinstance(build_extractor(BackboneConfig(size=112), engine="onnx"), Extractor)
    assert "aten::magic" in caplog.text and not list(fresh_cache.glob("*.onnx"))


def test_engine_choice(monkeypatch):
    """The engine is a setting, not a process-wide switch: None or "auto" is the default
    ($MUSEUM_SEARCH_ENGINE, else ONNX Runtime where it is installed), anything else is checked."""
    from museum_search.core.answer._pipeline import QuerySettings
    from museum_search.core.errors import MuseumSearchError

    monkeypatch.setenv("MUSEUM_SEARCH_ENGINE", "torch")
    assert engines.default() == engines.resolve(None) == engines.resolve("auto") == "torch"
    monkeypatch.delenv("MUSEUM_SEARCH_ENGINE")
    assert engines.default() == engines.resolve(None) == "onnx"  # installed here: the default
    assert engines.resolve("torch") == "torch"
    assert QuerySettings(engine="auto") == QuerySettings() and QuerySettings(engine="Torch").engine == "torch"
    with pytest.raises(MuseumSearchError, match="unknown inference engine"):
        engines.resolve("tensorflow")
    with pytest.raises(MuseumSearchError, match="unknown inference engine"):
        QuerySettings(engine="tensorflow")
    assert not hasattr(engines, "set_engine") and not hasattr(engines, "_engine")


def test_pipeline_and_jobs_run_on_the_engine_of_their_settings(sample_index, collection, monkeypatch):
    """A pipeline describes with its settings' engine and says which one ran; a build takes its engine
    as an argument (an unknown one is refused before any work)."""
    from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings
    from museum_search.core.errors import MuseumSearchError
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    monkeypatch.delenv("MUSEUM_SEARCH_ENGINE", raising=False)
    torch_pipe = QueryPipeline(sample_index, QuerySettings(engine="torch"))
    assert torch_pipe.extractor.engine == torch_pipe.engine == "torch"
    assert QueryPipeline(sample_index).engine == "onnx"  # the default
    onnx = run(build_index(collection, None, verification=False)).index
    torch_ = run(build_index(collection, None, verification=False, engine="torch")).index
    assert onnx.meta == torch_.meta
    np.testing.assert_allclose(np.asarray(onnx.descriptors), np.asarray(torch_.descriptors), atol=1e-4)
    with pytest.raises(MuseumSearchError, match="unknown inference engine"):
        run(build_index(collection, None, verification=False, engine="tensorflow"))


def test_index_built_with_one_engine_is_queried_with_the_other(collection, tmp_path):
    from museum_search.core.answer._pipeline import QueryPipeline, QuerySettings, load_query
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    index = run(build_index(collection, tmp_path / "index", verification=False)).index  # the default: onnx
    query = load_query(sorted(collection.glob("*.jpg"))[0])
    answers = {}
    for engine in ("onnx", "torch"):
        ext = build_extractor(index.meta.config(), engine=engine)
        (answers[engine],) = QueryPipeline(index, QuerySettings(verify=False), extractor=ext).answer([query])
    assert [r.path for r in answers["onnx"].results] == [r.path for r in answers["torch"].results]
    np.testing.assert_allclose([r.cosine for r in answers["onnx"].results],
                               [r.cosine for r in answers["torch"].results], atol=1e-4)


def test_queries_need_no_torch_once_exported(sample_index, sample_collection):
    """What the frozen kiosk does: load an index and answer a photo with torch not importable."""
    build_extractor(sample_index.meta.config(), engine="onnx")  # the export exists (the session's cache)
    query = sample_collection / "queries" / "q05.jpg"
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "torchvision", "efficientnet_lite_pytorch"):
                    raise ImportError("no torch in this build: " + name)
        sys.meta_path.insert(0, NoTorch())
        from museum_search.core.index._store import Index
        from museum_search.core.answer._pipeline import QueryPipeline, load_query
        pipe = QueryPipeline(Index.load({str(sample_index.path)!r}))
        (a,) = pipe.answer([load_query({str(query)!r})])
        print(type(pipe.extractor).__name__, a.top.instance, a.in_collection, "torch" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["OnnxExtractor", "turbulent_night", "True", "False"]


EXPORT_APART = r"""
import json, sys
from museum_search.core.inference._engines import build_extractor
from museum_search.core.inference._backbones import BackboneConfig
from museum_search.core.images import load_image
ext = build_extractor(BackboneConfig(size=96), engine="onnx")
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) // 1024
d = ext.embed_images([load_image(sys.argv[1])])
print(json.dumps({"kind": type(ext).__name__, "torch": "torch" in sys.modules, "hwm": hwm, "desc": d[0].tolist()}))
"""


def test_the_one_time_export_runs_in_a_child_process(tmp_path):
    """Issue 35: a first start exported the network inside the app, whose peak memory then stayed
    at 1.27 GB (torch, the model, the trace). The export runs in a child process now: the process
    that asked for it never imports torch, and gets the same descriptors as torch's own."""
    photo = sorted((Path(__file__).resolve().parents[1] / "resources" / "sample" / "queries").glob("*.jpg"))[0]
    env = {**os.environ, "MUSEUM_SEARCH_CACHE": str(tmp_path / "cache")}
    env.pop("MUSEUM_SEARCH_ONNX_DIR", None)
    out = subprocess.run([sys.executable, "-c", EXPORT_APART, str(photo)], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
    assert line is not None, out.stderr[-3000:]
    got = json.loads(line)
    assert got["kind"] == "OnnxExtractor" and got["torch"] is False
    assert list((tmp_path / "cache" / "onnx").glob("*.onnx"))  # kept for the next start
    torch_ext = build_extractor(BackboneConfig(size=96), engine="torch")
    np.testing.assert_allclose(np.array(got["desc"]), torch_ext.embed_images([load_image(photo)])[0], atol=1e-4)


def test_a_first_use_says_it_happens_once(fresh_cache):
    """Issue 35: the first start said "Loading mobilenet_v2…" for about 9 s without saying why; the
    step that exports the network says it is done only the first time, and later loads do not."""
    config = BackboneConfig(size=80)
    if not engines.onnx_available():
        pytest.skip("needs ONNX Runtime")
    assert engines.first_use(config, "onnx") and "only the first time" in engines.loading_stage(config, "onnx")
    assert not engines.first_use(config, "torch") and engines.loading_stage(config, "torch") == "loading mobilenet_v2"
    build_extractor(config, engine="onnx")
    assert not engines.first_use(config, "onnx") and engines.loading_stage(config, "onnx") == "loading mobilenet_v2"
