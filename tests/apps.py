"""Job apps used by the integration, end-to-end and fault tests."""

from __future__ import annotations

import asyncio
import os
import time

from coldbrew import App, Context, Permanent, Retry

app = App()


@app.job()
async def noop(ctx: Context) -> None:
    """Does nothing: the cost of the machinery itself."""


@app.job()
async def echo(ctx: Context, value: object = None) -> dict[str, object]:
    return {"value": value, "attempt": ctx.attempt, "tenant": ctx.tenant}


@app.job(timeout=60)
async def sleep_for(ctx: Context, seconds: float) -> float:
    ctx.progress(0.0, "sleeping")
    await asyncio.sleep(seconds)
    ctx.progress(1.0, "awake")
    return seconds


@app.job(timeout=60)
async def timed_sleep(ctx: Context, seconds: float) -> dict[str, float]:
    """Sleeps and returns its own wall-clock start and end, to measure overlap exactly."""
    start = time.time()
    await asyncio.sleep(seconds)
    return {"start": start, "end": time.time()}


@app.job(timeout=60)
async def transcode(ctx: Context, seconds: float) -> dict[str, float]:
    """Like ``timed_sleep``, under another type name: for per-type caps."""
    start = time.time()
    await asyncio.sleep(seconds)
    return {"start": start, "end": time.time()}


@app.job(max_attempts=5)
async def fail_times(ctx: Context, times: int) -> int:
    """Fails on its first ``times`` attempts, then succeeds."""
    if ctx.attempt <= times:
        raise ConnectionError(f"flaky attempt {ctx.attempt}")
    return ctx.attempt


@app.job(max_attempts=2)
async def always_fails(ctx: Context) -> None:
    raise RuntimeError("always fails")


@app.job()
async def permanent(ctx: Context) -> None:
    raise Permanent("bad input, never retry")


@app.job()
async def retry_later(ctx: Context, delay: float) -> int:
    if ctx.attempt == 1:
        raise Retry("come back later", delay=delay)
    return ctx.attempt


@app.job()
async def progress_steps(ctx: Context, steps: int, pause: float) -> int:
    for step in range(1, steps + 1):
        ctx.progress(step / steps, f"step {step}")
        await asyncio.sleep(pause)
    return steps


@app.job(timeout=0.3)
async def too_slow(ctx: Context) -> None:
    await asyncio.sleep(5)


@app.job()
async def side_effect(ctx: Context, seconds: float = 0.0) -> bool:
    """Records its effect once per job through ctx.once; sleeps to widen crash windows."""
    await asyncio.sleep(seconds)
    return await ctx.once("effect")


@app.job(queue="slow", timeout=30)
def cpu(ctx: Context, n: int) -> int:
    """CPU-bound work in the process pool."""
    total = 0
    for i in range(n):
        total += i * i
    ctx.progress(1.0, "summed")
    return total


@app.job(queue="slow", max_attempts=2)
def crash(ctx: Context) -> None:
    """Kills its own process."""
    os._exit(9)


@app.job(queue="slow", timeout=0.5, max_attempts=1)
def spin(ctx: Context) -> None:
    """Runs past its timeout in the pool."""
    time.sleep(10)


@app.job(queue="slow")
def cpu_sleep(ctx: Context, seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.job()
async def flaky_dependency(ctx: Context) -> None:
    """Every call to the 'storage' dependency fails."""
    async with ctx.breaker("storage"):
        raise ConnectionError("storage is down")


@app.job(max_attempts=50, max_wall_seconds=1.0)
async def walled(ctx: Context) -> None:
    raise ConnectionError("still failing")


@app.job()
async def outbox_write(ctx: Context) -> int:
    """Writes an outbox row with its guard, then fails once after the commit."""
    async with ctx.once_in_transaction("outbox") as conn:
        if conn is not None:
            await conn.execute("CREATE TABLE IF NOT EXISTS outbox (job_id text, attempt int)")
            await conn.execute("INSERT INTO outbox VALUES ($1, $2)", ctx.job_id, ctx.attempt)
    if ctx.attempt == 1:
        raise ConnectionError("fail after the outbox commit")
    return ctx.attempt


CANCELLED: dict[str, str] = {}


async def _record_cancel(ctx: Context, reason: str) -> None:
    CANCELLED[ctx.job_id] = reason


@app.job(on_cancel=_record_cancel)
async def cancellable(ctx: Context) -> None:
    await asyncio.sleep(60)


@app.job(max_attempts=3)
async def resumable(ctx: Context, steps: int) -> dict[str, object]:
    """Checkpoints after each step; the first attempt dies halfway, the next resumes."""
    done = list((ctx.checkpoint_state or {}).get("done", []))
    for step in range(len(done), steps):
        done.append(step)
        await ctx.checkpoint({"done": done})
        if ctx.attempt == 1 and step == steps // 2:
            raise ConnectionError("lost the connection halfway")
    return {"done": done, "resumed_at": steps // 2 + 1 if ctx.attempt > 1 else 0}


@app.job(max_attempts=2)
async def suicide(ctx: Context) -> None:
    """Kills the whole worker process, every time."""
    os._exit(17)


# --- jobs whose own output PostgreSQL cannot store (tests/integration/test_unstorable.py,
# tests/faults/test_garbage_generated.py) --------------------------------------------------


def _nested(levels: int) -> object:
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


def bad_value(kind: str, text: str) -> object:
    """The return value a ``misbehave`` job of this kind produces."""
    values = {
        "ok": {"text": text},
        "tiny_float": 1e-300,
        "huge_float": 1e308,
        "nul": {"s": text + "\x00"},
        "nul_key": {text + "\x00": 1},
        "surrogate": [text + "\ud800"],
        "nan": float("nan"),
        "inf": {"x": float("-inf")},
        "huge_int": 10**5000,
        "deep": _nested(150),
        "very_deep": _nested(5000),
        "big": "x" * (1024 * 1024 + 1),
        "unserializable": {text, 1},
    }
    return values[kind]


# kind -> (final status, error kind); what each misbehaviour must end as
MISBEHAVIOURS: dict[str, tuple[str, str | None]] = {
    "ok": ("succeeded", None),
    "tiny_float": ("succeeded", None),
    "huge_float": ("succeeded", None),
    "nul": ("failed", "unstorable_result"),
    "nul_key": ("failed", "unstorable_result"),
    "surrogate": ("failed", "unstorable_result"),
    "nan": ("failed", "unstorable_result"),
    "inf": ("failed", "unstorable_result"),
    "huge_int": ("failed", "unstorable_result"),
    "deep": ("failed", "unstorable_result"),
    "very_deep": ("failed", "unstorable_result"),
    "big": ("failed", "unstorable_result"),
    "unserializable": ("failed", "unserializable_result"),
    "error_nul": ("failed", "permanent"),
    "error_surrogate": ("failed", "permanent"),
    "error_kind_nul": ("dead", "tests\ufffdapps\ufffd.BadError"),
    "progress_nul": ("succeeded", None),
    "checkpoint_nul": ("failed", "permanent"),
    "checkpoint_nan": ("failed", "permanent"),
    "checkpoint_big": ("failed", "permanent"),
    "retry_far": ("failed", "unstorable_outcome"),
    "once_nul": ("dead", "coldbrew.errors.UnstorableValue"),  # a ValueError: retried
}
POOL_MISBEHAVIOURS = [  # pickled back from a pool child: nothing deeply nested
    k for k in MISBEHAVIOURS if k not in ("very_deep", "error_kind_nul", "unserializable")
]

# Python refuses a NUL or a lone surrogate in a class name, not in its module's name
BadNameError = type("BadError", (Exception,), {"__module__": "tests\x00apps\udfff"})


@app.job(max_attempts=2)
async def misbehave(ctx: Context, kind: str, text: str = "") -> object:
    """Returns, raises, reports or checkpoints something PostgreSQL cannot store."""
    if kind == "error_nul":
        raise Permanent(f"{text}\x00 went wrong")
    if kind == "error_surrogate":
        raise Permanent(f"{text}\ud800 went wrong")
    if kind == "error_kind_nul":
        raise BadNameError(text)
    if kind == "progress_nul":
        ctx.progress(0.5, f"\x00{text}\udfff")
        return {"text": text}
    if kind == "checkpoint_nul":
        await ctx.checkpoint({"s": text + "\x00"})
    if kind == "checkpoint_nan":
        await ctx.checkpoint([float("nan")])
    if kind == "checkpoint_big":
        await ctx.checkpoint("x" * (2 << 20))
    if kind == "retry_far":
        raise Retry("come back in 1e300 seconds", delay=1e300)
    if kind == "once_nul":
        await ctx.once(f"effect\x00{text}")
    return bad_value(kind, text)


@app.job(queue="slow", max_attempts=2)
def misbehave_in_pool(ctx: Context, kind: str, text: str = "") -> object:
    """``misbehave`` in the process pool: the result is pickled back to the worker first."""
    if kind == "error_nul":
        raise Permanent(f"{text}\x00 went wrong")
    if kind == "error_surrogate":
        raise Permanent(f"{text}\ud800 went wrong")
    if kind == "progress_nul":
        ctx.progress(0.5, f"\x00{text}\udfff")
        return {"text": text}
    if kind == "checkpoint_nul":
        ctx.checkpoint({"s": text + "\x00"})
    if kind == "checkpoint_nan":
        ctx.checkpoint([float("nan")])
    if kind == "checkpoint_big":
        ctx.checkpoint("x" * (2 << 20))
    if kind == "retry_far":
        raise Retry("come back in 1e300 seconds", delay=1e300)
    if kind == "once_nul":
        ctx.once(f"effect\x00{text}")
    return bad_value(kind, text)
