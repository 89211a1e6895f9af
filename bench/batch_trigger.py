"""What migration 0011's batch trigger costs a job's status change, side by side.

On one fresh namespace, 5,000 job rows go ``running`` → ``succeeded`` → ``running``
in one UPDATE per direction (the shape of ``complete_batch``: a group commit of many
rows per statement), in rounds that alternate four sides, so a change of load on
the shared machine hits each side alike:

* **plain, trigger on**: rows without ``batch_id`` (every job that is not a batch
  member): the trigger's WHEN clause is false, no function runs;
* **plain, trigger off**: the same rows with the trigger disabled -- the "before";
* **members**: rows of one batch (the function runs per row and updates the batch
  row, firing the callbacks at the end of each succeeded pass);
* **members, 50 batches**: rows spread over 50 batches.

Prints the median and spread of microseconds per row changed, and the ratio
plain-on / plain-off (1.00: no cost). The namespace is dropped at the end.

    PYTHONPATH=. python bench/batch_trigger.py [--rows 5000] [--rounds 7] [--plain-only]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg
from tests.helpers import DATABASE_URL, new_namespace

from coldbrew.migrate import drop_namespace, migrate

INSERT = """
INSERT INTO jobs (id, type, queue, tenant, max_attempts, status, batch_id)
SELECT $1 || g, 'noop', 'default', 'default', 3, 'running',
       CASE WHEN $2::int > 0 THEN $1 || 'b' || (g % $2) END
FROM generate_series(1, $3) AS g
"""
BATCHES = """
INSERT INTO batches (id, tenant, total, pending, on_complete)
SELECT $1 || 'b' || g, 'default', $3 / $2, $3 / $2,
       '{"type": "noop", "queue": "default", "tenant": "default", "max_attempts": 3}'::jsonb
FROM generate_series(0, $2 - 1) AS g
"""
FLIP = "UPDATE jobs SET status = $2::job_status, updated_at = now() WHERE id LIKE $1 || '%'"
REOPEN = "UPDATE batches SET pending = total, succeeded = 0, finished_at = NULL WHERE id LIKE $1"
SIDES = ("plain, trigger on", "plain, trigger off", "members", "members, 50 batches")


async def one_pass(conn: asyncpg.Connection, side: str, rows: int) -> float:
    """Seconds per row of one succeeded-and-back flip of the side's rows."""
    prefix = {"plain, trigger on": "p", "plain, trigger off": "p", "members": "m"}.get(side, "n")
    off = side == "plain, trigger off"
    if off:
        await conn.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_batch_member")
    try:
        start = time.perf_counter()
        await conn.execute(FLIP, prefix, "succeeded")
        await conn.execute(FLIP, prefix, "running")
        elapsed = time.perf_counter() - start
    finally:
        if off:
            await conn.execute("ALTER TABLE jobs ENABLE TRIGGER jobs_batch_member")
    await conn.execute(REOPEN, f"{prefix}b%")
    await conn.execute("DELETE FROM jobs WHERE id LIKE '%:on_%'")
    return elapsed / (2 * rows)


async def measure(rows: int, rounds: int, sides: tuple[str, ...]) -> dict[str, list[float]]:
    namespace = new_namespace()
    await migrate(DATABASE_URL, namespace)
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": namespace})
    try:
        for prefix, batches in (("p", 0), ("m", 1), ("n", 50)):
            if batches:
                await conn.execute(BATCHES, prefix, batches, rows)
            await conn.execute(INSERT, prefix, batches, rows)
        await conn.execute("VACUUM ANALYZE jobs")
        times: dict[str, list[float]] = {side: [] for side in sides}
        for round_ in range(rounds + 1):
            for side in sides if round_ % 2 else reversed(sides):
                took = await one_pass(conn, side, rows)
                if round_:  # the first round warms caches and plans
                    times[side].append(took)
        return times
    finally:
        await conn.close()
        await drop_namespace(DATABASE_URL, namespace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--plain-only", action="store_true", help="only the two plain sides (the before/after)"
    )
    args = parser.parse_args()
    sides = SIDES[:2] if args.plain_only else SIDES
    times = asyncio.run(measure(args.rows, args.rounds, sides))
    print(f"batch trigger: {args.rows} rows per side, {args.rounds} rounds (alternating sides)")
    print(f"{'side':<22}{'us/row median':>14}{'min-max':>16}")
    for side, values in times.items():
        us = [v * 1e6 for v in values]
        print(f"{side:<22}{statistics.median(us):>14.2f}{min(us):>8.2f}-{max(us):<7.2f}")
    pairs = [
        on / off
        for on, off in zip(times["plain, trigger on"], times["plain, trigger off"], strict=True)
    ]
    print(
        f"ratio plain on/off (median of pairs): {statistics.median(pairs):.3f} "
        f"[{min(pairs):.3f}-{max(pairs):.3f}] (1.00 = the trigger costs non-members nothing)"
    )


if __name__ == "__main__":
    main()
