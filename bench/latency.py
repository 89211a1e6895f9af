"""Latency benchmark (issue #5, scenario 2): publish-to-start latency at a steady rate.

A publisher subprocess sends ``--rate`` messages a second for ``--seconds``,
each at its slot on an absolute schedule (``start + i / rate``: a late slot
does not push the next ones back), each carrying the ``CLOCK_MONOTONIC`` time
taken just before it is published. The job, as its first action, sends one
UDP datagram ``"seq sent started"`` to a port the bench listens on; latency is
``started - sent``. One clock, one machine, no clock skew. Sides:

* ``raw``: a plain aio-pika consumer (uvloop, prefetch ``--prefetch``) that
  stamps and reports each message on receipt, then acks it. The floor.
* ``coldbrew``: one ``coldbrew worker bench.latency_app:app`` on a fresh
  namespace, fed per the message contract; ``ping`` reports when it starts
  (after the claim is committed and the delivery acked).
* ``dramatiq``: one Dramatiq worker process (``--threads`` threads) running the
  ``ping`` actor of ``peer_apps/dramatiq_app.py``, fed by ``actor.send``.

The first ``--warmup`` seconds of messages (by publish time) are discarded.
Sides alternate in a rotating order per round; each side's p50/p90/p99/max is
the median over rounds, and the ratio coldbrew p99 / Dramatiq p99 is taken per
round, then medianed.

    python bench/latency.py --repeat 3          # the reference run (~3.5 minutes)
    python bench/latency.py --quick             # 5 s at 500/s, 1 round, for development
    python bench/latency.py --profile DIR       # + one unmeasured coldbrew run under py-spy
    python bench/latency.py --stages            # + one unmeasured run, each job's path stamped

The targets printed are #5's (p50 <= 2 ms, p99 <= 2x Dramatiq's) and #19 item 3's,
each a median of per-round ratios against Dramatiq in the same round: p50 <= 1.2x,
p99 <= 1.5x, and the worker's CPU at this rate <= Dramatiq's (1.0x).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aio_pika
from bench import _latency_stages
from bench._common import (
    SERVICE_ERRORS,
    BenchError,
    Spread,
    add_claim_commit_argument,
    child_env,
    claim_commit_env,
    delete_broker_entities,
    machine_info,
    progress,
    run_main,
    tail,
)
from bench._profile import render_profile, start_profile, stop_profile
from bench.peers import (
    QueueProbe,
    check_alive,
    coldbrew_workers,
    peer_versions,
    spawn,
    stop_tree,
    tree_cpu_seconds,
)
from bench.throughput import Config, namespace_for, raw_queue_arguments

from coldbrew import logs
from coldbrew.migrate import connect_creating_database
from coldbrew.topology import Topology
from coldbrew.transport import Broker

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_DATABASE_URL = "postgresql://127.0.0.1:5432/coldbrew_bench"
SIDES = ("raw", "coldbrew", "dramatiq")
SCRIPT = Path(__file__).resolve()
CLOCK = time.CLOCK_MONOTONIC
START_TIMEOUT = 90.0
SETTLE_SECONDS = 1.0  # after the consumer is ready, before the first message
DRAIN_SECONDS = 10.0  # after the last publish, how long to wait for the last reports
TARGET_P50_MS = 2.0
TARGET_P99_VS_DRAMATIQ = 2.0
# issue #19 item 3: per-round ratios against Dramatiq in the same round, medianed
TARGETS_VS_DRAMATIQ = {"p50_ms": 1.2, "p99_ms": 1.5, "consumer_cpu_percent": 1.0}
PROFILE_RATE = 250  # Hz: py-spy's own CPU comes from the same two cores


def now() -> float:
    return time.clock_gettime(CLOCK)


@dataclass
class LatencyConfig(Config):
    """``throughput.Config`` (for ``namespace_for`` and the coldbrew worker) plus the schedule."""

    rate: float = 500.0
    seconds: float = 20.0
    warmup: float = 1.0
    sides: tuple[str, ...] = SIDES
    threads: int = 8
    claim_commit: str | None = None  # COLDBREW_CLAIM_COMMIT of the coldbrew worker (None: default)
    profile: Path | None = None  # one more, unmeasured coldbrew run with py-spy writing here
    stages: bool = False  # one more, unmeasured coldbrew run with each job's path stamped


@dataclass
class SideLatency:
    """One side's run in one round (``error`` set when it could not be measured)."""

    side: str
    round: int
    published: int = 0
    received: int = 0
    measured: int = 0
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    mean_ms: float = 0.0
    publisher: dict[str, Any] = field(default_factory=dict)
    consumer_cpu_percent: float = 0.0
    error: str | None = None


# --- the reports ---------------------------------------------------------------------------


class Reports(asyncio.DatagramProtocol):
    """The bench's UDP listener: one ``"seq sent started"`` datagram per job start."""

    def __init__(self) -> None:
        self.samples: dict[int, tuple[float, float]] = {}
        self.duplicates = 0
        self.garbled = 0
        self.expected: int | None = None
        self.complete = asyncio.Event()

    def expect(self, count: int) -> None:
        """``complete`` is set once ``count`` distinct jobs have reported."""
        self.expected = count
        if len(self.samples) >= count:
            self.complete.set()

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        try:
            seq_text, sent_text, started_text = data.decode().split()
            seq = int(seq_text)
            sample = (float(sent_text), float(started_text))
        except ValueError:
            self.garbled += 1
            return
        if seq in self.samples:
            self.duplicates += 1
        else:
            self.samples[seq] = sample
            if self.expected is not None and len(self.samples) >= self.expected:
                self.complete.set()


@contextlib.asynccontextmanager
async def listener() -> AsyncIterator[tuple[Reports, str]]:
    """A UDP socket on a free loopback port with a large receive buffer; yields (reports, addr)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    sock.bind(("127.0.0.1", 0))
    reports = Reports()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: reports, sock=sock
    )
    try:
        yield reports, f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        transport.close()


def percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    index = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def latency_stats(
    reports: Reports, published: int, warmup: float, first_sent: float
) -> dict[str, Any]:
    """Percentiles (ms) of ``started - sent`` for messages published after the warm-up."""
    kept = sorted(
        (started - sent) * 1000
        for sent, started in reports.samples.values()
        if sent >= first_sent + warmup
    )
    if not kept:
        raise BenchError("no job start was reported after the warm-up")
    return {
        "published": published,
        "received": len(reports.samples),
        "measured": len(kept),
        "p50_ms": percentile(kept, 0.50),
        "p90_ms": percentile(kept, 0.90),
        "p99_ms": percentile(kept, 0.99),
        "max_ms": kept[-1],
        "mean_ms": statistics.fmean(kept),
    }


# --- publishers (subprocesses) -----------------------------------------------------------------


def schedule_report(lags: list[float], started: float, published: int) -> dict[str, Any]:
    lags.sort()
    return {
        "published": published,
        "first_sent": started,
        "seconds": now() - started,
        "lag_p50_ms": percentile(lags, 0.5) * 1000 if lags else 0.0,
        "lag_p99_ms": percentile(lags, 0.99) * 1000 if lags else 0.0,
        "lag_max_ms": lags[-1] * 1000 if lags else 0.0,
    }


async def publish_amqp(
    amqp_url: str, exchange_name: str, routing_key: str, rate: float, seconds: float
) -> dict[str, Any]:
    """The contract's message, ``{"type":"ping","args":{"seq","sent"}}``, on a schedule.

    Each publish is its own task, so a slow confirm never delays the next slot.
    """
    count = int(rate * seconds)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = (
            await channel.get_exchange(exchange_name) if exchange_name else channel.default_exchange
        )
        loop = asyncio.get_running_loop()
        tasks: list[asyncio.Future[Any]] = []
        lags: list[float] = []
        prefix = secrets.token_hex(4)
        start = now() + 0.05
        for seq in range(count):
            slot = start + seq / rate
            delay = slot - now()
            if delay > 0:
                await asyncio.sleep(delay)
            sent = now()
            lags.append(max(0.0, sent - slot))
            body = json.dumps(
                {"type": "ping", "args": {"seq": seq, "sent": sent}}, separators=(",", ":")
            ).encode()
            message = aio_pika.Message(
                body,
                message_id=f"lat-{prefix}-{seq}",
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            tasks.append(
                loop.create_task(exchange.publish(message, routing_key=routing_key, timeout=30))
            )
        await asyncio.gather(*tasks)
    finally:
        await connection.close()
    return schedule_report(lags, start, count)


def publish_dramatiq(rate: float, seconds: float) -> dict[str, Any]:
    """``ping.send(seq, sent)`` through Dramatiq's own client, on the same schedule."""
    from bench.peer_apps import dramatiq_app

    count = int(rate * seconds)
    lags: list[float] = []
    start = now() + 0.05
    try:
        for seq in range(count):
            slot = start + seq / rate
            delay = slot - now()
            if delay > 0:
                time.sleep(delay)
            sent = now()
            lags.append(max(0.0, sent - slot))
            dramatiq_app.ping.send(seq, sent)
    finally:
        dramatiq_app.broker.close()
    return schedule_report(lags, start, count)


async def run_publisher(cfg: LatencyConfig, argv: list[str], env: Mapping[str, str]) -> Any:
    """Run one publisher subprocess to its end; return its JSON report."""
    log_path = cfg.workdir / "publisher.log"
    with log_path.open("ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(SCRIPT),
            *argv,
            "--rate",
            str(cfg.rate),
            "--seconds",
            str(cfg.seconds),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=cfg.workdir,
            start_new_session=True,
        )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=cfg.seconds + 120)
    finally:
        await stop_tree(process, grace=5)
    if process.returncode != 0:
        raise BenchError(f"publisher exited {process.returncode}:\n{tail(log_path)}")
    return json.loads(out.decode().strip().splitlines()[-1])


# --- the raw consumer (a subprocess) ---------------------------------------------------------


async def raw_consumer(amqp_url: str, queue_name: str, prefetch: int, udp: str) -> None:
    """Stamp and report each message on receipt, then ack it; runs until SIGTERM."""
    host, _, port = udp.rpartition(":")
    address = (host, int(port))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        started = now()
        args = json.loads(message.body)["args"]
        sock.sendto(f"{args['seq']} {args['sent']!r} {started!r}".encode(), address)
        await message.ack()

    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.declare_queue(queue_name, passive=True)
        await queue.consume(on_message)
        await stop.wait()
    finally:
        await connection.close()


# --- the sides ---------------------------------------------------------------------------------


async def wait_consumer(
    probe: QueueProbe, queue: str, process: asyncio.subprocess.Process, log_path: Path
) -> None:
    """Until the broker lists a consumer on ``queue`` (which the consumer may declare itself)."""
    deadline = time.perf_counter() + START_TIMEOUT
    while True:
        with contextlib.suppress(BenchError):
            _, consumers = await probe.counts(queue)
            if consumers >= 1:
                return
        check_alive([process], [log_path])
        if time.perf_counter() > deadline:
            raise BenchError(f"no consumer on {queue} after {START_TIMEOUT:g} s")
        await asyncio.sleep(0.02)


async def measure(
    cfg: LatencyConfig,
    label: str,
    processes: list[asyncio.subprocess.Process],
    logs_: list[Path],
    reports: Reports,
    publisher_argv: list[str],
    publisher_env: Mapping[str, str],
) -> dict[str, Any]:
    """Publish on schedule, wait for the reports, and compute the figures."""
    pids = [p.pid for p in processes]
    await asyncio.sleep(SETTLE_SECONDS)
    check_alive(processes, logs_)
    progress(f"{label}: publishing {cfg.rate:g}/s for {cfg.seconds:g} s")
    cpu0, t0 = tree_cpu_seconds(pids), time.perf_counter()
    report = await run_publisher(cfg, publisher_argv, publisher_env)
    cpu1, t1 = tree_cpu_seconds(pids), time.perf_counter()
    reports.expect(report["published"])
    with contextlib.suppress(TimeoutError):  # the lost ones are counted, not waited for
        await asyncio.wait_for(reports.complete.wait(), timeout=DRAIN_SECONDS)
    check_alive(processes, logs_)
    lost = report["published"] - len(reports.samples)
    if lost > report["published"] // 100:
        raise BenchError(
            f"{label}: {lost} of {report['published']} jobs never reported; consumer log:\n"
            + "\n".join(tail(path, 10) for path in logs_)
        )
    stats = latency_stats(reports, report["published"], cfg.warmup, report["first_sent"])
    stats["publisher"] = report
    stats["consumer_cpu_percent"] = (cpu1 - cpu0) / (t1 - t0) * 100
    if reports.duplicates or reports.garbled:
        stats["publisher"] |= {"duplicates": reports.duplicates, "garbled": reports.garbled}
    return stats


async def run_raw(cfg: LatencyConfig, index: int) -> dict[str, Any]:
    queue = f"cbbench_{cfg.run_id}.lat-raw.{index}"
    log_path = cfg.workdir / f"raw-{index}.log"
    process: asyncio.subprocess.Process | None = None
    try:
        connection = await aio_pika.connect(cfg.amqp_url)
        try:
            channel = await connection.channel()
            await channel.declare_queue(queue, durable=True, arguments=raw_queue_arguments())
        finally:
            await connection.close()
        async with listener() as (reports, udp), QueueProbe(cfg.amqp_url) as probe:
            argv = [sys.executable, str(SCRIPT), "--raw-consumer", queue]
            argv += ["--prefetch", str(cfg.prefetch), "--udp", udp, "--amqp-url", cfg.amqp_url]
            process = await spawn(argv, child_env({}), log_path, cfg.workdir)
            await wait_consumer(probe, queue, process, log_path)
            publisher = ["--publisher", "amqp", "--exchange", "", "--routing-key", queue]
            publisher += ["--amqp-url", cfg.amqp_url]
            return await measure(
                cfg, f"raw #{index + 1}", [process], [log_path], reports, publisher, child_env({})
            )
    finally:
        if process is not None:
            await stop_tree(process, grace=10)
        await delete_broker_entities(cfg.amqp_url, [queue], [])


async def run_coldbrew(
    cfg: LatencyConfig, index: int, profile: Path | None = None, stages: Path | None = None
) -> dict[str, Any]:
    """One coldbrew run; with ``profile``, py-spy samples the worker while it publishes; with
    ``stages``, the worker writes each job's stamps there (``bench/_latency_stages.py``)."""
    extra = profile is not None or stages is not None
    label = "coldbrew (profiled)" if extra else f"coldbrew #{index + 1}"
    worker_env = {"CBBENCH_STAGES": str(stages)} if stages is not None else {}
    async with namespace_for(cfg, label) as namespace:
        topology = Topology(namespace)
        broker = Broker(cfg.amqp_url, topology, name="coldbrew-bench-declare")
        await broker.connect()
        try:
            await broker.declare_job_queue("default", "default")
        finally:
            await broker.close()
        async with (
            listener() as (reports, udp),
            coldbrew_workers(
                cfg,
                namespace,
                "bench.latency_app:app",
                1,
                label,
                {"CBBENCH_UDP": udp} | claim_commit_env(cfg.claim_commit) | worker_env,
                wait_ready=True,
            ) as (processes, logs_),
        ):
            publisher = ["--publisher", "amqp", "--exchange", topology.jobs_exchange]
            publisher += ["--routing-key", "default.default", "--amqp-url", cfg.amqp_url]
            if profile is None:
                return await measure(
                    cfg, label, processes, logs_, reports, publisher, child_env({})
                )
            spy = await start_profile(profile, processes[0].pid, "worker", rate=PROFILE_RATE)
            try:
                stats = await measure(
                    cfg, label, processes, logs_, reports, publisher, child_env({})
                )
            finally:
                summary = await stop_profile(spy)
            if summary is None:
                raise BenchError(f"py-spy wrote no profile to {spy.folded}")
            (profile / "summary.json").write_text(json.dumps(summary, indent=2))
            return stats | {"profile": summary}


async def run_dramatiq(cfg: LatencyConfig, index: int) -> dict[str, Any]:
    queue = f"cbbench_{cfg.run_id}.lat-dramatiq.{index}"
    log_path = cfg.workdir / f"dramatiq-{index}.log"
    process: asyncio.subprocess.Process | None = None
    try:
        async with listener() as (reports, udp), QueueProbe(cfg.amqp_url) as probe:
            env = child_env(
                {
                    "CBBENCH_AMQP_URL": cfg.amqp_url,
                    "CBBENCH_QUEUE": queue,
                    "CBBENCH_UDP": udp,
                    "dramatiq_queue_prefetch": str(cfg.prefetch),
                }
            )
            argv = [sys.executable, "-m", "dramatiq", "bench.peer_apps.dramatiq_app"]
            argv += ["--processes", "1", "--threads", str(cfg.threads), "--queues", queue]
            process = await spawn(argv, env, log_path, cfg.workdir)
            await wait_consumer(probe, queue, process, log_path)
            label = f"dramatiq #{index + 1}"
            publisher = ["--publisher", "dramatiq"]
            return await measure(cfg, label, [process], [log_path], reports, publisher, env)
    finally:
        if process is not None:
            await stop_tree(process)
        await delete_broker_entities(cfg.amqp_url, [queue, f"{queue}.DQ", f"{queue}.XQ"], [])


RUNNERS = {"raw": run_raw, "coldbrew": run_coldbrew, "dramatiq": run_dramatiq}


async def run_side(cfg: LatencyConfig, side: str, index: int) -> SideLatency:
    """One side's run; a side that fails is recorded with its error, and the run goes on."""
    try:
        stats = await RUNNERS[side](cfg, index)
    except SERVICE_ERRORS as exc:
        progress(f"{side} #{index + 1}: FAILED: {exc}")
        return SideLatency(side, index, error=str(exc) or type(exc).__name__)
    result = SideLatency(side, index, **stats)
    missing = result.published - result.received
    progress(
        f"{side} #{index + 1}: p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, "
        f"max {result.max_ms:.1f} ms over {result.measured:,} jobs"
        + (f"; {missing} never reported" if missing else "")
    )
    return result


# --- the run -----------------------------------------------------------------------------------


async def run(cfg: LatencyConfig) -> dict[str, Any]:
    logs.configure("json", "warning")
    conn = await connect_creating_database(cfg.database_url)
    await conn.close()
    machine = await machine_info(cfg.amqp_url, cfg.database_url)
    machine["peer_packages"] = peer_versions()
    progress(
        f"{cfg.rate:g} msg/s for {cfg.seconds:g} s x {cfg.repeat} rounds, sides "
        f"{', '.join(cfg.sides)}; RabbitMQ {machine['rabbitmq']}, {machine['nproc']} CPUs"
    )
    results: list[SideLatency] = []
    for index in range(cfg.repeat):
        shift = index % len(cfg.sides)
        for side in cfg.sides[shift:] + cfg.sides[:shift]:
            results.append(await run_side(cfg, side, index))
    summary = summarize(cfg, machine, results)
    if cfg.profile is not None or cfg.stages:
        if cfg.profile is not None:
            cfg.profile.mkdir(parents=True, exist_ok=True)
        stages = cfg.workdir / "stages.json" if cfg.stages else None
        extra = await run_coldbrew(cfg, cfg.repeat, profile=cfg.profile, stages=stages)
        figures = {k: extra[k] for k in ("p50_ms", "p99_ms", "consumer_cpu_percent")}
        if cfg.profile is not None:
            summary["profile"] = extra["profile"] | figures
            progress(f"profile: written to {cfg.profile}")
        if stages is not None:  # the worker has exited: its last rows are written
            rows = json.loads(stages.read_text()) if stages.exists() else []
            summary["stages"] = _latency_stages.summarize(rows, cfg.warmup) | figures
    return summary


def summarize(
    cfg: LatencyConfig, machine: dict[str, Any], results: list[SideLatency]
) -> dict[str, Any]:
    sides: dict[str, Any] = {}
    for side in cfg.sides:
        runs = [r for r in results if r.side == side]
        ok = [r for r in runs if r.error is None]
        entry: dict[str, Any] = {
            "runs": [asdict(r) for r in runs],
            "errors": [r.error for r in runs if r.error],
        }
        if ok:
            for name in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"):
                values = [getattr(r, name) for r in ok]
                entry[name] = Spread.of(values).as_dict()
            entry["missing"] = sum(r.published - r.received for r in ok)
            entry["consumer_cpu_percent"] = statistics.median(r.consumer_cpu_percent for r in ok)
            entry["publisher_lag_max_ms"] = max(r.publisher.get("lag_max_ms", 0.0) for r in ok)
        sides[side] = entry
    done = {(r.side, r.round): r for r in results if r.error is None}
    ratios = [
        done[("coldbrew", i)].p99_ms / done[("dramatiq", i)].p99_ms
        for i in range(cfg.repeat)
        if ("coldbrew", i) in done and ("dramatiq", i) in done and done[("dramatiq", i)].p99_ms > 0
    ]
    cold = sides.get("coldbrew", {})
    versus: dict[str, Any] = {}
    for name, target in TARGETS_VS_DRAMATIQ.items():
        per_round = [
            getattr(done[("coldbrew", i)], name) / getattr(done[("dramatiq", i)], name)
            for i in range(cfg.repeat)
            if ("coldbrew", i) in done
            and ("dramatiq", i) in done
            and getattr(done[("dramatiq", i)], name) > 0
        ]
        median = statistics.median(per_round) if per_round else None
        versus[name] = {
            "median": median,
            "per_round": per_round,
            "target": target,
            "met": None if median is None else median <= target,
        }
    return {
        "config": {
            "rate": cfg.rate,
            "seconds": cfg.seconds,
            "warmup_seconds": cfg.warmup,
            "repeat": cfg.repeat,
            "sides": list(cfg.sides),
            "prefetch": cfg.prefetch,
            "coldbrew_concurrency": cfg.concurrency,
            "dramatiq_threads": cfg.threads,
            "coldbrew_claim_commit": cfg.claim_commit or "default",
        },
        "machine": machine,
        "sides": sides,
        "targets": {
            "coldbrew_p50_ms": {
                "value": cold.get("p50_ms", {}).get("median"),
                "target": TARGET_P50_MS,
                "met": None if "p50_ms" not in cold else cold["p50_ms"]["median"] <= TARGET_P50_MS,
            },
            "coldbrew_p99_vs_dramatiq_p99": {
                "median": statistics.median(ratios) if ratios else None,
                "per_round": ratios,
                "target": TARGET_P99_VS_DRAMATIQ,
                "met": None if not ratios else statistics.median(ratios) <= TARGET_P99_VS_DRAMATIQ,
            },
            "vs_dramatiq_19": versus,
        },
    }


def render(result: dict[str, Any]) -> str:
    cfg, machine = result["config"], result["machine"]
    dirty = " + uncommitted src changes" if machine.get("src_modified") else ""
    lines = [
        f"publish->start latency: {cfg['rate']:g} msg/s for {cfg['seconds']:g} s, "
        f"{cfg['repeat']} rounds, first {cfg['warmup_seconds']:g} s discarded; prefetch "
        f"{cfg['prefetch']} (raw, dramatiq), coldbrew concurrency {cfg['coldbrew_concurrency']}, "
        f"dramatiq {cfg['dramatiq_threads']} threads, coldbrew claim commit "
        f"{cfg.get('coldbrew_claim_commit', 'default')}",
        f"coldbrew {machine.get('coldbrew_commit') or '?'}{dirty}; {machine['nproc']} x "
        f"{machine['cpu_model']}; RabbitMQ {machine['rabbitmq']}, PostgreSQL "
        f"{machine['postgresql']}, Python {machine['python']}, dramatiq "
        f"{machine['peer_packages'].get('dramatiq')}",
        "",
        f"{'side':<10} {'p50 ms':>16} {'p90 ms':>16} {'p99 ms':>18} {'max ms':>18} "
        f"{'CPU %':>6} {'lost':>5}",
    ]

    def cell(entry: dict[str, Any], name: str, width: int) -> str:
        value = entry[name]
        text = f"{value['median']:.2f} ({value['min']:.2f}-{value['max']:.2f})"
        return f"{text:>{width}}"

    for side in cfg["sides"]:
        entry = result["sides"][side]
        if "p50_ms" not in entry:
            lines.append(f"{side:<10} FAILED: {entry['errors'][0][:200]}")
            continue
        lines.append(
            f"{side:<10} {cell(entry, 'p50_ms', 16)} {cell(entry, 'p90_ms', 16)} "
            f"{cell(entry, 'p99_ms', 18)} {cell(entry, 'max_ms', 18)} "
            f"{entry['consumer_cpu_percent']:>6.0f} {entry['missing']:>5}"
        )
        if entry["errors"]:
            lines.append(f"{'':<10} ({len(entry['errors'])} failed: {entry['errors'][0][:150]})")
    lines += [
        "(median over rounds, min-max in brackets; CPU % = the consumer's process tree while",
        " publishing, of one core; lost = published but never reported; publisher's worst lag "
        "behind its schedule: "
        + ", ".join(
            f"{s} {result['sides'][s]['publisher_lag_max_ms']:.1f} ms"
            for s in cfg["sides"]
            if "publisher_lag_max_ms" in result["sides"][s]
        )
        + ")",
        "",
    ]
    p50 = result["targets"]["coldbrew_p50_ms"]
    if p50["value"] is not None:
        verdict = "met" if p50["met"] else "MISSED"
        lines.append(
            f"coldbrew p50: {p50['value']:.2f} ms  target <= {p50['target']:g} ms: {verdict}"
        )
    ratio = result["targets"]["coldbrew_p99_vs_dramatiq_p99"]
    if ratio["median"] is not None:
        rounds = ", ".join(f"{r:.2f}" for r in ratio["per_round"])
        verdict = "met" if ratio["met"] else "MISSED"
        lines.append(
            f"coldbrew p99 / dramatiq p99 (median of rounds): {ratio['median']:.2f}  "
            f"[rounds: {rounds}]  target <= {ratio['target']:g}: {verdict}"
        )
    labels = {"p50_ms": "p50", "p99_ms": "p99", "consumer_cpu_percent": "worker CPU"}
    for name, entry in result["targets"].get("vs_dramatiq_19", {}).items():
        if entry["median"] is None:
            continue
        rounds = ", ".join(f"{r:.2f}" for r in entry["per_round"])
        verdict = "met" if entry["met"] else "MISSED"
        lines.append(
            f"#19: coldbrew {labels[name]} / dramatiq's (median of rounds): "
            f"{entry['median']:.2f}  [rounds: {rounds}]  target <= {entry['target']:g}: {verdict}"
        )
    if "stages" in result:
        stages = result["stages"]
        lines.append("")
        lines.append(
            f"one more coldbrew run, each job's path stamped (p50 {stages['p50_ms']:.2f} ms, "
            f"p99 {stages['p99_ms']:.2f} ms, {stages['consumer_cpu_percent']:.0f}% CPU):"
        )
        lines.extend(_latency_stages.render(stages))
    if "profile" in result:
        profile = result["profile"]
        lines.append("")
        lines.extend(
            render_profile(
                profile,
                f"one more coldbrew run (p50 {profile['p50_ms']:.2f} ms, p99 "
                f"{profile['p99_ms']:.2f} ms, {profile['consumer_cpu_percent']:.0f}% CPU "
                "while sampled)",
            )
        )
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rate", type=float, default=500.0, help="messages a second (500)")
    parser.add_argument("--seconds", type=float, help="publishing time per run (20; --quick 5)")
    parser.add_argument("--repeat", type=int, help="rounds, each side once a round (3; --quick 1)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds discarded first (1)")
    parser.add_argument("--quick", action="store_true", help="5 s, 1 round: for development")
    parser.add_argument(
        "--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}"
    )
    parser.add_argument(
        "--prefetch", type=int, default=100, help="prefetch of the raw loop and Dramatiq (100)"
    )
    parser.add_argument("--concurrency", type=int, default=100, help="COLDBREW_CONCURRENCY (100)")
    parser.add_argument("--threads", type=int, default=8, help="Dramatiq worker threads (8)")
    add_claim_commit_argument(parser)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="after the rounds, one more (unmeasured) coldbrew run with py-spy sampling the "
        "worker; collapsed stacks and a summary into DIR",
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="after the rounds, one more (unmeasured) coldbrew run whose worker stamps each "
        "job's path (bench/_latency_stages.py); prints per-stage percentiles",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    # internal: the subprocesses
    parser.add_argument("--publisher", choices=("amqp", "dramatiq"), help=argparse.SUPPRESS)
    parser.add_argument("--exchange", default="", help=argparse.SUPPRESS)
    parser.add_argument("--routing-key", help=argparse.SUPPRESS)
    parser.add_argument("--raw-consumer", metavar="QUEUE", help=argparse.SUPPRESS)
    parser.add_argument("--udp", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (5.0 if args.quick else 20.0)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.sides = tuple(s.strip() for s in args.sides.split(",") if s.strip())
    unknown = set(args.sides) - set(SIDES)
    if unknown or not args.sides:
        parser.error(f"--sides: unknown {', '.join(sorted(unknown)) or '(none given)'}")
    if args.rate <= 0 or args.seconds <= args.warmup or args.warmup < 0:
        parser.error("--rate must be positive and --seconds longer than --warmup")
    if min(args.repeat, args.prefetch, args.concurrency, args.threads) < 1:
        parser.error("--repeat, --prefetch, --concurrency and --threads must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.raw_consumer:
        import uvloop

        uvloop.run(raw_consumer(args.amqp_url, args.raw_consumer, args.prefetch, args.udp))
        return 0
    if args.publisher == "amqp":
        report = asyncio.run(
            publish_amqp(args.amqp_url, args.exchange, args.routing_key, args.rate, args.seconds)
        )
    elif args.publisher == "dramatiq":
        report = publish_dramatiq(args.rate, args.seconds)
    if args.publisher:
        print(json.dumps(report), flush=True)
        return 0

    def config(workdir: Path) -> LatencyConfig:
        return LatencyConfig(
            jobs=0,
            repeat=args.repeat,
            concurrency=args.concurrency,
            prefetch=args.prefetch,
            idle_seconds=0.0,
            amqp_url=args.amqp_url,
            database_url=args.database_url,
            workdir=workdir,
            rate=args.rate,
            seconds=args.seconds,
            warmup=args.warmup,
            sides=args.sides,
            threads=args.threads,
            claim_commit=args.claim_commit,
            profile=args.profile,
            stages=args.stages,
        )

    return run_main(config, run, render, json_output=args.json, workdir_prefix="cbbench-latency-")


if __name__ == "__main__":
    sys.exit(main())
