"""Start-up of the desktop application: seconds to a usable window, as a ratio to starting Python
and importing Qt's widgets (``python -c "import PySide6.QtWidgets"``), measured in the same run.

Each start runs the app's entry (``museum_search.gui.app.main``) in a fresh process under
``QT_QPA_PLATFORM=offscreen``, with a probe in front of it: the probe wraps ``QApplication.exec`` so
that a zero-delay timer fires at the event loop's first idle turn after the main window was shown
(``usable_s``, the number the target is about). A 10 ms timer then runs until the window has built
its Collection and Search tabs (``tabs_s``; where the app builds every tab before it shows, the
same as ``usable_s``; the Evaluation tab is built when first chosen), opened the index given
(``index_s``) and loaded its network
(``network_s``, only where the app loads the network before the first search), or ``--watch``
seconds have passed; its longest gap is the GUI thread's longest stall during that loading
(``stall_ms``). All times are wall-clock seconds from the moment the process was started, so the
interpreter's own start is included, as it is in the baseline.

Every start has its own settings folder (``XDG_CONFIG_HOME``) so no window geometry nor recent index
is shared with the user's. Starts of the trees compared and of the baseline are interleaved, round
by round, so that they share the machine's load.

Usage (the "before" from a worktree of the commit before the change, never the main checkout's HEAD):

    git worktree add /tmp/wt-startup <commit>
    .venv/bin/python bench/bench_startup.py --tree before=/tmp/wt-startup --tree after=. --runs 5

``--index`` names an index to open in the ``index`` scenario; without it the bundled sample
collection is indexed once (a few minutes) into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: Run in the child, in front of the app: reports the marks as one JSON line, then ends the process.
PROBE = r'''
import json, os, sys, time
T0 = float(os.environ["STARTUP_T0"])
WATCH = float(os.environ["STARTUP_WATCH"])
WANT_INDEX = os.environ.get("STARTUP_WANT_INDEX") == "1"
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow

_exec = QApplication.exec
result = {}
keep = []


def window():
    shown = [w for w in QApplication.topLevelWidgets() if isinstance(w, QMainWindow) and w.isVisible()]
    return shown[0] if shown else None


def finish():
    import museum_search
    result["module"] = museum_search.__file__
    print("STARTUP " + json.dumps(result), flush=True)
    os._exit(0)


def first_idle():
    result["usable_s"] = time.time() - T0
    w = window()
    result["window_shown"] = w is not None
    result["heavy_at_usable"] = sorted(m for m in ("torch", "torchvision", "onnxruntime", "faiss", "scipy",
                                                   "pyqtgraph") if m in sys.modules)
    clock = {"last": time.perf_counter(), "gap": 0.0}

    def tick():
        now = time.perf_counter()
        clock["gap"] = max(clock["gap"], now - clock["last"])
        clock["last"] = now
        t = time.time() - T0
        w = window()
        if w is not None:
            if "tabs_s" not in result and getattr(w, "ready", True):
                result["tabs_s"] = t
            state = getattr(w, "state", None)
            if "index_s" not in result and state is not None and state.index is not None:
                result["index_s"] = t
            net = getattr(w, "network", None)
            if "network_s" not in result and net is not None and net.ready:
                result["network_s"] = t
            has_net = net is not None
        else:
            has_net = False
        wanted = ["tabs_s"] + (["index_s"] + (["network_s"] if has_net else []) if WANT_INDEX else [])
        if all(k in result for k in wanted) or t - result["usable_s"] > WATCH:
            result["stall_ms"] = max(0.0, clock["gap"] - 0.010) * 1000
            result["complete"] = all(k in result for k in wanted)
            finish()

    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(tick)
    timer.start()
    keep.append(timer)


def probe_exec(*_args):
    QTimer.singleShot(0, first_idle)
    return _exec()


QApplication.exec = probe_exec
from museum_search.gui.app import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
'''


def _env(tree: Path, config: Path, watch: float, want_index: bool) -> dict:
    env = dict(os.environ)
    env.update(QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(config), PYTHONPATH=str(tree),
               STARTUP_WATCH=str(watch), STARTUP_WANT_INDEX="1" if want_index else "0")
    env.pop("MUSEUM_SEARCH_ENGINE", None)
    return env


def start_app(tree: Path, argv: list[str], config: Path, watch: float) -> dict:
    env = _env(tree, config, watch, want_index=bool(argv))
    env["STARTUP_T0"] = repr(time.time())
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=watch + 180)
    for line in proc.stdout.splitlines():
        if line.startswith("STARTUP "):
            return json.loads(line[len("STARTUP "):])
    raise RuntimeError(f"no result from the app in {tree} (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


def start_qt(tree: Path) -> float:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "import PySide6.QtWidgets"], cwd=tree, check=True,
                   env=dict(os.environ, PYTHONPATH=str(tree)))
    return time.time() - t0


def sample_index(folder: Path) -> Path:
    out = folder / "sample-index"
    if not (out / "manifest.json").is_file():
        sample = ROOT / "resources" / "sample"
        print(f"indexing the sample collection into {out} (once)…", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "museum_search", "index", str(sample / "collection"), "-o", str(out),
                        "--labels", "catalogue", "--catalogue", str(sample / "catalogue.csv")], cwd=ROOT, check=True)
    return out


def _stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                    help="a checkout to start (repeat: before=/tmp/wt-startup after=.); default after=.")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--index", type=Path, help="index for the 'index' scenario (default: the sample, indexed once)")
    ap.add_argument("--watch", type=float, default=60.0, help="longest wait for the loading after the window shows")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "startup.json")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in (args.tree or ["after=."]))
    trees = {name: Path(path).resolve() for name, path in trees.items()}
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    index = (args.index or sample_index(Path(tempfile.gettempdir()) / "bench-startup-cache")).resolve()
    scenarios = {"empty": [], "index": [str(index)]}
    runs: dict = {name: {s: [] for s in scenarios} for name in trees}
    qt: list[float] = []
    for r in range(args.runs):
        for name, tree in trees.items():
            for scenario, argv in scenarios.items():
                config = work / f"config-{name}-{scenario}-{r}"
                config.mkdir(parents=True)
                res = start_app(tree, argv, config, args.watch)
                runs[name][scenario].append(res)
                print(f"round {r + 1} {name:>8} {scenario:>5}: usable {res['usable_s']:.2f} s, "
                      f"tabs {res.get('tabs_s', float('nan')):.2f} s, index {res.get('index_s', float('nan')):.2f} s, "
                      f"network {res.get('network_s', float('nan')):.2f} s, stall {res['stall_ms']:.0f} ms, "
                      f"heavy at usable: {', '.join(res['heavy_at_usable']) or '-'}", file=sys.stderr)
        qt.append(start_qt(ROOT))
        print(f"round {r + 1} python -c 'import PySide6.QtWidgets': {qt[-1]:.2f} s", file=sys.stderr)
    qt_median = statistics.median(qt)
    summary: dict = {}
    for name in trees:
        summary[name] = {}
        for scenario in scenarios:
            rs = runs[name][scenario]
            entry: dict = {}
            for key in ("usable_s", "tabs_s", "index_s", "network_s"):
                values = [x[key] for x in rs if key in x]
                if values:
                    entry[key] = _stats(values)
                    entry[key.replace("_s", "_ratio_to_qt")] = statistics.median(values) / qt_median
            entry["longest_stall_ms"] = _stats([x["stall_ms"] for x in rs])
            entry["heavy_modules_at_usable"] = sorted({m for x in rs for m in x["heavy_at_usable"]})
            entry["all_loaded_within_watch"] = all(x.get("complete") for x in rs)
            summary[name][scenario] = entry
    result = {
        "what": "seconds from process start to the main window shown with the event loop idle (usable_s), "
                "to its Collection and Search tabs built (tabs_s; the Evaluation tab is built when first "
                "chosen), to the index given open (index_s) and to its network loaded "
                "(network_s: only where the app loads it before the first search); ratio = median / median "
                "of python -c 'import PySide6.QtWidgets' in the same run; offscreen Qt, fresh settings",
        "command": "python bench/bench_startup.py " + " ".join(f"--tree {n}={p}" for n, p in trees.items())
                   + f" --runs {args.runs}",
        "machine": {"cpus": os.cpu_count(), "load_avg_at_end": list(os.getloadavg()), "python": platform.python_version()},
        "index": str(index),
        "qt_import_s": _stats(qt),
        "trees": {n: str(p) for n, p in trees.items()},
        "results": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({n: {s: {k: v["median"] if isinstance(v, dict) and "median" in v else v
                              for k, v in e.items() if not k.startswith("heavy")}
                          for s, e in sc.items()} for n, sc in summary.items()}, indent=1))
    print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
