"""Opening an index of the older format 2 in the GUI: the error is shown with an offer to convert it;
Convert runs ``core.indexing.upgrade_index`` on a worker (progress, Cancel) and opens the result. The
format-2 indexes are written as museum-search 0.x wrote them (``test_index_format._write_v2``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QPushButton
from test_index_format import _write_v2

from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import MANIFEST, Index, LabellingSpec, _manifest_digest
from museum_search.core.inference._backbones import imported_meta
from museum_search.core.progress import Progress
from museum_search.gui import workers
from museum_search.gui.state import AppState, Settings

pytestmark = pytest.mark.gui

TIMEOUT = 60_000


def _index(tmp_path: Path, n: int = 40, dim: int = 16) -> Index:
    rng = np.random.default_rng(0)
    desc = rng.standard_normal((n, dim)).astype(np.float32)
    desc /= np.linalg.norm(desc, axis=1, keepdims=True)
    root = tmp_path / "photos"
    root.mkdir(exist_ok=True)
    items = [Item(f"obj{i // 4}/view{i % 4}.jpg", 0, 0.0, f"obj{i // 4}",
                  {"title": f"Object {i // 4}", "artist": ["Monet", "Degas"][i % 2]}) for i in range(n)]
    return Index(root, imported_meta(dim), items, desc, LabellingSpec("imported"))


def _snapshot(folder: Path) -> dict[str, bytes]:
    """The index's files and their bytes (the writer's lock file, which core keeps, aside)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name != ".museum-search.lock"}


def _visible(name: str):
    from PySide6.QtWidgets import QApplication

    return [w for w in QApplication.topLevelWidgets() if w.objectName() == name and w.isVisible()]


@pytest.fixture
def window(qtbot, tmp_path):
    from museum_search.gui.main_window import MainWindow

    state = AppState(Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)))
    win = MainWindow(state)
    qtbot.addWidget(win)
    win.resize(1024, 700)
    win.show()
    qtbot.waitExposed(win)
    yield win
    win.close()
    assert workers.wait_all(TIMEOUT)


def test_old_index_is_converted_after_asking_and_opened(qtbot, window, tmp_path):
    original = _index(tmp_path)
    old = tmp_path / "old-index"
    _write_v2(old, original)
    before = _snapshot(old)

    # File → Open index…: the error, with an offer to convert (Cancel leaves everything as it was)
    assert window.open_index(old) is False
    qtbot.waitUntil(lambda: len(_visible("upgradeIndexDialog")) == 1, timeout=5000)
    box = _visible("upgradeIndexDialog")[0]
    assert "older version of museum-search" in box.text()
    assert f"museum-search upgrade {old}" in box.informativeText()  # core's message, in full
    assert "Traceback" not in box.informativeText()
    assert box.defaultButton().text() == "Convert"
    box.reject()
    qtbot.waitUntil(lambda: not _visible("upgradeIndexDialog"), timeout=5000)
    qtbot.wait(20)
    assert window.state.index is None and _snapshot(old) == before
    assert not _visible("upgradeProgress")

    # Convert: on a worker, then opened in the application
    assert window.open_index(old) is False
    qtbot.waitUntil(lambda: len(_visible("upgradeIndexDialog")) == 1, timeout=5000)
    box = _visible("upgradeIndexDialog")[0]
    box.defaultButton().click()
    qtbot.waitUntil(lambda: window.state.index is not None, timeout=TIMEOUT)
    opened = window.state.index
    assert opened.path == old and len(opened) == len(original)
    np.testing.assert_array_equal(np.asarray(opened.descriptors), original.descriptors)
    assert list(opened.items) == original.items and opened.verdict["source"] == "test"
    assert opened.neighbours_stored > 0  # the gallery-rank matrix gave way to neighbour lists
    assert Index.load(old).neighbours_stored == opened.neighbours_stored  # converted on disk, in place
    assert not any(n.startswith("gallery_ranks") or n.endswith(".json") and n != MANIFEST for n in os.listdir(old))
    qtbot.waitUntil(lambda: not _visible("upgradeProgress"), timeout=5000)
    # every tab follows the converted index
    assert window.collection_tab.browser.visible_count() == len(original)
    assert "no approximate-search index" in window.collection_tab.detected_label.text()
    assert window.windowTitle().endswith(str(old))
    # the next time it just opens
    window.state.set_index(None)
    assert window.open_index(old) is True and window.state.index.path == old
    assert not _visible("upgradeIndexDialog")


def test_cancelled_conversion_leaves_the_old_index(qtbot, window, tmp_path, monkeypatch):
    from museum_search.core.jobs import _indexing as index_mod

    old = tmp_path / "old-index"
    _write_v2(old, _index(tmp_path))
    before = _snapshot(old)
    steps: list[int] = []

    def slow_derive(index, **_kwargs):  # the long part of a conversion (neighbours of 1M references)
        for i in range(3000):
            steps.append(i)
            yield Progress(i, 3000, None, stage="finding each reference's nearest neighbours")
            time.sleep(0.01)

    monkeypatch.setattr(index_mod, "derive", slow_derive)
    assert window.evaluation_tab.open_index(old) is False  # the Evaluation tab's own "Open index…"
    qtbot.waitUntil(lambda: len(_visible("upgradeIndexDialog")) == 1, timeout=5000)
    _visible("upgradeIndexDialog")[0].defaultButton().click()
    qtbot.waitUntil(lambda: len(steps) > 5 and len(_visible("upgradeProgress")) == 1, timeout=TIMEOUT)
    progress = _visible("upgradeProgress")[0]
    qtbot.waitUntil(lambda: progress.maximum() == 3000 and progress.value() > 0, timeout=5000)
    assert "nearest neighbours" in progress.labelText()
    progress.findChild(QPushButton).click()  # its Cancel button
    qtbot.waitUntil(lambda: not _visible("upgradeProgress"), timeout=TIMEOUT)
    assert workers.wait_all(TIMEOUT)
    assert len(steps) < 3000  # stopped well before the end
    assert _snapshot(old) == before  # untouched: the save never happened
    assert window.evaluation_tab.index is None and window.state.index is None
    assert not _visible("errorDialog")


def test_an_index_that_cannot_be_converted_is_only_refused(qtbot, window, tmp_path):
    old = tmp_path / "old-index"
    _write_v2(old, _index(tmp_path))
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["version"] = 1  # older than anything upgrade_index converts
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    (old / MANIFEST).write_text(json.dumps(manifest))
    assert window.open_index(old) is False
    qtbot.waitUntil(lambda: len(_visible("errorDialog")) == 1, timeout=5000)
    box = _visible("errorDialog")[0]
    # imported descriptors: the advice is to import them again, not to index a collection
    assert "import the descriptors again with: museum-search import" in box.text()
    assert "Traceback" not in box.text()
    assert not _visible("upgradeIndexDialog")
    box.close()


def test_kiosk_on_an_old_index_converts_it_then_starts(qtbot, tmp_path, monkeypatch):
    """``museum-search-gui --demo INDEX`` on a format-2 index: the offer, then the kiosk on the
    converted index (declining, or an index that cannot be opened, ends the application)."""
    from PySide6.QtWidgets import QApplication, QWidget

    from museum_search.gui import app as app_mod
    from museum_search.gui import demo_window
    from museum_search.gui.state import Settings as RealSettings

    original = _index(tmp_path)
    old = tmp_path / "old-index"
    _write_v2(old, original)
    shown: list = []

    class Kiosk(QWidget):  # the kiosk without its camera: records the index it was given
        def __init__(self, index, settings, *args, **kwargs):
            super().__init__()
            self.index = index
            shown.append(self)

        def showFullScreen(self) -> None:
            self.show()

    def settings() -> RealSettings:
        return RealSettings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))

    runs: list[str] = []

    def fake_exec(app) -> int:
        """The event loop of the run: answer the offer as the test says, then end."""
        answer = runs[-1]
        quits.clear()
        if answer == "error":
            qtbot.waitUntil(lambda: len(_visible("errorDialog")) == 1, timeout=5000)
            _visible("errorDialog")[0].close()
        else:
            qtbot.waitUntil(lambda: len(_visible("upgradeIndexDialog")) == 1, timeout=5000)
            box = _visible("upgradeIndexDialog")[0]
            if answer == "convert":
                box.defaultButton().click()
                qtbot.waitUntil(lambda: bool(shown), timeout=TIMEOUT)
                shown[-1].close()
            else:
                box.reject()
        qtbot.wait(50)
        quit_asked[answer] = bool(quits)
        return 0

    quits: list[int] = []
    quit_asked: dict[str, bool] = {}
    monkeypatch.setattr(QApplication, "exec", fake_exec)
    monkeypatch.setattr(QApplication, "quit", lambda *a: quits.append(1))
    monkeypatch.setattr(demo_window, "DemoWindow", Kiosk)
    monkeypatch.setattr("museum_search.gui.state.Settings", lambda *a: settings())
    app = QApplication.instance()
    quit_on_close = app.quitOnLastWindowClosed()
    import signal

    handler = signal.getsignal(signal.SIGINT)
    try:
        runs.append("cancel")
        assert app_mod.main(["--demo", str(old)]) == 0
        assert signal.getsignal(signal.SIGINT) is handler  # the app's Ctrl-C handler went with it
        assert not shown and (old / MANIFEST).is_file() and json.loads((old / MANIFEST).read_text())["version"] == 2
        assert quit_asked["cancel"]  # declined: nothing to show, the application ends

        runs.append("convert")
        assert app_mod.main(["--demo", str(old)]) == 0
        assert len(shown) == 1 and shown[0].index.path == old and len(shown[0].index) == len(original)
        assert app.quitOnLastWindowClosed()  # the kiosk closing ends the application again
        assert Index.load(old).neighbours_stored > 0
        assert not quit_asked["convert"]

        runs.append("error")
        missing = tmp_path / "no-index-here"
        missing.mkdir()
        assert app_mod.main(["--demo", str(missing)]) == 0
        assert len(shown) == 1 and quit_asked["error"]  # ends once the error has been read
    finally:
        app.setQuitOnLastWindowClosed(quit_on_close)
        for w in shown:
            w.deleteLater()
        assert workers.wait_all(TIMEOUT)


def test_update_in_the_collection_tab_converts_an_old_index_first(qtbot, window, tmp_path, monkeypatch):
    tab = window.collection_tab
    original = _index(tmp_path)
    old = tmp_path / "old-index"
    _write_v2(old, original)
    started: list[tuple[str, Path]] = []
    monkeypatch.setattr(tab, "_start", lambda gen, kind, out: (gen.close(), started.append((kind, out))))
    tab.collection_edit.setText(str(original.root))
    tab.index_edit.setText(str(old))
    tab._refresh_folder_check()
    assert tab.update_button.isEnabled()  # an index of this collection (its manifest says so)

    tab.update_button.click()
    qtbot.waitUntil(lambda: len(_visible("upgradeIndexDialog")) == 1, timeout=5000)
    assert "older format" in tab.progress.status_label.text() and not started
    _visible("upgradeIndexDialog")[0].reject()
    qtbot.waitUntil(lambda: "Nothing was updated" in tab.progress.status_label.text(), timeout=5000)
    assert not started and json.loads((old / MANIFEST).read_text())["version"] == 2

    tab.update_button.click()
    qtbot.waitUntil(lambda: len(_visible("upgradeIndexDialog")) == 1, timeout=5000)
    _visible("upgradeIndexDialog")[0].defaultButton().click()
    qtbot.waitUntil(lambda: bool(started), timeout=TIMEOUT)
    assert started == [("update", old)]  # then the update itself, on the converted index
    assert window.state.index is not None and window.state.index.path == old
    assert Index.load(old).neighbours_stored > 0
