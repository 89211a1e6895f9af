"""Dramatiq's side: a no-op actor and a ping actor on a RabbitMQ broker, no result backend.

Dramatiq acks a message after its actor returned (the worker thread hands it
back to the consumer thread, which acks), so it is late-acking as it comes.
Configured from the environment because the ``dramatiq`` CLI imports this
module by name: ``CBBENCH_AMQP_URL``, ``CBBENCH_QUEUE``, and for the latency
bench ``CBBENCH_UDP`` (``host:port`` the ping actor reports to). The prefetch
is Dramatiq's own ``dramatiq_queue_prefetch`` variable, set by the bench.
"""

from __future__ import annotations

import os
import socket
import time

import dramatiq
from bench.peer_apps import ackcount
from dramatiq.brokers.rabbitmq import RabbitmqBroker

QUEUE = os.environ.get("CBBENCH_QUEUE", "cbbench.dramatiq")

# Dramatiq's default middleware (age and time limits, retries, callbacks, pipelines,
# shutdown notifications), as a user gets it; no Results middleware, so no backend.
broker = RabbitmqBroker(url=os.environ.get("CBBENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1/"))
dramatiq.set_broker(broker)

ackcount.install("pika")

_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_udp.setblocking(False)
_host, _, _port = os.environ.get("CBBENCH_UDP", "127.0.0.1:9").rpartition(":")
_address = (_host, int(_port))


@dramatiq.actor(queue_name=QUEUE, actor_name="noop", max_retries=0)
def noop() -> None:
    """Does nothing: what is measured is Dramatiq's consume, dispatch and ack around it."""


@dramatiq.actor(queue_name=QUEUE, actor_name="ping", max_retries=0)
def ping(seq: int, sent: float) -> None:
    """Report "seq sent started" to the latency bench as soon as the actor runs."""
    started = time.clock_gettime(time.CLOCK_MONOTONIC)
    _udp.sendto(f"{seq} {sent!r} {started!r}".encode(), _address)
