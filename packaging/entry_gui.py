"""PyInstaller entry point of the ``museum-search-gui`` executable (see museum-search.spec).

``museum_search/gui/app.py`` uses relative imports, so it cannot be frozen as a script itself.
"""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    from museum_search.gui.app import main

    sys.exit(main())
