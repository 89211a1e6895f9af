"""``coldbrew api``: connects, listens, serves with uvicorn, and supervises background tasks.

The listening socket is bound here rather than by uvicorn, so a busy port is
one clear configuration error (exit 2) instead of uvicorn's ``sys.exit(1)``.
Signals are coldbrew's (``signals.on_stop_signals``): uvicorn's own handlers
would re-raise SIGTERM after shutdown and skip closing the pools. The HTTP
protocol is ``api.protocol``'s (read timeouts and a connection cap); websockets
are off, the API has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import structlog
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp

from coldbrew.api.app import ApiConfig, create_app, stop_waiting
from coldbrew.api.auth import KeyRing
from coldbrew.api.limits import ConnectionLimits
from coldbrew.api.protocol import protocol_class
from coldbrew.app import App
from coldbrew.client import Client
from coldbrew.errors import ColdbrewError, ConfigurationError
from coldbrew.metrics import ApiMetrics
from coldbrew.model import JobRecord
from coldbrew.settings import Settings
from coldbrew.signals import on_stop_signals

log = structlog.get_logger("coldbrew.api")

Background = Callable[[Client], Coroutine[Any, Any, None]]


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (coldbrew installs its own)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def http_server(asgi: ASGIApp, limits: ConnectionLimits) -> uvicorn.Server:
    """uvicorn serving ``asgi`` under ``limits``; ``serve(sockets=[...])`` runs it."""
    return _Server(
        uvicorn.Config(
            asgi,
            http=protocol_class(limits),
            ws="none",
            timeout_keep_alive=limits.keepalive_seconds,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
        )
    )


def key_ring(settings: Settings) -> KeyRing:
    """The API keys, or the explicit no-auth opt-in; refuse to start with neither (or both)."""
    keys = settings.api_key_map
    if keys and settings.api_insecure_no_auth:
        raise ConfigurationError(
            "COLDBREW_API_KEYS and COLDBREW_API_INSECURE_NO_AUTH=true are both set: choose one"
        )
    if not keys and not settings.api_insecure_no_auth:
        raise ConfigurationError(
            "COLDBREW_API_KEYS is empty: set key:tenant pairs (or COLDBREW_API_KEYS_FILE), or "
            "COLDBREW_API_INSECURE_NO_AUTH=true to serve every tenant without authentication"
        )
    return KeyRing(keys, insecure_no_auth=settings.api_insecure_no_auth)


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"COLDBREW_API_HOST/COLDBREW_API_PORT: cannot listen on {host}:{port}: {exc.strerror}"
        ) from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(settings: Settings, *, app: App | None = None) -> None:
    """Run the API until SIGTERM/SIGINT. Webhooks need nothing here: a delivery is a job,
    enqueued with the outcome (coldbrew/webhooks/); ``COLDBREW_WEBHOOK_URL`` (deprecated)
    is only the default URL of this API's submissions (``ApiConfig.webhook_url``)."""
    await run_server(settings, app=app, metrics=ApiMetrics(CollectorRegistry()))


async def run_server(
    settings: Settings,
    *,
    app: App | None = None,
    on_submitted: Callable[[JobRecord], None] | None = None,
    background: dict[str, Background] | None = None,
    metrics: ApiMetrics | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; a crashed background task stops it (exit 1)."""
    keys = key_ring(settings)
    sock = listen(settings.api_host, settings.api_port)
    async with Client.connect(settings, app=app) as client:
        await client.store.check_schema()
        config = ApiConfig.from_settings(settings)
        asgi = create_app(client, keys, config, on_submitted=on_submitted, metrics=metrics)
        server = http_server(asgi, ConnectionLimits.from_settings(settings))
        crashed: list[str] = []

        def stop() -> None:
            server.should_exit = True
            stop_waiting(asgi)

        tasks = [
            asyncio.create_task(_supervise(name, run(client), stop, crashed), name=name)
            for name, run in (background or {}).items()
        ]
        log.info(
            "api_listening",
            address=f"http://{settings.api_host}:{sock.getsockname()[1]}",
            auth="off" if keys.insecure_no_auth else "api keys",
        )
        try:
            with on_stop_signals(stop):
                await server.serve(sockets=[sock])
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            sock.close()
    if crashed:
        raise ColdbrewError(f"background task {crashed[0]} crashed (see the log); the API stopped")


async def _supervise(
    name: str, work: Coroutine[Any, Any, None], stop: Callable[[], None], crashed: list[str]
) -> None:
    """Run ``work``; if it ends with an error, log it and stop the server: never silent."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("api_background_task_crashed", task=name)
        crashed.append(name)
        stop()
