"""The Evaluation tab, round three (issue 35): the status is the selected run's, the selected query's
text is never cut at 1024x700, and the Compare table shows every column at 1600x1000 without a
horizontal scroll bar."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, QSettings

from museum_search.gui import workers
from museum_search.gui.main_window import MainWindow
from museum_search.gui.state import AppState, Settings
from museum_search.gui.widgets.plots import run_colour

pytestmark = pytest.mark.gui

QUERIES = Path(__file__).resolve().parents[1] / "resources" / "sample" / "queries"
TIMEOUT = 300_000


@pytest.fixture
def win(qtbot, tmp_path, sample_index):
    state = AppState(Settings(QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)))
    w = MainWindow(state)
    qtbot.addWidget(w)
    w.show()
    state.set_index(sample_index)
    w.tabs.setCurrentWidget(w.evaluation_tab)
    yield w
    w.close()
    assert workers.wait_all(TIMEOUT)


def _evaluate(qtbot, tab):
    done = []
    tab.run_finished.connect(done.append)
    with qtbot.waitSignal(tab.job_finished, timeout=TIMEOUT):
        assert tab.run_evaluation()
    tab.run_finished.disconnect(done.append)
    assert done, tab.progress_panel.status_label.text()
    return done[0]


def _rect_in(widget, top) -> QRect:
    return QRect(widget.mapTo(top, widget.rect().topLeft()), widget.size())


def test_status_selected_query_and_compare_table(qtbot, win):
    tab = win.evaluation_tab
    assert tab.load_queryset_path(QUERIES)
    tab.rerank.set_names([])
    tab.rerank.set_verify(False)
    run = _evaluate(qtbot, tab)
    done = tab._status_text
    assert done.startswith("Done in")
    other = replace(run, key=run.key + 100, colour=run_colour(1), name="plain · another run")
    tab.add_run(other)
    # selecting another run: the status is that run's, not the last job's (issue 35, item 5)
    tab.select_run(other)
    assert tab._status_text.startswith("plain · another run:") and done not in tab._status_text
    tab.select_run(run)
    assert tab._status_text == f"{run.name}: {done}"

    # 1024x700, a query selected: its photo above its text, the text whole (issue 35, item 6)
    win.resize(1024, 700)
    qtbot.waitUntil(lambda: (win.width(), win.height()) == (1024, 700), timeout=5000)
    tab.pages.setCurrentWidget(tab.queries)
    tab.queries.select_row(0)
    page = tab.queries
    qtbot.waitUntil(lambda: "Verdict" in page.query_info.text(), timeout=10_000)
    qtbot.wait(200)
    col = page.query_column
    image, info = page.query_image, page.query_info
    assert not _rect_in(image, col.widget()).intersects(_rect_in(info, col.widget()))
    assert info.height() >= info.heightForWidth(info.width())  # no line cut
    assert col.verticalScrollBar().maximum() == 0  # and all of it in view, without scrolling
    assert col.viewport().rect().contains(_rect_in(info, col.viewport()))
    assert image.width() >= 96

    # 1600x1000, the Compare page of two real runs (tested against each other, p cells filled):
    # every column in view, none behind a horizontal scroll bar
    tab.rerank.set_verify(True)
    _evaluate(qtbot, tab)
    tab.compare.set_baseline_key(run.key)
    tab._update_comparison()
    assert "differ" in tab.compare.table.item(tab.compare.table.rowCount() - 1, tab.compare.table.columnCount() - 1).text()
    win.resize(1600, 1000)
    qtbot.waitUntil(lambda: (win.width(), win.height()) == (1600, 1000), timeout=5000)
    tab.pages.setCurrentWidget(tab.compare)
    qtbot.wait(200)
    table = tab.compare.table
    assert table.horizontalScrollBar().maximum() == 0
    header = table.horizontalHeader()
    for c in range(table.columnCount()):
        x = table.columnViewportPosition(c)
        assert 0 <= x and x + table.columnWidth(c) <= table.viewport().width(), table.horizontalHeaderItem(c).text()
        assert header.sectionSize(c) >= header.sectionSizeFromContents(c).width() - 1
