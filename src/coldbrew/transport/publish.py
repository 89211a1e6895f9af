"""Publishing with confirms: jobs, republished deliveries and dead-letter copies.

A publish returns once RabbitMQ confirmed it; anything else is
``BrokerUnavailable``, and the caller keeps the job to publish again (the
relay's row stays unpublished). A robust connection does not replay a failed
publish (SEMANTICS §5).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustExchange

from coldbrew import tracing
from coldbrew.errors import BrokerUnavailable
from coldbrew.model import JobFields, message_body, message_headers
from coldbrew.topology import Topology
from coldbrew.transport.declare import Exchanges
from coldbrew.transport.inbound import Inbound

log = structlog.get_logger("coldbrew.broker")

PUBLISH_ERRORS: tuple[type[Exception], ...] = (
    # Exchange.publish on a channel already known to be closed (an outage, or
    # a channel the broker closed): aiormq's ChannelInvalidStateError, raised
    # by aio-pika's Exchange.publish and by aiormq's basic_publish lock. It is
    # a RuntimeError, and the only one a publish raises: the catch-all
    # RuntimeError that stood here caught nothing else.
    aiormq.exceptions.ChannelInvalidStateError,
    # A publish in flight when it failed: the pending confirm is rejected with
    # the reason of the close, AMQPConnectionError / ConnectionClosed (socket
    # errors arrive converted by aiormq's frame reader) or ChannelClosed (404
    # exchange gone, 406 message too large); DeliveryError on a basic.nack
    # (a reject-publish queue full). All AMQPError.
    aiormq.exceptions.AMQPError,
    # No confirm within publish_timeout (aiormq's basic_publish timeout).
    TimeoutError,
)
"""What a publish raises when RabbitMQ did not take the message."""


def job_message(job: JobFields) -> aio_pika.Message:
    """What goes on the wire for one job, per the producer contract (DESIGN §3)."""
    headers = message_headers(  # what parse_envelope reads back (model.py)
        idempotency_key=job.idempotency_key,
        max_attempts=job.max_attempts,
        timeout=job.timeout,
        traceparent=job.traceparent,
        tracestate=job.tracestate,
        previous_span=job.previous_span,
    )
    return aio_pika.Message(
        message_body(job.type, job.args),
        message_id=job.id,
        priority=job.priority,
        headers=headers,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


def copy_of(message: Inbound | AbstractIncomingMessage) -> aio_pika.Message:
    """A delivery (ours, or aio-pika's from a queue being emptied) as a new persistent
    message, properties and headers kept (to publish it again)."""
    return aio_pika.Message(
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


class Publisher:
    """Publishes on the confirming channel's exchanges, each publish awaiting its confirm."""

    def __init__(self, exchanges: Exchanges, topology: Topology, *, timeout: float) -> None:
        self._exchanges = exchanges
        self._topology = topology
        self._timeout = timeout

    async def publish_job(self, job: JobFields) -> None:
        """Publish one job and wait for the broker's confirm (quorum: to its priority's band,
        with the banded routing key; a ``coldbrew publish`` span, in the job's trace, when
        tracing is on)."""
        jobs = self._exchanges.jobs
        key = self._topology.routing_key(job.queue, job.tenant, job.priority)
        with tracing.job_span("coldbrew publish", job, kind="producer", destination=jobs.name):
            await self._publish(jobs, job_message(job), key)

    async def publish_jobs(self, jobs: Sequence[JobFields], *, window: int) -> list[bool]:
        """Publish many with confirms pipelined (``window`` in flight); True where confirmed."""
        limit = asyncio.Semaphore(window)

        async def one(job: JobFields) -> bool:
            async with limit:
                try:
                    await self.publish_job(job)
                except BrokerUnavailable as exc:
                    log.warning("publish_failed", job_id=job.id, error=str(exc))
                    return False
                return True

        return list(await asyncio.gather(*(one(job) for job in jobs)))

    async def republish(self, message: Inbound, routing_key: str | None = None) -> None:
        """Publish a delivery again to the jobs exchange, unchanged (after provisioning), with
        its own routing key or ``routing_key``."""
        key = message.routing_key or "" if routing_key is None else routing_key
        await self._publish(self._exchanges.jobs, copy_of(message), key)

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
        await self._publish(self._exchanges.dead, message, original_routing_key)

    async def _publish(
        self, exchange: AbstractRobustExchange, message: aio_pika.Message, key: str
    ) -> None:
        try:
            await exchange.publish(message, routing_key=key, mandatory=False, timeout=self._timeout)
        except PUBLISH_ERRORS as exc:
            raise BrokerUnavailable(
                f"publish to {exchange.name} failed: {exc or type(exc).__name__}"
            ) from exc
