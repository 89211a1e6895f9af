"""Plain-function jobs for the process-pool tests (``tests.unit.procpool_jobs:app``)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from coldbrew.app import App
from coldbrew.errors import Permanent, Retry

app = App()


@app.job()
def add(ctx: Any, a: int, b: int) -> int:
    return a + b


@app.job()
def describe(ctx: Any, **kwargs: Any) -> dict[str, Any]:
    """Echo the keyword arguments and what the context says about the job."""
    fields = ("job_id", "type", "attempt", "tenant", "queue", "max_attempts", "checkpoint_state")
    return {"kwargs": kwargs, "ctx": {name: getattr(ctx, name) for name in fields}}


@app.job()
def report_progress(ctx: Any, steps: int) -> str:
    ctx.log.debug("reporting_progress", steps=steps)
    for step in range(1, steps + 1):
        ctx.progress(step / steps, f"step {step}")
    return "done"


@app.job()
def use_once(ctx: Any, name: str) -> list[bool]:
    return [ctx.once(name), ctx.once(name), ctx.once(name + "-other")]


@app.job()
def use_checkpoint(ctx: Any, state: Any) -> dict[str, Any]:
    """Checkpoint twice: once accepted, once refused by the host."""
    ctx.checkpoint(state)
    saved = ctx.checkpoint_state
    try:
        ctx.checkpoint("refuse me")
    except Exception as exc:
        refused = f"{type(exc).__name__}: {exc}"
    else:
        refused = "not refused"
    return {"saved": saved, "refused": refused}


@app.job()
def pid(ctx: Any) -> int:
    return os.getpid()


@app.job()
def wait_for_file(ctx: Any, path: str, limit: float = 30.0) -> int:
    """Report the child's pid as progress, then block until ``path`` exists."""
    ctx.progress(None, str(os.getpid()))
    deadline = time.monotonic() + limit
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return os.getpid()


@app.job()
def crash(ctx: Any, code: int) -> None:
    os._exit(code)


@app.job()
def fail_permanent(ctx: Any, message: str) -> None:
    raise Permanent(message)


@app.job()
def fail_retry(ctx: Any, message: str, delay: float) -> None:
    raise Retry(message, delay=delay)


@app.job()
def fail_other(ctx: Any, message: str) -> None:
    raise ValueError(message)


@app.job()
def unpicklable(ctx: Any) -> Any:
    return threading.Lock()


@app.job()
def stamp(ctx: Any, label: str) -> tuple[str, int]:
    return (label, time.monotonic_ns())


@app.job()
def echo(ctx: Any, payload: bytes) -> bytes:
    return payload


_held: list[bytearray] = []  # memory a job leaves behind in its child, on purpose


def _allocate(mb: int, chunk_mb: int, pause: float) -> list[bytearray]:
    """``mb`` MB in chunks whose every page is written, so the resident size really grows.

    ``bytearray(n)`` alone would map zero pages that count for nothing until
    touched; repeating a one-byte array writes every byte. ``pause`` between
    chunks caps the rate on a fast machine, so a limit is seen well before
    the total.
    """
    chunks = []
    for _ in range(0, mb, chunk_mb):
        chunks.append(bytearray(b"\x01") * (chunk_mb * 1024 * 1024))
        time.sleep(pause)
    return chunks


@app.job()
def allocate(
    ctx: Any, mb: int, chunk_mb: int = 16, pause: float = 0.005, keep: bool = False
) -> dict[str, int]:
    """Hold ``mb`` MB of touched memory; with ``keep`` leave it allocated in the child."""
    chunks = _allocate(mb, chunk_mb, pause)
    if keep:
        _held.extend(chunks)
    return {"pid": os.getpid(), "mb": len(chunks) * chunk_mb}


@app.job()
def allocate_later(ctx: Any, mb: int, delay: float) -> int:
    """Return at once; ``delay`` s later a thread in the (then idle) child allocates ``mb`` MB."""

    def grow() -> None:
        time.sleep(delay)
        _held.extend(_allocate(mb, 16, 0.005))

    threading.Thread(target=grow, name="leak", daemon=True).start()
    return os.getpid()
