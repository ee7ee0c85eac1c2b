"""Ctrl-C in the terminal the app was started from (issue 33, item 3: "in the GUI too"): the app
ends with exit code 130 and one line, never an abort or a traceback, whatever it is doing: starting,
preparing the network for this computer, indexing the sample collection, or idle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

START_SAMPLE = "from museum_search.gui.app import main; raise SystemExit(main(['--sample']))"


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.3, 3.0, 7.0, 14.0])
def test_ctrl_c_ends_the_app_with_130_at_any_moment(tmp_path, delay):
    """A fresh home, started on the sample: at 0.3 s Python is still importing, later the network is
    being prepared or the sample indexed. The whole process group gets the SIGINT, as from a terminal."""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"),
               XDG_DATA_HOME=str(tmp_path / "data"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", START_SAMPLE], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(delay)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted (Ctrl-C)" in err
    for bad in ("Traceback", "Fatal Python error", "terminate called", "FATAL", "Aborted"):
        assert bad not in err, err[-2000:]
