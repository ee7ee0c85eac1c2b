"""museum_search.core runs without Qt: importing every core module with Qt made unimportable works."""

import pkgutil
import subprocess
import sys

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
