"""Builds the Starlette application from a connected ``Client`` and the API settings."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from coldbrew.api import dashboard, routes
from coldbrew.api.accesslog import AccessLog
from coldbrew.api.auth import CSRF_SECRET, CsrfKeys, KeyRing
from coldbrew.api.errors import (
    ApiError,
    on_api_error,
    on_client_gone,
    on_coldbrew_error,
    on_http_exception,
    on_unexpected,
)
from coldbrew.api.instrument import RequestMetrics
from coldbrew.api.limits import WaiterSlots
from coldbrew.api.openapi import build_spec
from coldbrew.client import Client
from coldbrew.errors import ColdbrewError
from coldbrew.metrics import ApiMetrics
from coldbrew.model import JobRecord
from coldbrew.settings import Settings
from coldbrew.stats import DrainRates


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """What the routes need beyond the client."""

    max_body_bytes: int = 256 * 1024
    max_wait_seconds: float = 60.0
    sse_keepalive_seconds: float = 15.0
    max_waiters: int = 500
    webhook_url: str | None = None
    """Deprecated ``COLDBREW_WEBHOOK_URL``: the webhook of a submission that names none."""
    session_seconds: float = 12 * 3600.0  # COLDBREW_DASHBOARD_SESSION_SECONDS

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiConfig:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_wait_seconds=settings.api_max_wait_seconds,
            max_waiters=settings.api_max_waiters,
            webhook_url=settings.webhook_url or None,
            session_seconds=settings.dashboard_session_seconds,
        )


@dataclass(frozen=True, slots=True)
class ApiState:
    client: Client
    keys: KeyRing
    config: ApiConfig
    on_submitted: Callable[[JobRecord], None] | None
    waiters: WaiterSlots  # long polls and event streams now open, out of config.max_waiters
    metrics: ApiMetrics
    spec: dict[str, Any]  # /openapi.json, built once from the validators and this config
    csrf: CsrfKeys  # the dashboard's signer, under the namespace's shared secret
    rates: DrainRates = field(default_factory=DrainRates)  # the dashboard's, across its loads
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # see stop_waiting()
    charts: dict[str | None, tuple[float, str]] = field(default_factory=dict)  # per scope: drawn


Endpoint = Callable[[Request], Awaitable[Response]]


class PathRoute(Route):
    """Every method of one path in one route, so that a 405 names them all in ``Allow``.

    Starlette tries routes in order and answers 405 from the first one whose
    path matched; with one ``Route`` per method, ``OPTIONS /jobs/{job_id}``
    said ``Allow: GET, HEAD`` and left out DELETE. Here one route holds the
    path's handlers, and its 405 is coldbrew's JSON error with the full list.
    """

    def __init__(self, path: str, name: str, **handlers: Endpoint) -> None:
        self.handlers = {method.upper(): handler for method, handler in handlers.items()}
        super().__init__(path, self._dispatch, methods=list(self.handlers), name=name)
        self.served: frozenset[str] = frozenset(self.methods or ())  # GET brings HEAD
        order = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
        self.allow = ", ".join(m for m in order if m in self.served)

    async def _dispatch(self, request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        return await self.handlers[method](request)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in self.served:
            raise ApiError(
                405,
                "method_not_allowed",
                f"{scope['method']} is not allowed here; allowed: {self.allow}",
                headers={"Allow": self.allow},
            )
        await super().handle(scope, receive, send)


ROUTES = [
    PathRoute("/jobs", "jobs", post=routes.submit_job),
    PathRoute("/jobs/{job_id}", "job", get=routes.get_job, delete=routes.cancel_job),
    PathRoute("/jobs/{job_id}/events", "job_events", get=routes.job_events),
    PathRoute("/batches/{batch_id}", "batch", get=routes.get_batch),
    PathRoute("/healthz", "healthz", get=routes.healthz),
    PathRoute("/readyz", "readyz", get=routes.readyz),
    PathRoute("/metrics", "metrics", get=routes.metrics),
    PathRoute("/openapi.json", "openapi", get=routes.openapi),
    PathRoute("/", "home", get=dashboard.home),
    PathRoute("/dashboard", "dashboard", get=dashboard.dashboard),
    PathRoute("/dashboard.json", "dashboard_json", get=dashboard.dashboard_json),
    PathRoute("/dashboard/login", "login", get=dashboard.login_form, post=dashboard.login),
    PathRoute("/dashboard/logout", "logout", post=dashboard.logout),
    PathRoute("/dashboard/jobs", "dashboard_jobs", get=dashboard.jobs),
    PathRoute("/dashboard/jobs/{job_id}", "dashboard_job", get=dashboard.dashboard_job),
    PathRoute(
        "/dashboard/jobs/{job_id}/events",
        "dashboard_job_events",
        get=dashboard.dashboard_job_events,
    ),
    PathRoute("/dashboard/static/job.js", "dashboard_script", get=dashboard.job_script),
    PathRoute("/dashboard/tenants/{name}", "dashboard_tenant", get=dashboard.tenant),
    PathRoute("/dashboard/audit", "dashboard_audit", get=dashboard.audit),
    PathRoute("/dashboard/confirm", "dashboard_confirm", get=dashboard.confirm),
    PathRoute("/dashboard/act", "dashboard_act", post=dashboard.act),
]


def create_app(
    client: Client,
    keys: KeyRing,
    config: ApiConfig | None = None,
    *,
    on_submitted: Callable[[JobRecord], None] | None = None,
    metrics: ApiMetrics | None = None,
) -> Starlette:
    """The ASGI app; ``client`` stays owned by the caller (it is opened and closed outside).

    ``metrics``: the process's (``coldbrew api`` shares them with the webhook
    dispatcher); a fresh registry when not given.
    """
    metrics = metrics or ApiMetrics(CollectorRegistry())
    app = Starlette(
        routes=list(ROUTES),
        middleware=[Middleware(AccessLog), Middleware(RequestMetrics, metrics=metrics)],
        exception_handlers={
            ApiError: on_api_error,
            HTTPException: on_http_exception,
            ClientDisconnect: on_client_gone,
            ColdbrewError: on_coldbrew_error,
            Exception: on_unexpected,
        },
    )
    config = config or ApiConfig()
    waiters = WaiterSlots(config.max_waiters)
    metrics.watch_waiters(lambda: waiters.open)
    app.state.api = ApiState(
        client,
        keys,
        config,
        on_submitted,
        waiters=waiters,
        metrics=metrics,
        spec=build_spec(max_wait_seconds=config.max_wait_seconds),
        csrf=CsrfKeys(lambda: client.store.dashboard.shared_secret(CSRF_SECRET)),
    )
    return app


def stop_waiting(app: Starlette) -> None:
    """At shutdown: long polls answer now and event streams end (clients reconnect).

    uvicorn's graceful shutdown waits for every open response; an event
    stream on a job that never finishes would hold SIGTERM off for good.
    """
    state: ApiState = app.state.api
    state.stopping.set()
