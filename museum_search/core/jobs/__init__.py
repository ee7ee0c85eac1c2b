"""Long work, as generators that report progress and can be cancelled: building, updating and
upgrading an index (locally or on a Ray cluster), importing descriptors, and calibrating the verdict.

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

from museum_search.core.jobs._calibration import STAFF_VIEWS_MIN
from museum_search.core.jobs._importing import (
    append_to_index,
    descriptor_queries,
    descriptor_queryset,
    import_index,
)
from museum_search.core.jobs._indexing import (
    BuildReport,
    build_job,
    check_batch_size,
    check_instance,
    update_index,
    update_job,
    upgrade_index,
)

__all__ = [
    "STAFF_VIEWS_MIN",
    "BuildReport",
    "append_to_index",
    "build_job",
    "check_batch_size",
    "check_instance",
    "descriptor_queries",
    "descriptor_queryset",
    "import_index",
    "update_index",
    "update_job",
    "upgrade_index",
]
