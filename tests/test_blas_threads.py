"""OpenBLAS's idle threads must not spin after a query's product (museum_search/__init__.py)."""

import os
import subprocess
import sys

CODE = ("import museum_search, os, numpy; "
        "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))")


def _timeout_seen(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if env_value is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = env_value
    out = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_package_sets_a_short_openblas_thread_timeout_before_numpy_loads():
    # set by the package (it is read when numpy loads OpenBLAS: the package is imported first by
    # every entry point, the console and GUI scripts and the frozen program's)
    assert _timeout_seen(None) == "20"


def test_a_value_the_user_set_wins():
    assert _timeout_seen("28") == "28"
