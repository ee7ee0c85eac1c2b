"""The fuzzer of ``tests/test_fuzz_inputs.py`` run longer than CI runs it, with fresh random inputs.

CI runs each target with its base number of examples, derandomized (the same inputs every run,
about 20 s in all). This runs them ``--scale`` times as long with Hypothesis' random inputs (a new
sample each run), and reports per target: inputs tried, inputs accepted (answered rather than
refused), seconds, and whether the property held (a failure prints Hypothesis' minimal input).

The web API's fuzzer (``tests/test_fuzz_api.py``: /api/identify and every route, on a live app of the
sample index) runs too, with ``FUZZ_EXAMPLES`` = ``--scale`` × its CI count (200 per target).

Usage: ``python bench/bench_fuzz.py [--scale 20] [-k TARGET]``; writes ``bench/results/fuzz.json``
(and ``fuzz.log``, pytest's whole output, when a property failed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=20.0, help="examples per target, times CI's (default 20)")
    ap.add_argument("-k", default=None, help="only the targets whose name matches (pytest -k)")
    args = ap.parse_args()
    if args.scale == 1:
        args.scale = 1.001  # scale 1 is CI's derandomized run; this bench always draws fresh inputs
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "fuzz.jsonl"
        env = dict(os.environ, MUSEUM_SEARCH_FUZZ_SCALE=str(args.scale), MUSEUM_SEARCH_FUZZ_LOG=str(log))
        cmd = [sys.executable, "-m", "pytest", "tests/test_fuzz_inputs.py", "-q", "-p", "no:cacheprovider",
               "-W", "ignore::UserWarning", *(["-k", args.k] if args.k else [])]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        targets = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        api, api_proc = _api_fuzz(args)
        targets += api
        wall = time.perf_counter() - t0
    failed = [line for line in proc.stdout.splitlines() + api_proc.stdout.splitlines() if line.startswith("FAILED")]
    print(f"{'target':<40} {'inputs':>8} {'accepted':>9} {'seconds':>8}")
    for t in targets:
        accepted = "-" if t["accepted"] is None else t["accepted"]
        print(f"{t['target']:<40} {t['inputs']:>8} {accepted:>9} {t['seconds']:>8.1f}")
    print(f"{sum(t['inputs'] for t in targets)} inputs in {wall:.0f} s; "
          + (f"{len(failed)} target(s) FAILED:" if failed else "every property held"))
    for line in failed:
        print("  " + line)
    out = REPO / "bench" / "results" / "fuzz.json"
    if failed:  # Hypothesis' report of each failure (its minimal input) in full beside the figures
        out.with_suffix(".log").write_text(proc.stdout + proc.stderr + api_proc.stdout + api_proc.stderr,
                                           encoding="utf-8")
        print(f"the failures in full: {out.with_suffix('.log')}")
    out.write_text(json.dumps({"scale": args.scale, "seconds": round(wall, 1), "targets": targets,
                               "failed": failed, "load": os.getloadavg()}, indent=1) + "\n")
    print(f"written to {out}")
    return 1 if failed or proc.returncode not in (0, 5) or api_proc.returncode not in (0, 5) else 0


#: inputs per web-API target in CI (tests/test_fuzz_api.py's default FUZZ_EXAMPLES)
API_EXAMPLES = 200


def _api_fuzz(args) -> tuple[list[dict], subprocess.CompletedProcess]:
    """The web API's fuzzer at ``--scale`` × CI's inputs: one row per target (its inputs are the
    examples asked for; its seconds the test's own call time, without building the sample index)."""
    examples = max(1, int(API_EXAMPLES * args.scale))
    env = dict(os.environ, FUZZ_EXAMPLES=str(examples), CI="true")
    cmd = [sys.executable, "-m", "pytest", "tests/test_fuzz_api.py", "-q", "-p", "no:cacheprovider",
           "--durations=0", "--durations-min=0", "-W", "ignore::DeprecationWarning",
           *(["-k", args.k] if args.k else [])]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    rows = []
    for line in proc.stdout.splitlines():  # "12.34s call     tests/test_fuzz_api.py::test_x"
        parts = line.split()
        if len(parts) == 3 and parts[1] == "call" and "test_fuzz_api.py::" in parts[2]:
            rows.append({"target": "api: " + parts[2].split("::", 1)[1], "inputs": examples,
                         "accepted": None, "seconds": float(parts[0].rstrip("s"))})
    return rows, proc


if __name__ == "__main__":
    raise SystemExit(main())
