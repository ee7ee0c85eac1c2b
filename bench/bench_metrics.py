"""Benchmark: vectorized metrics (summarize) vs a plain per-query Python loop.

1,000 queries x 10,000 references (full rankings), ~20 reference images per instance.
Measures CPU time (time.process_time) of

* ``summarize`` (P@1/5/10/20, AP, MRR, R-precision, NMRR, NAR, MNRO in one call),
* ``relevance_matrix`` (building the input from rankings and labels), for information,
* a plain Python loop over queries and ranks computing the same P@1/5/10/20, AP, NMRR, NAR and
  MNRO, which also cross-checks the vectorized values.

Target: summarize under 1 s CPU. Prints a table and writes bench/results/metrics.json.
Run: ``python bench/bench_metrics.py [--queries 1000 --refs 10000 --repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from museum_search.core.evaluation import _metrics as m

RESULTS = Path(__file__).resolve().parent / "results" / "metrics.json"


def make_data(n_queries: int, n_refs: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    n_inst = max(1, n_refs // 20)
    labels = rng.integers(0, n_inst, size=n_refs)
    q_inst = rng.integers(0, n_inst + n_inst // 50, size=n_queries)  # ~2% open-set queries
    relevant = [{int(i)} for i in q_inst]
    # scores with some signal: relevant references get a boost
    scores = rng.normal(size=(n_queries, n_refs)).astype(np.float32)
    scores += 2.5 * (labels[None, :] == q_inst[:, None])
    rankings = m.rankings_from_scores(scores)
    return rankings, labels, relevant


def loop_metrics(rel: np.ndarray, n_rel: np.ndarray, gtm: int, n_col: int) -> dict:
    """Plain per-query Python implementation (lists, no numpy inside the loops)."""
    out = {k: [] for k in ("p@1", "p@5", "p@10", "p@20", "map", "anmrr", "anar", "amnro")}
    for q in range(rel.shape[0]):
        row = rel[q].tolist()
        ng = int(n_rel[q])
        if ng == 0:
            for v in out.values():
                v.append(float("nan"))
            continue
        for k in (1, 5, 10, 20):
            out[f"p@{k}"].append(sum(row[:k]) / k)
        # ranks of relevant references (1-based)
        ranks = [i + 1 for i, r in enumerate(row) if r]
        # AP
        ap = 0.0
        for kth, rank in enumerate(ranks, start=1):
            ap += kth / rank
        out["map"].append(ap / ng)
        # NMRR
        x = 2 if ng > 50 else 4
        big_k = min(x * ng, 2 * gtm)
        avr = sum(r if r <= big_k else 1.25 * big_k for r in ranks) / ng
        out["anmrr"].append((avr - 0.5 * (1 + ng)) / (1.25 * big_k - 0.5 * (1 + ng)))
        # NAR
        out["anar"].append((sum(ranks) - ng * (ng + 1) / 2) / (n_col * ng))
        # MNRO, continuous reading of Eq. 15
        k_cut = 4 * ng if 100 * ng >= n_col else 0.04 * n_col
        total = 0.0
        for kth, rank in enumerate(ranks, start=1):
            if rank != kth:
                total += math.exp(-9.3668 * math.exp(-5.2074 * (rank - 1) / (k_cut - 1)))
        out["amnro"].append(total / ng)
    return {k: np.array(v) for k, v in out.items()}


def cpu(fn, repeat: int):
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        result = fn()
        best = min(best, time.process_time() - t0)
    return best, result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--refs", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    rankings, labels, relevant = make_data(args.queries, args.refs)
    t_relmat, (rel, n_rel) = cpu(
        lambda: m.relevance_matrix(rankings, labels, relevant), args.repeat
    )
    gtm = int(n_rel.max())
    t_vec, summary = cpu(lambda: m.summarize(rel, n_rel, ks=(1, 5, 10, 20)), args.repeat)
    t_loop, loop = cpu(lambda: loop_metrics(rel, n_rel, gtm, rel.shape[1]), 1)

    # cross-check the vectorized values against the loop
    max_abs_diff = 0.0
    for key, values in loop.items():
        vec = summary["per_query"][key]
        assert np.array_equal(np.isnan(vec), np.isnan(values)), key
        ok = ~np.isnan(values)
        diff = float(np.max(np.abs(vec[ok] - values[ok]))) if ok.any() else 0.0
        assert diff < 1e-9, (key, diff)
        max_abs_diff = max(max_abs_diff, diff)

    result = {
        "queries": args.queries,
        "references": args.refs,
        "evaluated_queries": summary["queries"],
        "open_set_queries": summary["open_set_queries"],
        "cpu_seconds": {
            "summarize_vectorized": t_vec,
            "relevance_matrix": t_relmat,
            "python_loop": t_loop,
        },
        "speedup_loop_over_vectorized": t_loop / t_vec if t_vec > 0 else float("inf"),
        "target_cpu_seconds": 1.0,
        "meets_target": t_vec < 1.0,
        "max_abs_diff_vs_loop": max_abs_diff,
        "metrics": {k: v for k, v in summary.items() if k != "per_query"},
        "timing": f"best of {args.repeat} (loop: 1 run), time.process_time",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    print(f"metrics benchmark: {args.queries} queries x {args.refs} references "
          f"({summary['queries']} evaluated, {summary['open_set_queries']} open-set)")
    print(f"{'step':<34}{'CPU s':>10}")
    print(f"{'summarize (vectorized)':<34}{t_vec:>10.3f}")
    print(f"{'relevance_matrix':<34}{t_relmat:>10.3f}")
    print(f"{'plain Python loop':<34}{t_loop:>10.3f}")
    print(f"{'loop / vectorized':<34}{result['speedup_loop_over_vectorized']:>10.1f}x")
    print(f"target < 1 s CPU: {'met' if result['meets_target'] else 'NOT met'}; "
          f"max |vectorized - loop| = {max_abs_diff:.2e}")
    print("means: " + ", ".join(f"{k}={summary[k]:.4f}" for k in
                               ("mp@1", "p@5", "map", "anmrr", "anar", "amnro")))
    print(f"wrote {RESULTS}")
    return result


if __name__ == "__main__":
    main()
