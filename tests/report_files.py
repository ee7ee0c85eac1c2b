"""A test helper: an evaluation's report written as a JSON file (what the tests read back or use as a
baseline). The product writes a run's whole document instead (``evaluation.run_document``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from museum_search.core.evaluation import _reports as reports


def write_json(report, index, path: Path, rankings: bool = False, seed: int = 0) -> dict[str, Any]:
    doc = reports.report_dict(report, index, rankings=rankings, seed=seed)
    reports.atomic_write(path, json.dumps(doc, ensure_ascii=False, indent=1))
    return doc
