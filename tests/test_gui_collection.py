"""The Collection tab and the thumbnail browser, driven offscreen on a small real collection."""

from __future__ import annotations

import csv
import re
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


def _words(text: str) -> list[str]:
    """The words of ``text`` as the catalogue's full-text index sees them: letters and digits (``_``
    and punctuation separate), lower case, accents removed."""
    import unicodedata

    flat = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return re.findall(r"[^\W_]+", flat.lower())


def _prefix_matches(items, text: str) -> set[int]:
    """Rows of ``items`` the filter must keep, worked out here from the items: every typed word (a
    whitespace-separated token; ``a_b`` is the phrase ``a b``) runs in one field (instance, file or
    a catalogue field), its last word as a prefix; ``field:word`` only in that field."""
    rows = set()
    for row, it in enumerate(items):
        fields = {"instance": it.instance, "path": it.path, **{k.lower(): v for k, v in it.metadata.items()}}
        ok = True
        for token in text.split():
            name, _, rest = token.partition(":")
            where = [fields[name.lower()]] if rest and name.lower() in fields else list(fields.values())
            want = _words(rest if rest and name.lower() in fields else token)
            if not want:
                continue
            ok = any(
                words[i:i + len(want) - 1] == want[:-1] and i + len(want) - 1 < len(words)
                and words[i + len(want) - 1].startswith(want[-1])
                for words in map(_words, where) for i in range(len(words)))
            if not ok:
                break
        if ok:
            rows.add(row)
    return rows


def _shown_rows(browser) -> set[int]:
    """The index rows the browser's view shows (through the view's model, as painted)."""
    from museum_search.gui.widgets.thumbnails import ROW_ROLE

    model = browser.view.model()
    return {model.index(r, 0).data(ROW_ROLE) for r in range(model.rowCount())}


def test_build_progress_browser_filter_thumbnails(tab, qtbot, small_collection, tmp_path):
    from museum_search.core.index._store import Index
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
    tab.progress.bar.valueChanged.connect(values.append)
    assert _build(tab, qtbot) is True

    # progress went through the bar up to the total (the describing stage, then any later stage)
    assert tab.progress.bar.value() == tab.progress.bar.maximum() >= N_IMAGES
    assert tab.progress.item_label.text().startswith(f"{N_IMAGES} / {N_IMAGES} described in")
    assert 0 < min(v for v in values if v > 0) < N_IMAGES and N_IMAGES in values
    # saved, opened, reported
    index = tab.state.index
    assert index is not None and len(index) == N_IMAGES
    assert Index.load(out).meta.size == SIZE
    assert "Index built" in tab.progress.status_label.text() and f"{N_IMAGES} references" in tab.progress.status_label.text()
    assert tab.update_button.isEnabled() and not tab.cancel_button.isEnabled()
    assert tab.skipped_tree.topLevelItemCount() == 0

    # the browser shows the index; the filter narrows it (instance, then metadata, any case): every
    # word typed begins a word of the reference
    browser = tab.browser
    assert browser.visible_count() == N_IMAGES
    assert browser.count_label.text() == f"{N_IMAGES} of {N_IMAGES} references"
    target = index.items[3].instance
    qtbot.keyClicks(browser.filter_edit, target)
    assert _shown_rows(browser) == _prefix_matches(index.items, target) and 3 in _shown_rows(browser)
    assert browser.count_label.text() == f"{browser.visible_count()} of {N_IMAGES} references"
    values_meta = [v for it in index.items for v in it.metadata.values() if v.strip()]
    if values_meta:
        word = values_meta[0].split()[0].upper()
        browser.filter_edit.setText(word)
        assert 1 <= len(_shown_rows(browser)) and _shown_rows(browser) == _prefix_matches(index.items, word)
        # the start of a word is enough; the middle of one is not
        browser.set_filter(word[:3].lower())
        assert _shown_rows(browser) == _prefix_matches(index.items, word[:3]) >= _prefix_matches(index.items, word)
    inner = target[1:]  # a substring of the instance that begins none of its words
    browser.set_filter(inner)
    assert _shown_rows(browser) == _prefix_matches(index.items, inner)
    if _HAS_SAMPLE:  # e.g. "alley_at_dusk" does not find "valley_at_dusk" (a substring search did)
        assert 3 not in _shown_rows(browser)
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
    from museum_search.core.index._store import Index, LabellingSpec
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

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

    tab.progress.bar.valueChanged.connect(on_value)
    assert _build(tab, qtbot) is False
    assert cancelled_at and cancelled_at[0] < N_IMAGES
    assert tab.progress.status_label.text() == "Cancelled — the previous index is unchanged"
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
    assert "Index updated" in tab.progress.status_label.text() and f"{N_IMAGES} unchanged" in tab.progress.status_label.text()
    assert tab.state.index is not before and len(tab.state.index) == N_IMAGES
    assert tab.state.index.meta == before.meta


def test_missing_weights_shows_error_dialog(tab, qtbot, small_collection, tmp_path, monkeypatch, capfd):
    import torch

    from museum_search.core.errors import WeightsUnavailableError
    from museum_search.core.inference import _backbones as backbones

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
    assert "Cannot build the index" in tab.progress.status_label.text()
    assert not (out / "manifest.json").exists()
    assert tab.build_button.isEnabled() and not tab.cancel_button.isEnabled()
    box.close()
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err and "Traceback" not in captured.out


def test_browser_loads_only_visible_items_and_marks_broken_files(qtbot, tmp_path, monkeypatch):
    from museum_search.core.index._catalogue import Item
    from museum_search.core.index._store import Index
    from museum_search.core.inference._backbones import BackboneMeta
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


# ---- where a new index goes ("never lose a user's file") -----------------------------------------

TINY = 64  # backbone image size for the index-folder tests: they are about files, not descriptors


def _museum(tmp_path: Path, name: str, n: int = 3) -> Path:
    """``tmp_path/name/collection`` with ``n`` catalogued sample photos (catalogue.csv beside it).
    Every such collection is called "collection": the folder name alone must not decide where an
    index goes."""
    return _copy_subset(SAMPLE / "catalogue.csv", [SAMPLE, SAMPLE / "collection"], tmp_path / name, n)


def _core_index(collection: Path, out: Path):
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.inference._backbones import BackboneConfig
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive as run

    run(build_index(collection, out, BackboneConfig(size=TINY),
                    LabellingSpec("catalogue", str(collection.parent / "catalogue.csv"))))
    return out


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else b"<dir>")
            for p in sorted(folder.rglob("*"))}


def _dialogs(name: str):
    from PySide6.QtWidgets import QApplication, QMessageBox

    return [w for w in QApplication.topLevelWidgets()
            if isinstance(w, QMessageBox) and w.objectName() == name and w.isVisible()]


def _close_error_dialogs() -> None:
    for box in _error_dialogs():
        box.close()


def test_new_collection_gets_its_own_folder_not_the_open_index(tab, qtbot, tmp_path, monkeypatch):
    """The bug: with the index of A open, choosing B and building replaced A's index."""
    from PySide6.QtWidgets import QFileDialog

    from museum_search.core.index._store import Index, default_index_folder

    a, b = _museum(tmp_path, "museum-a"), _museum(tmp_path, "museum-b", 4)
    a_index = _core_index(a, tmp_path / "a-index")
    a_files = _snapshot(a_index)
    tab.state.set_index(Index.load(a_index))
    assert tab.index_edit.text() == str(a_index)

    # File → Open collection folder… / Browse…: the index field follows the new collection
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(b))
    qtbot.mouseClick(tab.browse_button, _left())
    assert tab.collection_edit.text() == str(b)
    expected = default_index_folder(b)
    assert expected == b.parent / "collection-index"
    assert tab.index_edit.text() == str(expected) != str(a_index)
    assert not tab.update_button.isEnabled()
    assert tab.index_hint.text() == "A new folder will be created for the index."

    tab.size_spin.setValue(TINY)
    assert _build(tab, qtbot) is True
    assert not _dialogs("replaceIndexDialog") and not _error_dialogs()
    built = Index.load(expected)
    assert built.root == b.resolve() and len(built) == 4
    assert tab.state.index.path == expected
    assert _snapshot(a_index) == a_files  # A's index: same files, same manifest bytes
    assert Index.load(a_index).root == a.resolve()

    # choosing A again: its existing index is offered (same collection), not a new folder
    tab.set_collection(a)
    assert tab.index_edit.text() == str(default_index_folder(a)) == str(a.parent / "collection-index")
    tab.set_collection(b)
    assert tab.index_edit.text() == str(expected)
    assert "this collection" in tab.index_hint.text() and tab.update_button.isEnabled()


def test_building_into_another_collections_index_asks_first(tab, qtbot, tmp_path):
    from museum_search.core.index._store import Index, default_index_folder

    a, b = _museum(tmp_path, "museum-a"), _museum(tmp_path, "museum-b")
    a_index = _core_index(a, tmp_path / "a-index")
    a_files = _snapshot(a_index)
    tab.state.set_index(Index.load(a_index))
    tab.set_collection(b)
    tab.size_spin.setValue(TINY)
    # the technician types the open index's folder back in by hand
    tab.index_edit.clear()
    qtbot.keyClicks(tab.index_edit, str(a_index))
    qtbot.waitUntil(lambda: "another collection" in tab.index_hint.text(), timeout=5000)
    assert str(a.resolve()) in tab.index_hint.text()

    # Build asks; Cancel (and Esc) writes nothing
    qtbot.mouseClick(tab.build_button, _left())
    qtbot.waitUntil(lambda: len(_dialogs("replaceIndexDialog")) == 1, timeout=5000)
    box = _dialogs("replaceIndexDialog")[0]
    assert f"Replace the index of the collection {a.resolve()}?" == box.text()
    assert str(default_index_folder(b)) in box.informativeText()
    assert box.defaultButton() is box.new_folder_button  # the default never replaces anything
    assert not tab.running
    box.reject()
    qtbot.waitUntil(lambda: not _dialogs("replaceIndexDialog"), timeout=5000)
    assert not tab.running and "Nothing was built" in tab.progress.status_label.text()
    assert _snapshot(a_index) == a_files

    # the default answer: build in B's own new folder
    qtbot.mouseClick(tab.build_button, _left())
    qtbot.waitUntil(lambda: len(_dialogs("replaceIndexDialog")) == 1, timeout=5000)
    with qtbot.waitSignal(tab.job_done, timeout=90_000) as blocker:
        qtbot.mouseClick(_dialogs("replaceIndexDialog")[0].new_folder_button, _left())
    assert blocker.args == [True]
    assert tab.state.index.path == default_index_folder(b) == b.parent / "collection-index"
    assert Index.load(default_index_folder(b)).root == b.resolve()
    assert _snapshot(a_index) == a_files

    # "Replace that index", chosen on purpose, does replace it
    tab.index_edit.setText(str(a_index))
    qtbot.mouseClick(tab.build_button, _left())
    qtbot.waitUntil(lambda: len(_dialogs("replaceIndexDialog")) == 1, timeout=5000)
    with qtbot.waitSignal(tab.job_done, timeout=90_000) as blocker:
        qtbot.mouseClick(_dialogs("replaceIndexDialog")[0].replace_button, _left())
    assert blocker.args == [True]
    assert Index.load(a_index).root == b.resolve()


def test_folder_that_is_not_an_index_is_refused_and_left_alone(tab, qtbot, tmp_path):
    b = _museum(tmp_path, "museum-b")
    docs = tmp_path / "Documents"
    (docs / "letters").mkdir(parents=True)
    (docs / "inventory.xlsx").write_bytes(b"PK\x03\x04 not really a spreadsheet")
    (docs / "letters" / "2019.txt").write_text("dear curator", encoding="utf-8")
    before = _snapshot(docs)
    coll_before = _snapshot(b)
    tab.set_collection(b)
    tab.size_spin.setValue(TINY)

    for folder, words in ((docs, "is not empty and is not a museum-search index"),
                          (b, "collection folder itself"),
                          (b.parent, "contains the collection")):
        tab.index_edit.setText(str(folder))
        qtbot.waitUntil(lambda words=words: words in tab.index_hint.text(), timeout=5000)  # said as soon as typed
        assert tab.index_hint.text().startswith("⚠")
        qtbot.mouseClick(tab.build_button, _left())
        qtbot.waitUntil(lambda: len(_error_dialogs()) == 1, timeout=5000)
        box = _error_dialogs()[0]
        assert words in box.text() and "Traceback" not in box.text()
        assert str(b.parent / "collection-index") in box.text()  # says what to do instead
        assert words in tab.progress.status_label.text()
        assert not tab.running and tab.build_button.isEnabled()
        box.close()
        qtbot.waitUntil(lambda: not _error_dialogs(), timeout=5000)
    assert _snapshot(docs) == before  # not a file added, changed or removed
    assert _snapshot(b) == coll_before
    assert not (b.parent / "collection-index").exists()

    # Choose…: picking the full "Documents" folder means "put it in there": a new folder inside
    qtbot.mouseClick(tab.index_button, _left())
    chooser = tab.index_chooser
    qtbot.waitUntil(chooser.isVisible, timeout=5000)
    chooser.selectFile(str(docs))
    chooser.accept()
    assert not chooser.isVisible()
    assert tab.index_edit.text() == str(docs / "collection-index")
    assert tab.index_hint.text() == "A new folder will be created for the index."
    assert _snapshot(docs) == before


def test_index_chooser_creates_a_new_folder_after_asking(tab, qtbot, tmp_path):
    """The chooser used to refuse a folder that did not exist yet ("Directory not found")."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QDialogButtonBox

    from museum_search.gui.collection_tab import FolderChooser

    b = _museum(tmp_path, "museum-b")
    tab.set_collection(b)
    suggested = b.parent / "collection-index"
    assert tab.index_edit.text() == str(suggested) and not suggested.exists()
    before = _snapshot(tmp_path)

    qtbot.mouseClick(tab.index_button, _left())
    chooser = tab.index_chooser
    assert isinstance(chooser, FolderChooser)
    qtbot.waitUntil(chooser.isVisible, timeout=5000)
    assert chooser.testOption(FolderChooser.Option.DontUseNativeDialog)
    assert chooser.directory().absolutePath() == str(b.parent)  # opened where the suggestion goes,
    assert chooser.name_edit.text() == "collection-index"  # with its name typed in
    choose = chooser.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Open)
    assert choose.isEnabled()  # Qt disables it for a folder that does not exist

    # another new folder, two levels deep, typed by hand; Enter asks first, Cancel makes nothing
    target = tmp_path / "Indexes 2026" / "museum b"
    chooser.name_edit.setFocus()
    chooser.name_edit.setText(str(target))  # pasted (typing would pop the path completer up)
    assert choose.isEnabled()
    qtbot.keyClick(chooser.name_edit, Qt.Key.Key_Return)
    box = chooser.confirm_box
    assert box is not None and box.isVisible() and box.objectName() == "createFolderDialog"
    assert str(target) in box.text() and str(target.parent) in box.informativeText()
    box.button(box.StandardButton.Cancel).click()
    assert not target.parent.exists() and chooser.isVisible()
    assert _snapshot(tmp_path) == before

    qtbot.keyClick(chooser.name_edit, Qt.Key.Key_Return)
    chooser.confirm_box.button(chooser.confirm_box.StandardButton.Yes).click()  # "Create"
    assert target.is_dir() and not any(target.iterdir())
    assert chooser.created == [target.parent, target]
    assert not chooser.isVisible()
    assert tab.index_edit.text() == str(target)
    assert tab.index_hint.text() == "Empty folder: the index will be saved in it."
    assert "New folder" in tab.progress.status_label.text()
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k not in before} == {"Indexes 2026": b"<dir>",
                                                                   "Indexes 2026/museum b": b"<dir>"}
    assert all(after[k] == v for k, v in before.items())  # nothing else touched

    # an existing folder is chosen as before, nothing asked
    qtbot.mouseClick(tab.index_button, _left())
    chooser = tab.index_chooser
    chooser.selectFile(str(target))
    chooser.accept()
    assert chooser.confirm_box is None and tab.index_edit.text() == str(target)


def test_double_click_on_a_thumbnail_opens_the_large_view(tab, qtbot, tmp_path):
    from PySide6.QtCore import Qt

    from museum_search.core.index._store import Index

    a = _museum(tmp_path, "museum-a")
    index = Index.load(_core_index(a, tmp_path / "a-index"))
    tab.state.set_index(index)
    view = tab.browser.view
    qtbot.waitUntil(lambda: tab.browser.visible_count() == len(index), timeout=5000)
    idx = tab.browser.proxy.index(1, 0)
    rect = view.visualRect(idx)
    assert rect.isValid()
    # a double-click as the window system sends it: press, release, then the double-click
    # (QTest's mouseDClick alone sends only the last one)
    qtbot.mouseClick(view.viewport(), _left(), pos=rect.center())
    assert tab.reference_dialog is None  # a single click selects, nothing more
    qtbot.mouseDClick(view.viewport(), _left(), pos=rect.center())
    dialog = tab.reference_dialog
    assert dialog is not None and dialog.isVisible() and dialog.objectName() == "referenceDialog"
    item = index.items[dialog.row]
    assert dialog.row == idx.data(Qt.ItemDataRole.UserRole + 3)  # the row that was double-clicked
    assert dialog.path == Path(index.root) / item.path
    assert item.instance in dialog.windowTitle()
    qtbot.waitUntil(dialog.photo.has_image, timeout=30_000)  # the photo, large (not the thumbnail)
    assert max(dialog.photo.image().width(), dialog.photo.image().height()) > tab.browser.thumb_size
    texts = [lab.text() for lab in dialog.findChildren(type(tab.progress.status_label))]
    assert item.instance in texts and str(dialog.path) in texts
    assert all(v in texts for v in item.metadata.values() if v)  # the catalogue entry
    dialog.close()
    qtbot.waitUntil(lambda: not dialog.is_busy(), timeout=30_000)

    # Enter on the current thumbnail does the same
    view.setFocus()
    view.setCurrentIndex(tab.browser.proxy.index(0, 0))
    qtbot.keyClick(view, Qt.Key.Key_Return)
    assert tab.reference_dialog is not dialog and tab.reference_dialog.isVisible()
    assert tab.reference_dialog.row == 0
    tab.reference_dialog.close()


LOCK_HOLDER = """
import sys
from museum_search.core.index._store import writer_lock
with writer_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()  # until the test closes our stdin
"""


def test_index_being_written_by_another_process_is_reported(tab, qtbot, tmp_path):
    """E.g. a scheduled ``museum-search update`` is writing B's index when the technician rebuilds it."""
    import subprocess
    import sys

    from museum_search.core.index._store import Index, default_index_folder

    b = _museum(tmp_path, "museum-b")
    out = _core_index(b, default_index_folder(b))
    files = _snapshot(out)
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        tab.set_collection(b)
        assert tab.index_edit.text() == str(out)  # B's own index: Build replaces it, no question
        tab.size_spin.setValue(TINY + 32)
        assert _build(tab, qtbot, timeout=60_000) is False
        qtbot.waitUntil(lambda: len(_error_dialogs()) == 1, timeout=10_000)
        box = _error_dialogs()[0]
        assert box.windowTitle() == "Cannot build the index"
        assert f"being written by process {holder.pid}" in box.text()
        assert "Traceback" not in box.text()
        assert "being written by process" in tab.progress.status_label.text()
        # back to idle
        assert not tab.running and tab.build_button.isEnabled() and not tab.cancel_button.isEnabled()
        assert tab.collection_edit.isEnabled() and tab.index_edit.isEnabled() and tab.update_button.isEnabled()
        assert tab.progress.item_label.text() == "" and tab.progress.bar.maximum() >= 1
        assert not _dialogs("replaceIndexDialog")
        box.close()
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert {k: v for k, v in _snapshot(out).items() if k != ".museum-search.lock"} == \
        {k: v for k, v in files.items() if k != ".museum-search.lock"}  # untouched by either

    # once the other writer is done, the same Build works
    assert _build(tab, qtbot) is True
    assert Index.load(out).meta.size == TINY + 32


def test_sample_index_of_an_old_format_is_rebuilt_in_place(tab, qtbot, tmp_path, monkeypatch):
    import json

    from museum_search.core import paths
    from museum_search.core.index._store import Index
    from museum_search.gui import collection_tab

    sample = _museum(tmp_path, "installed-sample").parent
    monkeypatch.setattr(paths, "sample_collection", lambda: sample)
    monkeypatch.setattr(paths, "data_dir", lambda: tmp_path / "user-data")
    monkeypatch.setattr(collection_tab, "DEFAULT_SIZE", TINY)
    out = collection_tab.sample_index_dir()
    assert out == tmp_path / "user-data" / "indexes" / "sample"

    # an index written by the previous version (format 1) of this same sample
    _core_index(sample / "collection", out)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    manifest["version"] = 1
    manifest.pop("manifest_sha256", None)
    (out / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")

    with qtbot.waitSignal(tab.job_done, timeout=90_000) as blocker:
        tab.open_sample_collection()
    assert blocker.args == [True]
    assert not _dialogs("replaceIndexDialog") and not _error_dialogs()
    rebuilt = Index.load(out)  # the current format, in the same per-user folder
    assert rebuilt.root == (sample / "collection").resolve() and rebuilt.meta.size == TINY
    assert tab.state.index.path == out
    assert sorted(p.name for p in out.parent.iterdir()) == ["sample"]
    assert sorted(p.name for p in sample.iterdir()) == ["catalogue.csv", "collection"]  # no index beside it

    # next start: opened as it is, nothing built
    tab.state.set_index(None)
    tab.open_sample_collection()
    assert not tab.running and tab.state.index is not None and tab.state.index.path == out
    assert tab.progress.status_label.text() == "Sample collection: 3 references."

    # a sample index from another installation (another root) is our own folder too: rebuilt, no question
    elsewhere = _museum(tmp_path, "old-install")
    out_files = _snapshot(out)
    import shutil

    shutil.rmtree(out)
    _core_index(elsewhere, out)
    assert Index.load(out).root == elsewhere.resolve()
    with qtbot.waitSignal(tab.job_done, timeout=90_000) as blocker:
        tab.open_sample_collection()
    assert blocker.args == [True] and not _dialogs("replaceIndexDialog")
    assert Index.load(out).root == (sample / "collection").resolve()
    assert set(_snapshot(out)) != set(out_files)  # a new generation


def test_progress_of_a_stage_outside_a_plan_says_the_time_left_is_the_steps(tab):
    """A record that no job plan numbered (``Progress.steps == 0``, e.g. a job run without
    core.progress.with_plan) names its stage and says in the tooltip that the time left is the step's."""
    from museum_search.core.jobs._indexing import BUILD_STAGES
    from museum_search.core.progress import Progress

    tab._job, tab._job_kind = object(), "build"  # as while a build runs
    texts = []
    totals = [287, 287, 287, 120][: len(BUILD_STAGES)]
    for stage, total in zip(BUILD_STAGES, totals):
        tab._on_progress(Progress(total // 2, total, None, [], 10.0, stage=stage))
        texts.append((tab.progress.item_label.text(), tab.progress.item_label.toolTip()))
    tab._job = None
    for (text, tip), stage, total in zip(texts, BUILD_STAGES, totals):
        assert text == f"{stage[:1].upper()}{stage[1:]}: {total // 2:,} / {total:,} · 0:10 left", text
        assert "Time left in this step: 0:10" in tip and "whole" not in tip


# ---- issue 23 (round two): the progress line, the skipped list, the status news, the artist ------


@pytest.fixture
def window_tab(qtbot):
    """The Collection tab as the app shows it at 1024×700: a tab of a main window with a status bar."""
    from PySide6.QtWidgets import QMainWindow, QTabWidget, QWidget

    from museum_search.gui import workers
    from museum_search.gui.collection_tab import CollectionTab
    from museum_search.gui.state import AppState

    state = AppState()
    window = QMainWindow()
    tabs = QTabWidget()
    tab = CollectionTab(state)
    tabs.addTab(tab, "Collection")
    tabs.addTab(QWidget(), "Search")
    window.setCentralWidget(tabs)
    window.statusBar().showMessage("")
    qtbot.addWidget(window)
    window.resize(1024, 700)
    window.show()
    qtbot.waitExposed(window)
    tab.tabs = tabs
    yield tab
    tab.shutdown()
    assert workers.wait_all(60000)
    qtbot.wait(10)
    assert not tab.running


def _simulated_build(root: Path, n: int = 287, views: int = 50):
    """The records a build of ``n`` photos yields (core.indexing's stage names), with the photos'
    long paths, at steady rates: describing 0.04 s a photo, local features 0.16, calibration 1 s a view."""
    from museum_search.core.index import _neighbours
    from museum_search.core.progress import Progress

    yield Progress(0, 0, stage="listing and labelling the images", expected={"calibrating": views})
    stages = [("describing", n, 0.04), ("local features", n, 0.16), (_neighbours.NEIGHBOURS_STAGE, n, 0.0004),
              ("calibrating", views, 1.0)]
    for stage, total, dt in stages:
        for i in range(1, total + 1, 7 if total > 100 else 1):
            current = str(root / "references" / "a folder with a long name" / f"bbdd_{i:05d}.jpg")
            yield Progress(i, total, current, [], elapsed=i * dt, stage=stage)


def test_build_progress_line_fits_at_1024x700_with_the_whole_builds_time_left(window_tab, tmp_path):
    """Issue 23, item 1: the line was cut in the middle, hiding the count and the time left, and the
    time left was the step's. Now every line fits the label, with the step, the count and the whole
    build's time left (core.progress.JobEta over core.indexing.build_plan); the file is in the tooltip."""
    from museum_search.core.jobs._indexing import build_plan
    from museum_search.core.progress import with_plan
    from museum_search.gui.collection_tab import format_duration, time_left_text

    tab = window_tab
    tab.collection_edit.setText(str(tmp_path))
    label = tab.progress.item_label
    assert label.isVisible() and label.width() < 460  # the narrow controls column of a 1024-px window
    tab._job, tab._job_kind = object(), "build"  # as while a build runs
    seen = []
    for p in with_plan(_simulated_build(tmp_path), build_plan(matcher="sift")):
        tab._on_progress(p)
        if p.total <= 0:
            continue
        text, tip = label.text(), label.toolTip()
        assert label.fontMetrics().horizontalAdvance(text) <= label.contentsRect().width(), text
        assert f"{p.done:,} / {p.total:,}" in text, text
        assert p.step >= 1 and p.steps == 4
        assert f"Step {p.step} of 4" in text or f"{p.step}/4" in text, text
        if p.job_eta is not None:
            assert time_left_text(p) in text, text
            assert f"whole build: {format_duration(p.job_eta)}" in tip, tip
        assert "bbdd_" not in text and f"bbdd_{p.done:05d}.jpg" in tip, (text, tip)
        seen.append(p)
    tab._job = None
    # the time left is the whole build's: while describing, far more than the step's own
    middle = next(p for p in seen if p.stage == "describing" and p.done > 100)
    assert middle.job_eta > 10 * middle.eta
    # ... and it counts down over the build's steps, to 0 at the end
    assert seen[-1].job_eta == 0.0
    assert [p.step for p in seen] == sorted(p.step for p in seen) and seen[-1].step == 4


def test_status_bar_news_of_a_job_goes_away_on_another_tab_or_after_a_while(window_tab, qtbot, monkeypatch):
    from museum_search.gui import collection_tab

    tab = window_tab
    bar = tab.window().statusBar()
    tab.show_status_message("Index updated: 20 references.")
    assert bar.currentMessage() == "Index updated: 20 references."
    tab.tabs.setCurrentIndex(1)  # the Search tab
    assert bar.currentMessage() == ""
    tab.tabs.setCurrentIndex(0)
    monkeypatch.setattr(collection_tab, "STATUS_MESSAGE_MS", 50)
    tab.show_status_message("Index built: 3 references.")
    assert bar.currentMessage() == "Index built: 3 references."
    qtbot.waitUntil(lambda: bar.currentMessage() == "", timeout=5_000)


def test_choosing_another_folder_forgets_the_sample_collections_status(window_tab, tmp_path):
    tab = window_tab
    tab.progress.set_status("Sample collection: 42 references.")
    other = _museum(tmp_path, "mine")
    tab.set_collection(other)
    assert tab.progress.status() == ""


def _tree_paths(tab) -> list[str]:
    return [tab.skipped_tree.topLevelItem(i).text(0) for i in range(tab.skipped_tree.topLevelItemCount())]


def test_skipped_files_are_listed_once_and_the_update_counts_what_it_removed(window_tab, qtbot, tmp_path):
    """Issue 23, item 7: during an update (or a second build) the skipped list showed each unreadable
    file twice (the last job's rows, then this job's as they came); an update's "0 removed" did not
    explain an index smaller than the collection."""
    tab = window_tab
    collection = _museum(tmp_path, "museum", n=4)  # one object: built without calibration views
    photos = sorted(collection.glob("*.jpg"))
    photos[-1].write_bytes(b"this is no photo " * 30)  # catalogued, unreadable
    shutil.copy2(photos[0], collection / "extra.jpg")  # not in the catalogue
    tab.set_collection(collection)
    qtbot.waitUntil(lambda: tab.detected_label.text().startswith("Detected:"), timeout=30_000)
    assert "4 references" in tab.detected_label.text()
    tab.index_edit.setText(str(tmp_path / "index"))
    tab.size_spin.setValue(TINY)
    listed: list[list[str]] = []
    on_progress = tab._on_progress

    def spy(p):  # what the list shows after each progress record of the running job
        on_progress(p)
        listed.append(_tree_paths(tab))

    tab._on_progress = spy
    assert _build(tab, qtbot) is True
    assert listed and all(len(rows) == len(set(rows)) for rows in listed), listed
    listed.clear()
    assert sorted(_tree_paths(tab)) == ["extra.jpg", photos[-1].name]
    assert tab.skipped_box.title() == "Skipped and ignored files (2)"
    assert "3 references" in tab.progress.status() and "1 file(s) skipped: they cannot be read and are not in " \
        "the index" in tab.progress.status()

    # an indexed photo becomes unreadable: the update drops it, counts it, lists it once
    photos[1].write_bytes(b"\x00" * 400)
    with qtbot.waitSignal(tab.job_done, timeout=120_000) as blocker:
        qtbot.mouseClick(tab.update_button, _left())
    assert blocker.args == [True]
    assert listed and all(len(rows) == len(set(rows)) for rows in listed), listed
    assert sorted(_tree_paths(tab)) == sorted(["extra.jpg", photos[-1].name, photos[1].name])
    assert tab.skipped_box.title() == "Skipped and ignored files (3)"
    status = tab.progress.status()
    assert "0 added/changed, 1 removed, 2 unchanged (of 3 before)" in status, status
    assert len(tab.state.index) == 2
    line = tab.progress.item_label
    assert "1 removed" in line.text() and line.fontMetrics().horizontalAdvance(line.text()) <= line.contentsRect().width()
    assert "(of 3 before)" in line.toolTip()
    assert tab.window().statusBar().currentMessage().startswith("Index updated:")


def test_thumbnails_show_the_artist_a_filter_matched(qtbot, tmp_path):
    """Issue 23, item 10: a filter on "hugo" kept works whose thumbnails showed no "Hugo"."""
    from museum_search.core.index._catalogue import Item
    from museum_search.core.index._store import Index
    from museum_search.core.inference._backbones import BackboneMeta
    from museum_search.gui.widgets.thumbnails import LINES_ROLE, ThumbnailBrowser

    artists = ["Hugo Demarco", "Victor Perez-Porros", "Ana Hugoson", "Joan Miró", ""]
    items = [Item(f"w{i}.jpg", 0, 0.0, f"bbdd_{i:05d}", {"title": f"Work {i}", "Artist": a})
             for i, a in enumerate(artists)]
    meta = BackboneMeta("x", "w", "gem", "longest_side", 64, (1.0,), 3.0, 4, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
    browser = ThumbnailBrowser(thumb_size=96)
    qtbot.addWidget(browser)
    browser.resize(600, 400)
    browser.show()
    no_artist = Index(tmp_path, meta, [Item("a.jpg", 0, 0.0, "a", {"title": "A"})], np.zeros((1, 4), np.float32))
    browser.set_index(no_artist)
    two_lines = browser.view.gridSize().height()
    assert browser.delegate.lines == 2

    browser.set_index(Index(tmp_path, meta, items, np.zeros((5, 4), np.float32)))
    assert browser.delegate.lines == 3
    assert browser.view.gridSize().height() == two_lines + browser.view.fontMetrics().lineSpacing()
    browser.set_filter("hugo")
    shown = [browser.proxy.index(r, 0) for r in range(browser.visible_count())]
    assert [i.data(LINES_ROLE) for i in shown] == [("bbdd_00000", "Work 0", "Hugo Demarco"),
                                                  ("bbdd_00002", "Work 2", "Ana Hugoson")]
    assert all("Hugo" in i.data(LINES_ROLE)[2] and "Hugo" in i.data() for i in shown)
    # painted: the artist's line is drawn under the title (its pixels differ from an item without one)
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtWidgets import QStyleOptionViewItem

    def painted(idx) -> QImage:
        img = QImage(browser.delegate.item_width, browser.delegate.item_height(browser.view.fontMetrics()),
                     QImage.Format.Format_ARGB32)
        img.fill(0xFFFFFFFF)
        opt = QStyleOptionViewItem()
        opt.initFrom(browser.view)
        opt.rect = img.rect()
        painter = QPainter(img)
        browser.delegate.paint(painter, opt, idx)
        painter.end()
        return img

    def ink(img: QImage, line: int) -> int:  # the pixels drawn on text line ``line`` (0: the instance)
        ls = browser.view.fontMetrics().lineSpacing()
        top = 4 + 96 + 3 + line * ls  # below the thumbnail's square and the padding
        return sum(img.pixel(x, y) != 0xFFFFFFFF for x in range(img.width()) for y in range(top, top + ls))

    with_artist, without = painted(shown[0]), painted(browser.model.index(4, 0))
    assert ink(with_artist, 2) > 20 and ink(without, 2) == 0
    assert ink(with_artist, 1) > 20 and ink(without, 1) > 20  # both have a title


def test_builds_and_updates_run_on_the_session_s_engine_and_the_stored_matcher(qtbot, tmp_path, monkeypatch):
    """Issue 32: the engine and the matcher are settings of each job the tab starts (the session's
    ``AppState.engine``, the stored matcher of new indexes), passed in, not process-wide switches."""
    from PySide6.QtCore import QSettings

    from museum_search.gui import collection_tab, workers
    from museum_search.gui.state import AppState, Settings

    asked: list[tuple[str, dict]] = []
    for name in ("build_job", "update_job"):
        real = getattr(collection_tab, name)

        def recorded(*args, _real=real, _name=name, **kwargs):
            asked.append((_name, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(collection_tab, name, recorded)
    settings = Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat))
    settings.matcher = "sift"
    assert settings.whitening is False  # not asked for
    settings.whitening = True
    assert Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)).whitening is True  # stored
    tab = collection_tab.CollectionTab(AppState(settings, engine="torch"))
    qtbot.addWidget(tab)
    tab.show()
    try:
        tab.set_collection(_museum(tmp_path, "museum", n=3))
        qtbot.waitUntil(lambda: tab.detected_label.text().startswith("Detected:"), timeout=30_000)
        tab.index_edit.setText(str(tmp_path / "index"))
        tab.size_spin.setValue(TINY)
        assert _build(tab, qtbot) is True
        with qtbot.waitSignal(tab.job_done, timeout=120_000):
            qtbot.mouseClick(tab.update_button, _left())
    finally:
        tab.shutdown()
        assert workers.wait_all(60_000)
    assert [(n, kw.get("engine"), kw.get("matcher"), kw.get("whitening")) for n, kw in asked] == [
        ("build_job", "torch", "sift", True), ("update_job", "torch", None, None)]  # an update keeps the index's own
