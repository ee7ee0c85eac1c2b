"""Screenshots of every tab on real data, for the README and for looking at the app.

Run under Xvfb so the window is a real X11 window:

    xvfb-run -s "-screen 0 1600x1000x24" python tools/screenshots.py [--data ../shared/data/paintings]

At each window size (``--sizes``, default 1024x700 and 1600x1000) it grabs:

* ``collection-build``: the Collection tab during a build of the paintings references;
* ``collection``: the Collection tab on the built index;
* ``search-painting`` / ``evidence-painting``: a painting query and its evidence view;
* ``search-sample`` / ``evidence-sample``: a photo of the bundled sample collection and its evidence
  view (framed references on a wall);
* ``evaluation-running``: the Evaluation tab during a run;
* ``evaluation``, ``evaluation-compare``, ``evaluation-verdict``: after two runs, on the Queries
  (a query row selected), Compare runs and Verdict pages;
* ``kiosk-no-camera``: the kiosk on the sample collection with a phone link set and no camera (the
  QR code under the message);
* ``settings-long-message``: the Settings dialog after OK with a phone link a phone cannot open.

``--only NAME …`` takes some of the steps (build, collection, search, evaluation, kiosk, settings).

Files go to ``--out/<W>x<H>/<name>.png``; ``--readme`` also copies the 1600x1000 collection, search
and evaluation shots to ``--out/<name>.png`` (the README's pictures). The sample collection's index is
built in a temporary folder (``XDG_DATA_HOME`` is pointed there): no user file is touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README_SHOTS = ("collection", "search-painting", "evaluation")
STEPS = {"build": "build", "collection": "collection", "search": "search_painting search_sample",
         "evaluation": "evaluation", "kiosk": "kiosk", "settings": "settings"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "paintings")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "museum-search-screenshots")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--query-set", default="qsd2_w3")
    ap.add_argument("--sizes", nargs="+", default=["1024x700", "1600x1000"])
    ap.add_argument("--readme", action="store_true", help="also refresh the README's pictures")
    ap.add_argument("--only", nargs="+", choices=list(STEPS), help="only these steps")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ["XDG_DATA_HOME"] = str(args.work / "xdg-data")  # the sample index goes there

    from PySide6.QtWidgets import QApplication

    from museum_search.core import paths
    from museum_search.core.index._store import LabellingSpec
    from museum_search.core.jobs._indexing import build_index
    from museum_search.core.progress import drive

    app = QApplication(sys.argv[:1])
    index = args.work / "paintings-index"
    if not (index / "manifest.json").is_file():
        print("indexing", args.data / "references", flush=True)
        drive(build_index(args.data / "references", index))
    sample = paths.sample_collection()
    sample_index = args.work / "sample-index"
    if not (sample_index / "manifest.json").is_file():
        print("indexing the sample collection", flush=True)
        drive(build_index(sample / "collection", sample_index,
                          labelling=LabellingSpec("catalogue", str(sample / "catalogue.csv"))))

    failures = 0
    for size in args.sizes:
        w, h = (int(v) for v in size.lower().split("x"))
        out = args.out / f"{w}x{h}"
        out.mkdir(parents=True, exist_ok=True)
        failures += Session(app, args, w, h, out, index, sample_index).run()
    if args.readme:
        for name in README_SHOTS:
            src = args.out / "1600x1000" / f"{name}.png"
            if src.is_file():
                shutil.copyfile(src, args.out / f"{name.split('-')[0]}.png")
    return 1 if failures else 0


class Session:
    """One window at one size, walked through every tab."""

    def __init__(self, app, args, w: int, h: int, out: Path, index: Path, sample_index: Path):
        self.app, self.args, self.w, self.h, self.out = app, args, w, h, out
        self.index, self.sample_index = index, sample_index

    def pump(self, seconds: float, until=None) -> bool:
        end = time.time() + seconds
        while time.time() < end:
            self.app.processEvents()
            if until is not None and until():
                return True
            time.sleep(0.02)
        return until is None

    def shot(self, widget, name: str, settle: float = 0.8) -> None:
        self.pump(settle)
        path = self.out / f"{name}.png"
        widget.grab().save(str(path))
        print("saved", path, flush=True)

    def run(self) -> int:
        from museum_search.gui import workers
        from museum_search.gui.main_window import MainWindow

        self.win = MainWindow()
        self.win.resize(self.w, self.h)
        self.win.move(0, 0)
        self.win.show()
        self.pump(2)
        failures = 0
        names = [n for key in (self.args.only or STEPS) for n in STEPS[key].split()]
        for step in (getattr(self, n) for n in names):
            try:
                step()
            except Exception:  # one broken step must not lose the others' pictures
                traceback.print_exc()
                failures += 1
        workers.wait_all()
        self.win.close()
        self.pump(1)
        return failures

    def build(self) -> None:
        tab = self.win.collection_tab
        self.win.tabs.setCurrentWidget(tab)
        tab.set_collection(self.args.data / "references")
        target = self.args.work / f"build-{self.w}x{self.h}"
        shutil.rmtree(target, ignore_errors=True)  # our own scratch folder under --work
        tab._set_index_dir(target)
        if not tab.start_build():
            raise RuntimeError("the build did not start")
        # wait until the build is past loading the network and into the photos
        line = tab.progress.item_label  # the one progress line: step, count, the whole build's time left
        self.pump(300, until=lambda: tab.running and "Step 2" in line.full_text() and " left" in line.text())
        self.shot(self.win, "collection-build", settle=0.1)
        tab.cancel()
        self.pump(60, until=lambda: not tab.running)

    def collection(self) -> None:
        assert self.win.open_index(self.index)
        self.pump(5)
        self.win.tabs.setCurrentWidget(self.win.collection_tab)
        self.shot(self.win, "collection")

    def _search(self, index: Path, query: Path, name: str) -> None:
        tab = self.win.search_tab
        assert self.win.open_index(index)
        self.pump(5)
        self.win.tabs.setCurrentWidget(tab)
        tab.search_file(str(query))
        self.pump(180, until=lambda: bool(tab.results()) and not tab.is_busy())
        self.pump(2)
        self.shot(self.win, f"search-{name}")
        dialog = tab.show_result_dialog(tab.results()[0])
        dialog.resize(min(self.w, 1400), min(self.h, 900))
        self.pump(30, until=lambda: dialog.evidence_view.evidence() is not None)
        self.shot(dialog, f"evidence-{name}")
        dialog.close()

    def search_painting(self) -> None:
        query = sorted((self.args.data / "queries" / self.args.query_set).glob("*.jpg"))[2]
        self._search(self.index, query, "painting")

    def search_sample(self) -> None:
        from museum_search.core import paths

        photos = sorted((paths.sample_collection() / "queries").rglob("*.jpg"))
        self._search(self.sample_index, photos[0], "sample")

    def evaluation(self) -> None:
        assert self.win.open_index(self.index)
        self.pump(5)
        tab = self.win.evaluation_tab
        self.win.tabs.setCurrentWidget(tab)
        tab.load_queryset_path(self.args.data / "queries" / self.args.query_set)
        tab.rerank.set_names([])  # the unverified baseline first
        tab.rerank.set_verify(False)
        tab.run_evaluation()
        bar = tab.progress_panel.bar
        self.pump(60, until=lambda: tab.is_running() and 5 <= bar.value() < bar.maximum() - 5)
        self.shot(self.win, "evaluation-running", settle=0)
        self.pump(1800, until=lambda: not tab.is_running())
        tab.rerank.set_names([])  # then the default pipeline: verified answers
        tab.rerank.set_verify(True)
        tab.run_evaluation()
        self.pump(1800, until=lambda: not tab.is_running())
        tab.queries.select_row(0)
        self.shot(self.win, "evaluation")
        tab.pages.setCurrentWidget(tab.compare)
        self.shot(self.win, "evaluation-compare")
        tab.pages.setCurrentWidget(tab.verdict_page)
        self.shot(self.win, "evaluation-verdict")
        tab.pages.setCurrentWidget(tab.queries)

    def kiosk(self) -> None:
        """The kiosk without a camera, a phone link set (throw-away settings): the QR code under the message."""
        from PySide6.QtCore import QSettings

        from museum_search.core.index import Index
        from museum_search.gui.demo_window import DemoWindow
        from museum_search.gui.state import QR_URL_SETTING, Settings

        settings = Settings(QSettings(str(self.args.work / "kiosk-settings.ini"), QSettings.Format.IniFormat))
        settings.set_value(QR_URL_SETTING, "http://192.168.1.20:8000/")

        def no_camera(_number):
            raise OSError("no camera (screenshot)")

        kiosk = DemoWindow(Index.load(self.sample_index), settings, no_camera)
        kiosk.resize(self.w, self.h)
        kiosk.move(0, 0)
        kiosk.show()
        self.pump(120, until=lambda: kiosk.mode == "error" and kiosk.message_page.phone_qr.isVisible())
        self.shot(kiosk, "kiosk-no-camera")
        kiosk.shutdown()
        kiosk.close()

    def settings(self) -> None:
        """Settings after OK with a phone link only this computer can open: the dialog grows to say why."""
        from museum_search.gui.main_window import SettingsDialog

        dialog = SettingsDialog(self.win.state, self.win)
        dialog.show()
        self.pump(1)
        dialog.qr_url.setText("http://127.0.0.1:8000/")
        dialog.accept()  # refused: nothing is saved
        self.shot(dialog, "settings-long-message")
        dialog.reject()


if __name__ == "__main__":
    raise SystemExit(main())
