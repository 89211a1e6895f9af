"""One JSON error shape for every failure: ``{"error": {"kind": ..., "message": ...}}``.

Handlers map coldbrew's exception tree to HTTP statuses here, so routes raise
what they mean and no response ever carries a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from coldbrew.errors import (
    BatchNotFound,
    BrokerUnavailable,
    ConfigurationError,
    ContractViolation,
    DatabaseUnavailable,
    InvalidRequest,
    JobNotFound,
    ServiceUnavailable,
    UnknownJobType,
    UnstorableData,
)

log = structlog.get_logger("coldbrew.api")

RETRY_AFTER_SECONDS = "5"


class ApiError(Exception):
    """An HTTP error with a stable ``kind`` code and a specific message."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def error_document(
    kind: str, message: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The error body; also written by ``api.protocol`` for answers made outside the app."""
    return {"error": {"kind": kind, "message": message, **(extra or {})}}


def error_response(
    status: int,
    kind: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    body = error_document(kind, message, extra)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


async def on_api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.kind, exc.message, exc.headers, exc.extra)


async def on_http_exception(_request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (a path no route has: 404) in the one error shape."""
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, kind, exc.detail, exc.headers)


async def on_client_gone(request: Request, _exc: Exception) -> Response:
    """The client left (or was cut off by a read timeout) before its body arrived.

    Nobody will read this answer (the server drops it); it exists so that a
    departed client is not logged as a server bug with a traceback.
    """
    log.debug("api_client_disconnected", path=request.url.path)
    return error_response(
        408, "client_disconnected", "the connection closed before the request body arrived"
    )


async def on_coldbrew_error(request: Request, exc: Exception) -> Response:
    """coldbrew's own errors: not found, bad input, services down."""
    if isinstance(exc, BatchNotFound):
        return error_response(404, "not_found", f"no batch with id {exc.batch_id!r}")
    if isinstance(exc, JobNotFound):
        return error_response(404, "not_found", f"no job with id {exc.job_id!r}")
    if isinstance(exc, UnknownJobType):
        return error_response(422, "unknown_type", str(exc))
    if isinstance(exc, InvalidRequest):  # what a worker would reject, refused before any write
        return error_response(413 if exc.reason == "too_large" else 422, exc.reason, exc.detail)
    if isinstance(exc, UnstorableData):  # PostgreSQL refused the data: the request's fault
        log.warning("api_data_refused", path=request.url.path, error=str(exc))
        return error_response(422, "unstorable", str(exc))
    if isinstance(exc, ConfigurationError | ContractViolation):
        kind = exc.reason if isinstance(exc, ContractViolation) else "invalid_request"
        return error_response(422, kind, str(exc))
    if isinstance(exc, ServiceUnavailable):
        return _unavailable(request, exc)
    return await on_unexpected(request, exc)


def _unavailable(request: Request, exc: ServiceUnavailable) -> Response:
    # the detail (hosts, masked URLs) goes to the log, not to API users
    log.warning("api_service_unavailable", path=request.url.path, error=str(exc))
    if isinstance(exc, DatabaseUnavailable):
        kind, what = "database_unavailable", "the job store (PostgreSQL) is unreachable"
    elif isinstance(exc, BrokerUnavailable):
        kind, what = "broker_unavailable", "the message broker (RabbitMQ) is unreachable"
    else:
        kind, what = "service_unavailable", "a backing service is unreachable"
    return error_response(
        503, kind, f"{what}; retry later", headers={"Retry-After": RETRY_AFTER_SECONDS}
    )


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """A bug: log it with its traceback, answer 500 without one."""
    log.error("api_unexpected_error", path=request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the details")
