"""What the webhook trigger (migration 0012) costs the outcome write, measured side by side.

Three namespaces, the same rows, the real ``complete_batch`` statement (the
group-committed outcome, ``batch`` rows per statement): ``no trigger`` (the
trigger dropped: the schema before 0012), ``trigger, no URL`` (the common case:
the WHEN clause passes a terminal status, the function finds no URL on the job
nor its tenant and returns) and ``trigger, URL`` (every job has a URL: a
delivery job is built and inserted per row). Rounds interleave the three, so a
change of load hits each alike; prints the median and the spread (min..max) of
microseconds per row, and the ratio to ``no trigger``. Schemas are dropped at the end.

    PYTHONPATH=. python bench/webhook_trigger.py [--rows 2000] [--batch 100] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import asyncpg
from tests.helpers import DATABASE_URL, new_namespace

from coldbrew.migrate import drop_namespace, migrate
from coldbrew.sql import QUERIES

KINDS = ("no trigger", "trigger, no URL", "trigger, URL")
INSERT = """
INSERT INTO jobs (id, type, queue, tenant, args, status, attempt, max_attempts,
                  started_at, lease_expires_at, worker_id, webhook_url)
SELECT 'r' || $1 || '-' || g, 'echo', 'default', 'acme', '{"value": 1}', 'running', 1, 3,
       now(), now() + interval '1 minute', 'bench', $2
FROM generate_series(1, $3) AS g
"""


async def connect(namespace: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": namespace})
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


async def one_round(
    conn: asyncpg.Connection, tag: str, url: str | None, rows: int, batch: int
) -> float:
    """Seconds per row to write ``rows`` succeeded outcomes, ``batch`` per statement."""
    await conn.execute(INSERT, tag, url, rows)
    ids = [f"r{tag}-{n}" for n in range(1, rows + 1)]
    statement = QUERIES["complete_batch"].text
    elapsed = 0.0
    for start in range(0, rows, batch):
        chunk = ids[start : start + batch]
        size = len(chunk)
        args = (
            chunk,
            [1] * size,
            ["succeeded"] * size,
            [{"ok": True}] * size,
            [None] * size,
            [None] * size,
            [0.0] * size,
            [None] * size,
            [None] * size,
            [None] * size,
        )
        began = time.perf_counter()
        await conn.fetch(statement, *args)
        elapsed += time.perf_counter() - began
    await conn.execute("DELETE FROM jobs")  # the next round starts from the same table
    await conn.execute("VACUUM jobs")
    return elapsed / rows


async def measure(rows: int, batch: int, rounds: int) -> dict[str, list[float]]:
    names = {kind: new_namespace() for kind in KINDS}
    conns: dict[str, asyncpg.Connection] = {}
    try:
        for kind, name in names.items():
            await migrate(DATABASE_URL, name)
            conns[kind] = await connect(name)
        await conns["no trigger"].execute("DROP TRIGGER jobs_webhook_on_finish ON jobs")
        urls = {"no trigger": None, "trigger, no URL": None, "trigger, URL": "https://h.example/x"}
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for round_no in range(rounds + 1):  # round 0 warms caches and is not counted
            for kind in KINDS:
                per_row = await one_round(conns[kind], str(round_no), urls[kind], rows, batch)
                if round_no:
                    times[kind].append(per_row)
        return times
    finally:
        for conn in conns.values():
            await conn.close()
        for name in names.values():
            await drop_namespace(DATABASE_URL, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    times = asyncio.run(measure(args.rows, args.batch, args.rounds))
    base = statistics.median(times["no trigger"])
    print(f"complete_batch, {args.rows} rows x {args.rounds} rounds, {args.batch} per statement")
    print(f"{'kind':<18} {'us/row median':>14} {'min..max':>16} {'ratio':>7}")
    for kind, samples in times.items():
        median = statistics.median(samples)
        spread = f"{min(samples) * 1e6:.1f}..{max(samples) * 1e6:.1f}"
        print(f"{kind:<18} {median * 1e6:>14.1f} {spread:>16} {median / base:>7.2f}")


if __name__ == "__main__":
    main()
