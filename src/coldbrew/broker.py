"""RabbitMQ through aio-pika: connect, declare, publish with confirms, consume.

The broker moves work; it never decides a job's fate (the store does). The
first connection fails fast so the CLI can exit 3 with the masked URL; after
that aio-pika's robust connection reconnects by itself and re-declares every
exchange, queue, binding and consumer declared here (SEMANTICS §5).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aio_pika
import aiormq
import structlog
from aio_pika.abc import (
    AbstractRobustChannel,
    AbstractRobustConnection,
    AbstractRobustExchange,
    AbstractRobustQueue,
)

from coldbrew.deliveries import (
    Inbound,
    InboundChannel,
    InboundConnection,
    InboundHandler,
    OnDelivery,
    settle,
)
from coldbrew.errors import BrokerUnavailable
from coldbrew.model import routing_key
from coldbrew.settings import mask_url
from coldbrew.topology import Topology

log = structlog.get_logger("coldbrew.broker")

PUBLISH_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,
    aio_pika.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
    RuntimeError,  # aiormq raises it for a writer that went away mid-publish
)


@dataclass(frozen=True, slots=True)
class Sweep:
    """What ``Broker.sweep_queue`` took: the queue's ready count, then the messages."""

    ready: int
    messages: list[Inbound]

    @property
    def drained(self) -> bool:
        """Whether it took every message that was ready when it began."""
        return len(self.messages) >= self.ready


INSPECT_TIMEOUT = 5.0
"""Seconds a passive declare (``Broker.queue_counts``) may take, reconnecting included."""


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """A passive ``queue.declare``'s answer: ready messages (unacked ones are not counted)
    and consumers."""

    ready: int
    consumers: int


@dataclass(frozen=True, slots=True)
class JobMessage:
    """What goes on the wire for one job, per the producer contract."""

    id: str
    type: str
    queue: str
    tenant: str
    args: Mapping[str, Any]
    priority: int = 0
    idempotency_key: str | None = None
    max_attempts: int | None = None
    timeout: float | None = None

    def to_message(self) -> aio_pika.Message:
        headers: dict[str, Any] = {}
        if self.idempotency_key is not None:
            headers["x-idempotency-key"] = self.idempotency_key
        if self.max_attempts is not None:
            headers["x-max-attempts"] = self.max_attempts
        if self.timeout is not None:
            headers["x-timeout-seconds"] = self.timeout
        body = json.dumps({"type": self.type, "args": self.args}, separators=(",", ":"))
        return aio_pika.Message(
            body.encode(),
            message_id=self.id,
            priority=self.priority,
            headers=headers,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
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


class Broker:
    """One robust connection with a publishing channel (confirms) and a consuming channel."""

    def __init__(
        self,
        url: str,
        topology: Topology,
        *,
        name: str = "coldbrew",
        reconnect_interval: float = 1.0,
        publish_timeout: float = 30.0,
        heartbeat: int | None = None,
        consume_channels: int = 1,
    ) -> None:
        self.url = url
        self._heartbeat = heartbeat
        self.topology = topology
        self._name = name
        self._reconnect_interval = reconnect_interval
        self._publish_timeout = publish_timeout
        self._connection: AbstractRobustConnection | None = None
        self._publish_channel: AbstractRobustChannel | None = None
        self._consume_channels: list[AbstractRobustChannel] = []
        self._prefetch = 0
        self.consume_channels = consume_channels
        self._jobs_exchange: AbstractRobustExchange | None = None
        self._dead_exchange: AbstractRobustExchange | None = None
        self._consumers: dict[str, tuple[AbstractRobustQueue, str]] = {}
        self._sweep_channel: AbstractRobustChannel | None = None
        self._inspect_channel: AbstractRobustChannel | None = None
        self._closing = False
        self.on_queue_cancelled: Callable[[str], None] | None = None
        """Told a consumed queue's name when the broker cancels its consumer (deleted)."""

    async def connect(self, *, prefetch: int = 0) -> None:
        """Connect once (fail fast), open channels and declare the fixed topology."""
        quiet, drop = logging.getLogger("aiormq.connection"), _DropAll()
        quiet.addFilter(drop)  # the first failure is reported once, as BrokerUnavailable
        try:
            self._connection = await aio_pika.connect_robust(
                with_heartbeat(self.url, self._heartbeat),
                reconnect_interval=self._reconnect_interval,
                client_properties={"connection_name": self._name},
                connection_class=InboundConnection,
            )
        except (TimeoutError, OSError, aiormq.exceptions.AMQPError) as exc:
            raise BrokerUnavailable(
                f"cannot connect to RabbitMQ at {mask_url(self.url)}: {exc or type(exc).__name__}"
            ) from exc
        finally:
            quiet.removeFilter(drop)
        self._connection.reconnect_callbacks.add(self._on_reconnect)
        self._connection.close_callbacks.add(self._on_close)
        self._publish_channel = await self._connection.channel(publisher_confirms=True)
        self._prefetch = prefetch
        self._consume_channels = [await self._open_consume_channel()]
        await self._declare_fixed()

    async def _open_consume_channel(self) -> AbstractRobustChannel:
        assert self._connection is not None
        channel = await self._connection.channel(publisher_confirms=True)
        if isinstance(channel, InboundChannel):
            channel.on_queue_cancelled = self._consumer_cancelled
        if self._prefetch:
            await channel.set_qos(prefetch_count=self._prefetch)
        return channel

    def _consumer_cancelled(self, queue_name: str) -> None:
        log.warning("consumer_cancelled_by_broker", queue=queue_name)
        if self.on_queue_cancelled is not None:
            self.on_queue_cancelled(queue_name)

    async def _next_consume_channel(self) -> AbstractRobustChannel:
        """Queues go round-robin onto up to ``consume_channels`` channels.

        Acks are batched per channel with ``multiple=True``, which can only
        reach up to the oldest delivery still held on that channel. Deliveries
        of a paused or capped tenant, or of a tenant the scheduler serves
        rarely, stay held; on a channel shared by every queue they force
        everyone else's acks to go singly, one awaited frame each. Measured in
        bench/fairness.py (caps): other tenants' throughput 0.6-0.7x with one
        channel, 0.9x with a channel per queue. The bound keeps a worker with
        thousands of tenant queues from opening thousands of channels (each
        an Erlang process in RabbitMQ).
        """
        if not self._consume_channels:
            raise BrokerUnavailable("broker used before connect()")
        index = len(self._consumers) % self.consume_channels
        while index >= len(self._consume_channels):
            self._consume_channels.append(await self._open_consume_channel())
        return self._consume_channels[index]

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

    def _channel(self) -> AbstractRobustChannel:
        channel = self._publish_channel
        if channel is None:
            raise BrokerUnavailable("broker used before connect()")
        return channel

    async def _declare_fixed(self) -> None:
        """Exchanges and the unrouted and dead queues; idempotent and replayed on reconnect."""
        topo = self.topology
        channel = self._channel()
        unrouted = await channel.declare_exchange(
            topo.unrouted_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        self._dead_exchange = await channel.declare_exchange(
            topo.dead_exchange, aio_pika.ExchangeType.FANOUT, durable=True
        )
        self._jobs_exchange = await channel.declare_exchange(
            topo.jobs_exchange,
            aio_pika.ExchangeType.TOPIC,
            durable=True,
            arguments=topo.jobs_exchange_arguments(),
        )
        unrouted_queue = await channel.declare_queue(
            topo.unrouted_queue, durable=True, arguments=topo.unrouted_queue_arguments()
        )
        await unrouted_queue.bind(unrouted, routing_key="#")
        dead_queue = await channel.declare_queue(
            topo.dead_queue, durable=True, arguments=topo.dead_queue_arguments()
        )
        await dead_queue.bind(self._dead_exchange, routing_key="#")

    async def redeclare_topology(self) -> None:
        """Declare the exchanges and the unrouted and dead queues again, with their bindings
        (after the broker deleted one: a queue aio-pika restores by itself has no binding)."""
        try:
            await self._declare_fixed()
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(f"declaring the topology: {exc or type(exc).__name__}") from exc

    async def declare_job_queue(self, queue: str, tenant: str) -> None:
        """Declare and bind the queue of one lane and tenant (idempotent)."""
        channel = self._channel()
        declared = await channel.declare_queue(
            self.topology.job_queue(queue, tenant),
            durable=True,
            arguments=self.topology.job_queue_arguments(),
        )
        await declared.bind(self.topology.jobs_exchange, routing_key=routing_key(queue, tenant))

    # --- publishing ------------------------------------------------------------

    async def publish_job(self, job: JobMessage) -> None:
        """Publish one job and wait for the broker's confirm."""
        await self._publish(self._jobs(), job.to_message(), routing_key(job.queue, job.tenant))

    async def publish_jobs(self, jobs: Sequence[JobMessage], *, window: int = 256) -> list[bool]:
        """Publish many with confirms pipelined (``window`` in flight); True where confirmed."""
        limit = asyncio.Semaphore(window)

        async def one(job: JobMessage) -> bool:
            async with limit:
                try:
                    await self.publish_job(job)
                except BrokerUnavailable as exc:
                    log.warning("publish_failed", job_id=job.id, error=str(exc))
                    return False
                return True

        return list(await asyncio.gather(*(one(job) for job in jobs)))

    async def republish(self, message: Inbound) -> None:
        """Publish a delivery again to the jobs exchange, unchanged (after provisioning)."""
        copy = aio_pika.Message(
            message.body,
            headers=dict(message.headers or {}),
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            priority=message.priority,
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            timestamp=message.timestamp,
            type=message.type,
            app_id=message.app_id,
        )
        await self._publish(self._jobs(), copy, message.routing_key or "")

    async def publish_dead(
        self,
        body: bytes,
        *,
        reason: str,
        detail: str,
        headers: Mapping[str, Any],
        message_id: str | None,
        original_routing_key: str,
    ) -> None:
        """Put a copy of a dead job or rejected message on ``<ns>.dead`` with its reason."""
        all_headers = dict(headers)
        all_headers.update(
            {
                "x-coldbrew-reason": reason,
                "x-coldbrew-detail": detail[:1000],
                "x-coldbrew-routing-key": original_routing_key,
            }
        )
        message = aio_pika.Message(
            body,
            headers=all_headers,
            message_id=message_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        if self._dead_exchange is None:
            raise BrokerUnavailable("broker used before connect()")
        await self._publish(self._dead_exchange, message, original_routing_key)

    def _jobs(self) -> AbstractRobustExchange:
        if self._jobs_exchange is None:
            raise BrokerUnavailable("broker used before connect()")
        return self._jobs_exchange

    async def _publish(
        self, exchange: AbstractRobustExchange, message: aio_pika.Message, key: str
    ) -> None:
        try:
            await exchange.publish(
                message, routing_key=key, mandatory=False, timeout=self._publish_timeout
            )
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(
                f"publish to {exchange.name} failed: {exc or type(exc).__name__}"
            ) from exc

    # --- consuming ---------------------------------------------------------------

    async def consume(
        self, queue_name: str, arguments: Mapping[str, Any], on_delivery: OnDelivery
    ) -> None:
        """Start consuming ``queue_name``: each delivery reaches ``on_delivery`` as an ``Inbound``.

        The queue is declared (idempotently, same arguments) on the consuming
        channel so that aio-pika restores it and its consumer after a reconnect.
        """
        if queue_name in self._consumers:
            return
        channel = await self._next_consume_channel()
        queue = await channel.declare_queue(queue_name, durable=True, arguments=dict(arguments))

        tag = await queue.consume(InboundHandler(on_delivery).incoming, no_ack=False)
        self._consumers[queue_name] = (queue, tag)

    @property
    def consuming(self) -> int:
        return len(self._consumers)

    async def sweep_queue(
        self,
        queue_name: str,
        *,
        limit: int,
        quiet_seconds: float = 0.2,
        max_seconds: float = 2.0,
        on_start: Callable[[int], Awaitable[None]] | None = None,
    ) -> Sweep:
        """Take up to ``limit`` of a queue's ready messages at once, past its priority order.

        A consumer of its own, on a channel of its own, with a prefetch as
        large as what is taken, collects deliveries until it has what was
        ready, none came for ``quiet_seconds``, or ``max_seconds`` passed;
        then it is cancelled. The messages stay unacked on that channel: the
        caller keeps some (they settle like any delivery) and requeues the
        rest (``requeue``). The channel stays open for the kept ones; a
        delivery arriving after the collection ended goes straight back.
        """
        channel = await self._sweeping_channel()
        try:
            queue = await channel.declare_queue(queue_name, passive=True, robust=False)
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._sweep_channel = None  # the broker closed the channel on the 404
            return Sweep(0, [])
        result = queue.declaration_result
        ready = result.message_count or 0 if result is not None else 0
        if ready == 0:
            return Sweep(0, [])
        want = min(ready, limit)
        if on_start is not None:  # told how many it may take, before it takes any
            await on_start(want)
        await channel.set_qos(prefetch_count=want)
        loop = asyncio.get_running_loop()
        taken: list[Inbound] = []
        collecting = True
        last = loop.time()
        enough = asyncio.Event()

        async def take(message: Inbound) -> None:
            nonlocal last
            if not collecting:
                await settle(message, requeue=True)
                return
            taken.append(message)
            last = loop.time()
            if len(taken) >= want:
                enough.set()

        tag = await queue.consume(InboundHandler(take).incoming, no_ack=False, robust=False)
        try:
            deadline = loop.time() + max_seconds
            while not enough.is_set() and loop.time() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(enough.wait(), timeout=quiet_seconds)
                if loop.time() - last >= quiet_seconds:
                    break
        except BaseException:
            collecting = False
            await self.requeue(taken)
            raise
        finally:
            collecting = False
            with contextlib.suppress(*PUBLISH_ERRORS):
                await queue.cancel(tag)
        return Sweep(ready, list(taken))

    async def _sweeping_channel(self) -> AbstractRobustChannel:
        if self._connection is None:
            raise BrokerUnavailable("broker used before connect()")
        channel = self._sweep_channel
        if channel is None or channel.is_closed:
            channel = self._sweep_channel = await self._connection.channel()
        return channel

    async def queue_counts(self, queue_name: str) -> QueueCounts | None:
        """Ready messages and consumers of a queue (a passive declare); None if it is missing.

        On a channel of its own: the broker closes a channel on the 404 of a
        missing queue, and it is reopened for the next call.
        """
        if self._connection is None:
            raise BrokerUnavailable("broker used before connect()")
        try:
            async with asyncio.timeout(INSPECT_TIMEOUT):  # an outage is not waited out here
                channel = self._inspect_channel
                if channel is None or channel.is_closed:
                    channel = self._inspect_channel = await self._connection.channel(
                        publisher_confirms=False
                    )
                queue = await channel.declare_queue(queue_name, passive=True, robust=False)
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._inspect_channel = None
            return None
        except PUBLISH_ERRORS as exc:
            self._inspect_channel = None
            raise BrokerUnavailable(f"counting {queue_name}: {exc or type(exc).__name__}") from exc
        result = queue.declaration_result
        return QueueCounts(result.message_count or 0, result.consumer_count or 0)

    @staticmethod
    async def requeue(messages: Sequence[Inbound]) -> None:
        """Hand deliveries back to the broker, each at the head of its priority."""
        for message in messages:
            await settle(message, requeue=True)

    async def cancel_consumers(self) -> None:
        """Stop all deliveries at once (drain); unacked ones stay with us until acked."""
        consumers, self._consumers = self._consumers, {}
        for queue, tag in consumers.values():
            try:
                await queue.cancel(tag)
            except PUBLISH_ERRORS as exc:
                log.warning("consumer_cancel_failed", queue=queue.name, error=str(exc))
