"""``museum-search stats`` (issue 34, item 2): the figures of the visitor log's counts, as text,
``--json`` and ``--csv``, the same as core's; a reader never makes a log."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta

from test_visitors_store import answer

from museum_search.core.visitors import KeepPolicy, VisitorLog

DAY = datetime(2026, 11, 27, 10, 0)


def stats_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "museum_search", "stats", *args], capture_output=True, text=True,
                          timeout=300)


def test_stats_prints_what_core_counts(sample_index, tmp_path):
    index, folder = sample_index.path, tmp_path / "visitors"
    r = stats_cli(str(index), "--visitors", str(folder))
    assert r.returncode == 1 and "no visitor log" in r.stderr and not folder.exists()  # a reader makes nothing
    with VisitorLog.open(index, KeepPolicy(), folder=folder) as log:
        for k in range(30):
            inst = ("rose_window", "twelve_suns", None)[k % 3]
            log.record(answer(inst, 0.97 if inst else 0.1), source=("kiosk", "phone")[k % 2],
                       language=("fr", "en")[k % 2], when=DAY + timedelta(hours=k % 7, days=k // 20))
        want = log.stats().to_dict()
    r = stats_cli(str(index), "--visitors", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert {k: got[k] for k in want} == json.loads(json.dumps(want))
    assert got["total"] == 30 and got["not_recognised"] == 10
    r = stats_cli(str(index), "--visitors", str(folder), "--csv", str(tmp_path / "counts.csv"))
    assert r.returncode == 0, r.stderr
    assert "30 question(s) in all; 10 not recognised (33%)" in r.stdout
    assert "    10  rose_window" in r.stdout and "2026-11-28" in r.stdout
    rows = (tmp_path / "counts.csv").read_text().splitlines()
    assert sum(int(x.rsplit(",", 1)[1]) for x in rows[1:]) == 30
    r = stats_cli(str(index), "--visitors", str(folder), "--csv", str(tmp_path / "counts.csv"))
    assert r.returncode == 1 and "exists already" in r.stderr  # never over a file
