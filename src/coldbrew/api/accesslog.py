"""One structured access-log line per request: method, path, status, duration, tenant, id.

A pure ASGI middleware (like ``instrument.RequestMetrics``), so a streamed
answer (an event stream) is logged when it ends, with its whole duration.
The request id is the caller's ``X-Request-ID`` when it is a short token, or
a new one; it is echoed in the response's ``X-Request-ID`` and lets a user's
report be matched with the log line. The tenant is the one authentication
found (``note_tenant``), ``-`` when the request had none (probes, a 401).
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Final

import structlog
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = structlog.get_logger("coldbrew.api.access")

REQUEST_ID_RE: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}")
STATE_TENANT: Final = "tenant"
STATE_REQUEST_ID: Final = "request_id"


def note_tenant(request: Request, tenant: str | None) -> None:
    """Tell the access log whose request this is (``None``: every tenant, auth off)."""
    request.state.tenant = "*" if tenant is None else tenant


def request_id_of(header: bytes | None) -> str:
    text = header.decode("latin-1") if header else ""
    return text if REQUEST_ID_RE.fullmatch(text) else uuid.uuid4().hex


class AccessLog:
    """ASGI middleware: the ``api_request`` log line and the ``X-Request-ID`` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = dict(scope.get("headers") or [])
        request_id = request_id_of(headers.get(b"x-request-id"))
        state = scope.setdefault("state", {})
        state[STATE_REQUEST_ID] = request_id
        status = 500  # what the server answers if the app raises before it answers

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            log.info(
                "api_request",
                method=scope["method"],
                path=scope["path"],
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
                tenant=state.get(STATE_TENANT, "-"),
                request_id=request_id,
            )
