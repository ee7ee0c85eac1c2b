"""museum-search: instance search for museum and heritage collections."""

__version__ = "0.2.0"
