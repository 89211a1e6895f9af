"""taskiq's side: a no-op task on taskiq-aio-pika's ``AioPikaBroker``, no result backend.

Late acks are the worker's ``--ack-type when_executed`` (the bench passes it):
the receiver acks right after the task function returned. The queue is
declared classic (taskiq-aio-pika's default is a quorum queue) so every side
drains the same kind of queue. Configured from the environment because
``taskiq worker`` imports this module by name: ``CBBENCH_AMQP_URL``,
``CBBENCH_QUEUE`` (the run's queue; the exchange and dead-letter queue are
named after it) and ``CBBENCH_PREFETCH`` (the channel's qos).
"""

from __future__ import annotations

import os

from bench.peer_apps import ackcount
from taskiq_aio_pika import AioPikaBroker
from taskiq_aio_pika.exchange import Exchange
from taskiq_aio_pika.queue import Queue, QueueType

QUEUE = os.environ.get("CBBENCH_QUEUE", "cbbench.taskiq")

broker = AioPikaBroker(
    url=os.environ.get("CBBENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1/"),
    qos=int(os.environ.get("CBBENCH_PREFETCH", "100")),
    exchange=Exchange(name=f"{QUEUE}.exchange"),
    task_queues=[Queue(name=QUEUE, type=QueueType.CLASSIC)],
    dead_letter_queue=Queue(name=f"{QUEUE}.dead", type=QueueType.CLASSIC),
)

ackcount.install("aiormq")


@broker.task(task_name="noop")
async def noop() -> None:
    """Does nothing: what is measured is taskiq's consume, dispatch and ack around it."""
