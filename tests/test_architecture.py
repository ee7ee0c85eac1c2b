"""museum_search.core runs without Qt (importing every core module with Qt made unimportable works), is
layered as pyproject.toml's import-linter contracts say, and passes ruff and mypy."""

import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import museum_search.core

ROOT = Path(__file__).resolve().parents[1]


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


CORE = ROOT / "museum_search" / "core"


def test_core_top_level_keeps_only_leaves():
    """Core's folder shows the layers: at most 12 leaf modules at the top, the rest in packages."""
    leaves = [p.stem for p in CORE.glob("*.py") if p.name != "__init__.py"]
    assert len(leaves) <= 12, leaves
    packages = sorted(p.name for p in CORE.iterdir() if (p / "__init__.py").is_file())
    assert {"inference", "index", "verification", "answer", "jobs", "evaluation"} <= set(packages)


def test_every_package_has_a_face():
    """Each package of core has a face: ``__all__`` in its ``__init__``, naming only what it imports, and every
    module behind it private (``_name``), as scikit-image does."""
    import importlib

    for init in CORE.glob("*/__init__.py"):
        name = f"museum_search.core.{init.parent.name}"
        face = importlib.import_module(name)
        assert getattr(face, "__all__", None), f"{name} has no __all__"
        missing = [n for n in face.__all__ if not hasattr(face, n)]
        assert not missing, f"{name}.__all__ names what it does not have: {missing}"
        public = [p.name for p in init.parent.glob("*.py") if p.name != "__init__.py" and not p.name.startswith("_")]
        assert not public, f"{name}: modules behind the face must be private: {public}"


def _tool(name: str) -> str:
    """The dev tool ``name`` beside this Python first (the project's .venv is not necessarily on PATH);
    in CI a missing tool fails (the dev extra installs it), elsewhere the test is skipped."""
    beside = Path(sys.executable).parent / name
    exe = str(beside) if beside.is_file() else shutil.which(name)
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: bash tools/install.sh --dev installs it")
        pytest.skip(f"{name} is not installed (dev extra)")
    return exe


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=600, cwd=str(ROOT))


def test_import_linter_contracts():
    """The `[tool.importlinter]` contracts of pyproject.toml: core imports no Qt and no gui; core's
    modules import only the layers below them; the CLI sits above the app and the web service (which
    never import each other), both above core."""
    r = _run(_tool("lint-imports"))
    assert r.returncode == 0, r.stdout + r.stderr
    for contract in ("core is free of Qt", "core is layered", "the views sit on core", "every package is used through its face"):
        assert any(line.startswith(contract) and line.rstrip().endswith("KEPT") for line in r.stdout.splitlines()), \
            r.stdout


def test_ruff_is_clean():
    r = _run(_tool("ruff"), "check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_is_clean_on_core():
    r = _run(_tool("mypy"), "--no-incremental", "museum_search/core")
    assert r.returncode == 0, r.stdout + r.stderr
