"""The network side: backbones (a name → constructor registry and their weights), pooling (pure
functions), the engines that run them (ONNX Runtime, or torch), and descriptor extraction over a
collection or a query photo's regions.

This is the package's face: code outside the package imports these names only (an import-linter
contract says so); the modules behind it are private."""

from museum_search.core.inference._backbones import (
    DEFAULT_BACKBONE,
    DEFAULT_HEAD,
    DEFAULT_SIZE,
    HEADS,
    IMPORTED,
    REGISTRY,
    BackboneConfig,
    BackboneMeta,
    DescriptorExtractor,
    NoNetwork,
    check_config,
    imported_meta,
    meta_for,
)
from museum_search.core.inference._engines import (
    ENGINES,
    OPSET,
    ExportMismatch,
    OnnxExtractor,
    build_extractor,
    export_dirs,
    export_file,
    export_key,
    extractor_for_meta,
    first_use,
    half_weights,
    loading_stage,
    onnx_available,
    read_export,
    torch_available,
    write_export,
)
from museum_search.core.inference._engines import (
    default as default_engine,
)
from museum_search.core.inference._engines import (
    resolve as resolve_engine,
)
from museum_search.core.inference._extract import (
    ExtractResult,
    extract,
    query_crops,
)

__all__ = [
    "BackboneConfig",
    "BackboneMeta",
    "DEFAULT_BACKBONE",
    "DEFAULT_HEAD",
    "DEFAULT_SIZE",
    "DescriptorExtractor",
    "ENGINES",
    "ExportMismatch",
    "ExtractResult",
    "HEADS",
    "IMPORTED",
    "NoNetwork",
    "OPSET",
    "OnnxExtractor",
    "REGISTRY",
    "build_extractor",
    "check_config",
    "default_engine",
    "export_dirs",
    "export_file",
    "export_key",
    "extract",
    "extractor_for_meta",
    "first_use",
    "half_weights",
    "imported_meta",
    "loading_stage",
    "meta_for",
    "onnx_available",
    "query_crops",
    "read_export",
    "resolve_engine",
    "torch_available",
    "write_export",
]
