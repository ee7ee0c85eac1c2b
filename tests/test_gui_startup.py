"""Start-up of the app: the window shows before the tabs, the index and the network are loaded, and
nothing heavy is imported to show it; its place on the screen comes back as it was left (no frame
offset without a window manager). Times are in bench/bench_startup.py, not here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, QSettings
from PySide6.QtGui import QGuiApplication

from museum_search.gui import workers
from museum_search.gui.main_window import GEOMETRY_SETTING, MainWindow, fit_on_screen
from museum_search.gui.state import AppState, Settings

pytestmark = pytest.mark.gui

REPO = Path(__file__).resolve().parents[1]
#: What must not load before the window shows (seconds each on a busy machine; torch alone took 9 s).
HEAVY = ("torch", "torchvision", "onnxruntime", "faiss", "pyqtgraph", "scipy")


def _state(path: Path) -> AppState:
    return AppState(Settings(QSettings(str(path), QSettings.Format.IniFormat)))


def test_main_window_module_imports_nothing_heavy():
    code = ("import json, sys, museum_search.gui.main_window, museum_search.gui.app; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                         env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_lazy_window_shows_first_then_tabs_index_and_network(qtbot, tmp_path, sample_index, block, monkeypatch):
    from museum_search.core import inference
    from museum_search.core.index._store import Index
    from museum_search.core.inference import _engines as engines

    read = block(Index, "load")
    net = block(inference, "extractor_for_meta")  # what the window calls: the package's face
    state = _state(tmp_path / "s.ini")
    w = MainWindow(state, lazy=True)
    qtbot.addWidget(w)
    w.show()
    # shown, with a loading page in each tab: nothing waited for the tabs' modules
    assert w.isVisible() and not w.ready
    assert [w.tabs.widget(i).objectName() for i in range(3)] == ["tabLoading"] * 3
    w.when_ready(lambda: w.open_index_in_background(sample_index.path))
    qtbot.waitUntil(lambda: w.ready, timeout=60_000)
    assert [type(w.tabs.widget(i)).__name__ for i in range(2)] == ["CollectionTab", "SearchTab"]
    assert w.tabs.widget(1) is w.search_tab and w.tabs.currentIndex() == 0
    # the Evaluation tab (its plots are slow to build) waits until it is chosen
    qtbot.wait(200)
    assert w.tabs.widget(2).objectName() == "tabLoading" and not w.all_tabs_built
    w.tabs.setCurrentIndex(2)
    qtbot.waitUntil(lambda: type(w.tabs.widget(2)).__name__ == "EvaluationTab", timeout=60_000)
    assert w.tabs.currentIndex() == 2 and not w.all_tabs_built  # the Visitors tab too waits until chosen
    w.tabs.setCurrentIndex(3)
    qtbot.waitUntil(lambda: type(w.tabs.widget(3)).__name__ == "VisitorsTab", timeout=60_000)
    assert w.all_tabs_built
    assert read.started.wait(30)
    # the index is being read on a worker: the window answers meanwhile, and nothing is open yet
    for _ in range(5):
        qtbot.wait(20)
    assert w.state.index is None and "Opening the index" in w.status_label.text()
    read.release.set()
    qtbot.waitUntil(lambda: w.state.index is not None, timeout=30_000)
    assert len(w.state.index) == 42 and str(sample_index.path) in w.windowTitle()
    # then its network, on a worker, with the state shown in the status bar
    assert net.started.wait(30)
    assert w.network.loading and not w.network.ready
    assert w.network_label.isVisibleTo(w) and w.network_label.text().startswith("Loading the network")
    assert w.network_bar.isVisibleTo(w)
    net.release.set()
    qtbot.waitUntil(lambda: w.network.ready, timeout=120_000)
    assert not w.network_label.isVisibleTo(w) and not w.network_bar.isVisibleTo(w)
    # the search that follows uses the network loaded (core.engines keeps it): the same extractor
    assert engines.extractor_for_meta(w.state.index.meta) is engines.extractor_for_meta(w.state.index.meta)
    w.close()
    assert workers.wait_all(60_000)


_APP_START = textwrap.dedent("""
    import json, os, sys, time
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMainWindow
    _exec = QApplication.exec
    seen = {}

    def exec_(*_args):
        def first_idle():
            w = [x for x in QApplication.topLevelWidgets() if isinstance(x, QMainWindow) and x.isVisible()][0]
            seen["at_show"] = {"index": w.state.index is not None, "ready": w.ready,
                               "status": w.status_label.text(),
                               "heavy": sorted(m for m in ("torch", "onnxruntime", "faiss") if m in sys.modules)}

            def poll():
                if w.state.index is not None and w.network.ready:
                    seen["after"] = {"references": len(w.state.index), "title": w.windowTitle(),
                                     "onnxruntime": "onnxruntime" in sys.modules}
                    print("SEEN " + json.dumps(seen), flush=True)
                    os._exit(0)
            timer = QTimer(w)
            timer.timeout.connect(poll)
            timer.start(20)
        QTimer.singleShot(0, first_idle)
        return _exec()

    QApplication.exec = exec_
    from museum_search.gui.app import main
    main(sys.argv[1:])
""")


def test_app_entry_shows_the_window_then_opens_the_index_and_loads_the_network(tmp_path, sample_index):
    """``museum-search-gui INDEX``: at the event loop's first idle turn the window is shown, says it is
    opening the index, and has imported neither torch, ONNX Runtime nor faiss; the index and its network
    (ONNX Runtime) come after."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "config"))
    out = subprocess.run([sys.executable, "-c", _APP_START, str(sample_index.path)], capture_output=True, text=True,
                         timeout=300, cwd=REPO, env=env)
    line = [x for x in out.stdout.splitlines() if x.startswith("SEEN ")]
    assert line, out.stderr[-3000:]
    seen = json.loads(line[0][5:])
    assert seen["at_show"]["index"] is False and seen["at_show"]["ready"] is False
    assert seen["at_show"]["status"].startswith("Opening the index") and seen["at_show"]["heavy"] == []
    assert seen["after"]["references"] == 42 and str(sample_index.path) in seen["after"]["title"]
    assert seen["after"]["onnxruntime"]  # the default engine's network, loaded behind the window


def test_background_open_of_a_broken_index_shows_the_error(qtbot, tmp_path):
    from PySide6.QtWidgets import QApplication, QMessageBox

    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{oops")
    w = MainWindow(_state(tmp_path / "s.ini"))
    qtbot.addWidget(w)
    w.show()
    w.open_index_in_background(tmp_path / "broken")

    def error_box():
        return [b for b in QApplication.topLevelWidgets()
                if isinstance(b, QMessageBox) and b.objectName() == "errorDialog" and b.isVisible()]

    qtbot.waitUntil(lambda: bool(error_box()), timeout=30_000)
    assert "damaged" in error_box()[-1].text() and w.state.index is None
    for b in error_box():
        b.close()
    w.close()
    assert workers.wait_all(60_000)


def test_lazy_window_closed_before_its_tabs_are_built(qtbot, tmp_path):
    w = MainWindow(_state(tmp_path / "s.ini"), lazy=True)
    qtbot.addWidget(w)
    w.show()
    w.close()  # nothing to shut down yet, and no tab is built to be closed
    assert not w.isVisible() and w.busy_text() is None
    qtbot.wait(50)


# ---- the window's place ----------------------------------------------------------------------------


def test_geometry_comes_back_as_it_was_left(qtbot, tmp_path):
    avail = QGuiApplication.primaryScreen().availableGeometry()
    rect = QRect(avail.left() + 30, avail.top() + 20, avail.width() // 2, avail.height() // 2)
    w = MainWindow(_state(tmp_path / "s.ini"), lazy=True)
    qtbot.addWidget(w)
    w.setGeometry(rect)
    w.show()
    qtbot.waitExposed(w)
    w.close()
    w2 = MainWindow(_state(tmp_path / "s.ini"), lazy=True)
    qtbot.addWidget(w2)
    assert w2.geometry() == rect
    w2.show()
    qtbot.waitExposed(w2)
    assert w2.geometry() == rect
    w2.close()


def test_geometry_off_screen_or_too_large_is_brought_back(qtbot, tmp_path):
    avail = QGuiApplication.primaryScreen().availableGeometry()
    settings = _state(tmp_path / "s.ini").settings
    settings.set_value(GEOMETRY_SETTING, QRect(avail.right() + 2000, avail.bottom() + 500, 400, 300))
    w = MainWindow(AppState(settings), lazy=True)
    qtbot.addWidget(w)
    assert avail.contains(w.geometry()) and w.size().width() == 400
    settings.set_value(GEOMETRY_SETTING, QRect(-50, -40, avail.width() + 300, avail.height() + 200))
    w2 = MainWindow(AppState(settings), lazy=True)
    qtbot.addWidget(w2)
    assert w2.geometry() == avail
    assert fit_on_screen(QRect(avail.left() + 10, avail.top() + 10, 300, 200)) == QRect(
        avail.left() + 10, avail.top() + 10, 300, 200)  # already on the screen: unchanged


def test_first_start_fits_the_screen(qtbot, tmp_path):
    avail = QGuiApplication.primaryScreen().availableGeometry()
    w = MainWindow(_state(tmp_path / "s.ini"), lazy=True)
    qtbot.addWidget(w)
    assert avail.contains(w.geometry())
    assert w.width() == min(1280, avail.width()) and w.height() == min(820, avail.height())


_XCB_START = textwrap.dedent("""
    import sys
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication
    app = QApplication(["museum-search"])
    from museum_search.gui.main_window import MainWindow
    from museum_search.gui.state import AppState, Settings
    w = MainWindow(AppState(Settings(QSettings(sys.argv[1], QSettings.Format.IniFormat))), lazy=True)
    w.show()
    def done():
        g = w.geometry()
        print("GEOMETRY", g.x(), g.y(), g.width(), g.height(), flush=True)
        w.close()
        app.quit()
    QTimer.singleShot(1500, done)
    app.exec()
""")


@pytest.mark.skipif(shutil.which("xvfb-run") is None, reason="xvfb-run is not installed")
def test_second_start_without_a_window_manager_is_where_the_first_was(tmp_path):
    """X11 with no window manager (a kiosk): saveGeometry()'s frame came back 1 px right and 25 px
    down at every start, leaving a black strip at the top. Two starts on Xvfb, no window manager."""
    settings = tmp_path / "s.ini"
    shown = []
    for _ in range(2):
        out = subprocess.run(["xvfb-run", "-a", "-s", "-screen 0 1024x700x24", sys.executable, "-c", _XCB_START,
                              str(settings)], capture_output=True, text=True, timeout=180, cwd=REPO,
                             env=dict(os.environ, QT_QPA_PLATFORM="xcb"))
        line = [x for x in out.stdout.splitlines() if x.startswith("GEOMETRY")]
        assert line, out.stderr[-2000:]
        shown.append(tuple(int(v) for v in line[0].split()[1:]))
    assert shown[0] == (0, 0, 1024, 700)  # the default size, fitted to the small screen
    assert shown[1] == shown[0]
