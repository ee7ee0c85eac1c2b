"""PyInstaller runtime hook (see museum-search.spec): a stand-in for ``PySide6.QtOpenGL``, left out of the build.

pyqtgraph imports ``PySide6.QtOpenGL`` as it is imported, for its optional OpenGL drawing, which museum-search
never turns on; the module's binding is 8.5 MB. The stand-in satisfies that import and fails clearly if anything
ever uses it.
"""

import importlib.util
import sys
import types

if importlib.util.find_spec("PySide6.QtOpenGL") is None:

    def _missing(name):
        raise AttributeError(f"PySide6.QtOpenGL.{name}: OpenGL drawing is not part of this build of museum-search")

    _stand_in = types.ModuleType("PySide6.QtOpenGL", _missing.__doc__)
    _stand_in.__getattr__ = _missing
    sys.modules["PySide6.QtOpenGL"] = _stand_in
