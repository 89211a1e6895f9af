"""Counts and times every request by its route template, for ``GET /metrics``.

A pure ASGI middleware rather than a Starlette ``BaseHTTPMiddleware``: it
sees the status in ``http.response.start`` and the end of a streamed answer
(an event stream) without buffering anything. The route label is the
template Starlette matched (``scope["route"].path``, ``/jobs/{job_id}``),
``unmatched`` when none did, so a scan of random paths adds no series.
"""

from __future__ import annotations

import time
from typing import Final

from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coldbrew.metrics import ApiMetrics

# HTTP's registered methods; anything else is labelled ``other`` (a bounded label)
METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}
)
UNMATCHED: Final = "unmatched"


class RequestMetrics:
    """ASGI middleware: ``coldbrew_api_requests_total`` and ``coldbrew_api_request_seconds``."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server answers if the app raises before it answers

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            method = scope["method"] if scope["method"] in METHODS else "other"
            route = route_label(scope.get("route"))
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.request_seconds.labels(route, method).observe(
                time.perf_counter() - started
            )


def route_label(route: BaseRoute | None) -> str:
    """The matched route's template, or ``unmatched``."""
    return route.path if isinstance(route, Route) else UNMATCHED


def metrics_response(request: Request, metrics: ApiMetrics) -> Response:
    """The registry in the format the scraper asked for (text 0.0.4 unless OpenMetrics)."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(
        encoder(metrics.registry),
        media_type=content_type,
        headers={"Cache-Control": "no-store"},
    )
