"""Unique jobs' cost at submission: a plain submit, a new unique job, a unique duplicate.

One ``Client`` (no broker: the publish is the same for all three and would only
add noise) submits, interleaved so a change of load hits every kind alike, a
job of a type without ``unique_for`` (``insert_job``: one statement), a new
unique job (``insert_unique_job``: one statement) and a duplicate of one
(``insert_unique_job`` + ``find_unique_holder``: two). Prints the median and
90th percentile per kind. The namespace is dropped at the end.

    PYTHONPATH=. python bench/unique_submit.py [--rounds 600]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tests.helpers import DATABASE_URL, make_settings, new_namespace

from coldbrew import logs
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.migrate import drop_namespace, migrate


async def measure(rounds: int) -> dict[str, list[float]]:
    namespace = new_namespace()
    await migrate(DATABASE_URL, namespace)
    app = load_app("tests.unique_apps:app")
    try:
        async with Client.connect(make_settings(namespace), app=app, broker=False) as client:
            kinds: dict[str, Callable[[int], Awaitable[Any]]] = {
                "plain": lambda i: client.submit("plain", {"x": i}),
                "unique, new": lambda i: client.submit("sync_account", {"account": f"a{i}"}),
                "unique, duplicate": lambda i: client.submit("sync_account", {"account": "a0"}),
            }
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            for i in range(rounds):
                for kind, submit in kinds.items():
                    start = time.perf_counter()
                    await submit(i)
                    times[kind].append(time.perf_counter() - start)
            return times
    finally:
        await drop_namespace(DATABASE_URL, namespace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=600)
    args = parser.parse_args()
    logs.configure("json", "warning")
    times = asyncio.run(measure(args.rounds))
    for kind, samples in times.items():
        ordered = sorted(samples)
        p90 = ordered[int(len(ordered) * 0.9)]
        median = statistics.median(ordered)
        print(f"{kind:18s} median {median * 1e3:6.2f} ms   p90 {p90 * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
