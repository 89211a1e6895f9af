"""What the webhook trigger (migration 0012) costs the outcome write, measured side by side.

Three namespaces, the same rows, the real ``complete_batch`` statement (the
group-committed outcome, ``batch`` rows per statement): ``no trigger`` (the
trigger dropped: the schema before 0012), ``trigger, no URL`` (the common case:
the WHEN clause passes a terminal status, the function finds no URL on the job
nor its tenant and returns) and ``trigger, URL`` (every job has a URL: a
delivery job is built and inserted per row). Rounds interleave the three, so a
change of load hits each alike; prints the median and the spread (min..max) of
microseconds per row, and the ratio to ``no trigger``, both of wall time and of the
PostgreSQL backend's CPU time (``/proc/<pid>/stat``: the server is local), which a
loaded machine disturbs less than wall time. Last, the trigger's own time per call as
EXPLAIN ANALYZE reports it (one plain 1,000-row UPDATE to succeeded per kind, 3 times),
the figure least disturbed by other load. Schemas are dropped at the end.

    PYTHONPATH=. python bench/webhook_trigger.py [--rows 2000] [--batch 100] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) the PostgreSQL backend ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_round(
    conn: asyncpg.Connection, tag: str, url: str | None, rows: int, batch: int
) -> tuple[float, float]:
    """Wall and backend CPU seconds per row to write ``rows`` succeeded outcomes, ``batch``
    per statement."""
    await conn.execute(INSERT, tag, url, rows)
    ids = [f"r{tag}-{n}" for n in range(1, rows + 1)]
    statement = QUERIES["complete_batch"].text
    elapsed = 0.0
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    cpu = backend_cpu(pid)
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
    cpu = backend_cpu(pid) - cpu
    await conn.execute("DELETE FROM jobs")  # the next round starts from the same table
    await conn.execute("VACUUM jobs")
    return elapsed / rows, cpu / rows


EXPLAIN = (
    "EXPLAIN (ANALYZE, FORMAT JSON) UPDATE jobs SET status = 'succeeded', finished_at = now()"
    " WHERE status = 'running'"
)


async def trigger_per_call(conn: asyncpg.Connection, url: str | None) -> list[float]:
    """Microseconds per call of the trigger, three 1,000-row updates."""
    found: list[float] = []
    for run in range(3):
        await conn.execute(INSERT, f"x{run}", url, 1000)
        plan = json.loads(await conn.fetchval(EXPLAIN))[0]
        (trigger,) = plan["Triggers"]
        found.append(trigger["Time"] / trigger["Calls"] * 1000)
        await conn.execute("DELETE FROM jobs")
    return found


async def measure(
    rows: int, batch: int, rounds: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    names = {kind: new_namespace() for kind in KINDS}
    conns: dict[str, asyncpg.Connection] = {}
    try:
        for kind, name in names.items():
            await migrate(DATABASE_URL, name)
            conns[kind] = await connect(name)
        await conns["no trigger"].execute("DROP TRIGGER jobs_webhook_on_finish ON jobs")
        urls = {"no trigger": None, "trigger, no URL": None, "trigger, URL": "https://h.example/x"}
        times: dict[str, list[float]] = {kind: [] for kind in KINDS}
        cpus: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for round_no in range(rounds + 1):  # round 0 warms caches and is not counted
            for kind in KINDS:
                wall, cpu = await one_round(conns[kind], str(round_no), urls[kind], rows, batch)
                if round_no:
                    times[kind].append(wall)
                    cpus[kind].append(cpu)
        for kind in KINDS[1:]:
            calls = await trigger_per_call(conns[kind], urls[kind])
            print(f"trigger per call ({kind}): " + ", ".join(f"{c:.1f}" for c in calls) + " us")
        return times, cpus
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
    times, cpus = asyncio.run(measure(args.rows, args.batch, args.rounds))
    print(f"complete_batch, {args.rows} rows x {args.rounds} rounds, {args.batch} per statement")
    for what, table in (("wall", times), ("backend CPU", cpus)):
        base = statistics.median(table["no trigger"])
        print(f"{what + ' us/row':<22} {'median':>8} {'min..max':>16} {'ratio':>7}")
        for kind, samples in table.items():
            median = statistics.median(samples)
            spread = f"{min(samples) * 1e6:.1f}..{max(samples) * 1e6:.1f}"
            print(f"  {kind:<20} {median * 1e6:>8.1f} {spread:>16} {median / base:>7.2f}")


if __name__ == "__main__":
    main()
