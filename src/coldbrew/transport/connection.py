"""The one robust AMQP connection of a process, and the channels opened on it.

The first connection fails fast so the CLI can exit 3 with the masked URL;
after that aio-pika's robust connection reconnects by itself and re-declares
every exchange, queue, binding and consumer declared through it (SEMANTICS
§5). Every channel is opened here, so that an outage met while opening one is
``BrokerUnavailable`` wherever it happens.

``COLDBREW_AMQP_URL`` may list several brokers (the nodes of a cluster). A
process starts at the URL its spread key hashes to (``start_index``: a fleet
spreads over the nodes) and tries the others in list order from there; once
connected, every reconnect attempt moves on to the next URL
(``FailoverConnection``), and aio-pika's recovery re-declares the topology and
re-consumes on whichever node answers.
"""

from __future__ import annotations

import logging
import os
import socket
import zlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiormq
import structlog
from aio_pika.abc import AbstractRobustChannel
from yarl import URL

from coldbrew.errors import BrokerUnavailable
from coldbrew.settings import mask_url, split_urls
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


# Seconds one connection attempt (socket and AMQP handshake) may take before the next URL
# is tried; a healthy broker answers in milliseconds.
CONNECT_TIMEOUT = 10.0


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


def default_spread_key() -> str:
    """A process's own key (as ``COLDBREW_WORKER_ID``'s default): host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


def start_index(spread_key: str, count: int) -> int:
    """Which of ``count`` broker URLs a process connects to first.

    A stable hash (CRC-32) of its key, so that a fleet spreads over the nodes
    and a worker restarted under the same ``COLDBREW_WORKER_ID`` comes back to
    the same node; the others follow in list order from there.
    """
    return zlib.crc32(spread_key.encode()) % count if count > 1 else 0


class FailoverConnection(InboundConnection):
    """A robust connection over several broker URLs: each connect attempt after the
    first goes to the next URL of the list (wrapping around).

    aio-pika reconnects to its one ``url``; its recovery loop opens every
    transport through ``RobustConnection.__connect_transport``, the one place
    this class takes over (aio-pika 10.x: the failover test guards the hook).
    Connection options in a URL's query (``heartbeat``...) apply to that URL.
    """

    def __init__(self, urls: Sequence[str], first: int, **kwargs: Any) -> None:
        self.urls = tuple(urls)
        self.index = first % len(self.urls)
        self._attempts = 0
        super().__init__(URL(self.urls[self.index]), **kwargs)

    async def _RobustConnection__connect_transport(self) -> None:
        """Move to the next URL (except for the very first attempt), then connect there."""
        if self._attempts:
            self.index = (self.index + 1) % len(self.urls)
            url = URL(self.urls[self.index])
            options = {k: v for k, v in url.query.items() if k in self._option_names}
            parsed = self._parse_parameters(options)
            self.kwargs.update({name: parsed[name] for name in options if name in parsed})
            self.url = url
            log.info("broker_trying", url=mask_url(str(url)), index=self.index)
        self._attempts += 1
        await super()._RobustConnection__connect_transport()  # type: ignore[misc]

    @property
    def _option_names(self) -> frozenset[str]:
        return frozenset(
            p.name for p in self.PARAMETERS if p.name not in ("reconnect_interval", "fail_fast")
        )


class BrokerConnection:
    """A robust connection: opened once (fail fast), then kept up by aio-pika."""

    def __init__(
        self,
        url: str,
        *,
        name: str = "coldbrew",
        reconnect_interval: float = 1.0,
        heartbeat: int | None = None,
        spread_key: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.url = url
        self.urls = split_urls(url)
        self._first = start_index(spread_key or default_spread_key(), len(self.urls))
        self._name = name
        self._reconnect_interval = reconnect_interval
        self._heartbeat = heartbeat
        self._connect_timeout = connect_timeout
        self._connection: FailoverConnection | None = None
        self._closing = False

    async def open(self) -> None:
        """Connect once, trying each URL in turn from this process's first one;
        ``BrokerUnavailable`` (with the masked URLs) if none answers."""
        quiet, drop = logging.getLogger("aiormq.connection"), _DropAll()
        quiet.addFilter(drop)  # the first failure is reported once, as BrokerUnavailable
        failures: list[str] = []
        try:
            for step in range(len(self.urls)):
                index = (self._first + step) % len(self.urls)
                try:
                    self._connection = await self._connect(index)
                    break
                except CONNECT_ERRORS as exc:
                    failures.append(
                        f"{mask_url(self.urls[index])}: {str(exc) or type(exc).__name__}"
                    )
                    if len(failures) == len(self.urls):
                        raise BrokerUnavailable(
                            "cannot connect to RabbitMQ at " + "; ".join(failures)
                        ) from exc
                    log.warning("broker_unreachable_trying_next", failed=failures[-1])
        finally:
            quiet.removeFilter(drop)
        assert self._connection is not None  # the loop connected or raised
        self._connection.reconnect_callbacks.add(self._on_reconnect)
        self._connection.close_callbacks.add(self._on_close)
        log.debug("broker_connected", url=self.node)

    async def _connect(self, index: int) -> FailoverConnection:
        urls = [with_heartbeat(url, self._heartbeat) for url in self.urls]
        connection = FailoverConnection(
            urls,
            index,
            reconnect_interval=self._reconnect_interval,
            client_properties={"connection_name": self._name},
        )
        try:
            # bounds every attempt, the reconnects' too: a node that accepts the socket and
            # never answers (hung, or half out of its cluster) must not stall the failover
            await connection.connect(timeout=self._connect_timeout)
        except BaseException:
            await connection.close()
            raise
        return connection

    @property
    def node(self) -> str:
        """The (masked) URL of the broker this process is connected to, or last tried."""
        if self._connection is None:
            return mask_url(self.urls[self._first])
        return mask_url(self.urls[self._connection.index])

    async def channel(self, *, publisher_confirms: bool = True) -> AbstractRobustChannel:
        """A new channel, restored with the connection (keep a reference: SEMANTICS §5)."""
        if self._connection is None:
            raise BrokerUnavailable("broker used before connect()")
        try:
            return await self._connection.channel(publisher_confirms=publisher_confirms)
        except CHANNEL_ERRORS as exc:
            raise BrokerUnavailable(
                f"cannot open a channel to {self.node}: {exc or type(exc).__name__}"
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
        log.info("broker_reconnected", url=self.node)

    def _on_close(self, _conn: Any, exc: BaseException | None = None) -> None:
        if exc is not None and not self._closing:
            log.warning("broker_connection_lost", url=self.node, error=str(exc))
