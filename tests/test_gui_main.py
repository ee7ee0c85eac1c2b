"""The main window: tabs, menu, settings dialog, opening indexes (good and broken)."""

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtGui import QKeySequence

from museum_search.gui import workers
from museum_search.gui.main_window import MainWindow, SettingsDialog
from museum_search.gui.state import AppState, Settings

pytestmark = pytest.mark.gui


@pytest.fixture
def window(qtbot, tmp_path):
    state = AppState(Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)))
    w = MainWindow(state)
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()
    assert workers.wait_all(60_000)


def test_tabs_menu_and_recent(window, sample_index):
    assert [window.tabs.tabText(i).replace("&", "") for i in range(3)] == ["Collection", "Search", "Evaluation"]
    menus = [a.text().replace("&", "") for a in window.menuBar().actions()]
    assert menus == ["File", "View", "Help"]
    assert window.open_index(sample_index.path)
    assert window.state.index is not None and len(window.state.index) == 42
    assert str(sample_index.path) in window.state.settings.recent_indexes()
    assert str(sample_index.path) in window.windowTitle()


def test_broken_index_shows_error_and_keeps_current(window, sample_index, tmp_path, qtbot):
    from PySide6.QtWidgets import QApplication, QMessageBox

    assert window.open_index(sample_index.path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{oops")
    assert not window.open_index(tmp_path / "broken")
    assert window.state.index is not None and len(window.state.index) == 42  # nothing changed
    boxes = [w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.objectName() == "errorDialog"]
    assert boxes and "damaged" in boxes[-1].text()
    for b in boxes:
        b.close()


def test_settings_dialog_saves_camera_and_exit_keys(window):
    s = window.state.settings
    d = SettingsDialog(window.state, window)
    assert not hasattr(d, "threshold")  # the verdict is calibrated per index, not a setting
    d.camera.setValue(2)
    d.exit_keys.setKeySequence(QKeySequence("Ctrl+Shift+Q"))
    d.accept()
    assert s.camera == 2
    assert s.value("demo/exit_keys") == "Ctrl+Shift+Q"


def test_the_command_line_engine_is_the_session_s(qtbot, tmp_path):
    """``gui --engine``: the session's engine, the stored setting left as it was."""
    settings = Settings(QSettings(str(tmp_path / "e.ini"), QSettings.Format.IniFormat))
    settings.engine = "onnx"
    assert AppState(settings).engine == "onnx"
    assert AppState(settings, engine="torch").engine == "torch" and settings.engine == "onnx"


def test_settings_dialog_chooses_the_inference_engine(window, sample_index, monkeypatch):
    """The engine is the session's setting (AppState.engine), put in the settings of every pipeline the
    tabs start; the dialog stores it and the views build their pipelines again."""
    monkeypatch.delenv("MUSEUM_SEARCH_ENGINE", raising=False)
    window.state.set_index(sample_index)
    seen = []
    window.state.index_changed.connect(seen.append)
    d = SettingsDialog(window.state, window)
    assert d.engine.currentData() == "auto" and window.state.engine == "auto"
    assert window.search_tab.query_settings().engine is None  # the default: onnx here
    d.engine.setCurrentIndex(d.engine.findData("torch"))
    d.accept()
    assert window.state.settings.engine == "torch" and window.state.engine == "torch"
    assert seen == [sample_index]  # the views build their pipelines again, on the new engine
    assert window.search_tab.query_settings().engine == window.evaluation_tab.query_settings().engine == "torch"
    d = SettingsDialog(window.state, window)
    d.engine.setCurrentIndex(d.engine.findData("auto"))
    d.accept()
    assert window.state.engine == "auto" and window.search_tab.query_settings().engine is None
