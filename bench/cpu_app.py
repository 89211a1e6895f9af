"""The app of ``bench/procpool.py``: one CPU-bound plain-function job, run in the process pool.

``burn`` is a module-level function, so the same object is what coldbrew's
pool children run (looked up through ``bench.cpu_app:app``) and what
``concurrent.futures.ProcessPoolExecutor`` pickles by reference: both sides
run identical code.
"""

from __future__ import annotations

import os
import time
from typing import Any

from coldbrew import App

app = App()

MODULUS = 1_000_003


@app.job()
def burn(ctx: Any, n: int) -> int:
    """Pure-Python integer arithmetic, ``n`` rounds (holds the GIL; ~0.12 us per round here).

    ``ctx`` is unused, so the plain executor can pass None.
    """
    total = 0
    for i in range(n):
        total = (total * 31 + i) % MODULUS
    return total


def warm(seconds: float) -> int:
    """Block ``seconds`` and return the pid: makes a plain executor start all its processes."""
    time.sleep(seconds)
    return os.getpid()
