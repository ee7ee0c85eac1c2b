"""The Collection tab and the thumbnail browser, driven offscreen on a small real collection."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLE

_HAS_SAMPLE = (SAMPLE / "catalogue.csv").is_file() and (SAMPLE / "collection").is_dir()
pytestmark = [pytest.mark.gui] + ([] if _HAS_SAMPLE else [pytest.mark.data])

N_IMAGES = 12
SIZE = 128  # small images: the tests are about the GUI, not the descriptors


def _copy_subset(catalogue: Path, image_dirs: list[Path], dest: Path, n: int) -> Path:
    """Copy the first ``n`` catalogued images to ``dest/collection`` with a filtered
    ``dest/catalogue.csv`` (found by the auto rule next to the collection)."""
    with open(catalogue, encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows = list(reader)
    file_col = next(h for h in header if h.strip().lower() in ("file", "path", "filename"))
    coll = dest / "collection"
    coll.mkdir(parents=True)
    kept = []
    for row in rows:
        for d in image_dirs:
            src = d / row[file_col]
            if src.is_file():
                shutil.copy2(src, coll / src.name)
                kept.append({**row, file_col: src.name})
                break
        if len(kept) == n:
            break
    assert len(kept) == n, f"only {len(kept)} catalogued images found in {image_dirs}"
    with open(dest / "catalogue.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(kept)
    return coll


@pytest.fixture(scope="module")
def small_collection(tmp_path_factory, request) -> Path:
    """~12 catalogued real photos: from the bundled sample if present, else from ../shared/data."""
    dest = tmp_path_factory.mktemp("small-collection")
    if _HAS_SAMPLE:
        return _copy_subset(SAMPLE / "catalogue.csv", [SAMPLE, SAMPLE / "collection"], dest, N_IMAGES)
    shared = request.getfixturevalue("shared_data") / "paintings"
    return _copy_subset(shared / "catalogue.csv", [shared, shared / "references"], dest, N_IMAGES)


@pytest.fixture
def tab(qtbot):
    from museum_search.gui import workers
    from museum_search.gui.collection_tab import CollectionTab
    from museum_search.gui.state import AppState

    state = AppState()
    widget = CollectionTab(state)
    qtbot.addWidget(widget)
    widget.resize(1280, 800)
    widget.show()
    qtbot.waitExposed(widget)
    yield widget
    widget.shutdown()
    assert workers.wait_all(60000)
    qtbot.wait(10)  # deliver the last finished signals
    assert not widget.running


def _n_instances(collection: Path) -> int:
    with open(collection.parent / "catalogue.csv", encoding="utf-8", newline="") as f:
        return len({row["instance"] for row in csv.DictReader(f)})


def _build(tab, qtbot, timeout=180_000):
    with qtbot.waitSignal(tab.job_done, timeout=timeout) as blocker:
        qtbot.mouseClick(tab.build_button, _left())
    return blocker.args[0]


def _left():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


def _error_dialogs():
    from PySide6.QtWidgets import QApplication, QMessageBox

    return [w for w in QApplication.topLevelWidgets()
            if isinstance(w, QMessageBox) and w.objectName() == "errorDialog" and w.isVisible()]


def test_build_progress_browser_filter_thumbnails(tab, qtbot, small_collection, tmp_path):
    from museum_search.core.index import Index
    from museum_search.gui.widgets.thumbnails import THUMB_ROLE, ThumbnailCache

    tab.set_collection(small_collection)
    assert tab.catalogue_edit.text() == str(small_collection.parent / "catalogue.csv")  # auto-filled
    qtbot.waitUntil(lambda: tab.detected_label.text().startswith("Detected:"), timeout=30_000)
    assert f"{N_IMAGES} references of {_n_instances(small_collection)} instances" in tab.detected_label.text()
    assert "Catalogue" in tab.detected_label.text()
    assert not tab.update_button.isEnabled()  # no index there yet

    out = tmp_path / "index"
    tab.index_edit.setText(str(out))
    tab.size_spin.setValue(SIZE)
    values: list[int] = []
    tab.progress_bar.valueChanged.connect(values.append)
    assert _build(tab, qtbot) is True

    # progress went through the bar up to the total
    assert tab.progress_bar.maximum() == N_IMAGES
    assert tab.progress_bar.value() == N_IMAGES
    assert 0 < min(v for v in values if v > 0) < N_IMAGES and N_IMAGES in values
    # saved, opened, reported
    index = tab.state.index
    assert index is not None and len(index) == N_IMAGES
    assert Index.load(out).meta.size == SIZE
    assert "Index built" in tab.status_label.text() and f"{N_IMAGES} references" in tab.status_label.text()
    assert tab.update_button.isEnabled() and not tab.cancel_button.isEnabled()
    assert tab.skipped_tree.topLevelItemCount() == 0

    # the browser shows the index; the filter narrows it (instance, then metadata, any case)
    browser = tab.browser
    assert browser.visible_count() == N_IMAGES
    assert browser.count_label.text() == f"{N_IMAGES} of {N_IMAGES} references"
    target = index.items[3].instance
    qtbot.keyClicks(browser.filter_edit, target)
    assert browser.visible_count() == sum(target.lower() in it.instance.lower() or target.lower() in it.path.lower()
                                          for it in index.items) >= 1
    assert browser.count_label.text() == f"{browser.visible_count()} of {N_IMAGES} references"
    values_meta = [v for it in index.items for v in it.metadata.values() if v.strip()]
    if values_meta:
        word = values_meta[0].split()[0].upper()
        browser.filter_edit.setText(word)
        expected = sum(
            any(word.lower() in t.lower() for t in (it.instance, it.path, *it.metadata.values()))
            for it in index.items
        )
        assert 1 <= browser.visible_count() == expected
    browser.filter_edit.clear()
    assert browser.visible_count() == N_IMAGES

    # thumbnails of the visible items arrive through the cache's `ready` signal
    cache = ThumbnailCache.instance()
    first = str(index.root / index.items[0].path)
    qtbot.waitUntil(lambda: cache.peek(first, browser.thumb_size) is not None, timeout=30_000)
    assert cache.failure(first, browser.thumb_size) is None
    pm = browser.proxy.index(0, 0).data(THUMB_ROLE)
    assert pm is not None and not pm.isNull()
    assert max(pm.width(), pm.height()) <= browser.thumb_size
    assert max(pm.width(), pm.height()) >= browser.thumb_size // 2


def test_cancel_keeps_previous_index(tab, qtbot, small_collection, tmp_path):
    from museum_search.core.backbones import BackboneConfig
    from museum_search.core.extract import run
    from museum_search.core.index import Index, LabellingSpec, build_index

    out = tmp_path / "index"
    run(build_index(small_collection, out, BackboneConfig(size=SIZE),
                    LabellingSpec("catalogue", str(small_collection.parent / "catalogue.csv"))))
    before = Index.load(out)
    manifest = (out / "manifest.json").read_bytes()
    files = sorted(p.name for p in out.iterdir())

    # opening an index (as from the menu) shows it and fills the form
    tab.state.set_index(before)
    assert tab.collection_edit.text() == str(before.root)
    assert tab.index_edit.text() == str(out)
    assert tab.rule_combo.currentData() == "catalogue"
    assert tab.backbone_combo.currentData() == before.meta.name
    assert tab.size_spin.value() == SIZE
    assert tab.browser.visible_count() == N_IMAGES
    assert tab.update_button.isEnabled()

    # rebuild with another size, cancel after the first file batch
    tab.size_spin.setValue(SIZE + 32)
    tab.batch_size = 2  # several progress steps, so the cancel lands well before the end
    cancelled_at: list[int] = []

    def on_value(v: int) -> None:
        if v > 0 and not cancelled_at:
            cancelled_at.append(v)
            assert tab.cancel_button.isEnabled()
            qtbot.mouseClick(tab.cancel_button, _left())

    tab.progress_bar.valueChanged.connect(on_value)
    assert _build(tab, qtbot) is False
    assert cancelled_at and cancelled_at[0] < N_IMAGES
    assert tab.status_label.text() == "Cancelled — the previous index is unchanged"
    assert (out / "manifest.json").read_bytes() == manifest
    assert sorted(p.name for p in out.iterdir()) == files
    after = Index.load(out)
    assert after.meta == before.meta and after.meta.size == SIZE and len(after) == N_IMAGES
    assert tab.state.index is before
    assert tab.build_button.isEnabled() and not tab.cancel_button.isEnabled()

    # Update on an unchanged collection: nothing to describe, everything kept, new index opened
    assert tab.update_button.isEnabled()
    with qtbot.waitSignal(tab.job_done, timeout=60_000) as blocker:
        qtbot.mouseClick(tab.update_button, _left())
    assert blocker.args == [True]
    assert "Index updated" in tab.status_label.text() and f"{N_IMAGES} unchanged" in tab.status_label.text()
    assert tab.state.index is not before and len(tab.state.index) == N_IMAGES
    assert tab.state.index.meta == before.meta


def test_missing_weights_shows_error_dialog(tab, qtbot, small_collection, tmp_path, monkeypatch, capfd):
    import torch

    from museum_search.core import backbones
    from museum_search.core.errors import WeightsUnavailableError

    real = backbones.resolve_weights
    spec = backbones.REGISTRY["resnet152"]
    url = backbones._torchvision_weights(spec).url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name

    def offline(spec, weights_file=None, download=True):
        if spec.name == "resnet152" and cached.is_file():  # weights on this machine: pretend not
            raise WeightsUnavailableError(f"no weights for {spec.name} on this machine (test)")
        return real(spec, weights_file, download=False)  # never download in a test

    monkeypatch.setattr(backbones, "resolve_weights", offline)
    tab.set_collection(small_collection)
    tab._set_combo(tab.backbone_combo, "resnet152")
    assert tab.backbone_combo.currentData() == "resnet152"
    assert "ResNet-152" in tab.backbone_combo.toolTip()
    out = tmp_path / "index"
    tab.index_edit.setText(str(out))
    assert _build(tab, qtbot) is False

    qtbot.waitUntil(lambda: len(_error_dialogs()) == 1, timeout=10_000)
    box = _error_dialogs()[0]
    assert "resnet152" in box.text() and "weights" in box.text()
    assert "Traceback" not in box.text()
    assert "Cannot build the index" in tab.status_label.text()
    assert not (out / "manifest.json").exists()
    assert tab.build_button.isEnabled() and not tab.cancel_button.isEnabled()
    box.close()
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err and "Traceback" not in captured.out


def test_browser_loads_only_visible_items_and_marks_broken_files(qtbot, tmp_path, monkeypatch):
    from museum_search.core.backbones import BackboneMeta
    from museum_search.core.index import Index, Item
    from museum_search.gui.widgets.thumbnails import (
        THUMB_ROLE,
        ThumbnailBrowser,
        ThumbnailCache,
    )

    n = 3000
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    items = [Item("bad.jpg" if i == 0 else f"missing-{i}.jpg", 0, 0.0, f"obj{i:04d}",
                  {"title": f"Work {i}", "artist": "Munch" if i % 10 == 0 else "Other"}) for i in range(n)]
    meta = BackboneMeta("x", "w", "gem", "longest_side", 64, (1.0,), 3.0, 4, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    index = Index(tmp_path, meta, items, np.zeros((n, 4), np.float32))

    cache = ThumbnailCache.instance()
    requested: set[str] = set()
    real_get = cache.get

    def spy(path, size):
        requested.add(str(path))
        return real_get(path, size)

    monkeypatch.setattr(cache, "get", spy)
    browser = ThumbnailBrowser(thumb_size=96)
    qtbot.addWidget(browser)
    browser.resize(500, 400)
    browser.set_index(index)
    browser.show()
    qtbot.waitExposed(browser)
    qtbot.waitUntil(lambda: len(requested) > 0, timeout=5000)
    first = str(tmp_path / "bad.jpg")
    qtbot.waitUntil(lambda: cache.failure(first, 96) is not None, timeout=10_000)
    qtbot.wait(50)
    # only what is on screen was asked for
    assert 0 < len(requested) < 100
    assert browser.count_label.text() == "3,000 of 3,000 references"
    # a file that cannot be decoded gets the drawn placeholder, and is not retried
    assert "JPEG" in cache.failure(first, 96) or "corrupt" in cache.failure(first, 96)
    broken_key = cache.broken(96).cacheKey()
    assert real_get(first, 96).cacheKey() == broken_key
    assert cache.pending() == 0 or first not in {k[0] for k in list(cache._queue)}
    assert browser.proxy.index(0, 0).data(THUMB_ROLE).cacheKey() == broken_key
    assert "Cannot be shown" in browser.proxy.index(0, 0).data(0x03)  # ToolTipRole
    # filtering by metadata is case-insensitive and all words must match
    browser.set_filter("MUNCH work")
    assert browser.visible_count() == n // 10
    browser.set_filter("munch OBJ012")
    assert browser.visible_count() == 1  # obj0120 only: obj0121..obj0129 are not by Munch
    browser.set_filter("")
    assert browser.visible_count() == n
    cache.cancel_pending()
    assert cache.wait(10_000)


def test_numpy_to_qimage_copies_pixels():
    from museum_search.gui.widgets.thumbnails import numpy_to_qimage

    rgb = np.zeros((5, 7, 3), np.uint8)
    rgb[1, 2] = (10, 200, 30)
    img = numpy_to_qimage(rgb[:, :, :])
    rgb[:] = 255  # the image must not share this memory
    assert (img.width(), img.height()) == (7, 5)
    c = img.pixelColor(2, 1)
    assert (c.red(), c.green(), c.blue()) == (10, 200, 30)
    grey = numpy_to_qimage(np.full((3, 4), 77, np.uint8))
    assert grey.pixelColor(0, 0).red() == 77
    with pytest.raises(ValueError):
        numpy_to_qimage(np.zeros((3, 4, 3), np.float32))
