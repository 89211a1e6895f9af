"""Helpers shared by the benchmarks: processes, /proc readings, publishing and clean-up.

Nothing here imports the code under test beyond names (``Topology``) and
``quote_ident``: the producer side is plain aio-pika, as a producer in any
language would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg

from coldbrew.migrate import quote_ident
from coldbrew.topology import Topology

REPO_ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NOOP_BODY = json.dumps({"type": "noop", "args": {}}, separators=(",", ":")).encode()


def progress(message: str) -> None:
    """One progress line on stderr (the results go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- /proc ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # after the ")" that closes comm, fields[0] is field 3 (state): utime is 14, stime 15
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of one process, in KiB, from /proc/<pid>/status."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found


def cpu_by_command(names: Iterable[str]) -> dict[int, tuple[str, float]]:
    """``pid -> (command, CPU seconds)`` of every live process whose command is in ``names``."""
    wanted = set(names)
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        if comm in wanted:
            fields = text.rsplit(")", 1)[1].split()
            found[int(entry.name)] = (comm, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS)
    return found


def cpu_delta(
    before: Mapping[int, tuple[str, float]], after: Mapping[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds per command between two ``cpu_by_command`` readings.

    Approximate and machine-wide: a process that exits between the readings
    takes its CPU with it, and other users of the same server count too.
    """
    totals: dict[str, float] = {}
    for pid, (comm, seconds) in after.items():
        start = before.get(pid)
        used = seconds - start[1] if start is not None and start[0] == comm else seconds
        totals[comm] = totals.get(comm, 0.0) + used
    return totals


@dataclass(frozen=True, slots=True)
class MachineCPU:
    """Cumulative CPU seconds of the whole machine, from /proc/stat."""

    busy: float
    steal: float

    @classmethod
    def read(cls) -> MachineCPU:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        # user nice system idle iowait irq softirq steal guest guest_nice
        ticks = [int(f) for f in fields[:8]]
        busy = ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]
        return cls(busy / CLOCK_TICKS, ticks[7] / CLOCK_TICKS)

    def __sub__(self, other: MachineCPU) -> MachineCPU:
        return MachineCPU(self.busy - other.busy, self.steal - other.steal)


# --- machine ------------------------------------------------------------------------


async def machine_info(amqp_url: str, database_url: str) -> dict[str, Any]:
    """What the numbers were measured on."""
    info = host_info()
    connection = await aio_pika.connect(amqp_url)
    try:
        props = connection.transport.connection.server_properties  # type: ignore[union-attr]
        info["rabbitmq"] = _text(props.get("version"))
    finally:
        await connection.close()
    conn = await asyncpg.connect(database_url)
    try:
        info["postgresql"] = await conn.fetchval("SHOW server_version")
    finally:
        await conn.close()
    return info


def host_info() -> dict[str, Any]:
    """CPU, memory, kernel, Python and driver versions of this host."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    meminfo = Path("/proc/meminfo").read_text()
    mem = re.search(r"^MemTotal:\s*(\d+) kB", meminfo, re.MULTILINE)
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "cpu_model": model.group(1).strip() if model else "unknown",
        "ram_gib": round(int(mem.group(1)) / 1024 / 1024, 1) if mem else None,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": _package_versions(("aio-pika", "aiormq", "asyncpg", "uvloop")),
        "coldbrew_commit": _git("rev-parse", "--short", "HEAD"),
        "src_modified": bool(_git("status", "--porcelain", "--", "src")),
    }
    return info


def _git(*args: str) -> str:
    """Output of a git command in the repository, or "" when git is unavailable."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _package_versions(names: Sequence[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


# --- publishing -----------------------------------------------------------------------


async def publish_noops(
    exchange: aio_pika.abc.AbstractExchange,
    routing_key: str,
    count: int,
    *,
    id_prefix: str,
    window: int = 256,
) -> float:
    """Publish ``count`` no-op jobs per the message contract, confirms pipelined; return seconds.

    The exchange's channel must have publisher confirms on. Every message is
    persistent, JSON, with a unique ``message_id``.
    """
    limit = asyncio.Semaphore(window)
    started = time.perf_counter()

    async def one(index: int) -> None:
        message = aio_pika.Message(
            NOOP_BODY,
            message_id=f"{id_prefix}-{index}",
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await exchange.publish(message, routing_key=routing_key, mandatory=False, timeout=60)
        finally:
            limit.release()

    tasks: list[asyncio.Future[None]] = []
    try:
        for index in range(count):
            await limit.acquire()
            tasks.append(asyncio.ensure_future(one(index)))
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # none left unretrieved
        raise
    return time.perf_counter() - started


# --- processes ------------------------------------------------------------------------


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This environment minus ``COLDBREW_*`` variables, plus ``extra``; the repo on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLDBREW_")}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT)
    env.update(extra)
    return env


async def stop_process(process: asyncio.subprocess.Process, *, grace: float = 20.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Safe on an exited process."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=grace)
    except TimeoutError:
        progress(f"pid {process.pid} ignored SIGTERM for {grace:g} s: killing it")
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


async def http_status(port: int, path: str) -> int | None:
    """Status code of ``GET http://127.0.0.1:<port><path>``, or None when nothing answers (2 s)."""
    try:
        async with asyncio.timeout(2.0):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except (OSError, TimeoutError):
        return None
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    try:
        writer.write(request.encode())
        async with asyncio.timeout(2.0):
            await writer.drain()
            line = await reader.readline()
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --- clean-up ---------------------------------------------------------------------------


async def drop_namespace(amqp_url: str, database_url: str, namespace: str) -> None:
    """Drop a namespace's schema and every queue and exchange it named; idempotent."""
    topo = Topology(namespace)
    queues = {topo.job_queue("default", "default"), topo.unrouted_queue, topo.dead_queue}
    try:
        conn = await asyncpg.connect(database_url)
    except (OSError, asyncpg.PostgresError) as exc:
        progress(f"clean-up: cannot reach PostgreSQL to drop schema {namespace}: {exc}")
    else:
        try:
            with contextlib.suppress(asyncpg.PostgresError):
                rows = await conn.fetch(
                    f"SELECT queue, tenant FROM {quote_ident(namespace)}.tenant_queues"
                )
                queues.update(topo.job_queue(r["queue"], r["tenant"]) for r in rows)
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
        finally:
            await conn.close()
    await delete_broker_entities(
        amqp_url, sorted(queues), [topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange]
    )


async def delete_broker_entities(
    amqp_url: str, queues: Sequence[str], exchanges: Sequence[str]
) -> None:
    """Delete queues and exchanges (missing ones are fine)."""
    try:
        connection = await aio_pika.connect(amqp_url)
    except (OSError, aio_pika.exceptions.AMQPException) as exc:
        progress(f"clean-up: cannot reach RabbitMQ to delete {', '.join(queues)}: {exc}")
        return
    try:
        channel = await connection.channel()
        for name in queues:
            await channel.queue_delete(name)
        for name in exchanges:
            await channel.exchange_delete(name)
    finally:
        await connection.close()


# --- statistics ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "min": self.low, "max": self.high}
