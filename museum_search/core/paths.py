"""Where things are: bundled resources, per-user config/cache/data folders (platformdirs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from platformdirs import PlatformDirs

APP = "museum-search"
_dirs = PlatformDirs(APP, appauthor=False)


def resources_dir() -> Path:
    """The ``resources/`` folder: next to the package in a checkout, inside a PyInstaller build."""
    candidates = []
    if hasattr(sys, "_MEIPASS"):
        candidates.append(Path(sys._MEIPASS) / "resources")
    candidates.append(Path(__file__).resolve().parents[2] / "resources")
    candidates.append(Path(sys.prefix) / "share" / APP / "resources")
    for c in candidates:
        if c.is_dir():
            return c
    return candidates[-1]


def resource(*parts: str) -> Path:
    return resources_dir().joinpath(*parts)


def sample_collection() -> Path:
    return resource("sample")


def data_dir() -> Path:
    """Per-user data (e.g. the index of the bundled sample collection)."""
    return Path(_dirs.user_data_dir)


def cache_dir() -> Path:
    """Per-user cache (e.g. the ONNX exports of the backbones); ``$MUSEUM_SEARCH_CACHE`` overrides it."""
    return Path(os.environ["MUSEUM_SEARCH_CACHE"]) if os.environ.get("MUSEUM_SEARCH_CACHE") else Path(_dirs.user_cache_dir)
