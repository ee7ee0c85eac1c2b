"""What the collection learns from its visitors: kept photos (opt-in, re-encoded, with a quota and a
retention period), anonymous counts per hour of what visitors ask about, and the staff's review
queue that turns a kept photo into a new reference view or a real unknown view.

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

from museum_search.core.visitors._policy import (
    KEEP_MODES,
    KeepPolicy,
)
from museum_search.core.visitors._review import (
    add_views_job,
    discard,
    mark_unknown,
    refit_job,
    unknown_job,
)
from museum_search.core.visitors._stats import (
    VisitorStats,
)
from museum_search.core.visitors._store import (
    KeptPhoto,
    VisitorLog,
    visitors_folder,
)

__all__ = [
    "KEEP_MODES",
    "KeepPolicy",
    "KeptPhoto",
    "VisitorLog",
    "VisitorStats",
    "add_views_job",
    "discard",
    "mark_unknown",
    "refit_job",
    "unknown_job",
    "visitors_folder",
]
