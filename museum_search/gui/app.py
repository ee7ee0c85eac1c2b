"""Entry point of the desktop application (``museum-search-gui`` / ``museum-search gui``).

The window shows first; what it runs on loads behind it (:mod:`.main_window`): the tabs' modules on a
thread, the index given on the command line and the network on workers. Neither torch nor ONNX
Runtime is imported before the window shows (``bench/bench_startup.py`` measures the start).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Sequence

from museum_search.gui import INTERRUPTED, exit_interrupted


def main(argv: Sequence[str] | None = None, *, engine: str | None = None) -> int:
    """The application (or with ``--demo`` the kiosk) until it is left. ``engine``: the inference engine of
    this session (``museum-search gui --engine``; None: the one stored in the app's Settings)."""
    parser = argparse.ArgumentParser(prog="museum-search-gui", description="museum-search desktop application")
    parser.add_argument("index", nargs="?", type=Path, help="index folder to open")
    parser.add_argument("--demo", action="store_true", help="start the full-screen kiosk on INDEX")
    parser.add_argument("--camera", type=int, default=None, help="camera number for the demo")
    parser.add_argument("--sample", action="store_true",
                        help="open the bundled sample collection (indexed on first start)")
    parser.add_argument("--version", action="store_true")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.version:
        from museum_search import __version__

        print(f"museum-search {__version__}")
        return 0

    if args.demo and args.index is None:
        parser.error("--demo needs an INDEX")
    # until the app's own handler: before the window exists nothing has begun
    previous = signal.signal(signal.SIGINT, exit_interrupted)
    try:
        app = _application()
        ticker = _interrupt_quits(app)
        try:
            return _run_demo(app, args, engine) if args.demo else _run_main(app, args, engine)
        finally:
            ticker.stop()
    finally:  # the caller's handler again (a test process, a script calling main)
        signal.signal(signal.SIGINT, previous)


def _run_main(app, args, engine: str | None) -> int:
    """The main window until it is closed (opening ``args.index``, the sample or the last index)."""
    from museum_search.gui.main_window import MainWindow
    from museum_search.gui.state import AppState

    window = MainWindow(AppState(engine=engine), lazy=True)
    window.show()
    if args.index is not None:
        window.state.status.emit(f"Opening the index {args.index}…")
        window.when_ready(lambda: window.open_index_in_background(args.index))
    elif args.sample:
        window.when_ready(lambda: window.collection_tab.open_sample_collection())
    else:  # a plain start: where the last session left off
        window.when_ready(window.reopen_last_index)
    return app.exec()


def _application():
    """The QApplication (the engine and the matcher are the session's settings: :class:`.state.AppState`).

    torch is not imported here: where it is needed (the torch engine, a first ONNX export), a worker
    imports it behind the window, which then stalls for 1-3 s once instead of every start waiting
    9-17 s for it."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    QApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("museum-search")
    app.setOrganizationName("museum-search")
    from museum_search.gui.main_window import app_icon

    app.setWindowIcon(app_icon())
    return app


def _interrupt_quits(app):
    """Ctrl-C in the terminal the app was started from ends it as the CLI ends: what runs is cancelled
    (each window closes as on Quit, without asking; the kiosk as when staff leave), one line is
    printed, and the exit code is 130. Qt's event loop runs no Python, so a timer lets Python look at
    its signals every 0.2 s; a second Ctrl-C while closing is ignored."""
    from PySide6.QtCore import QTimer

    hit: list[bool] = []

    def quit_now() -> None:
        print(INTERRUPTED, file=sys.stderr, flush=True)
        for w in app.topLevelWidgets():
            if w.isVisible():
                if hasattr(w, "_quit_confirmed"):
                    w._quit_confirmed = True  # the main window: quit without asking, its jobs cancelled
                if type(w).__name__ == "DemoWindow":
                    w.shutdown()  # the kiosk: as when staff leave it
                w.close()
        app.exit(130)

    def on_interrupt(_signum, _frame) -> None:
        if not hit:
            hit.append(True)
            QTimer.singleShot(0, quit_now)

    signal.signal(signal.SIGINT, on_interrupt)
    ticker = QTimer(app)
    ticker.setObjectName("interruptTicker")
    ticker.timeout.connect(lambda: None)
    ticker.start(200)
    return ticker


def _run_demo(app, args, engine: str | None = None) -> int:
    """The kiosk on ``args.index`` (full screen) until it is left, its network on ``engine`` (None: the
    stored setting's)."""
    from PySide6.QtWidgets import QWidget

    from museum_search.gui import upgrade
    from museum_search.gui.demo_window import DemoWindow
    from museum_search.gui.main_window import app_icon
    from museum_search.gui.state import Settings

    settings = Settings()
    engine = engine or settings.engine
    if args.camera is not None:
        settings.camera = args.camera
    windows = []

    def opened(index) -> None:
        app.setQuitOnLastWindowClosed(True)
        windows.append(DemoWindow(index, settings, engine=engine))
        windows[-1].showFullScreen()

    # An index of an older format is offered for conversion first. Until the kiosk shows, closing a
    # dialog must not end the application; if the index cannot be opened, it ends once the error
    # has been read (there is no window to go back to).
    app.setQuitOnLastWindowClosed(False)
    host = QWidget()  # never shown: owns the dialogs shown before the kiosk (else they are freed at once)
    host.setWindowIcon(app_icon())
    upgrade.open_index(host, args.index, opened, on_failed=lambda: _quit_after_errors(app))
    code = app.exec()
    host.deleteLater()
    return code


def _quit_after_errors(app) -> None:
    """Quit once no error dialog is open (the kiosk could not open its index)."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QMessageBox

    boxes = [w for w in app.topLevelWidgets()
             if isinstance(w, QMessageBox) and w.objectName() == "errorDialog" and not w.isHidden()]
    if not boxes:
        QTimer.singleShot(0, app.quit)
    for box in boxes:
        box.finished.connect(lambda _r: _quit_after_errors(app))


if __name__ == "__main__":
    raise SystemExit(main())
