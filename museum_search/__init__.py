"""museum-search: instance search for museum and heritage collections."""

import os as _os

# OpenBLAS (numpy's, faiss's) keeps its idle threads spinning for 2**28 cycles (~0.1 s) after every
# matrix product. A query's small product (its scores) then takes a core from the forward pass, SIFT
# and matching that follow it on a 2-core machine: SIFT right after such a product measured 209-222
# ms against 171-173 ms after a pause, and 171-176 ms either way with 2**20 cycles (~0.4 ms, still
# awake between back-to-back products). Read when OpenBLAS loads, so set before numpy is imported;
# a value the user set wins.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

__version__ = "0.2.0"
