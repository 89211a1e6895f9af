"""Failover (issue #14): how long a worker takes to serve again after its broker node or
its PostgreSQL host dies.

Each round starts one in-process worker whose first URL (broker) or first host
(PostgreSQL) is a TCP proxy in front of the real service and whose second is the
real one, lets it run a job, then cuts the proxy (every connection aborted, the
port closed: a dead node) and submits a job at once, through a client on the real
service. Printed per kind, over ``--rounds`` rounds (median, min, max):

- ``job``: from the cut to that job's ``succeeded`` (submitted right after it);
- ``ready``: from the cut to ``/readyz`` answering 200 and naming the second URL
  (broker) or host (PostgreSQL; read by the db-health ping, every 5 s).

The broker is retried once a second (``BrokerConnection``'s reconnect interval);
PostgreSQL connections are reopened as each part meets the outage. The real
services are never stopped. Every schema and queue the run makes is dropped.

    python bench/failover.py --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):  # run as a script: make ``bench`` and ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Spread, progress
from tests.failover_proxy import TcpProxy, readyz
from tests.helpers import AMQP_URL, DATABASE_URL, cleanup_namespace, make_settings, new_namespace

from coldbrew import logs
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.migrate import migrate
from coldbrew.transport.connection import start_index
from coldbrew.worker import Worker


def _first_key(namespace: str) -> str:
    n = 0
    while start_index(f"{namespace}-{n}", 2) != 0:
        n += 1
    return f"{namespace}-{n}"


def _at(url: str, port: int) -> str:
    parts = urlsplit(url)
    user, at, _ = parts.netloc.rpartition("@")
    return parts._replace(netloc=f"{user}{at}127.0.0.1:{port}").geturl()


async def one_round(kind: str) -> dict[str, float]:
    """One worker, one cut; seconds from the cut to the job and to /readyz."""
    namespace = new_namespace()
    await migrate(DATABASE_URL, namespace)
    service = urlsplit(AMQP_URL if kind == "broker" else DATABASE_URL)
    proxy = await TcpProxy(service.hostname or "127.0.0.1", service.port or 0).start()
    overrides: dict[str, Any] = {"worker_id": _first_key(namespace), "processes": 1}
    if kind == "broker":
        overrides["amqp_url"] = f"{_at(AMQP_URL, proxy.port)},{AMQP_URL}"
        moved = AMQP_URL.split("@")[-1]
    else:
        multi = service._replace(netloc=f"127.0.0.1:{proxy.port},{service.netloc}").geturl()
        overrides["database_url"] = multi + "?target_session_attrs=read-write"
        moved = f":{service.port}"
    settings = make_settings(namespace, **overrides)
    app = load_app("tests.apps:app")
    worker = Worker(app, settings)
    task = asyncio.create_task(worker.run())
    try:
        await worker.wait_ready(task)
        async with Client.connect(make_settings(namespace), app=app) as client:
            warm = await client.submit("echo", {"value": 0})
            await client.wait(warm.id, timeout=30)
            start = time.monotonic()
            await proxy.cut()
            job = await client.submit("echo", {"value": 1})
            ready_task = asyncio.create_task(_ready(worker.metrics_port or 0, moved, start))
            record = await client.wait(job.id, timeout=120, poll=0.02)
            job_seconds = time.monotonic() - start
            assert record.status == "succeeded", record.status
            return {"job": job_seconds, "ready": await ready_task}
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)
        await proxy.close()
        await cleanup_namespace(namespace)


async def _ready(port: int, moved: str, start: float) -> float:
    while True:
        status, body = await readyz(port)
        node = body.get("broker" if "@" in moved else "database", "")
        if status == 200 and node.endswith(moved):
            return time.monotonic() - start
        await asyncio.sleep(0.05)


async def run(rounds: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for kind in ("broker", "database"):
        seen: dict[str, list[float]] = {"job": [], "ready": []}
        for n in range(rounds):
            figures = await one_round(kind)
            progress(
                f"{kind} round {n + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in figures.items())
            )
            for key, value in figures.items():
                seen[key].append(value)
        result[kind] = {key: Spread.of(values).as_dict() for key, values in seen.items()}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logs.configure("json", "error")  # the cut's reconnect warnings are the point, not news
    result = asyncio.run(run(args.rounds))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("| node cut | to the job's success (s) | to /readyz on the next (s) |")
    print("|---|---|---|")
    for kind, figures in result.items():
        cells = [
            f"{f['median']:.2f} ({f['min']:.2f} to {f['max']:.2f})"
            for f in (figures["job"], figures["ready"])
        ]
        print(f"| {kind} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
