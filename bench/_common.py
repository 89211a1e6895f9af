"""Helpers shared by the benchmarks: processes, /proc readings, publishing, clean-up, and
``run_main``, every script's ``main()`` tail (event loop, exit codes, the report).

Nothing here imports the code under test beyond names (``Topology``) and
``quote_ident``: the producer side is plain aio-pika, as a producer in any
language would be.
"""

from __future__ import annotations

import argparse
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
import tempfile
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aio_pika
import asyncpg
from aiormq.exceptions import AMQPError

from coldbrew.errors import ColdbrewError
from coldbrew.migrate import quote_ident
from coldbrew.topology import Topology

if TYPE_CHECKING:
    from bench.throughput import Config

REPO_ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
NOOP_BODY = json.dumps({"type": "noop", "args": {}}, separators=(",", ":")).encode()


class BenchError(RuntimeError):
    """A side could not be measured (the message says why)."""


# What a run can fail with when a service is down or misbehaves: exit 1 with the message.
SERVICE_ERRORS = (BenchError, ColdbrewError, OSError, asyncpg.PostgresError, AMQPError)


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


def add_claim_commit_argument(parser: argparse.ArgumentParser) -> None:
    """``--claim-commit sync|async``: the coldbrew worker's ``COLDBREW_CLAIM_COMMIT``."""
    parser.add_argument(
        "--claim-commit",
        choices=("sync", "async"),
        help="COLDBREW_CLAIM_COMMIT of the coldbrew worker (its default when not given)",
    )


def claim_commit_env(claim_commit: str | None) -> dict[str, str]:
    """The worker's environment for ``--claim-commit`` (nothing: its own default)."""
    return {"COLDBREW_CLAIM_COMMIT": claim_commit} if claim_commit else {}


def worker_env(cfg: Config, namespace: str, port: int) -> dict[str, str]:
    """The environment of a ``coldbrew`` subprocess on ``namespace`` (metrics on ``port``)."""
    return child_env(
        {
            "COLDBREW_AMQP_URL": cfg.amqp_url,
            "COLDBREW_DATABASE_URL": cfg.database_url,
            "COLDBREW_NAMESPACE": namespace,
            "COLDBREW_CONCURRENCY": str(cfg.concurrency),
            "COLDBREW_METRICS_HOST": "127.0.0.1",
            "COLDBREW_METRICS_PORT": str(port),
            "COLDBREW_SHUTDOWN_GRACE_SECONDS": "10",
            "COLDBREW_LOG_FORMAT": "json",
            "COLDBREW_LOG_LEVEL": "info",
        }
    )


@dataclass(frozen=True, slots=True)
class RunningWorker:
    process: asyncio.subprocess.Process
    port: int
    log_path: Path
    ready_at: float
    """``time.time()`` when ``/readyz`` first answered 200."""
    ready_seconds: float
    """Seconds from just before the start to ``/readyz`` answering 200."""

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def worker_process(
    cfg: Config,
    namespace: str,
    label: str,
    *,
    app_ref: str = "bench.apps:app",
    extra_env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    ready_timeout: float = 60.0,
    stop_grace: float = 20.0,
    stop_times: dict[str, float] | None = None,
) -> AsyncIterator[RunningWorker]:
    """A ``coldbrew worker APP_REF`` subprocess with ``worker_env`` plus ``extra_env``, ready.

    Ready means ``/readyz`` answered 200 within ``ready_timeout`` seconds. Its
    output goes to ``log_path`` (default ``<workdir>/worker-<namespace>.log``).
    SIGTERMed on the way out (SIGKILL after ``stop_grace``); the seconds from
    SIGTERM to exit go to ``stop_times["stop_seconds"]`` when given.
    """
    port = free_port()
    env = worker_env(cfg, namespace, port) | dict(extra_env or {})
    if log_path is None:
        log_path = cfg.workdir / f"worker-{namespace}.log"
    started = time.perf_counter()
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "coldbrew",
            "worker",
            app_ref,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=cfg.workdir,
            start_new_session=True,
        )
    try:
        while await http_status(port, "/readyz") != 200:
            if process.returncode is not None:
                raise BenchError(f"{label}: worker exited {process.returncode}:\n{tail(log_path)}")
            if time.perf_counter() - started > ready_timeout:
                raise BenchError(
                    f"{label}: worker not ready after {ready_timeout:g} s:\n{tail(log_path)}"
                )
            await asyncio.sleep(0.02)
        yield RunningWorker(process, port, log_path, time.time(), time.perf_counter() - started)
    finally:
        stopping = time.perf_counter()
        await stop_process(process, grace=stop_grace)
        if stop_times is not None:
            stop_times["stop_seconds"] = time.perf_counter() - stopping
        if process.returncode not in (0, None):
            progress(f"{label}: worker exited {process.returncode}; log tail:\n{tail(log_path)}")


async def http_get(port: int, path: str, timeout: float = 5.0) -> bytes | None:
    """Body of ``GET http://127.0.0.1:<port><path>`` when it answers 200, else None."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                writer.write(request.encode())
                await writer.drain()
                data = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    return body if head.split(b" ", 2)[1:2] == [b"200"] else None


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


async def scrape_metrics(port: int) -> dict[str, float]:
    """A worker's Prometheus ``/metrics``, each metric's samples summed over labels.

    Empty when it does not answer 200; a metric it does not show is absent.
    """
    body = await http_get(port, "/metrics")
    found: dict[str, float] = {}
    if body is None:
        return found
    for line in body.decode(errors="replace").splitlines():
        match = _SAMPLE.match(line)
        if match:
            name = match.group(1)
            found[name] = found.get(name, 0.0) + float(match.group(3))
    return found


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --- clean-up ---------------------------------------------------------------------------


async def drop_namespace(amqp_url: str, database_url: str, namespace: str) -> None:
    """Drop a namespace's schema and every queue and exchange it named; idempotent."""
    topo = Topology(namespace)
    pairs = [("default", "default")]
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
                pairs += [(r["queue"], r["tenant"]) for r in rows]
            await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(namespace)} CASCADE")
        finally:
            await conn.close()
    queues = sorted(set(topo.every_queue_name(pairs)))  # both layouts (quorum: 3 bands)
    await delete_broker_entities(
        amqp_url, queues, [topo.jobs_exchange, topo.unrouted_exchange, topo.dead_exchange]
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


# --- main ---------------------------------------------------------------------------------

C = TypeVar("C")


def run_main(
    make_config: Callable[[Path], C],
    run: Callable[[C], Awaitable[dict[str, Any]]],
    render: Callable[[dict[str, Any]], str],
    *,
    json_output: bool,
    workdir_prefix: str,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> int:
    """Every benchmark's ``main()`` tail; returns its exit status.

    Makes a temporary work directory, builds the config with ``make_config``
    and runs ``run(cfg)`` on a new event loop (``loop_factory``'s, default
    asyncio's) with SIGTERM cancelling it like Ctrl-C, so every ``finally``
    cleans up. Exit 130 on Ctrl-C, 143 on SIGTERM, 1 on ``SERVICE_ERRORS`` (a
    message on stderr); otherwise the result goes to stdout, as JSON with
    ``json_output`` or else as ``render`` makes it, once the work directory is
    gone, and the status is 0.
    """
    terminated = False

    async def cancellable(cfg: C) -> dict[str, Any]:
        main_task = asyncio.current_task()
        assert main_task is not None

        def terminate() -> None:
            nonlocal terminated
            terminated = True
            main_task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
        return await run(cfg)

    with tempfile.TemporaryDirectory(prefix=workdir_prefix) as workdir:
        cfg = make_config(Path(workdir))
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                result = runner.run(cancellable(cfg))
        except (KeyboardInterrupt, asyncio.CancelledError):
            progress("interrupted: everything created was removed")
            return 143 if terminated else 130
        except SERVICE_ERRORS as exc:
            progress(f"failed: {exc or type(exc).__name__} (everything created was removed)")
            return 1
    print(json.dumps(result, indent=2, default=str) if json_output else render(result))
    return 0
