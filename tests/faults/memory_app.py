"""Jobs for the memory-limit harm test (``tests.faults.memory_app:app``)."""

from __future__ import annotations

import asyncio
import os
import time

from coldbrew import App, Context

app = App()

CHUNK_MB = 32


@app.job(max_attempts=2, timeout=120)
def hog(ctx: Context, mb: int) -> dict[str, int]:
    """Allocate ``mb`` MB of touched memory in 32 MB chunks, at most ~2 GB/s.

    Every page is written (``bytearray(b"\\x01") * n`` fills it), so the
    resident size really grows; the pause caps the rate on a fast machine so
    the pool's 0.1 s sampling sees the limit long before the total.
    """
    chunks = []
    for _ in range(0, mb, CHUNK_MB):
        chunks.append(bytearray(b"\x01") * (CHUNK_MB * 1024 * 1024))
        time.sleep(0.016)
    return {"pid": os.getpid(), "mb": len(chunks) * CHUNK_MB}


@app.job(timeout=30)
def square(ctx: Context, x: int) -> int:
    """A small process-pool job: the pool keeps serving these beside the hog."""
    return x * x


@app.job(timeout=30)
async def ping(ctx: Context, n: int) -> int:
    """A coroutine job on the worker's event loop."""
    await asyncio.sleep(0.02)
    return n
