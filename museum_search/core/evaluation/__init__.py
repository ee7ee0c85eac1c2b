"""Evaluation of a descriptor / re-ranker combination on labelled query sets: the query sets, the
runner, the metrics, statistics (confidence intervals, paired tests), sweeps, reports and exports.

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

from museum_search.core.evaluation._export import (
    QuerySetSource,
    RunSpec,
    read_run,
    run_document,
    run_spec,
    same_numbers,
    write_run_csv,
    write_run_json,
)
from museum_search.core.evaluation._querysets import (
    LAYOUTS,
    LabelledQuery,
    QuerySet,
    load_queryset,
    read_ground_truth_rows,
)
from museum_search.core.evaluation._reports import (
    COMPARED,
    atomic_write,
    compare_with_baseline,
    confidence_intervals,
    paired_tests,
    run_name,
    unknown_instances_warning,
    values_by_query,
    write_trec,
)
from museum_search.core.evaluation._runner import (
    DESCRIBING,
    EvalReport,
    EvalStep,
    QueryRecord,
    evaluate,
    precision_recall_curve,
)
from museum_search.core.evaluation._stats import (
    PairedTestResult,
    format_p,
    stars,
)
from museum_search.core.evaluation._sweep import (
    PARAMETER_NAMES,
    SweepPoint,
    SweepStep,
    parse_values,
    sweep,
    sweep_advice,
)

__all__ = [
    "COMPARED",
    "DESCRIBING",
    "EvalReport",
    "EvalStep",
    "LAYOUTS",
    "PARAMETER_NAMES",
    "PairedTestResult",
    "LabelledQuery",
    "QueryRecord",
    "QuerySet",
    "QuerySetSource",
    "RunSpec",
    "SweepPoint",
    "SweepStep",
    "atomic_write",
    "compare_with_baseline",
    "confidence_intervals",
    "evaluate",
    "format_p",
    "load_queryset",
    "paired_tests",
    "parse_values",
    "precision_recall_curve",
    "read_ground_truth_rows",
    "read_run",
    "run_document",
    "run_name",
    "run_spec",
    "same_numbers",
    "stars",
    "sweep",
    "sweep_advice",
    "unknown_instances_warning",
    "values_by_query",
    "write_run_csv",
    "write_run_json",
    "write_trec",
]
