"""``claim_batch`` on every kind of row a delivery may find, in one batch.

The statement inserts what has no row, claims what is claimable with attempts left, marks
dead what waits with its attempts spent, and refuses the rest; one UPDATE does the last
two (bench/README, "PostgreSQL's CPU per job"), so each kind is checked here: what the
batch returns and what the row holds after it.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from coldbrew.settings import Settings
from coldbrew.sql import QUERIES
from coldbrew.store import KEYED_BATCH_PLANS, connection_settings

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ROW_TRACE = "00-11111111111111111111111111111111-2222222222222222-01"

# id: (status, attempt, max_attempts, snoozes, run_at offset s, lease offset s, cancel, trace)
ROWS: dict[str, tuple[str, int, int, int, int, int | None, bool, str | None]] = {
    "queued": ("queued", 0, 3, 0, -5, None, False, None),
    "spent": ("queued", 3, 3, 0, -5, None, False, None),
    "spent-retrying": ("retrying", 2, 2, 0, -5, None, False, None),
    "spent-scheduled-early": ("scheduled", 3, 3, 0, 3600, None, False, None),
    "scheduled-early": ("scheduled", 0, 3, 0, 3600, None, False, None),
    "scheduled-due": ("scheduled", 1, 3, 0, -5, None, False, None),
    "retrying-early": ("retrying", 1, 3, 0, 3600, None, False, None),
    "cancelled-waiting": ("queued", 0, 3, 0, -5, None, True, None),
    "running-live": ("running", 1, 3, 0, -5, 600, False, None),
    "running-expired": ("running", 1, 3, 0, -5, -600, False, None),
    "running-expired-spent": ("running", 3, 3, 0, -5, -600, False, None),
    "snoozed": ("queued", 3, 3, 1, -5, None, False, None),
    "row-trace": ("queued", 0, 3, 0, -5, None, False, ROW_TRACE),
    "succeeded": ("succeeded", 1, 3, 0, -5, None, False, None),
}

# id: (claimed, reported status, reported attempt)
EXPECTED: dict[str, tuple[bool, str, int]] = {
    "new": (True, "running", 1),
    "queued": (True, "running", 1),
    "spent": (False, "dead", 3),
    "spent-retrying": (False, "dead", 2),
    "spent-scheduled-early": (False, "scheduled", 3),
    "scheduled-early": (False, "scheduled", 0),
    "scheduled-due": (True, "running", 2),
    "retrying-early": (False, "retrying", 1),
    "cancelled-waiting": (False, "queued", 0),
    "running-live": (False, "running", 1),
    "running-expired": (True, "running", 2),
    "running-expired-spent": (False, "running", 3),
    "snoozed": (True, "running", 4),
    "row-trace": (True, "running", 1),
    "succeeded": (False, "succeeded", 1),
}

SEED = """
INSERT INTO jobs (id, type, queue, tenant, max_attempts, status, attempt, snoozes, run_at,
                  lease_expires_at, worker_id, cancel_requested, traceparent, tracestate,
                  progress_message, finished_at, started_at)
VALUES ($1, 'noop', 'default', 'default', $4::int4, $2::job_status, $3::int4, $5::int4,
        now() + make_interval(secs => $6::int4), now() + make_interval(secs => $7::int4),
        CASE WHEN $7::int4 IS NOT NULL THEN 'w-old' END, $8::bool, $9::text,
        CASE WHEN $9::text IS NOT NULL THEN 'row=state' END, 'halfway',
        CASE WHEN $2::text = 'succeeded' THEN now() - interval '1 minute' END,
        CASE WHEN $7::int4 IS NOT NULL THEN now() - interval '1 hour' END)
"""


def claim_args(ids: list[str]) -> list[Any]:
    n = len(ids)
    return [ids, ["noop"] * n, ["default"] * n, ["default"] * n, ["{}"] * n, [0] * n,
            [3] * n, [None] * n, [None] * n, 30.0, "w-new", [TRACE] * n,
            ["delivery=state"] * n]  # fmt: skip


async def test_claim_batch_on_every_kind_of_row(settings: Settings) -> None:
    conn = await asyncpg.connect(
        settings.database_url,
        server_settings={**connection_settings(settings.namespace), **KEYED_BATCH_PLANS},
    )
    try:
        for job_id, (
            status,
            attempt,
            most,
            snoozes,
            run_in,
            lease_in,
            cancel,
            trace,
        ) in ROWS.items():
            await conn.execute(
                SEED, job_id, status, attempt, most, snoozes, run_in, lease_in, cancel, trace
            )
        before = {r["id"]: dict(r) for r in await conn.fetch("SELECT * FROM jobs")}
        ids = list(EXPECTED)
        rows = await conn.fetch(QUERIES["claim_batch"].text, *claim_args(ids))
        found = {r["id"]: (r["claimed"], r["status"], r["attempt"]) for r in rows}
        assert found == EXPECTED
        waited = {r["id"]: r["waited"] for r in rows}
        assert waited["new"] == 0
        assert waited["queued"] >= 4  # its run_at was 5 s ago
        assert waited["spent"] is None

        after = {r["id"]: dict(r) for r in await conn.fetch("SELECT * FROM jobs")}
        for job_id, (claimed, status, attempt) in EXPECTED.items():
            row = after[job_id]
            assert (row["status"], row["attempt"]) == (status, attempt), job_id
            if claimed:
                assert row["worker_id"] == "w-new", job_id
                assert row["lease_expires_at"] is not None, job_id
                assert row["started_at"] is not None, job_id
                assert row["publish_after"] is None, job_id
                assert row["dead_reason"] is None, job_id
                assert row["finished_at"] is None, job_id
            elif status == "dead":
                assert row["dead_reason"] == "max_attempts", job_id
                assert row["finished_at"] is not None, job_id
                assert row["worker_id"] is None and row["lease_expires_at"] is None, job_id
                assert row["progress_message"] is None, job_id
                assert row["traceparent"] is None, job_id  # a dead row takes no trace
            else:  # refused: the row is as it was
                assert row == before[job_id], job_id
        # a claimed row that kept its progress message keeps it (only death clears it)
        assert after["queued"]["progress_message"] == "halfway"
        # a row without a trace context takes the delivery's; one with its own keeps it
        assert (after["queued"]["traceparent"], after["queued"]["tracestate"]) == (
            TRACE,
            "delivery=state",
        )
        assert (after["row-trace"]["traceparent"], after["row-trace"]["tracestate"]) == (
            ROW_TRACE,
            "row=state",
        )
        assert after["new"]["traceparent"] == TRACE
        # a reclaimed expired lease keeps when the job first started
        assert after["running-expired"]["started_at"] == before["running-expired"]["started_at"]
    finally:
        await conn.close()
