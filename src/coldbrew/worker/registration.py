"""Publishing the app's job types at start-up, so submitters without the app route them.

``coldbrew submit thumbnail`` without ``--app`` cannot see that ``thumbnail``
is declared ``@app.job(queue="slow")``; the fleet can. Each worker writes its
app's types (lane, attempts, timeout, process pool) to ``registered_types``
before it consumes, and ``Client.submit`` reads them. Newest wins: when two
workers' apps disagree about a type (a deploy in progress, two apps sharing a
type name), the last to start decides, and the worker logs what it replaced.
One statement at start-up, not a loop: registrations change only with an app.
"""

from __future__ import annotations

import structlog

from coldbrew.app import App
from coldbrew.store import JobStore, TypeRegistration

log = structlog.get_logger("coldbrew.worker")


def registrations(app: App) -> list[TypeRegistration]:
    """What ``app`` says about each of its job types."""
    return [
        TypeRegistration(
            name=spec.name,
            queue=spec.queue,
            max_attempts=spec.max_attempts,
            timeout=spec.timeout,
            is_process=spec.runs_in_process,
        )
        for spec in sorted(app.jobs.values(), key=lambda spec: spec.name)
    ]


async def publish_job_types(store: JobStore, app: App, worker_id: str) -> int:
    """Register ``app``'s job types as this worker's; warn about each one that another
    worker's app registered otherwise. Returns how many types were registered."""
    types = registrations(app)
    if not types:
        return 0
    new = {t.name: t for t in types}
    for old in await store.types.register(types, worker_id):
        mine = new[old.name]
        log.warning(
            "job_type_registration_replaced",
            type=old.name,
            lane=mine.queue,
            max_attempts=mine.max_attempts,
            timeout_seconds=mine.timeout,
            is_process=mine.is_process,
            previous_lane=old.queue,
            previous_max_attempts=old.max_attempts,
            previous_timeout_seconds=old.timeout,
            previous_is_process=old.is_process,
            previous_worker_id=old.worker_id,
            previous_registered_at=old.updated_at.isoformat(),
            hint="two workers' apps disagree about this type; the newest registration wins",
        )
    return len(types)
