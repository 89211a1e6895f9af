"""The one robust AMQP connection of a process, and the channels opened on it.

The first connection fails fast so the CLI can exit 3 with the masked URL;
after that aio-pika's robust connection reconnects by itself and re-declares
every exchange, queue, binding and consumer declared through it (SEMANTICS
§5). Every channel is opened here, so that an outage met while opening one is
``BrokerUnavailable`` wherever it happens.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection

from coldbrew.errors import BrokerUnavailable
from coldbrew.settings import mask_url
from coldbrew.transport.inbound import InboundConnection

log = structlog.get_logger("coldbrew.broker")

CONNECT_ERRORS: tuple[type[Exception], ...] = (
    # connect_robust with fail_fast: the socket (refused, unreachable, DNS) and
    # its timeout, or the handshake (AMQPConnectionError, AuthenticationError,
    # ProbableAuthenticationError, IncompatibleProtocolError: all AMQPError).
    TimeoutError,
    OSError,
    aiormq.exceptions.AMQPError,
)

CHANNEL_ERRORS: tuple[type[Exception], ...] = (
    # Opening a channel while the robust connection is between a loss and its
    # reconnect raises a bare RuntimeError: aio-pika's Connection.channel()
    # "Connection was not opened" (no transport), aiormq's Connection.channel()
    # "<Connection ...> closed" (the old transport); aio-pika's Channel._open
    # raises aiormq's ChannelInvalidStateError (a RuntimeError) "No active
    # transport in channel". No narrower class exists for these; the catch is
    # kept around the one call that raises them.
    RuntimeError,
    # The Channel.Open RPC itself: the connection lost meanwhile.
    aiormq.exceptions.AMQPError,
)


class _DropAll(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


def with_heartbeat(url: str, seconds: int | None) -> str:
    """Ask for AMQP heartbeats every ``seconds`` unless the URL already says.

    The broker closes the connection of a peer that missed two heartbeats, which
    requeues the deliveries a hung worker (stopped, or its loop blocked) still
    holds: this bounds how long such a worker can sit on jobs (guarantee 3).
    """
    if seconds is None:
        return url
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.setdefault("heartbeat", str(seconds))
    return urlunsplit(parts._replace(query=urlencode(query)))


class BrokerConnection:
    """A robust connection: opened once (fail fast), then kept up by aio-pika."""

    def __init__(
        self,
        url: str,
        *,
        name: str = "coldbrew",
        reconnect_interval: float = 1.0,
        heartbeat: int | None = None,
    ) -> None:
        self.url = url
        self._name = name
        self._reconnect_interval = reconnect_interval
        self._heartbeat = heartbeat
        self._connection: AbstractRobustConnection | None = None
        self._closing = False

    async def open(self) -> None:
        """Connect once; ``BrokerUnavailable`` (with the masked URL) if RabbitMQ is away."""
        quiet, drop = logging.getLogger("aiormq.connection"), _DropAll()
        quiet.addFilter(drop)  # the first failure is reported once, as BrokerUnavailable
        try:
            self._connection = await aio_pika.connect_robust(
                with_heartbeat(self.url, self._heartbeat),
                reconnect_interval=self._reconnect_interval,
                client_properties={"connection_name": self._name},
                connection_class=InboundConnection,
            )
        except CONNECT_ERRORS as exc:
            raise BrokerUnavailable(
                f"cannot connect to RabbitMQ at {mask_url(self.url)}: {exc or type(exc).__name__}"
            ) from exc
        finally:
            quiet.removeFilter(drop)
        self._connection.reconnect_callbacks.add(self._on_reconnect)
        self._connection.close_callbacks.add(self._on_close)

    async def channel(self, *, publisher_confirms: bool = True) -> AbstractRobustChannel:
        """A new channel, restored with the connection (keep a reference: SEMANTICS §5)."""
        if self._connection is None:
            raise BrokerUnavailable("broker used before connect()")
        try:
            return await self._connection.channel(publisher_confirms=publisher_confirms)
        except CHANNEL_ERRORS as exc:
            raise BrokerUnavailable(
                f"cannot open a channel to {mask_url(self.url)}: {exc or type(exc).__name__}"
            ) from exc

    async def close(self) -> None:
        if self._connection is not None:
            self._closing = True
            await self._connection.close()
            self._connection = None

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.connected.is_set()

    def _on_reconnect(self, *_: Any) -> None:
        log.info("broker_reconnected", url=mask_url(self.url))

    def _on_close(self, _conn: Any, exc: BaseException | None = None) -> None:
        if exc is not None and not self._closing:
            log.warning("broker_connection_lost", url=mask_url(self.url), error=str(exc))
