"""The calibrated verdict as the views show it (offscreen Qt): the Collection tab's operating point
and its warning when weak, the kiosk's plain words for the confidence and its log for staff.

(The Search tab's banner is checked in tests/test_gui_search.py, the kiosk's card in
tests/test_gui_demo.py, the Evaluation tab's GAP in tests/test_gui_evaluation.py.)
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QLabel

from museum_search.core.answer._presentation import CONFIDENCE_BANDS
from museum_search.core.answer._verdict import Verdict
from museum_search.core.index._store import Index
from museum_search.gui import workers
from museum_search.gui.demo_window import CONFIDENCE_WORDS, confidence_words

pytestmark = pytest.mark.gui

WEAK = {"known_accepted": 0.32, "unknown_rejected": 0.96, "known": 50, "unknown": 50, "source": "synthetic views"}
STRONG = {"known_accepted": 0.97, "unknown_rejected": 0.95, "known": 50, "unknown": 50, "source": "real views"}


def _with_point(sample_index, point: dict | None) -> Index:
    """The sample index opened again (its own object: the session's stays as it is), its verdict
    with the operating point ``point`` (in memory only)."""
    index = Index.load(sample_index.path)
    verdict = Verdict.of_index(index)
    op = None if point is None else {**(verdict.operating_point or {}), **point}
    index.verdict = replace(verdict, operating_point=op).to_dict()
    return index


@pytest.fixture
def collection_tab(qtbot, tmp_path):
    from museum_search.gui.collection_tab import CollectionTab
    from museum_search.gui.state import AppState, Settings

    state = AppState(Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)))
    tab = CollectionTab(state)
    qtbot.addWidget(tab)
    tab.resize(1280, 800)
    tab.show()
    qtbot.waitExposed(tab)
    yield tab
    tab.shutdown()
    assert workers.wait_all(60_000)
    qtbot.wait(10)


def test_collection_tab_shows_the_operating_point_and_warns_when_weak(qtbot, collection_tab, sample_index):
    tab = collection_tab
    summary = tab.findChild(QLabel, "detectedLabelling")
    warning = tab.findChild(QLabel, "verdictWarning")
    assert warning is not None and warning.isHidden()  # no index yet

    strong = _with_point(sample_index, STRONG)
    tab.state.set_index(strong)
    verdict = Verdict.of_index(strong)
    assert verdict.operating_point["known_accepted"] == STRONG["known_accepted"]
    assert verdict.plain_summary() in summary.text()  # in a curator's words (issue 35); the rule in the tooltip
    assert verdict.summary() in summary.toolTip()
    assert f"{STRONG['known_accepted']:.0%}" in summary.text()  # the operating point, in the index summary
    assert verdict.warning() is None and warning.isHidden()

    weak = _with_point(sample_index, WEAK)
    tab.state.set_index(weak)
    verdict = Verdict.of_index(weak)
    assert verdict.plain_summary() in summary.text() and f"{WEAK['known_accepted']:.0%}" in summary.text()
    assert verdict.warning() is not None
    assert warning.isVisible() and verdict.warning()[1:] in warning.text()
    tab.grab().save("/tmp/collection_weak_verdict.png")

    tab.state.set_index(strong)  # another index: its own verdict, no warning left behind
    assert warning.isHidden() and Verdict.of_index(strong).plain_summary() in summary.text()
    tab.state.set_index(weak)
    tab.state.set_index(None)
    assert warning.isHidden()

    tab.state.set_index(_with_point(sample_index, None))  # not measured (an older calibration): no warning
    assert warning.isHidden()


def test_kiosk_confidence_words_are_plain():
    assert confidence_words(None) == ""
    thresholds = [floor for _, floor in CONFIDENCE_BANDS]  # core's bands: the kiosk words each one
    assert set(CONFIDENCE_WORDS) == {band for band, _ in CONFIDENCE_BANDS}
    assert thresholds == sorted(thresholds, reverse=True) and thresholds[-1] == 0.0
    for p in (0.0, 0.3, 0.5, 0.79, 0.8, 0.9, 0.95, 0.999, 1.0):
        words = confidence_words(p)
        assert words and not any(ch.isdigit() for ch in words) and "%" not in words  # never the number
    assert confidence_words(0.99) != confidence_words(0.6)
    assert confidence_words(0.99) == confidence_words(1.0) == CONFIDENCE_WORDS[CONFIDENCE_BANDS[0][0]]
