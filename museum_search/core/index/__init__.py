"""The index on disk and what it holds: the store (manifest, atomic generations, journal, writer
lock), the items' catalogue (SQLite), labels of a collection, the references' local features, exact
and approximate search over the descriptors, and the neighbour lists.

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

from museum_search.core.index._approximate import (
    ADD_STAGE,
    TRAIN_STAGE,
    AnnIndex,
)
from museum_search.core.index._catalogue import (
    Item,
)
from museum_search.core.index._exact import (
    candidate_scores,
    exact_prefix,
    exact_scores,
)
from museum_search.core.index._features import (
    Features,
    LocalFeatures,
)
from museum_search.core.index._labels import (
    CATALOGUE_FILE_COLUMNS,
    CATALOGUE_INSTANCE_COLUMNS,
    CLICIDE_QUERY_FOLDER,
    GAROFOU_QUERY_FOLDER,
    HIDDEN_REASON,
    RULES,
    Labelling,
    compile_regex,
    detect_name_rule,
    find_catalogue,
    find_column,
    is_folder_layout,
    is_hidden_path,
    label_collection,
    label_file,
    labelling_summary,
    normalize_relpath,
    read_csv_table,
    scan_images,
    split_unusable,
    summarize_ignored,
)
from museum_search.core.index._modes import (
    AUTO_MIN_REFERENCES,
    resolve_mode,
)
from museum_search.core.index._neighbours import (
    NEIGHBOURS_STAGE,
    update_neighbour_lists,
)
from museum_search.core.index._store import (
    K_MAX,
    MANIFEST,
    UPGRADABLE,
    VERSION,
    Index,
    LabellingSpec,
    check_output_folder,
    committed_in_this_process,
    default_index_folder,
    file_sha256,
    index_version,
    indexed_collection,
    is_index_folder,
    read_manifest,
    writer_lock,
)

__all__ = [
    "ADD_STAGE",
    "AUTO_MIN_REFERENCES",
    "AnnIndex",
    "CATALOGUE_FILE_COLUMNS",
    "CATALOGUE_INSTANCE_COLUMNS",
    "CLICIDE_QUERY_FOLDER",
    "Features",
    "GAROFOU_QUERY_FOLDER",
    "HIDDEN_REASON",
    "Index",
    "Item",
    "K_MAX",
    "Labelling",
    "LabellingSpec",
    "LocalFeatures",
    "MANIFEST",
    "NEIGHBOURS_STAGE",
    "RULES",
    "TRAIN_STAGE",
    "UPGRADABLE",
    "VERSION",
    "candidate_scores",
    "check_output_folder",
    "committed_in_this_process",
    "compile_regex",
    "default_index_folder",
    "labelling_summary",
    "detect_name_rule",
    "exact_prefix",
    "exact_scores",
    "file_sha256",
    "find_catalogue",
    "find_column",
    "index_version",
    "indexed_collection",
    "is_folder_layout",
    "is_hidden_path",
    "is_index_folder",
    "label_collection",
    "label_file",
    "normalize_relpath",
    "read_csv_table",
    "read_manifest",
    "resolve_mode",
    "scan_images",
    "split_unusable",
    "summarize_ignored",
    "update_neighbour_lists",
    "writer_lock",
]
