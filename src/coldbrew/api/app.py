"""Builds the Starlette application from a connected ``Client`` and the API settings."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from coldbrew.api import dashboard, routes
from coldbrew.api.auth import KeyRing
from coldbrew.api.errors import (
    ApiError,
    on_api_error,
    on_client_gone,
    on_coldbrew_error,
    on_unexpected,
)
from coldbrew.api.limits import WaiterSlots
from coldbrew.client import Client
from coldbrew.errors import ColdbrewError
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

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiConfig:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_wait_seconds=settings.api_max_wait_seconds,
            max_waiters=settings.api_max_waiters,
        )


@dataclass(frozen=True, slots=True)
class ApiState:
    client: Client
    keys: KeyRing
    config: ApiConfig
    on_submitted: Callable[[JobRecord], None] | None
    waiters: WaiterSlots  # long polls and event streams now open, out of config.max_waiters
    rates: DrainRates = field(default_factory=DrainRates)  # the dashboard's, across its loads
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # see stop_waiting()


ROUTES = [
    Route("/jobs", routes.submit_job, methods=["POST"], name="submit_job"),
    Route("/jobs/{job_id}", routes.get_job, methods=["GET"], name="get_job"),
    Route("/jobs/{job_id}", routes.cancel_job, methods=["DELETE"], name="cancel_job"),
    Route("/jobs/{job_id}/events", routes.job_events, methods=["GET"], name="job_events"),
    Route("/healthz", routes.healthz, methods=["GET"], name="healthz"),
    Route("/readyz", routes.readyz, methods=["GET"], name="readyz"),
    Route("/openapi.json", routes.openapi, methods=["GET"], name="openapi"),
    Route("/", dashboard.home, methods=["GET"], name="home"),
    Route("/dashboard", dashboard.dashboard, methods=["GET"], name="dashboard"),
    Route("/dashboard.json", dashboard.dashboard_json, methods=["GET"], name="dashboard_json"),
    Route("/dashboard/login", dashboard.login_form, methods=["GET"], name="login_form"),
    Route("/dashboard/login", dashboard.login, methods=["POST"], name="login"),
    Route("/dashboard/logout", dashboard.logout, methods=["POST"], name="logout"),
    Route(
        "/dashboard/jobs/{job_id}", dashboard.dashboard_job, methods=["GET"], name="dashboard_job"
    ),
]


def create_app(
    client: Client,
    keys: KeyRing,
    config: ApiConfig | None = None,
    *,
    on_submitted: Callable[[JobRecord], None] | None = None,
) -> Starlette:
    """The ASGI app; ``client`` stays owned by the caller (it is opened and closed outside)."""
    app = Starlette(
        routes=list(ROUTES),
        exception_handlers={
            ApiError: on_api_error,
            ClientDisconnect: on_client_gone,
            ColdbrewError: on_coldbrew_error,
            Exception: on_unexpected,
        },
    )
    config = config or ApiConfig()
    app.state.api = ApiState(
        client, keys, config, on_submitted, waiters=WaiterSlots(config.max_waiters)
    )
    return app


def stop_waiting(app: Starlette) -> None:
    """At shutdown: long polls answer now and event streams end (clients reconnect).

    uvicorn's graceful shutdown waits for every open response; an event
    stream on a job that never finishes would hold SIGTERM off for good.
    """
    state: ApiState = app.state.api
    state.stopping.set()
