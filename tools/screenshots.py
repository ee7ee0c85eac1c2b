"""Screenshots of each tab on real data, for the README (docs/screenshots/*.png).

Run under Xvfb so the window is a real X11 window:

    xvfb-run -s "-screen 0 1440x900x24" python tools/screenshots.py [--data ../shared/data/paintings]

It indexes the paintings references (or opens --index), runs a search with a query photo and an
evaluation of a query set, and grabs the main window at each step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "paintings")
    ap.add_argument("--index", type=Path, default=Path("/tmp/museum-search-screenshots-index"))
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--query-set", default="qsd2_w3")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from PySide6.QtWidgets import QApplication

    from museum_search.core.indexing import build_index
    from museum_search.core.progress import drive
    from museum_search.gui import workers
    from museum_search.gui.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    if not (args.index / "manifest.json").is_file():
        print("indexing", args.data / "references", flush=True)
        drive(build_index(args.data / "references", args.index))
    win = MainWindow()
    win.resize(1400, 860)
    win.show()

    def pump(seconds: float, until=None) -> None:
        end = time.time() + seconds
        while time.time() < end:
            app.processEvents()
            if until is not None and until():
                break
            time.sleep(0.02)

    def shot(name: str) -> None:
        pump(0.8)
        path = args.out / f"{name}.png"
        win.grab().save(str(path))
        print("saved", path, flush=True)

    assert win.open_index(args.index)
    pump(3)
    win.tabs.setCurrentWidget(win.collection_tab)
    pump(4)
    shot("collection")

    win.tabs.setCurrentWidget(win.search_tab)
    query = sorted((args.data / "queries" / args.query_set).glob("*.jpg"))[2]
    win.search_tab.search_file(str(query))
    pump(120, until=lambda: bool(win.search_tab.results()) and not win.search_tab.is_busy())
    pump(4)
    shot("search")

    tab = win.evaluation_tab
    win.tabs.setCurrentWidget(tab)
    tab.load_queryset_path(args.data / "queries" / args.query_set)
    tab.rerank.set_names([])  # the unverified baseline first
    tab.rerank.set_verify(False)
    tab.run_evaluation()
    pump(1800, until=lambda: not tab.is_running())
    tab.rerank.set_names([])  # then the default pipeline: verified answers
    tab.rerank.set_verify(True)
    tab.run_evaluation()
    pump(1800, until=lambda: not tab.is_running())
    tab.queries.select_row(0)
    pump(4)
    shot("evaluation")
    workers.wait_all()
    win.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
