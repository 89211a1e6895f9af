"""Batches' values: job descriptions, ids, and the status a batch's counts mean."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from coldbrew.batches import BATCH_ID_RE, BatchRecord, Job, callback_job_id, member_job_id
from coldbrew.model import JOB_ID_RE


def record(pending: int, succeeded: int, *, cancelled: bool = False) -> BatchRecord:
    return BatchRecord(
        id="b",
        tenant="acme",
        description=None,
        total=3,
        pending=pending,
        counts={"succeeded": succeeded},
        progress=0.5,
        callbacks={"on_complete": {"type": "notify"}},
        collect_results=False,
        cancel_requested=cancelled,
        created_at=datetime(2026, 12, 1, tzinfo=UTC),
        finished_at=None,
        fired={"on_complete": "queued"},
    )


def test_job_of_takes_jobs_pairs_and_type_names() -> None:
    """A member may be given as a Job, a (type, args) pair or a bare type; anything else is a
    TypeError that says what is accepted."""
    assert Job.of(("echo", {"value": 1})) == Job("echo", {"value": 1})
    assert Job.of("noop") == Job("noop")
    job = Job("slow", queue="slow")
    assert Job.of(job) is job
    with pytest.raises(TypeError, match="coldbrew.Job or a"):
        Job.of(["echo", {}])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pending", "succeeded", "cancelled", "status"),
    [
        (1, 2, False, "running"),
        (0, 3, False, "succeeded"),
        (0, 2, False, "completed"),
        (0, 0, True, "cancelled"),
        (0, 3, True, "succeeded"),  # cancelled too late: every member had succeeded
    ],
)
def test_status_follows_pending_and_counts(
    pending: int, succeeded: int, cancelled: bool, status: str
) -> None:
    """running until no member is pending; then what the members' ends add up to."""
    assert record(pending, succeeded, cancelled=cancelled).status == status


def test_status_json_names_each_callback_job() -> None:
    """Each callback shows its type, its fixed job id and its job's status once enqueued."""
    status = record(0, 3).to_status_json()
    assert status["callbacks"] == {
        "on_complete": {"type": "notify", "job_id": "b:on_complete", "status": "queued"}
    }
    assert status["finished_at"] is None and status["progress"] == 0.5


def test_the_longest_batch_id_leaves_room_for_its_jobs_ids() -> None:
    """A 100-character batch id gives valid job ids to its callbacks and members."""
    longest = "x" * 100
    assert BATCH_ID_RE.match(longest) and not BATCH_ID_RE.match(longest + "x")
    assert JOB_ID_RE.match(callback_job_id(longest, "complete"))
    assert JOB_ID_RE.match(member_job_id(longest, 9999))
