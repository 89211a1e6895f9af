"""PostgreSQL's CPU per job of the no-op drain's two statements, and where it goes.

A drain of a raw producer's jobs costs PostgreSQL two statements per batch of
jobs: ``claim_batch`` (the delivered row does not exist yet: it is inserted as
``running``, asynchronous commit) and ``complete_batch`` (the outcome, fenced by
attempt, synchronous commit). This bench runs exactly those statements, as the
worker's group commit sends them (``batch`` jobs per statement, each on its own
dedicated connection with the worker's plan settings), against fresh namespaces,
and reads what each costs the server: the backend's CPU (``/proc/<pid>/stat``;
the server is local), WAL bytes (``pg_current_wal_lsn()`` deltas: other users of
the server add to it, so it is an upper bound), and the table's HOT share.

Variants name what they take away from the schema (``--variants``), so that the
difference to ``as is`` says what that part costs: e.g. ``-webhook`` drops the
webhook trigger, ``-search`` the three dashboard search indexes. Rounds
interleave the variants, so a change of load hits each alike; medians and
spreads (min..max) over rounds. Schemas are dropped at the end.

    PYTHONPATH=. python bench/pg_cost.py [--jobs 4000] [--batch 20] [--rounds 5]
        [--variants as-is,-webhook,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from dataclasses import dataclass, field

import asyncpg
from tests.helpers import DATABASE_URL, new_namespace

from coldbrew.migrate import drop_namespace, migrate
from coldbrew.sql import QUERIES
from coldbrew.store.base import KEYED_BATCH_PLANS

# What each variant removes from a freshly migrated schema (the diagnosis: what a part
# of the schema costs the drain). Everything here runs in the bench's own namespaces.
VARIANTS: dict[str, list[str]] = {
    "as-is": [],
    "-webhook": ["DROP TRIGGER jobs_webhook_on_finish ON jobs"],
    # the webhook trigger's function without a SET search_path (diagnosis: what the GUC
    # save and restore of each call cost; since migration 0023 it has none, so this is
    # as-is again, and run against an older src it measures the old function)
    "-webhook-set": ["ALTER FUNCTION coldbrew_enqueue_webhook() RESET search_path"],
    "-row-triggers": [
        "DROP TRIGGER jobs_webhook_on_finish ON jobs",
        "DROP TRIGGER jobs_batch_member ON jobs",
        "DROP TRIGGER jobs_chain_step_finished ON jobs",
        "DROP TRIGGER jobs_tally_update ON jobs",
        "DROP TRIGGER jobs_tally_insert ON jobs",
        "DROP TRIGGER jobs_attempt_ended ON jobs",
    ],
    "-search": [
        "DROP INDEX jobs_search_created",
        "DROP INDEX jobs_search_tenant",
        "DROP INDEX jobs_search_status",
    ],
    "-unfinished": ["DROP INDEX jobs_unfinished"],
    "-finished": ["DROP INDEX jobs_finished"],
    "-running": ["DROP INDEX jobs_running", "DROP INDEX jobs_lease_expiry"],
}

# A variant may run with other settings on its two connections (diagnosis only).
# "plan-cache-auto" is the batch connections before they forced the generic plan.
VARIANT_SETTINGS: dict[str, dict[str, str]] = {
    "plan-cache-auto": {"plan_cache_mode": "auto"},
}
VARIANTS.update({name: [] for name in VARIANT_SETTINGS})


@dataclass
class Sample:
    """One round of one variant: per-job figures."""

    claim_cpu_us: float
    complete_cpu_us: float
    wal_bytes: float
    wall_us: float


@dataclass
class Variant:
    name: str
    namespace: str
    claim: asyncpg.Connection | None = None
    complete: asyncpg.Connection | None = None
    samples: list[Sample] = field(default_factory=list)


def backend_cpu(pid: int) -> float:
    """CPU seconds (user + system) the PostgreSQL backend ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def connect(namespace: str, synchronous: bool, variant: str) -> asyncpg.Connection:
    """A connection like the worker's batch connections (store/base.py)."""
    settings = {"search_path": namespace, **KEYED_BATCH_PLANS, **VARIANT_SETTINGS.get(variant, {})}
    settings["synchronous_commit"] = "on" if synchronous else "off"
    conn = await asyncpg.connect(DATABASE_URL, server_settings=settings)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


def claim_args(ids: list[str]) -> tuple[object, ...]:
    n = len(ids)
    return (
        ids,
        ["noop"] * n,
        ["default"] * n,
        ["default"] * n,
        [{}] * n,
        [0] * n,
        [3] * n,
        [None] * n,
        [None] * n,
        30.0,
        "bench-worker",
        [None] * n,
        [None] * n,
    )


def complete_args(ids: list[str]) -> tuple[object, ...]:
    n = len(ids)
    return (
        ids,
        [1] * n,
        ["succeeded"] * n,
        [None] * n,
        [None] * n,
        [None] * n,
        [0.0] * n,
        [None] * n,
        [None] * n,
        [None] * n,
    )


async def one_round(v: Variant, jobs: int, batch: int) -> Sample:
    """Claim then complete ``jobs`` new jobs, ``batch`` per statement, as a drain does."""
    assert v.claim is not None
    assert v.complete is not None
    claim_sql = QUERIES["claim_batch"].text
    complete_sql = QUERIES["complete_batch"].text
    claim_pid = await v.claim.fetchval("SELECT pg_backend_pid()")
    complete_pid = await v.complete.fetchval("SELECT pg_backend_pid()")
    tag = uuid.uuid4().hex[:12]
    ids = [f"{tag}-{n}" for n in range(jobs)]
    wal0 = await v.claim.fetchval("SELECT pg_current_wal_lsn()")
    claim_cpu = complete_cpu = 0.0
    began = time.perf_counter()
    for start in range(0, jobs, batch):
        chunk = ids[start : start + batch]
        cpu = backend_cpu(claim_pid)
        rows = await v.claim.fetch(claim_sql, *claim_args(chunk))
        claim_cpu += backend_cpu(claim_pid) - cpu
        if sum(1 for r in rows if r["claimed"]) != len(chunk):
            raise RuntimeError(f"{v.name}: a claim batch claimed {len(rows)} of {len(chunk)}")
        cpu = backend_cpu(complete_pid)
        done = await v.complete.fetch(complete_sql, *complete_args(chunk))
        complete_cpu += backend_cpu(complete_pid) - cpu
        if len(done) != len(chunk):
            raise RuntimeError(f"{v.name}: a completion batch wrote {len(done)} of {len(chunk)}")
    wall = time.perf_counter() - began
    wal1 = await v.claim.fetchval("SELECT pg_current_wal_lsn()")
    wal = await v.claim.fetchval("SELECT pg_wal_lsn_diff($1, $2)", wal1, wal0)
    return Sample(
        claim_cpu / jobs * 1e6, complete_cpu / jobs * 1e6, float(wal) / jobs, wall / jobs * 1e6
    )


async def table_facts(conn: asyncpg.Connection) -> dict[str, float]:
    row = await conn.fetchrow(
        "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
        "WHERE relid = 'jobs'::regclass"
    )
    return {k: float(row[k]) for k in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd")}


IN_FLIGHT = """
INSERT INTO jobs (id, type, queue, tenant, max_attempts, status, attempt, started_at,
                  lease_expires_at, worker_id)
SELECT 'inflight-' || g, 'noop', 'default', 'default', 3, 'running', 1, now(),
       now() + interval '1 hour', 'bench-other' FROM generate_series(1, $1) AS g
"""


async def measure(
    names: list[str], jobs: int, batch: int, rounds: int, in_flight: int
) -> list[Variant]:
    variants = [Variant(name, new_namespace()) for name in names]
    try:
        for v in variants:
            await migrate(DATABASE_URL, v.namespace)
            v.claim = await connect(v.namespace, synchronous=False, variant=v.name)
            v.complete = await connect(v.namespace, synchronous=True, variant=v.name)
            for statement in VARIANTS[v.name]:
                await v.complete.execute(statement)
            # other jobs in flight (running, held by other workers or slots), as in a drain:
            # a plan that walks the running rows pays for them in every batch
            await v.complete.execute(IN_FLIGHT, in_flight)
        if os.environ.get("PG_COST_PIDS"):  # for `perf record -p` (diagnosis)
            for v in variants:
                assert v.claim is not None
                assert v.complete is not None
                pids = [await c.fetchval("SELECT pg_backend_pid()") for c in (v.claim, v.complete)]
                print(f"{v.name}: claim backend {pids[0]}, complete backend {pids[1]}", flush=True)
            await asyncio.sleep(float(os.environ["PG_COST_PIDS"]))
        for round_no in range(rounds + 1):  # round 0 warms caches and plans, not counted
            for v in variants:
                sample = await one_round(v, jobs, batch)
                if round_no:
                    v.samples.append(sample)
        await asyncio.sleep(0.7)  # the statistics collector flushes every 500 ms
        for v in variants:
            assert v.complete is not None
            facts = await table_facts(v.complete)
            v.samples.sort(key=lambda s: s.claim_cpu_us + s.complete_cpu_us)
            hot = facts["n_tup_hot_upd"] / max(1.0, facts["n_tup_upd"])
            print(
                f"{v.name}: {facts['n_tup_upd']:.0f} updates, HOT {hot:.0%}",
                flush=True,
            )
        return variants
    finally:
        for v in variants:
            for conn in (v.claim, v.complete):
                if conn is not None:
                    await conn.close()
            await drop_namespace(DATABASE_URL, v.namespace)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default="as-is")
    parser.add_argument(
        "--in-flight", type=int, default=300, help="other running jobs present (default 300)"
    )
    args = parser.parse_args()
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            parser.error(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")
    variants = asyncio.run(measure(names, args.jobs, args.batch, args.rounds, args.in_flight))
    print(
        f"claim_batch + complete_batch, {args.jobs} new jobs x {args.rounds} rounds, "
        f"{args.batch} per statement, {args.in_flight} other jobs running; "
        "PostgreSQL backend CPU us/job, median (min-max)"
    )
    print(f"{'variant':<15} {'claim':>20} {'complete':>20} {'both':>20} {'WAL B/job':>20}")
    for v in variants:
        claim = [s.claim_cpu_us for s in v.samples]
        complete = [s.complete_cpu_us for s in v.samples]
        both = [s.claim_cpu_us + s.complete_cpu_us for s in v.samples]
        wal = [s.wal_bytes for s in v.samples]
        print(
            f"{v.name:<15} {spread(claim):>20} {spread(complete):>20} {spread(both):>20} "
            f"{spread(wal):>20}"
        )


if __name__ == "__main__":
    main()
