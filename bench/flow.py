"""Flow (issue #16): commit-to-start latency of ``submit(connection=)`` beside ``submit()``.

1. **Latency.** ``--rounds`` (40) times, interleaved: a plain ``Client.submit``
   (the client publishes at once) and a ``submit(connection=conn)`` in an
   asyncpg transaction of the caller's (the relay publishes it after the
   commit, woken by NOTIFY). Each job returns ``time.time()`` when it starts;
   latency = start - (return of submit | commit); a plain submit's job
   can start before ``submit`` returns (it marks the row published after the
   confirm), hence negative values. The relay's interval is left
   at its default (1 s), so a latency well under it shows the wake at work.
One in-process worker (the same event loop as the submitters: latencies
include that loop's turns); a fresh namespace, dropped at the end.

    python bench/flow.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
from bench._common import drop_namespace

from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.migrate import migrate
from coldbrew.settings import load_settings
from coldbrew.worker import Worker


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def latency(client: Client, pool: asyncpg.Pool, rounds: int) -> dict[str, list[float]]:
    seen: dict[str, list[float]] = {"plain submit": [], "submit(connection=)": []}
    for _ in range(rounds):
        job = await client.submit("stamp", {})
        given = time.time()
        done = await client.wait(job.id, timeout=30, poll=0.005)
        seen["plain submit"].append(done.result - given)
        async with pool.acquire() as conn:
            async with conn.transaction():
                job = await client.submit("stamp", {}, connection=conn)
            committed = time.time()
        done = await client.wait(job.id, timeout=30, poll=0.005)
        seen["submit(connection=)"].append(done.result - committed)
    return seen


async def run(args: argparse.Namespace) -> dict[str, Any]:
    namespace = f"cbflow_{secrets.token_hex(4)}"
    settings = load_settings(namespace=namespace, metrics_port=0, log_level="warning")
    await migrate(settings.database_url, namespace)
    app = load_app("bench.flow_app:app")
    worker = Worker(app, settings)
    task = asyncio.create_task(worker.run())
    result: dict[str, Any] = {}
    try:
        await worker.wait_ready(task)
        async with (
            Client.connect(settings, app=app) as client,
            asyncpg.create_pool(settings.database_url, min_size=1, max_size=2) as pool,
        ):
            seen = await latency(client, pool, args.rounds)
            for name, values in seen.items():
                ms = [v * 1000 for v in values]
                result[name] = {
                    "p50_ms": round(statistics.median(ms), 1),
                    "p90_ms": round(pct(ms, 0.9), 1),
                    "max_ms": round(max(ms), 1),
                }
    finally:
        worker.stop()
        await task
        await drop_namespace(settings.amqp_url, settings.database_url, namespace)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
