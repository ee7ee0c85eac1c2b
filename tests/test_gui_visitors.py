"""The app's side of issue 34: the Visitors tab (what visitors ask, CSV export, the empty states),
the staff's review queue, the visitor Settings, and the kiosk recording each answer.

Real answers of the query pipeline on the sample collection's photos are recorded in a real visitor
log (core.visitors); every figure the tab shows is compared with what the test recorded."""

from __future__ import annotations

import csv
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QItemSelectionModel, QSettings
from PySide6.QtWidgets import QApplication, QLabel, QMessageBox

from museum_search.core.answer import QueryPipeline, QuerySettings, confidence_band, query_from_array
from museum_search.core.capture import FileSequenceCamera
from museum_search.core.images import load_image
from museum_search.core.visitors import KEEP_MODES, KeepPolicy, VisitorLog
from museum_search.gui import workers
from museum_search.gui.demo_window import DemoWindow
from museum_search.gui.main_window import SettingsDialog
from museum_search.gui.state import AppState, Settings
from museum_search.gui.visitors_tab import (
    BANDS,
    COUNTING_OFF,
    NO_INDEX,
    NOTHING_IN_PERIOD,
    NOTHING_YET,
    VisitorsTab,
)
from museum_search.gui.widgets.review_queue import best_per_object

pytestmark = pytest.mark.gui

TIMEOUT = 120_000
SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"


def _queries() -> list[Path]:
    return sorted((SAMPLE / "queries").glob("q*.jpg"))


@pytest.fixture(scope="module")
def answered(sample_index) -> list[SimpleNamespace]:
    """The sample's photos with the query pipeline's answers (some recognised, some not)."""
    pipe = QueryPipeline(sample_index, QuerySettings())
    out = []
    for path in _queries():
        image = load_image(path, max_side=1024)
        (answer,) = pipe.answer([query_from_array(image, path.name)])
        out.append(SimpleNamespace(path=path, image=image, answer=answer))
    assert any(a.answer.in_collection for a in out) and any(not a.answer.in_collection for a in out)
    return out


def _state(tmp_path: Path, index=None, **policy) -> AppState:
    state = AppState(Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)))
    state.settings.visitors_folder = str(tmp_path / "visitors")
    if policy:
        state.settings.visitor_policy = KeepPolicy(**policy)
    state.index = index
    return state


@pytest.fixture
def make_tab(qtbot):
    tabs = []

    def make(state: AppState) -> VisitorsTab:
        tab = VisitorsTab(state)
        qtbot.addWidget(tab)
        tab.resize(1280, 800)
        tab.show()
        tabs.append(tab)
        return tab

    yield make
    for tab in tabs:
        tab.shutdown()
    assert workers.wait_all(TIMEOUT)


def _wait_read(qtbot, tab: VisitorsTab) -> None:
    qtbot.waitUntil(lambda: not tab.is_busy(), timeout=TIMEOUT)
    QApplication.processEvents()


def _script(answered, hours_ago: list[int]) -> list[tuple[SimpleNamespace, datetime, str]]:
    """Records spread over the last days: (answer, when, source), the same photos asked several times."""
    now = datetime.now().replace(minute=20, second=0, microsecond=0)
    return [(answered[i % len(answered)], now - timedelta(hours=h), ("kiosk", "phone")[i % 2])
            for i, h in enumerate(hours_ago)]


def _record(index, folder: Path, script, policy: KeepPolicy | None = None) -> None:
    with VisitorLog.open(index.path, policy or KeepPolicy(), folder=folder) as log:
        for a, when, source in script:
            log.record(a.answer, source=source, language="en", image=a.image, when=when)


def test_the_tab_shows_the_counts_the_records_made_and_exports_them(qtbot, make_tab, sample_index, answered,
                                                                    tmp_path):
    script = _script(answered, [1, 1, 2, 5, 5, 5, 26, 27, 50, 50, 51, 75])
    state = _state(tmp_path, sample_index)
    _record(sample_index, tmp_path / "visitors", script)
    tab = make_tab(state)
    tab.period.setCurrentIndex(tab.period.findData(None))  # everything
    _wait_read(qtbot, tab)
    assert tab.message() == ""  # the plots show
    per_hour = Counter(when.strftime("%Y-%m-%dT%H:00") for _a, when, _s in script)
    x, heights = tab.plots.bar_data("hour_bars")
    assert sorted(heights) == sorted(per_hour.values()) and sum(heights) == len(script)
    per_day = Counter(when.date() for _a, when, _s in script)
    missed = Counter(when.date() for a, when, _s in script if not a.answer.in_collection)
    _x, day_heights = tab.plots.bar_data("day_bars")
    _x, missed_heights = tab.plots.bar_data("not_recognised_bars")
    days = sorted(per_day)
    assert day_heights == [per_day[d] for d in days]
    assert missed_heights == [missed[d] for d in days]
    bands = Counter(confidence_band(a.answer.confidence) or "none" for a, _w, _s in script)
    assert tab.plots.bar_data("band_bars")[1] == [bands[b] for b in BANDS]
    # hovering a bar says its figures
    first_hour = min(per_hour)
    assert tab.plots.value_text(tab.plots.hour_plot, x[0]) == \
        f"{first_hour.replace('T', ' ')}: {per_hour[first_hour]} questions"
    day_x, _h = tab.plots.bar_data("day_bars")
    assert tab.plots.value_text(tab.plots.day_plot, day_x[-1]) == \
        f"{days[-1]}: {per_day[days[-1]]} questions, {missed[days[-1]]} not recognised"
    assert tab.plots.value_text(tab.plots.band_plot, 0.2) == f"sure: {bands['sure']} answers"
    for plot in (tab.plots.hour_plot, tab.plots.day_plot, tab.plots.share_plot, tab.plots.band_plot):
        tab.plots._hover(plot.vb.sceneBoundingRect().center())  # the mouse over each plot
    recognised = Counter(a.answer.top.instance for a, _w, _s in script if a.answer.in_collection)
    assert dict(tab.top.rows()) == dict(recognised)
    assert f"{len(script):,} questions" in tab.summary.text()
    # the CSV holds the same counts, one row per hour, object, verdict, band, language and source
    out = tmp_path / "export" / "visitors.csv"
    out.parent.mkdir()
    assert tab.export_csv(out)
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    # a file that exists is replaced only when the save dialog asked (overwrite): else it is left as it is
    out.write_text("staff's own file\n", encoding="utf-8")
    assert not tab.export_csv(out)
    assert out.read_text(encoding="utf-8") == "staff's own file\n"
    for box in QApplication.topLevelWidgets():
        if isinstance(box, QMessageBox) and box.objectName() == "errorDialog":
            assert "exists already" in box.text()
            box.close()
    assert tab.export_csv(out, overwrite=True)
    with open(out, newline="", encoding="utf-8") as f:
        assert list(csv.DictReader(f)) == rows
    assert sum(int(r["n"]) for r in rows) == len(script)
    by_source = Counter()
    for r in rows:
        by_source[r["source"]] += int(r["n"])
    assert by_source == Counter(s for _a, _w, s in script)
    by_hour = Counter()
    for r in rows:
        by_hour[r["hour"]] += int(r["n"])
    assert by_hour == per_hour


def test_empty_states_say_why_in_a_sentence(qtbot, make_tab, sample_index, tmp_path):
    tab = make_tab(_state(tmp_path / "a"))
    _wait_read(qtbot, tab)
    assert tab.message() == NO_INDEX
    (tmp_path / "b").mkdir()
    off = _state(tmp_path / "b", sample_index, counting=False)
    tab = make_tab(off)
    _wait_read(qtbot, tab)
    assert tab.message() == COUNTING_OFF
    assert not (tmp_path / "b" / "visitors").exists()  # nothing counted or kept: no folder made for it
    (tmp_path / "c").mkdir()
    tab = make_tab(_state(tmp_path / "c", sample_index))
    _wait_read(qtbot, tab)
    assert tab.message() == NOTHING_IN_PERIOD.format(period="last 30 days")  # the period shown by default
    tab.period.setCurrentIndex(tab.period.findData(None))
    _wait_read(qtbot, tab)
    assert tab.message() == NOTHING_YET
    assert not tab.export_button.isEnabled()


def _select(queue, rows: list[int]) -> None:
    sel = queue.photos.selectionModel()
    sel.clearSelection()
    for r in rows:
        sel.select(queue.model.index(r, 0), QItemSelectionModel.SelectionFlag.Select)


def test_review_actions_change_the_store(qtbot, make_tab, sample_index, answered, tmp_path):
    script = _script(answered, list(range(6, 0, -1)))  # recorded as they were asked: the oldest first
    folder = tmp_path / "visitors"
    policy = KeepPolicy(keep="all")
    _record(sample_index, folder, script, policy)
    state = _state(tmp_path, sample_index, keep="all")
    tab = make_tab(state)
    _wait_read(qtbot, tab)
    queue = tab.queue
    with VisitorLog.open(sample_index.path, policy, folder=folder) as log:
        kept = log.kept("new")
    assert [p.id for p in queue.model.photos] == [p.id for p in kept] and len(kept) == len(script)
    hours = [p.hour for p in queue.model.photos]
    assert hours == sorted(hours, reverse=True) and hours[0] > hours[-1]  # newest first
    assert "(6)" in tab.pages.tabText(1)
    # the first photo's candidates, its top one preselected in the picker, and its evidence
    first = queue.model.photos[0]
    assert queue.candidates.count() == len(best_per_object(first.candidates)) >= 1
    if first.candidates:
        assert queue.instance.currentText() == first.candidates[0]["instance"]
    qtbot.waitUntil(lambda: not queue.evidence_busy(), timeout=TIMEOUT)
    # reading the log again (the tab shown again) keeps the photo shown, its evidence and the selection
    queue.photos.setCurrentIndex(queue.model.index(2, 0))
    qtbot.waitUntil(lambda: not queue.evidence_busy(), timeout=TIMEOUT)
    _select(queue, [1, 2])
    shown, chosen, evidence = queue.current_photo().id, [p.id for p in queue.selected()], queue._evidence_key
    tab.refresh()
    _wait_read(qtbot, tab)
    assert queue.current_photo().id == shown and [p.id for p in queue.selected()] == chosen
    assert queue._evidence_key == evidence and not queue.evidence_busy()
    # "Not in our collection" for two photos
    _select(queue, [0, 1])
    unknown = [p.id for p in queue.selected()]
    assert queue.mark_selected_unknown()
    _wait_read(qtbot, tab)
    qtbot.waitUntil(lambda: len(queue.model.photos) == len(script) - 2, timeout=TIMEOUT)
    # "Discard" asks first, then deletes
    _select(queue, [0])
    gone = queue.selected()[0]
    box = queue.discard_selected()
    assert isinstance(box, QMessageBox) and gone.path.exists()
    box.button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(lambda: len(queue.model.photos) == len(script) - 3, timeout=TIMEOUT)
    _wait_read(qtbot, tab)
    with VisitorLog.open(sample_index.path, policy, folder=folder) as log:
        left = {p.id for p in log.kept("new")}
        assert {p.id for p in log.kept("unknown")} == set(unknown)
    assert left == {p.id for p in kept} - set(unknown) - {gone.id}
    assert not gone.path.exists()
    assert "(3)" in tab.pages.tabText(1)


def test_visitor_settings_round_trip(qtbot, tmp_path):
    state = _state(tmp_path)
    assert state.settings.visitor_policy == KeepPolicy()  # keep nothing and count, by default
    d = SettingsDialog(state)
    qtbot.addWidget(d)
    rows = d.visitors
    assert [rows.keep.itemData(i) for i in range(rows.keep.count())] == list(KEEP_MODES)
    assert rows.keep.currentData() == "none" and rows.counting.isChecked()
    assert not rows.quota.isEnabled()  # the limits are for keeping
    rows.keep.setCurrentIndex(rows.keep.findData("unsure"))
    assert rows.quota.isEnabled()
    rows.quota.setValue(120)
    rows.per_day.setValue(40)
    rows.days.setValue(9)
    rows.counting.setChecked(False)
    rows.folder.setText(str(tmp_path / "elsewhere"))
    for w in (rows.keep, rows.quota, rows.per_day, rows.days, rows.counting, rows.folder):
        assert w.toolTip()
    assert "No photo" in rows.counted.text()
    d.accept()
    want = KeepPolicy(keep="unsure", quota_mb=120.0, per_day=40, retention_days=9, counting=False)
    again = Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))
    assert again.visitor_policy == want and again.visitors_folder == str(tmp_path / "elsewhere")
    d2 = SettingsDialog(AppState(again))
    qtbot.addWidget(d2)
    assert d2.visitors.keep.currentData() == "unsure" and d2.visitors.days.value() == 9
    assert not d2.visitors.counting.isChecked()


def _kiosk(qtbot, index, state: AppState, photo: Path) -> DemoWindow:
    w = DemoWindow(index, state.settings, lambda _n: FileSequenceCamera([photo], fps=12, loop=True, max_side=960),
                   steady_seconds=60, result_seconds=60)
    qtbot.addWidget(w)
    w.resize(1280, 720)
    w.show()
    qtbot.waitExposed(w)
    return w


@pytest.mark.parametrize("keep, counting", [("none", True), ("all", True), ("none", False)])
def test_the_kiosk_records_each_answer(qtbot, sample_index, answered, tmp_path, keep, counting):
    state = _state(tmp_path, keep=keep, counting=counting)
    a = next(x for x in answered if x.answer.in_collection)
    w = _kiosk(qtbot, sample_index, state, a.path)
    try:
        qtbot.waitUntil(lambda: w.mode == "live" and w.camera_view.latest_frame() is not None, timeout=TIMEOUT)
        notice = w.findChild(QLabel, "demoNotice")
        policy = state.settings.visitor_policy
        assert notice.isVisibleTo(w) == (keep != "none")
        if keep != "none":
            assert notice.text() == policy.notice("en")
        for n in (1, 2):
            w._touched()
            qtbot.waitUntil(lambda n=n: w.recognitions == n and not w.is_busy(), timeout=TIMEOUT)
            w.back_to_live()
    finally:
        w.shutdown()
        qtbot.waitUntil(lambda: not w.is_busy(), timeout=TIMEOUT)
        assert workers.wait_all(TIMEOUT)
    if not counting and keep == "none":  # nothing counted or kept: no log, no folder
        assert w.recognitions == 2 and not (tmp_path / "visitors").exists()
        return
    with VisitorLog.open(sample_index.path, policy, folder=tmp_path / "visitors") as log:
        stats = log.stats()
        kept = log.kept()
    answer = w.last_recognition.answer
    assert stats.total == 2 and stats.sources == {"kiosk": 2}
    if answer.in_collection:
        assert dict(stats.top_objects) == {answer.top.instance: 2}
    assert len(kept) == (2 if keep == "all" else 0)
    assert all(k.source == "kiosk" for k in kept)


@pytest.fixture
def small_index(collection, tmp_path):
    """A real index of 3 objects of the sample (changed by the test)."""
    from museum_search.core.index import Index, LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive

    spec = LabellingSpec("catalogue", str(collection / "catalogue.csv"))
    drive(build_index(collection, tmp_path / "index", labelling=spec))
    return Index.load(tmp_path / "index")


def _add(qtbot, queue, row: int, instance: str) -> None:
    _select(queue, [row])
    queue.instance.setCurrentText(instance)
    assert queue.add_button.isEnabled() and instance in queue.add_button.text()
    assert queue.add_selected()
    assert queue.running and queue.cancel_button.isVisibleTo(queue)


def test_this_is_object_x_adds_the_photo_to_the_index_which_then_recognises_it(qtbot, make_tab, small_index,
                                                                                tmp_path, block):
    from museum_search.core.index import Index

    index = small_index
    truth = dict(line.split(",") for line in (SAMPLE / "queries" / "ground_truth.csv").read_text().split()[1:])
    photo = next(SAMPLE / "queries" / q for q, inst in sorted(truth.items()) if inst in index.instances)
    instance = truth[photo.name]
    image = load_image(photo, max_side=1024)
    (answer,) = QueryPipeline(index, QuerySettings()).answer([query_from_array(image, photo.name)])
    policy = KeepPolicy(keep="all")
    with VisitorLog.open(index.path, policy, folder=tmp_path / "visitors") as log:
        kept = [log.record(answer, source="kiosk", image=image) for _ in range(2)]  # asked twice
    state = _state(tmp_path, index, keep="all")
    tab = make_tab(state)
    _wait_read(qtbot, tab)
    queue = tab.queue
    assert [p.id for p in queue.model.photos] == [k.id for k in reversed(kept)]
    before = int((index.labels == instance).sum())
    # cancelled while it runs: the index, the photos and their records stay as they were
    blocked = block(Index, "load")
    _add(qtbot, queue, 0, instance)
    assert blocked.started.wait(60)
    queue.cancel_button.click()
    blocked.release.set()
    qtbot.waitUntil(lambda: not queue.running, timeout=TIMEOUT)
    assert "Cancelled" in queue.progress.status() and state.index is index
    assert Index.load(index.path).descriptors.shape == index.descriptors.shape
    _wait_read(qtbot, tab)
    assert len(queue.model.photos) == 2 and all(Path(p.path).is_file() for p in queue.model.photos)
    # cancelled too late (the update saved, the log being told): the index it saved is opened
    late = block(VisitorLog, "set_status")
    _add(qtbot, queue, 0, instance)
    assert late.started.wait(120)
    queue.cancel_button.click()
    late.release.set()
    qtbot.waitUntil(lambda: state.index is not index and not queue.running, timeout=TIMEOUT)
    assert "already added" in queue.progress.status() and len(state.index) == len(index) + 1
    _wait_read(qtbot, tab)
    # and the other photo, to the end
    assert len(queue.model.photos) == 1
    _add(qtbot, queue, 0, instance)
    qtbot.waitUntil(lambda: not queue.running, timeout=TIMEOUT)
    _wait_read(qtbot, tab)
    new = state.index
    assert len(new) == len(index) + 2 and int((new.labels == instance).sum()) == before + 2
    assert "Added" in queue.progress.status()
    (after,) = QueryPipeline(new, QuerySettings()).answer([query_from_array(image, photo.name)])
    assert after.in_collection and after.top.instance == instance
    added = [r for r in range(len(new)) if new.labels[r] == instance and "visitors" in str(new.abspath(r))]
    assert len(added) == 2 and any(after.verified_inliers.get(r, 0) > 0 for r in added)
    with VisitorLog.open(index.path, policy, folder=tmp_path / "visitors") as log:
        done = log.kept("added")
    assert {d.id for d in done} == {k.id for k in kept} and {d.instance for d in done} == {instance}
    assert queue.model.photos == [] and "(" not in tab.pages.tabText(1)
