"""The views let go of what they no longer show (issue 13, item 6; ``bench/bench_session.py``):
finished jobs are freed with what their callbacks hold, the Search tab keeps one result dialog,
and the Evaluation tab's older runs keep only the top of their rankings. No network: the sample
photos are described by their mean colour."""

from __future__ import annotations

import csv
import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QSettings
from PySide6.QtWidgets import QApplication

from museum_search.core import memory
from museum_search.core.images import load_image
from museum_search.core.index._catalogue import Item
from museum_search.core.index._store import Index
from museum_search.core.inference._backbones import BackboneMeta, DescriptorExtractor
from museum_search.gui import workers
from museum_search.gui.state import AppState, Settings

pytestmark = pytest.mark.gui

SAMPLE = Path(__file__).resolve().parents[1] / "resources" / "sample"


class MeanColour(DescriptorExtractor):
    """A network stand-in: the mean colour of the input (and a constant), L2-normalized."""

    engine = "test"

    def _run(self, batch: np.ndarray) -> np.ndarray:
        m = batch.mean(axis=(2, 3))
        x = np.concatenate([m, np.full((len(m), 1), 0.5, np.float32)], axis=1).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def sample():
    """The sample collection as an index of mean colours, its queries and the stand-in network."""
    meta = BackboneMeta(name="mean-colour", weights_id="none", head="gem", input_policy="longest_side", size=32,
                        scales=(1.0,), gem_p=3.0, dim=4, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    ext = MeanColour(meta)
    with open(SAMPLE / "catalogue.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    root = SAMPLE / "collection"
    items = [Item(r["file"], (root / r["file"]).stat().st_size, 0.0, r["instance"], {"title": r["title"]})
             for r in rows]
    desc = ext.embed_images([load_image(root / it.path, max_side=64) for it in items])
    return Index(root, meta, items, desc), SAMPLE / "queries", ext


def _settings(tmp_path) -> Settings:
    return Settings(QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat))


def test_finished_jobs_are_freed_with_what_their_callbacks_hold(qtbot):
    class Photo:  # stands for the query photo a search job's callbacks close over
        pass

    refs = []
    for kind in ("function", "generator"):
        photo = Photo()
        refs.append(weakref.ref(photo))
        results = []

        def gen(photo=photo):
            yield 1
            return photo

        job = workers.start((lambda photo=photo: photo) if kind == "function" else gen(),
                            on_result=lambda value, photo=photo: results.append(value is photo))  # noqa: B023 - called in this iteration
        qtbot.waitUntil(lambda: not job.running, timeout=10_000)  # noqa: B023, F821 - this iteration's job, deleted below on purpose
        assert results == [True]
        del photo, job, gen
    qtbot.wait(50)  # the release runs when the event loop is idle
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_search_tab_keeps_one_result_dialog(qtbot, tmp_path, sample):
    from museum_search.gui.search_tab import ResultDialog, SearchTab
    from museum_search.gui.widgets.query_page import ranked_results

    index = sample[0]
    tab = SearchTab(AppState(_settings(tmp_path)))
    qtbot.addWidget(tab)
    results = ranked_results(index, np.arange(4), np.linspace(1, 0.5, len(index)).astype(np.float32))
    for r in results:  # a user opening one result after another
        dialog = tab.show_result_dialog(r)
        qtbot.waitUntil(lambda dialog=dialog: not dialog.is_busy(), timeout=10_000)
        dialog.reject()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert tab.findChildren(ResultDialog) == [tab._dialog] and tab._dialog.result == results[-1]
    tab.shutdown()


def test_evaluation_tab_keeps_the_newest_runs_whole(qtbot, tmp_path, sample, monkeypatch):
    from museum_search.core.evaluation import _runner as runner
    from museum_search.gui.evaluation_tab import EvaluationTab

    index, queries, ext = sample
    monkeypatch.setattr(runner, "extractor_for_meta", lambda meta, weights=None, engine=None: ext)
    monkeypatch.setattr(memory, "RUNS_KEPT_WHOLE", 2)
    monkeypatch.setattr(memory, "RANKS_KEPT", 10)
    state = AppState(_settings(tmp_path))
    state.set_index(index)
    tab = EvaluationTab(state)
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    tab.show()
    assert tab.load_queryset_path(queries)
    tab.rerank.set_names([])
    tab.rerank.set_verify(False)
    shown = summary = None
    for n in range(4):
        with qtbot.waitSignal(tab.run_finished, timeout=120_000):
            assert tab.run_evaluation()
        qtbot.waitUntil(lambda: not tab.is_running(), timeout=30_000)
        if n == 0:
            tab.queries.select_row(0)
            shown = (tab.queries.query_info.text(), [c.result.path for c in tab.queries.result_grid.cards()])
            summary = dict(tab.runs[0].report.summary)
    assert len(tab.runs) == 4
    lengths = [{len(rec.ranking) for rec in run.report.records} for run in tab.runs]
    assert lengths == [{10}, {10}, {len(index)}, {len(index)}]
    assert all(len(rec.relevance) == len(index) for run in tab.runs for rec in run.report.records)
    # the oldest run still shows the same figures and the same top results
    tab.select_run(tab.runs[0])
    tab.queries.select_row(0)
    assert tab.runs[0].report.summary == summary
    assert (tab.queries.query_info.text(), [c.result.path for c in tab.queries.result_grid.cards()]) == shown
    tab.shutdown()
    assert workers.wait_all(30_000)
