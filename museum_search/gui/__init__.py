"""The desktop application (PySide6 + pyqtgraph): views over :mod:`museum_search.core`."""

from museum_search.gui.compat import guard_bool_refcounts

guard_bool_refcounts()  # before any signal is emitted (see compat)
