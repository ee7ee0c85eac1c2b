"""The desktop application (PySide6 + pyqtgraph): views over :mod:`museum_search.core`."""

import os as _os
import signal as _signal
import sys as _sys
import threading as _threading

#: what a Ctrl-C in the terminal prints before the app ends with exit code 130
INTERRUPTED = "museum-search: interrupted (Ctrl-C); the running work was cancelled and nothing was changed"


def exit_interrupted(_signum=None, _frame=None) -> None:
    """Ctrl-C before the app's own handler (:func:`museum_search.gui.app.main`): nothing has begun,
    so the process ends at once, with the one line and exit code 130. Not by raising: a
    KeyboardInterrupt or SystemExit raised while PySide6 is imported or inside a Qt call is lost or
    fatal (a SIGINT 0.06-0.1 s after the start gave a traceback, an abort, or the app going on with
    the Ctrl-C lost)."""
    print(INTERRUPTED, file=_sys.stderr, flush=True)
    _os._exit(130)


# PySide6 loads here: a Ctrl-C meanwhile ends the process (when no one else handles it), then the
# caller's handler is back
_default = (_threading.current_thread() is _threading.main_thread()
            and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler)
if _default:
    _signal.signal(_signal.SIGINT, exit_interrupted)
try:
    from museum_search.gui.compat import guard_bool_refcounts

    guard_bool_refcounts()  # before any signal is emitted (see compat)
finally:
    if _default:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
