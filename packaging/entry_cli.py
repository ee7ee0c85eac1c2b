"""PyInstaller entry point of the ``museum-search`` console executable (see museum-search.spec)."""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()
    from museum_search.cli import main

    sys.exit(main())
