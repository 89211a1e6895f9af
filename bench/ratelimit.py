"""Rate-limit benchmark (issue #15): a tenant limited to 50/s beside an unlimited one.

Two ``coldbrew worker bench.ratelimit_app:app`` subprocesses on a fresh
namespace. Tenant ``free`` (unlimited) always has a backlog of jobs that
sleep ``--free-ms`` (so its throughput is bound by the job slots, which a
limited delivery must not hold). First ``--baseline`` seconds of ``free``
alone; then 5,000 no-op jobs of tenant ``limited`` (``coldbrew tenants set
limited --rate 50/s``, default burst 5) are submitted and ``--seconds`` more
are measured. Counted from the rows' ``started_at``:

* the limited tenant's starts per second over the window (target 50 +-5%),
  per one-second bin (median, min, max) and the most in any sliding second
  (bound: 50 + the burst);
* ``free``'s jobs/s alone and beside the limited backlog (target >= 0.95x).

    python bench/ratelimit.py              # ~100 s
    python bench/ratelimit.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aio_pika
import asyncpg
from bench._common import Spread, progress, run_main, worker_process
from bench.throughput import Config, namespace_for

from coldbrew.client import Client
from coldbrew.migrate import quote_ident
from coldbrew.ratelimit import parse_rate
from coldbrew.settings import Settings
from coldbrew.topology import Topology

APP = "bench.ratelimit_app:app"


@dataclass(frozen=True, slots=True)
class Bench:
    base: Config
    rate: str
    limited_jobs: int
    baseline: float
    seconds: float
    free_ms: float


async def publish(cfg: Bench, namespace: str, tenant: str, count: int, ms: float) -> None:
    """Publish ``count`` jobs of ``tenant`` straight to ``<ns>.jobs`` (confirmed, 256 deep):
    no row until a worker claims it, as any producer of the contract may do."""
    body = json.dumps({"type": "work", "args": {"ms": ms}}).encode()
    connection = await aio_pika.connect(cfg.base.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(Topology(namespace).jobs_exchange)
        window = asyncio.Semaphore(256)

        async def one() -> None:
            try:
                message = aio_pika.Message(
                    body,
                    message_id=uuid.uuid4().hex,
                    content_type="application/json",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                await exchange.publish(message, routing_key=f"default.{tenant}", timeout=60)
            finally:
                window.release()

        tasks = []
        for _ in range(count):
            await window.acquire()
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    finally:
        await connection.close()


async def starts(database_url: str, namespace: str, tenant: str) -> list[float]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            f"SELECT extract(epoch FROM started_at)::float8 AS t FROM {quote_ident(namespace)}.jobs"
            " WHERE tenant = $1 AND started_at IS NOT NULL ORDER BY started_at",
            tenant,
        )
    finally:
        await conn.close()
    return [r["t"] for r in rows]


def in_window(times: list[float], begin: float, end: float) -> list[float]:
    return [t for t in times if begin <= t < end]


def most_in_a_second(times: list[float]) -> int:
    best, j = 0, 0
    for i, t in enumerate(times):
        while j < len(times) and times[j] < t + 1.0:
            j += 1
        best = max(best, j - i)
    return best


async def run_once(cfg: Bench, index: int) -> dict[str, Any]:
    """One run: ``free`` alone, then beside the limited backlog; measured inside the namespace."""
    rate = parse_rate(cfg.rate)
    async with namespace_for(cfg.base, f"ratelimit {index}") as namespace:
        settings = Settings(
            amqp_url=cfg.base.amqp_url, database_url=cfg.base.database_url, namespace=namespace
        )
        async with Client.connect(settings) as client:
            await client.store.tenants.set_tenant_rate(
                "limited",
                per_second=rate.per_second,
                burst=None,
                clear=False,
                channel=Topology(namespace).tenant_channel,
            )
            marks = await drive(cfg, client, namespace)
        limited = await starts(cfg.base.database_url, namespace, "limited")
        free = await starts(cfg.base.database_url, namespace, "free")
    return measure(cfg, rate.per_second, rate.burst, limited, free, marks)


async def drive(cfg: Bench, client: Client, namespace: str) -> tuple[float, float, float]:
    """Two workers; ``free`` fed throughout; the limited backlog after the baseline.
    Returns the wall times: baseline start, baseline end, limited backlog submitted."""
    for tenant in ("free", "limited"):  # provision both tenants' queues
        await client.submit("work", {"ms": 0}, tenant=tenant)
    # free's backlog for the whole run: 1.3x what its slots can take
    free_total = int(
        1.3 * 2 * cfg.base.concurrency * 1000 / cfg.free_ms * (5 + cfg.baseline + cfg.seconds + 3)
    )
    await publish(cfg, namespace, "free", free_total, cfg.free_ms)
    async with contextlib.AsyncExitStack() as stack:
        for i in (1, 2):
            await stack.enter_async_context(
                worker_process(
                    cfg.base,
                    namespace,
                    f"worker {i}",
                    app_ref=APP,
                    log_path=cfg.base.workdir / f"worker-{namespace}-{i}.log",
                )
            )
        await asyncio.sleep(3)  # warm up: both workers consuming
        base_begin = time.time()
        await asyncio.sleep(cfg.baseline)
        base_end = time.time()
        progress(f"baseline done; publishing {cfg.limited_jobs} limited jobs")
        loaded = time.time()
        await publish(cfg, namespace, "limited", cfg.limited_jobs, 0)
        progress(f"limited backlog published; measuring {cfg.seconds:g} s")
        await asyncio.sleep(cfg.seconds + 2)
    return base_begin, base_end, loaded


def measure(
    cfg: Bench,
    per_second: float,
    burst: int,
    limited: list[float],
    free: list[float],
    marks: tuple[float, float, float],
) -> dict[str, Any]:
    base_begin, base_end, loaded = marks
    after = [t for t in limited if t >= loaded]
    if len(after) < 2:
        return {"error": f"only {len(after)} limited jobs started"}
    begin = after[0] + 1.0  # past the first burst
    end = begin + cfg.seconds
    window = in_window(after, begin, end)
    bins = [len(in_window(window, begin + k, begin + k + 1)) for k in range(int(cfg.seconds))]
    free_alone = len(in_window(free, base_begin, base_end)) / (base_end - base_begin)
    free_beside = len(in_window(free, begin, end)) / cfg.seconds
    return {
        "rate_target": per_second,
        "burst": burst,
        "limited_rate": len(window) / cfg.seconds,
        "limited_per_second": Spread.of(bins).as_dict(),
        "limited_most_in_any_second": most_in_a_second(after),
        "limited_started_total": len(after),
        "free_alone_per_s": free_alone,
        "free_beside_per_s": free_beside,
        "free_ratio": free_beside / free_alone if free_alone else None,
    }


async def run(cfg: Bench) -> dict[str, Any]:
    runs = [await run_once(cfg, i) for i in range(cfg.base.repeat)]
    return {
        "config": {
            "rate": cfg.rate,
            "limited_jobs": cfg.limited_jobs,
            "baseline_s": cfg.baseline,
            "seconds": cfg.seconds,
            "free_ms": cfg.free_ms,
            "concurrency": cfg.base.concurrency,
            "workers": 2,
        },
        "runs": runs,
    }


def render(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"rate limit {c['rate']} on tenant 'limited' ({c['limited_jobs']} jobs waiting), "
        f"unlimited tenant 'free' ({c['free_ms']:g} ms jobs), 2 workers x {c['concurrency']} "
        f"slots, {c['seconds']:g} s measured",
    ]
    for i, r in enumerate(result["runs"]):
        if "error" in r:
            lines.append(f"run {i + 1}: {r['error']}")
            continue
        b = r["limited_per_second"]
        ok_rate = abs(r["limited_rate"] / r["rate_target"] - 1) <= 0.05
        ok_burst = r["limited_most_in_any_second"] <= r["rate_target"] + r["burst"]
        ok_free = (r["free_ratio"] or 0) >= 0.95
        lines += [
            f"run {i + 1}:",
            f"  limited: {r['limited_rate']:.2f}/s over the window "
            f"({'ok' if ok_rate else 'MISSED'}, target {r['rate_target']:g} +-5%); per 1-s bin "
            f"median {b['median']:g}, min {b['min']:g}, max {b['max']:g}",
            f"  limited: most in any sliding second {r['limited_most_in_any_second']} "
            f"({'ok' if ok_burst else 'MISSED'}, bound {r['rate_target']:g} + burst {r['burst']})",
            f"  free: {r['free_alone_per_s']:.1f}/s alone, {r['free_beside_per_s']:.1f}/s beside "
            f"the limited backlog = {r['free_ratio']:.3f}x ({'ok' if ok_free else 'MISSED'}, "
            "target >= 0.95x)",
        ]
    rates = [r["limited_rate"] for r in result["runs"] if "error" not in r]
    ratios = [r["free_ratio"] for r in result["runs"] if "error" not in r]
    if len(rates) > 1:
        lines.append(
            f"over runs: limited rate median {statistics.median(rates):.2f} "
            f"({min(rates):.2f}-{max(rates):.2f}); free ratio median "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="50/s")
    parser.add_argument("--limited-jobs", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--baseline", type=float, default=15.0)
    parser.add_argument("--free-ms", type=float, default=100.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--database-url", default="postgresql://127.0.0.1:5432/coldbrew_bench")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def make_config(workdir: Path) -> Bench:
        base = Config(
            jobs=args.limited_jobs,
            repeat=args.repeat,
            concurrency=args.concurrency,
            prefetch=0,
            idle_seconds=0,
            amqp_url=args.amqp_url,
            database_url=args.database_url,
            workdir=workdir,
        )
        return Bench(base, args.rate, args.limited_jobs, args.baseline, args.seconds, args.free_ms)

    return run_main(make_config, run, render, json_output=args.json, workdir_prefix="cb-rate-")


if __name__ == "__main__":
    sys.exit(main())
