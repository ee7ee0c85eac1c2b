"""PyInstaller entry point of the ``museum-search`` console executable (see museum-search.spec).

On Linux the build has no second executable for the GUI: the ``museum-search-gui`` launcher script starts this
one with ``MUSEUM_SEARCH_FROZEN_ENTRY=gui``, and it then runs the desktop application with the launcher's
arguments (exactly what ``entry_gui.py`` does on Windows and macOS).
"""

import multiprocessing
import os
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    if os.environ.pop("MUSEUM_SEARCH_FROZEN_ENTRY", "") == "gui":
        from museum_search.gui.app import main
    else:
        from museum_search.cli import main

    sys.exit(main())
