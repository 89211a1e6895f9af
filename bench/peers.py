"""Peer benchmark (issue #5, scenario 1): drain N pre-published no-op jobs, coldbrew vs its peers.

Every side drains ``--jobs`` persistent messages that were published to its
own fresh queue before its consumer started, with its consumer in separate
subprocesses, late-acking:

* ``raw``: the plain aio-pika consume-and-ack loop of ``bench/throughput.py``
  (``run_raw``), the limit.
* ``coldbrew``, ``coldbrew-2p``: one or two ``coldbrew worker`` processes on a
  fresh namespace, fed per the message contract (``throughput.prepublish``).
* ``celery-solo``, ``celery-prefork``: Celery with ``task_acks_late``, the solo
  pool, or the prefork pool with 2 children.
* ``dramatiq``: one Dramatiq worker process with ``--threads`` threads.
* ``taskiq``: one taskiq worker process on taskiq-aio-pika, ``--ack-type when_executed``.

Each peer is published to in its own format, by its own client, from a
subprocess (not timed). A drain is timed from the moment the broker reports
the side's consumers on the queue until the N-th ack has been written (every
consumer process counts its acks in shared memory, see
``peer_apps/ackcount.py``); for coldbrew, which acks at the claim, until
N rows say ``succeeded`` *and* N acks were written. Acks before the clock
started are subtracted. Sides alternate in a rotating order per round.

    python bench/peers.py --repeat 3            # the reference run
    python bench/peers.py --quick               # 2,000 jobs, 1 round, for development
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aio_pika
import asyncpg
from aiormq.exceptions import ChannelNotFoundEntity
from bench._common import (
    SERVICE_ERRORS,
    BenchError,
    MachineCPU,
    Spread,
    child_env,
    cpu_by_command,
    cpu_delta,
    cpu_seconds,
    delete_broker_entities,
    free_port,
    http_status,
    machine_info,
    progress,
    run_main,
    stop_process,
    tail,
    worker_env,
)
from bench.peer_apps.ackcount import ENV as ACK_DIR_ENV
from bench.peer_apps.ackcount import AckReader
from bench.throughput import (
    Config,
    namespace_for,
    prepublish,
    run_raw,
    wait_succeeded,
)

from coldbrew import logs
from coldbrew.migrate import connect_creating_database, quote_ident
from coldbrew.settings import Settings
from coldbrew.topology import Topology

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_DATABASE_URL = "postgresql://127.0.0.1:5432/coldbrew_bench"
SIDES = ("raw", "coldbrew", "coldbrew-2p", "celery-solo", "celery-prefork", "dramatiq", "taskiq")
SINGLE_PROCESS_PEERS = ("celery-solo", "dramatiq", "taskiq")
SERVICE_COMMANDS = ("postgres", "beam.smp")
SCRIPT = Path(__file__).resolve()
POLL_SECONDS = 0.005  # ack counters and the consumer count: shared memory and one passive declare
PUBLISH_TIMEOUT = 300.0
START_TIMEOUT = 90.0
CELERY_PREFORK_CHILDREN = 2
TARGET_RAW = 0.8  # issue #19: against the raw loop at its best prefetch
TARGET_PEER = 1.1  # issue #19: against the fastest single-process peer at its best prefetch
PREFETCHES = (100, 300, 1000)


@dataclass
class PeerConfig(Config):
    """``throughput.Config`` (reused by ``run_raw``, ``prepublish``...) plus the peers' knobs."""

    sides: tuple[str, ...] = SIDES
    threads: int = 8
    coldbrew_prefetch: int = 0
    prefetches: tuple[int, ...] = PREFETCHES
    """Each peer (and the raw loop) drains once per prefetch a round; its best counts."""


@dataclass
class SideDrain:
    """One side's drain in one round (``error`` set when it could not be measured)."""

    side: str
    round: int
    jobs: int
    seconds: float = 0.0
    consumer_cpu_seconds: float = 0.0
    postgres_cpu_seconds: float = 0.0
    rabbitmq_cpu_seconds: float = 0.0
    machine_busy_cores: float = 0.0
    machine_steal_cores: float = 0.0
    publish_seconds: float = 0.0
    processes: int = 0
    rss_kib: int = 0
    steady_rate: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_job(self) -> float:
        return self.consumer_cpu_seconds / self.jobs * 1e6 if self.jobs else 0.0


# --- process trees -------------------------------------------------------------------------


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (children of every thread), from /proc."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError):
                todo.extend(int(p) for p in (task / "children").read_text().split())
    return found


def tree_cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU of these processes and all their descendants (exited ones excluded)."""
    total = 0.0
    for root in pids:
        for pid in tree_pids(root):
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += cpu_seconds(pid)
    return total


def tree_rss_kib(pids: Sequence[int]) -> tuple[int, int]:
    """(process count, summed VmRSS in KiB) of these process trees."""
    count = rss = 0
    for root in pids:
        for pid in tree_pids(root):
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss += int(line.split()[1])
                        count += 1
    return count, rss


@dataclass(frozen=True, slots=True)
class Reading:
    """CPU at one instant: the consumer process trees, the services, the whole machine."""

    at: float
    consumer: float
    services: dict[int, tuple[str, float]]
    machine: MachineCPU

    @classmethod
    def take(cls, pids: Sequence[int]) -> Reading:
        return cls(
            time.perf_counter(),
            tree_cpu_seconds(pids),
            cpu_by_command(SERVICE_COMMANDS),
            MachineCPU.read(),
        )


def measured(
    side: str, index: int, jobs: int, start: Reading, end: Reading, pids: Sequence[int]
) -> SideDrain:
    services = cpu_delta(start.services, end.services)
    machine = end.machine - start.machine
    wall = end.at - start.at
    processes, rss = tree_rss_kib(pids)
    return SideDrain(
        side,
        index,
        jobs,
        seconds=wall,
        consumer_cpu_seconds=end.consumer - start.consumer,
        postgres_cpu_seconds=services.get("postgres", 0.0),
        rabbitmq_cpu_seconds=services.get("beam.smp", 0.0),
        machine_busy_cores=machine.busy / wall,
        machine_steal_cores=machine.steal / wall,
        processes=processes,
        rss_kib=rss,
    )


async def spawn(
    argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path
) -> asyncio.subprocess.Process:
    """A consumer subprocess in a session of its own (its children are killed with it)."""
    with log_path.open("ab") as log_file:
        return await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )


async def stop_tree(process: asyncio.subprocess.Process, grace: float = 20.0) -> None:
    """SIGTERM the process (its own shutdown), then SIGKILL whatever is left of its session."""
    await stop_process(process, grace=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


# --- the broker, seen from the bench ----------------------------------------------------------


class QueueProbe:
    """Passive ``queue.declare`` on a connection of the bench's own: ready messages, consumers."""

    def __init__(self, amqp_url: str) -> None:
        self._url = amqp_url
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None

    async def __aenter__(self) -> QueueProbe:
        self._connection = await aio_pika.connect(self._url)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._connection is not None:
            await self._connection.close()

    async def counts(self, queue: str) -> tuple[int, int]:
        """(messages ready, consumers) of ``queue``; BenchError if it does not exist."""
        assert self._connection is not None
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel()
        try:
            declared = await self._channel.declare_queue(queue, passive=True)
        except ChannelNotFoundEntity:
            self._channel = None
            raise BenchError(f"queue {queue} does not exist") from None
        result = declared.declaration_result
        return result.message_count or 0, result.consumer_count or 0

    async def wait_ready(self, queue: str, expected: int, timeout: float) -> None:
        """Until ``expected`` messages are ready in ``queue`` (publishes without confirms land)."""
        deadline = time.perf_counter() + timeout
        while True:
            with contextlib.suppress(BenchError):
                ready, _ = await self.counts(queue)
                if ready == expected:
                    return
                if ready > expected:
                    raise BenchError(f"{queue}: {ready} messages ready, expected {expected}")
            if time.perf_counter() > deadline:
                raise BenchError(f"{queue}: never reached {expected} ready messages")
            await asyncio.sleep(0.05)


def check_alive(processes: Sequence[asyncio.subprocess.Process], logs_: Sequence[Path]) -> None:
    for process, log_path in zip(processes, logs_, strict=True):
        if process.returncode is not None:
            raise BenchError(f"consumer exited {process.returncode}:\n{tail(log_path)}")


async def wait_consumers(
    probe: QueueProbe,
    queue: str,
    expected: int,
    processes: Sequence[asyncio.subprocess.Process],
    logs_: Sequence[Path],
) -> None:
    """Until the broker lists ``expected`` consumers on ``queue``: the clock's start."""
    deadline = time.perf_counter() + START_TIMEOUT
    while True:
        _, consumers = await probe.counts(queue)
        if consumers >= expected:
            return
        check_alive(processes, logs_)
        if time.perf_counter() > deadline:
            raise BenchError(f"{consumers}/{expected} consumers after {START_TIMEOUT:g} s")
        await asyncio.sleep(POLL_SECONDS)


async def wait_acks(
    acks: AckReader,
    jobs: int,
    processes: Sequence[asyncio.subprocess.Process],
    logs_: Sequence[Path],
    steady: list[tuple[int, float]] | None = None,
) -> None:
    """Until the consumer processes have written ``jobs`` acks between them.

    ``steady``, when given, receives (acks, time) as the count first passes 10%
    and 90% of ``jobs``: the rate between them leaves out start-up and the tail.
    """
    deadline = time.perf_counter() + max(120.0, jobs / 50)
    marks = [jobs // 10, jobs - jobs // 10]
    while (total := acks.total()) < jobs:
        while steady is not None and marks and total >= marks[0]:
            steady.append((total, time.perf_counter()))
            marks.pop(0)
        check_alive(processes, logs_)
        if time.perf_counter() > deadline:
            raise BenchError(f"{total}/{jobs} acked when the deadline passed")
        await asyncio.sleep(POLL_SECONDS)


def steady_rate(steady: list[tuple[int, float]]) -> float | None:
    """Acks per second between the 10% and 90% marks (None if the drain outran the poll)."""
    if len(steady) < 2 or steady[1][1] <= steady[0][1]:
        return None
    return (steady[1][0] - steady[0][0]) / (steady[1][1] - steady[0][1])


@contextlib.contextmanager
def ack_directory() -> Any:
    """A fresh directory in /dev/shm for the consumers' ack counters, removed afterwards."""
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    directory = Path(tempfile.mkdtemp(prefix="cbbench-acks-", dir=base))
    reader = AckReader(directory)
    try:
        yield directory, reader
    finally:
        reader.close()
        shutil.rmtree(directory, ignore_errors=True)


# --- publishing to a peer (a subprocess, in the peer's own format) -------------------------


def publish_peer_main(peer: str, jobs: int) -> int:
    """``--publish-peer``: publish ``jobs`` no-op tasks with the peer's own client, then exit."""
    started = time.perf_counter()
    if peer == "celery":
        from bench.peer_apps.celery_app import app, noop

        with app.producer_or_acquire() as producer:
            for _ in range(jobs):
                noop.apply_async(producer=producer)
    elif peer == "dramatiq":
        from bench.peer_apps import dramatiq_app

        for _ in range(jobs):
            dramatiq_app.noop.send()
        dramatiq_app.broker.close()
    elif peer == "taskiq":
        asyncio.run(_publish_taskiq(jobs))
    else:
        raise SystemExit(f"unknown peer {peer}")
    print(json.dumps({"published": jobs, "seconds": time.perf_counter() - started}), flush=True)
    return 0


async def _publish_taskiq(jobs: int) -> None:
    from bench.peer_apps.taskiq_app import broker, noop

    await broker.startup()
    try:
        window = asyncio.Semaphore(256)

        async def one() -> None:
            try:
                await noop.kiq()
            finally:
                window.release()

        tasks = []
        for _ in range(jobs):
            await window.acquire()
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
    finally:
        await broker.shutdown()


async def publish_peer(cfg: PeerConfig, peer: str, env: Mapping[str, str], log_path: Path) -> float:
    """Run the publishing subprocess; return its seconds."""
    with log_path.open("ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            "--publish-peer",
            peer,
            "--jobs",
            str(cfg.jobs),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=cfg.workdir,
            start_new_session=True,
        )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=PUBLISH_TIMEOUT)
    finally:
        await stop_tree(process, grace=5)
    if process.returncode != 0:
        raise BenchError(f"publishing to {peer} exited {process.returncode}:\n{tail(log_path)}")
    return float(json.loads(out.decode().strip().splitlines()[-1])["seconds"])


# --- the peers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """How one peer is published to, started, and what it leaves on the broker."""

    client: str  # the --publish-peer name
    worker: Callable[[PeerConfig, str], list[str]]
    queues: Callable[[str], list[str]]
    exchanges: Callable[[str], list[str]]
    env: Callable[[PeerConfig], dict[str, str]] = lambda cfg: {}


def _celery_worker(pool: str, children: int) -> Callable[[PeerConfig, str], list[str]]:
    def argv(cfg: PeerConfig, queue: str) -> list[str]:
        return [
            *(sys.executable, "-m", "celery", "-A", "bench.peer_apps.celery_app", "worker"),
            *("--pool", pool, "--concurrency", str(children), "--loglevel", "WARNING"),
            # the worker heartbeat stays on (the default): without it the loop stalls, see README
            *("--without-gossip", "--without-mingle"),
            *("--hostname", f"{queue}@%h"),
        ]

    return argv


PEERS: dict[str, PeerSpec] = {
    "celery-solo": PeerSpec(
        "celery",
        _celery_worker("solo", 1),
        queues=lambda q: [q],
        exchanges=lambda q: [q, f"{q}.events"],
        env=lambda cfg: {"CBBENCH_CONCURRENCY": "1"},
    ),
    "celery-prefork": PeerSpec(
        "celery",
        _celery_worker("prefork", CELERY_PREFORK_CHILDREN),
        queues=lambda q: [q],
        exchanges=lambda q: [q, f"{q}.events"],
        env=lambda cfg: {"CBBENCH_CONCURRENCY": str(CELERY_PREFORK_CHILDREN)},
    ),
    "dramatiq": PeerSpec(
        "dramatiq",
        lambda cfg, q: [
            *(sys.executable, "-m", "dramatiq", "bench.peer_apps.dramatiq_app"),
            *("--processes", "1", "--threads", str(cfg.threads), "--queues", q),
        ],
        queues=lambda q: [q, f"{q}.DQ", f"{q}.XQ"],
        exchanges=lambda q: [],
        env=lambda cfg: {"dramatiq_queue_prefetch": str(cfg.prefetch)},
    ),
    "taskiq": PeerSpec(
        "taskiq",
        lambda cfg, q: [
            *(sys.executable, "-m", "taskiq", "worker", "bench.peer_apps.taskiq_app:broker"),
            *("--workers", "1", "--ack-type", "when_executed", "--log-level", "WARNING"),
            *("--max-async-tasks", str(cfg.concurrency)),
        ],
        queues=lambda q: [q, f"{q}.dead"],
        exchanges=lambda q: [f"{q}.exchange"],
    ),
}


def peer_env(cfg: PeerConfig, spec: PeerSpec, queue: str, ack_dir: Path | None) -> dict[str, str]:
    extra = {
        "CBBENCH_AMQP_URL": cfg.amqp_url,
        "CBBENCH_QUEUE": queue,
        "CBBENCH_PREFETCH": str(cfg.prefetch),
        **spec.env(cfg),
    }
    if ack_dir is not None:
        extra[ACK_DIR_ENV] = str(ack_dir)
    return child_env(extra)


async def run_peer(cfg: PeerConfig, side: str, index: int) -> SideDrain:
    spec = PEERS[side]
    label = f"{side} #{index + 1}"
    queue = f"cbbench_{cfg.run_id}.{side}.{index}"
    log_path = cfg.workdir / f"{side}-{index}.log"
    processes: list[asyncio.subprocess.Process] = []
    try:
        with ack_directory() as (ack_dir, acks):
            publish_seconds = await publish_peer(
                cfg, spec.client, peer_env(cfg, spec, queue, None), log_path
            )
            async with QueueProbe(cfg.amqp_url) as probe:
                await probe.wait_ready(queue, cfg.jobs, timeout=60)
                progress(f"{label}: published {cfg.jobs} in {publish_seconds:.1f} s; consuming")
                env = peer_env(cfg, spec, queue, ack_dir)
                processes.append(await spawn(spec.worker(cfg, queue), env, log_path, cfg.workdir))
                await wait_consumers(probe, queue, 1, processes, [log_path])
                start = Reading.take([p.pid for p in processes])
                acked0 = acks.total()
                steady: list[tuple[int, float]] = []
                await wait_acks(acks, cfg.jobs, processes, [log_path], steady)
                end = Reading.take([p.pid for p in processes])
                drain = measured(
                    side, index, cfg.jobs - acked0, start, end, [p.pid for p in processes]
                )
                for process in processes:
                    await stop_tree(process)
                # the consumers are gone: anything delivered but not acked is ready again
                left, _ = await probe.counts(queue)
            total = acks.total()
        drain.publish_seconds = publish_seconds
        drain.steady_rate = steady_rate(steady)
        drain.extra = {"acked_before_start": acked0, "acks": total, "left_after_stop": left}
        if left != 0 or total != cfg.jobs:
            raise BenchError(f"{label}: {left} messages left, {total} acks for {cfg.jobs} jobs")
        return drain
    finally:
        for process in processes:
            await stop_tree(process)
        await delete_broker_entities(cfg.amqp_url, spec.queues(queue), spec.exchanges(queue))


# --- coldbrew -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def coldbrew_workers(
    cfg: Config,
    namespace: str,
    app_ref: str,
    count: int,
    label: str,
    extra_env: Mapping[str, str],
    *,
    wait_ready: bool,
) -> AsyncIterator[tuple[list[asyncio.subprocess.Process], list[Path]]]:
    """``count`` ``coldbrew worker APP_REF`` subprocesses started together; stopped on the way out.

    Each has its own metrics port and ``COLDBREW_WORKER_ID``. Yields the
    processes and their log files: with ``wait_ready`` once every ``/readyz``
    answers 200, otherwise at once.
    """
    processes: list[asyncio.subprocess.Process] = []
    logs_: list[Path] = []
    ports: list[int] = []
    try:
        for number in range(count):
            port = free_port()
            env = worker_env(cfg, namespace, port)
            env["COLDBREW_WORKER_ID"] = f"{namespace}-w{number}"
            env.update(extra_env)
            log_path = cfg.workdir / f"worker-{namespace}-{number}.log"
            argv = [sys.executable, "-m", "coldbrew", "worker", app_ref]
            processes.append(await spawn(argv, env, log_path, cfg.workdir))
            logs_.append(log_path)
            ports.append(port)
        if wait_ready:
            deadline = time.perf_counter() + START_TIMEOUT
            for port in ports:
                while await http_status(port, "/readyz") != 200:
                    check_alive(processes, logs_)
                    if time.perf_counter() > deadline:
                        raise BenchError(f"{label}: worker not ready after {START_TIMEOUT:g} s")
                    await asyncio.sleep(0.02)
        yield processes, logs_
    finally:
        for process, log_path in zip(processes, logs_, strict=False):
            await stop_tree(process)
            if process.returncode not in (0, None, -signal.SIGKILL):
                progress(f"{label}: worker exited {process.returncode}:\n{tail(log_path)}")


async def run_coldbrew_side(cfg: PeerConfig, side: str, index: int) -> SideDrain:
    count = 2 if side == "coldbrew-2p" else 1
    label = f"{side} #{index + 1}"
    async with namespace_for(cfg, label) as namespace:
        publish_seconds = await prepublish(cfg, namespace, index)
        queue = Topology(namespace).job_queue("default", "default")
        progress(f"{label}: published {cfg.jobs} in {publish_seconds:.1f} s; starting {count}")
        extra = {"COLDBREW_PREFETCH": str(cfg.coldbrew_prefetch)} if cfg.coldbrew_prefetch else {}
        with ack_directory() as (ack_dir, acks):
            extra[ACK_DIR_ENV] = str(ack_dir)
            conn = await asyncpg.connect(cfg.database_url)
            try:
                async with (
                    QueueProbe(cfg.amqp_url) as probe,
                    coldbrew_workers(
                        cfg,
                        namespace,
                        "bench.peer_apps.coldbrew_app:app",
                        count,
                        label,
                        extra,
                        wait_ready=False,
                    ) as (processes, logs_),
                ):
                    pids = [p.pid for p in processes]
                    await wait_consumers(probe, queue, count, processes, logs_)
                    start = Reading.take(pids)
                    acked0 = acks.total()
                    done0 = await conn.fetchval(
                        f"SELECT count(*) FROM {quote_ident(namespace)}.jobs "
                        "WHERE status = 'succeeded'"
                    )
                    steady: list[tuple[int, float]] = []
                    watch = asyncio.ensure_future(
                        wait_acks(acks, cfg.jobs, processes, logs_, steady)
                    )
                    try:
                        polls, polling = await wait_succeeded(
                            cfg, conn, namespace, processes[0], label
                        )
                        await watch
                    finally:
                        watch.cancel()
                        with contextlib.suppress(asyncio.CancelledError, BenchError):
                            await watch
                    end = Reading.take(pids)
                    check_alive(processes, logs_)
                    drain = measured(side, index, cfg.jobs - done0, start, end, pids)
                    for process in processes:
                        await stop_tree(process)
                    left, _ = await probe.counts(queue)
                statuses = dict(
                    await conn.fetch(
                        f"SELECT status::text, count(*) FROM {quote_ident(namespace)}.jobs "
                        "GROUP BY 1"
                    )
                )
            finally:
                await conn.close()
            total = acks.total()
    drain.publish_seconds = publish_seconds
    drain.steady_rate = steady_rate(steady)
    drain.extra = {
        "acked_before_start": acked0,
        "succeeded_before_start": done0,
        "acks": total,
        "left_after_stop": left,
        "statuses": statuses,
        "poll_ms_mean": polling / polls * 1000,
    }
    if left != 0 or statuses != {"succeeded": cfg.jobs}:
        raise BenchError(f"{label}: {left} messages left, job statuses {statuses}")
    return drain


async def run_raw_side(cfg: PeerConfig, index: int) -> SideDrain:
    """``throughput.run_raw``, timed by its consumer: "go" to a round trip after the last ack."""
    raw = await run_raw(cfg, index, cfg.prefetch)
    return SideDrain(
        "raw",
        index,
        raw.jobs,
        seconds=raw.seconds,
        consumer_cpu_seconds=raw.consumer_cpu_seconds,
        postgres_cpu_seconds=raw.postgres_cpu_seconds,
        rabbitmq_cpu_seconds=raw.rabbitmq_cpu_seconds,
        machine_busy_cores=raw.machine_busy_cores,
        machine_steal_cores=raw.machine_steal_cores,
        publish_seconds=raw.publish_seconds,
        processes=1,
        rss_kib=raw.peak_rss_kib or 0,
    )


async def run_side(cfg: PeerConfig, side: str, index: int) -> SideDrain:
    """One drain; a side that fails is recorded with its error, and the run goes on."""
    try:
        if side == "raw":
            drain = await run_raw_side(cfg, index)
        elif side.startswith("coldbrew"):
            drain = await run_coldbrew_side(cfg, side, index)
        else:
            drain = await run_peer(cfg, side, index)
    except SERVICE_ERRORS as exc:
        progress(f"{side} #{index + 1}: FAILED: {exc}")
        return SideDrain(side, index, cfg.jobs, error=str(exc) or type(exc).__name__)
    progress(
        f"{side} #{index + 1}: {drain.rate:,.0f} jobs/s ({drain.seconds:.2f} s), "
        f"{drain.cpu_us_per_job:,.0f} us CPU/job"
    )
    return drain


# --- the run ----------------------------------------------------------------------------------


async def run(cfg: PeerConfig) -> dict[str, Any]:
    logs.configure("json", "warning")
    conn = await connect_creating_database(cfg.database_url)
    await conn.close()
    machine = await machine_info(cfg.amqp_url, cfg.database_url)
    machine["peer_packages"] = peer_versions()
    progress(
        f"{cfg.jobs} jobs x {cfg.repeat} rounds, sides {', '.join(cfg.sides)}; "
        f"RabbitMQ {machine['rabbitmq']}, PostgreSQL {machine['postgresql']}, "
        f"{machine['nproc']} CPUs"
    )
    drains: list[SideDrain] = []
    for index in range(cfg.repeat):
        shift = index % len(cfg.sides)
        for side in cfg.sides[shift:] + cfg.sides[:shift]:  # a rotating order per round
            drains.append(await best_of_prefetches(cfg, side, index))
    return summarize(cfg, machine, drains)


async def best_of_prefetches(cfg: PeerConfig, side: str, index: int) -> SideDrain:
    """A peer's (or the raw loop's) best drain of the round over ``cfg.prefetches``; coldbrew
    sizes its own hold, so it drains once. The prefetch each drain had is in ``extra``."""
    if side.startswith("coldbrew"):
        return await run_side(cfg, side, index)
    tried: list[SideDrain] = []
    for prefetch in cfg.prefetches:
        drain = await run_side(dataclasses.replace(cfg, prefetch=prefetch), side, index)
        drain.extra["prefetch"] = prefetch
        tried.append(drain)
    ok = [d for d in tried if d.error is None]
    if not ok:
        return tried[-1]
    best = max(ok, key=lambda d: d.rate)
    best.extra["rates_by_prefetch"] = {d.extra["prefetch"]: d.rate for d in ok}
    return best


def peer_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("celery", "kombu", "amqp", "dramatiq", "pika", "taskiq", "taskiq-aio-pika"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    return found


def summarize(cfg: PeerConfig, machine: dict[str, Any], drains: list[SideDrain]) -> dict[str, Any]:
    sides: dict[str, Any] = {}
    for side in cfg.sides:
        runs = [d for d in drains if d.side == side]
        ok = [d for d in runs if d.error is None]
        entry: dict[str, Any] = {
            "runs": [asdict(d) | {"rate": d.rate} for d in runs],
            "errors": [d.error for d in runs if d.error],
        }
        if ok:
            entry |= {
                "rate": Spread.of([d.rate for d in ok]).as_dict(),
                "seconds": Spread.of([d.seconds for d in ok]).as_dict(),
                "cpu_us_per_job": Spread.of([d.cpu_us_per_job for d in ok]).as_dict(),
                "postgres_cpu_us_per_job": statistics.median(
                    d.postgres_cpu_seconds / d.jobs * 1e6 for d in ok
                ),
                "rabbitmq_cpu_us_per_job": statistics.median(
                    d.rabbitmq_cpu_seconds / d.jobs * 1e6 for d in ok
                ),
                "machine_busy_cores": statistics.median(d.machine_busy_cores for d in ok),
                "machine_steal_cores": statistics.median(d.machine_steal_cores for d in ok),
                "processes": max(d.processes for d in ok),
                "rss_mib": statistics.median(d.rss_kib / 1024 for d in ok),
            }
            steady = [d.steady_rate for d in ok if d.steady_rate is not None]
            if steady:
                entry["steady_rate"] = Spread.of(steady).as_dict()
        sides[side] = entry
    return {
        "config": {
            "jobs": cfg.jobs,
            "repeat": cfg.repeat,
            "sides": list(cfg.sides),
            "prefetch": list(cfg.prefetches),
            "coldbrew_concurrency": cfg.concurrency,
            "coldbrew_prefetch": Settings.model_construct(
                concurrency=cfg.concurrency, prefetch=cfg.coldbrew_prefetch
            ).hold_cap,
            "dramatiq_threads": cfg.threads,
            "celery_prefork_children": CELERY_PREFORK_CHILDREN,
            "poll_seconds": POLL_SECONDS,
        },
        "machine": machine,
        "sides": sides,
        "ratios": ratios(cfg, drains),
    }


def ratios(cfg: PeerConfig, drains: list[SideDrain]) -> dict[str, Any]:
    """coldbrew/raw and coldbrew/fastest single-process peer, per round, then the median."""
    ok = {(d.side, d.round): d for d in drains if d.error is None}
    vs_raw: list[float] = []
    vs_peer: list[float] = []
    fastest: list[str] = []
    for index in range(cfg.repeat):
        cold = ok.get(("coldbrew", index))
        if cold is None:
            continue
        raw = ok.get(("raw", index))
        if raw is not None:
            vs_raw.append(cold.rate / raw.rate)
        peers = [ok[(s, index)] for s in SINGLE_PROCESS_PEERS if (s, index) in ok]
        if peers:
            best = max(peers, key=lambda d: d.rate)
            vs_peer.append(cold.rate / best.rate)
            fastest.append(best.side)

    def one(values: list[float], target: float) -> dict[str, Any]:
        median = statistics.median(values) if values else None
        return {
            "median": median,
            "per_round": values,
            "target": target,
            "met": None if median is None else median >= target,
        }

    return {
        "coldbrew_vs_raw": one(vs_raw, TARGET_RAW),
        "coldbrew_vs_fastest_single_process_peer": one(vs_peer, TARGET_PEER) | {"peer": fastest},
    }


NAMES = {
    "raw": "raw loop",
    "coldbrew": "coldbrew 1 proc",
    "coldbrew-2p": "coldbrew 2 procs",
    "celery-solo": "celery solo",
    "celery-prefork": "celery prefork 2",
    "dramatiq": "dramatiq 1x8",
    "taskiq": "taskiq 1 proc",
}


def render(result: dict[str, Any]) -> str:
    cfg, machine = result["config"], result["machine"]
    dirty = " + uncommitted src changes" if machine.get("src_modified") else ""
    versions = ", ".join(f"{k} {v}" for k, v in machine["peer_packages"].items())
    lines = [
        f"peer throughput: {cfg['jobs']:,} pre-published no-op jobs, {cfg['repeat']} rounds, "
        f"late acks; raw and peers at their best of prefetch "
        f"{'/'.join(map(str, cfg['prefetch']))}, coldbrew concurrency "
        f"{cfg['coldbrew_concurrency']}, its hold capped at {cfg['coldbrew_prefetch']}",
        f"coldbrew {machine.get('coldbrew_commit') or '?'}{dirty}; {machine['nproc']} x "
        f"{machine['cpu_model']}, {machine['ram_gib']} GiB; RabbitMQ {machine['rabbitmq']}, "
        f"PostgreSQL {machine['postgresql']}, Python {machine['python']}",
        f"peers: {versions}",
        "",
        f"{'':<17} {'jobs/s':>8} {'jobs/s':>15} {'drain':>6} {'10-90%':>7} "
        f"{'-- CPU us/job --':>21} {'cores':>5} {'':>5} {'RSS':>5}",
        f"{'side':<17} {'median':>8} {'min-max':>15} {'s':>6} {'jobs/s':>7} {'consumer':>8} "
        f"{'pg':>5} {'rmq':>6} {'busy':>5} {'procs':>5} {'MiB':>5}",
    ]
    for side in cfg["sides"]:
        entry = result["sides"][side]
        name = NAMES.get(side, side)
        if "rate" not in entry:
            lines.append(f"{name:<17} FAILED: {entry['errors'][0][:200]}")
            continue
        rate = entry["rate"]
        spread = f"{rate['min']:,.0f}-{rate['max']:,.0f}"
        steady = f"{entry['steady_rate']['median']:,.0f}" if "steady_rate" in entry else "-"
        lines.append(
            f"{name:<17} {rate['median']:>8,.0f} {spread:>15} {entry['seconds']['median']:>6.2f} "
            f"{steady:>7} {entry['cpu_us_per_job']['median']:>8,.0f} "
            f"{entry['postgres_cpu_us_per_job']:>5,.0f} "
            f"{entry['rabbitmq_cpu_us_per_job']:>6,.0f} {entry['machine_busy_cores']:>5.2f} "
            f"{entry['processes']:>5} {entry['rss_mib']:>5.0f}"
        )
        if entry["errors"]:
            lines.append(f"{'':<17} ({len(entry['errors'])} failed: {entry['errors'][0][:150]})")
        chosen = [r["extra"].get("prefetch") for r in entry["runs"] if r.get("extra")]
        if any(p is not None for p in chosen):
            lines.append(f"{'':<17} (best prefetch per round: {', '.join(map(str, chosen))})")
    lines += [
        "(medians; jobs/s = all N acked (coldbrew: and succeeded) from the consumers' start;",
        " 10-90% = the ack rate between 10% and 90% of N, without start-up and tail;",
        " consumer = the side's process tree; pg, rmq = all postgres and beam.smp",
        " processes on the machine; busy = whole-machine cores busy during the drain)",
        "",
    ]
    vs_raw = result["ratios"]["coldbrew_vs_raw"]
    vs_peer = result["ratios"]["coldbrew_vs_fastest_single_process_peer"]
    for title, ratio in (
        ("coldbrew/raw", vs_raw),
        ("coldbrew/fastest single-process peer", vs_peer),
    ):
        if ratio["median"] is None:
            lines.append(f"ratio {title}: not measured")
            continue
        rounds = ", ".join(f"{r:.2f}" for r in ratio["per_round"])
        if "peer" in ratio:
            rounds = ", ".join(
                f"{r:.2f} ({NAMES.get(p, p)})"
                for r, p in zip(ratio["per_round"], ratio["peer"], strict=True)
            )
        verdict = "met" if ratio["met"] else "MISSED"
        lines.append(
            f"ratio {title} (median of rounds): {ratio['median']:.2f}  [rounds: {rounds}]  "
            f"target >= {ratio['target']}: {verdict}"
        )
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, help="messages per drain (20000; --quick 2000)")
    parser.add_argument("--repeat", type=int, help="rounds, each side once a round (3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 1 round: for development")
    parser.add_argument(
        "--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}"
    )
    parser.add_argument(
        "--prefetch",
        default=",".join(map(str, PREFETCHES)),
        help="prefetches the raw loop and each peer try per round, the best kept (100,300,1000)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=100, help="COLDBREW_CONCURRENCY, taskiq's async tasks"
    )
    parser.add_argument(
        "--coldbrew-prefetch", type=int, default=0, help="COLDBREW_PREFETCH (0: coldbrew's default)"
    )
    parser.add_argument("--threads", type=int, default=8, help="Dramatiq worker threads (8)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    parser.add_argument("--publish-peer", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.jobs = args.jobs or (2_000 if args.quick else 20_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.sides = tuple(s.strip() for s in args.sides.split(",") if s.strip())
    try:
        args.prefetch = tuple(int(p) for p in str(args.prefetch).split(",") if p.strip())
    except ValueError:
        parser.error(f"--prefetch: not a comma-separated list of integers: {args.prefetch}")
    if not args.prefetch:
        parser.error("--prefetch: none given")
    unknown = set(args.sides) - set(SIDES)
    if unknown or not args.sides:
        parser.error(f"--sides: unknown {', '.join(sorted(unknown)) or '(none given)'}")
    if min(args.jobs, args.repeat, *args.prefetch, args.concurrency, args.threads) < 1:
        parser.error("--jobs, --repeat, --prefetch, --concurrency and --threads must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.publish_peer:
        return publish_peer_main(args.publish_peer, args.jobs)

    def config(workdir: Path) -> PeerConfig:
        return PeerConfig(
            jobs=args.jobs,
            repeat=args.repeat,
            concurrency=args.concurrency,
            prefetch=args.prefetch[0],
            prefetches=args.prefetch,
            idle_seconds=0.0,
            amqp_url=args.amqp_url,
            database_url=args.database_url,
            workdir=workdir,
            sides=args.sides,
            threads=args.threads,
            coldbrew_prefetch=args.coldbrew_prefetch,
        )

    return run_main(config, run, render, json_output=args.json, workdir_prefix="cbbench-peers-")


if __name__ == "__main__":
    sys.exit(main())
