"""The AMQP side of coldbrew: the connection, publishing, deliveries and their acks.

This is the package's face: the rest of coldbrew (worker/, client.py, api/,
cli.py, tests, bench/) imports these names from ``coldbrew.transport`` and
never from its modules, which may move. What each module owns:

- ``broker``: ``Broker``, the one object upper layers hold;
- ``connection``: the robust connection (fail fast, then reconnect) and its channels;
- ``declare``: the fixed exchanges and queues, and tenant queues;
- ``publish``: confirmed publishes (``job_message``), failures as ``BrokerUnavailable``;
- ``consume``: the tenant queues' consumers over a bounded set of channels;
- ``inbound``: ``Inbound``, one delivery, settled by ``ack()``, ``requeue()`` or ``reject()``;
- ``acks``: acks batched per channel (``ChannelAcks``);
- ``sweep``: the aging sweep's consumer (``Sweep``);
- ``switch``: retiring a queue of another layout (``coldbrew queues migrate``).

It decides nothing about a job: no PostgreSQL, no job status, no retry policy.
"""

from __future__ import annotations

from coldbrew.transport.acks import ChannelAcks
from coldbrew.transport.broker import Broker
from coldbrew.transport.inbound import Inbound, InboundHandler, OnDelivery, QueueCancels
from coldbrew.transport.inspect import QueueCounts
from coldbrew.transport.sweep import Sweep
from coldbrew.transport.switch import Retired

__all__ = [
    "Broker",
    "ChannelAcks",
    "Inbound",
    "InboundHandler",
    "OnDelivery",
    "QueueCancels",
    "QueueCounts",
    "Retired",
    "Sweep",
]
