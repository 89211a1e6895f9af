"""The HTTP endpoints: submit, read (with ETags and long polls), stream, cancel, probes.

A long poll that would wait and an event stream each hold one of the
process's waiter slots (``COLDBREW_API_MAX_WAITERS``) while they are open.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from coldbrew import storable, tracing
from coldbrew.api.auth import Principal
from coldbrew.api.errors import ApiError
from coldbrew.api.etag import if_none_match
from coldbrew.api.instrument import metrics_response
from coldbrew.api.limits import WaiterSlot
from coldbrew.api.schemas import SubmitBody, parse_submit
from coldbrew.api.watch import Snapshot, follow, wait_for_change
from coldbrew.errors import BatchNotFound, JobNotFound, ServiceUnavailable
from coldbrew.model import MAX_IDEMPOTENCY_KEY, JobRecord, Status

if TYPE_CHECKING:
    from coldbrew.api.app import ApiState

JSON_TYPES = ("application/json", "application/problem+json")
NO_CACHE = {"Cache-Control": "no-cache"}


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


async def _owned_job(request: Request, principal: Principal) -> JobRecord:
    """The job named in the path, if the caller's tenant owns it; another tenant's is 404."""
    job_id = request.path_params["job_id"]
    record = await _state(request).client.get(job_id)
    if not principal.may_see(record.tenant):
        raise JobNotFound(job_id)  # the same answer as a missing job: ids do not leak
    return record


async def _gone(request: Request, state: ApiState) -> bool:
    """A waiter stops: its client left, or the server is stopping (``app.stop_waiting``)."""
    return state.stopping.is_set() or await request.is_disconnected()


async def submit_job(request: Request) -> Response:
    state = _state(request)
    principal = state.keys.authenticate(request)
    content_type = request.headers.get("content-type", "application/json").split(";")[0]
    if content_type.strip().lower() not in JSON_TYPES:
        raise ApiError(415, "unsupported_media_type", "send the job as application/json")
    body = parse_submit(await _read_body(request, state.config.max_body_bytes))
    tenant = body.tenant or principal.tenant or "default"
    if not principal.may_see(tenant):
        raise ApiError(
            403,
            "tenant_mismatch",
            f"this API key belongs to tenant {principal.tenant!r}, not {tenant!r}",
        )
    # a caller's W3C trace context: the job's submit span is a child of its request's span
    with tracing.remote_parent(
        request.headers.get("traceparent"), request.headers.get("tracestate")
    ):
        record = await _submit(state, body, request, tenant)
    if record.duplicate and not principal.may_see(record.tenant):
        # a key without "tenant" in unique_by spans tenants: say so, show nothing of the job
        raise ApiError(
            409,
            "unique_conflict",
            "a job of another tenant holds this job's unique key (its unique_by has no "
            '"tenant"); nothing was submitted',
        )
    if state.on_submitted is not None and not record.duplicate:
        state.on_submitted(record)
    snapshot = Snapshot.of(record)
    return JSONResponse(
        snapshot.status,
        status_code=200 if record.duplicate else 202,  # 200: a unique duplicate, nothing new
        headers={"Location": f"/jobs/{record.id}", "ETag": snapshot.etag, **NO_CACHE},
    )


def _idempotency_key(request: Request) -> str | None:
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise ApiError(
            422,
            "invalid_idempotency_key",
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} characters",
        )
    if (problem := storable.text_problem(key)) is not None:
        raise ApiError(422, "invalid_idempotency_key", f"Idempotency-Key {problem}")
    return key


async def _submit(state: ApiState, body: SubmitBody, request: Request, tenant: str) -> JobRecord:
    """``POST /jobs``'s submission, with what the request says."""
    return await state.client.submit(
        body.type,
        body.args,
        tenant=tenant,
        queue=body.queue,
        priority=body.priority,
        idempotency_key=_idempotency_key(request),
        max_attempts=body.max_attempts,
        timeout=body.timeout_seconds,
        unique_for=body.unique_for,
        unique_by=None if body.unique_by is None else tuple(body.unique_by),
        unique_states=None if body.unique_states is None else tuple(body.unique_states),
        unique_keys=None if body.unique_keys is None else tuple(body.unique_keys),
        run_at=body.schedule(),
        delay=body.delay_seconds,
        webhook_url=body.webhook_url or state.config.webhook_url,
    )


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    too_large = ApiError(413, "too_large", f"the body is over the limit of {limit} bytes")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def get_job(request: Request) -> Response:
    state = _state(request)
    principal = state.keys.authenticate(request)
    wait = _wait_seconds(request, state.config.max_wait_seconds)
    snapshot = Snapshot.of(await _owned_job(request, principal))
    client_has = request.headers.get("if-none-match")
    waits = client_has is None or if_none_match(client_has, snapshot.etag)
    if wait > 0 and waits and not snapshot.terminal:  # a terminal job answers at once
        # 503 when COLDBREW_API_MAX_WAITERS are already waiting
        with state.waiters.take("long_poll"):
            snapshot = await wait_for_change(
                partial(_owned_job, request, principal),
                snapshot,
                timeout=wait,
                gone=partial(_gone, request, state),
            )
    headers = {"ETag": snapshot.etag, **NO_CACHE}
    if if_none_match(client_has, snapshot.etag):
        return Response(status_code=304, headers=headers)
    return JSONResponse(snapshot.status, headers=headers)


def _wait_seconds(request: Request, limit: float) -> float:
    text = request.query_params.get("wait")
    if text is None:
        return 0.0
    try:
        wait = float(text)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= limit:  # also false for nan
        raise ApiError(422, "invalid_wait", f"wait must be a number of seconds in 0..{limit:g}")
    return wait


async def job_events(request: Request) -> Response:
    """Server-sent events: one ``status`` event per change, until the job is terminal."""
    principal = _state(request).keys.authenticate(request)
    return await event_stream(request, principal)


async def event_stream(request: Request, principal: Principal) -> Response:
    """The event stream of the path's job for ``principal`` (the dashboard's too)."""
    state = _state(request)
    await _owned_job(request, principal)  # 404 before the stream starts, not inside it
    slot = state.waiters.take("event_stream")  # 503 (before the stream starts) if all taken
    last = request.headers.get("last-event-id")
    fetch = partial(_owned_job, request, principal)

    async def stream() -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        try:
            async for snapshot in follow(
                fetch,
                last_etag=f'"{last}"' if last else None,
                gone=partial(_gone, request, state),
                keepalive=state.config.sse_keepalive_seconds,
            ):
                if snapshot is None:
                    yield ": keepalive\n\n"
                    continue
                data = json.dumps(snapshot.status, separators=(",", ":"))
                yield f"id: {snapshot.etag.strip(chr(34))}\nevent: status\ndata: {data}\n\n"
        except ServiceUnavailable:  # headers are sent: say it in the stream, then end
            error = {
                "kind": "service_unavailable",
                "message": "the job store is unreachable; reconnect later with Last-Event-ID",
            }
            yield f"event: error\ndata: {json.dumps(error)}\n\n"

    return _SlotStream(
        stream(),
        slot,
        media_type="text/event-stream",
        headers={**NO_CACHE, "X-Accel-Buffering": "no"},
    )


class _SlotStream(StreamingResponse):
    """A stream that gives its waiter slot back however it ends.

    Releasing in the generator's ``finally`` would leak the slot when the
    client is gone before the first chunk: a generator never started runs no
    ``finally``.
    """

    def __init__(self, content: AsyncIterator[str], slot: WaiterSlot, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slot.release()


async def cancel_job(request: Request) -> Response:
    """Cancel: 200 once cancelled, 202 while a running job is being stopped, 409 if finished."""
    state = _state(request)
    principal = state.keys.authenticate(request)
    record = await _owned_job(request, principal)
    reason = request.query_params.get("reason") or "cancelled over the HTTP API"
    record = await state.client.cancel(record.id, reason)  # over MAX_REASON: 422
    snapshot = Snapshot.of(record)
    if record.status is Status.CANCELLED:
        return JSONResponse(snapshot.status, headers={"ETag": snapshot.etag})
    if record.status is Status.RUNNING:
        return JSONResponse(snapshot.status, status_code=202, headers={"ETag": snapshot.etag})
    raise ApiError(
        409,
        "already_finished",
        f"job {record.id} is already {record.status}",
        extra={"job": snapshot.status},
    )


async def get_batch(request: Request) -> Response:
    """A batch's status JSON, if the caller's tenant owns it; another tenant's is 404."""
    state = _state(request)
    principal = state.keys.authenticate(request)
    batch_id = request.path_params["batch_id"]
    record = await state.client.get_batch(batch_id)  # 422 invalid_batch_id, 404 BatchNotFound
    if not principal.may_see(record.tenant):
        raise BatchNotFound(batch_id)  # the same answer as a missing batch: ids do not leak
    return JSONResponse(record.to_status_json(), headers=NO_CACHE)


async def healthz(_request: Request) -> Response:
    """Liveness: the process answers."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Readiness: PostgreSQL answers and the broker connection is up."""
    client = _state(request).client
    problems: dict[str, Any] = {}
    try:
        await client.store.ping()
    except ServiceUnavailable:
        problems["database"] = "unreachable"
    if client.broker is not None and not client.broker.connected:
        problems["broker"] = "reconnecting (submissions are kept and published by the relay)"
    if "database" in problems:
        return JSONResponse({"status": "unavailable", **problems}, status_code=503)
    return JSONResponse({"status": "ok", **problems})


async def openapi(request: Request) -> Response:
    """The OpenAPI document, built at start-up from the validators the routes use."""
    return JSONResponse(_state(request).spec)


async def metrics(request: Request) -> Response:
    """Prometheus metrics of this API process; unauthenticated, like the worker's."""
    return metrics_response(request, _state(request).metrics)
