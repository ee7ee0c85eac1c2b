"""museum_search.core runs without Qt: importing every core module with Qt made unimportable works."""

import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import museum_search.core


def test_core_imports_without_qt():
    modules = [m.name for m in pkgutil.walk_packages(museum_search.core.__path__, "museum_search.core.")]
    assert len(modules) > 15
    code = (
        "import sys\n"
        "for name in ('PySide6', 'pyqtgraph', 'superqt', 'shiboken6', 'qtpy'):\n"
        "    sys.modules[name] = None  # any import of these now fails\n"
        f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
        "assert not any(k.startswith('museum_search.gui') for k in sys.modules)\n"
        "print('ok', len(sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_import_linter_contract():
    """The `[tool.importlinter]` contract of pyproject.toml: core imports no Qt and no gui."""
    # beside this Python first: the project's .venv is not necessarily on PATH
    beside = Path(sys.executable).parent / "lint-imports"
    exe = str(beside) if beside.is_file() else shutil.which("lint-imports")
    if exe is None:
        pytest.skip("import-linter is not installed (dev extra)")
    r = subprocess.run([exe], capture_output=True, text=True, timeout=300,
                       cwd=str(Path(__file__).resolve().parents[1]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "core is free of Qt KEPT" in r.stdout
