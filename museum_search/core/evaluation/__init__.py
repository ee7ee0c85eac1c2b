"""Evaluation of a descriptor / re-ranker combination on labelled query sets: the query sets, the
runner, the metrics, statistics (confidence intervals, paired tests), sweeps, reports and exports.

The metric table (:data:`METRICS`, one :class:`Metric` per metric: its key, labels, direction and
number format, and where it is shown; :data:`SUMMARY_METRICS`, :data:`QUERY_METRICS`,
:data:`HEADLINE_METRICS`, :data:`COMPARED`, :data:`PRINTED_METRICS`, :data:`PRIMARY`) is where the
views take their lists of metrics from.

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
from museum_search.core.evaluation._metrics import (
    COMPARED,
    HEADLINE_METRICS,
    METRICS,
    PRIMARY,
    PRINTED_METRICS,
    QUERY_METRICS,
    SUMMARY_METRICS,
    Metric,
    current_keys,
)
from museum_search.core.evaluation._querysets import (
    LAYOUTS,
    LabelledQuery,
    QuerySet,
    load_queryset,
    read_ground_truth_rows,
)
from museum_search.core.evaluation._reports import (
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
    "HEADLINE_METRICS",
    "LAYOUTS",
    "METRICS",
    "Metric",
    "PARAMETER_NAMES",
    "PairedTestResult",
    "PRIMARY",
    "PRINTED_METRICS",
    "LabelledQuery",
    "QUERY_METRICS",
    "QueryRecord",
    "QuerySet",
    "QuerySetSource",
    "RunSpec",
    "SUMMARY_METRICS",
    "SweepPoint",
    "SweepStep",
    "atomic_write",
    "compare_with_baseline",
    "confidence_intervals",
    "current_keys",
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
