"""Celery's side: one no-op task, late acks, no result backend, prefetch like the others.

Configured from the environment because ``celery -A bench.peer_apps.celery_app
worker`` imports this module by name: ``CBBENCH_AMQP_URL``, ``CBBENCH_QUEUE``
(the run's own queue, exchange and routing key), ``CBBENCH_PREFETCH`` (the
per-worker prefetch; the multiplier is derived from it and
``CBBENCH_CONCURRENCY``, Celery's pool size).
"""

from __future__ import annotations

import os

from bench.peer_apps import ackcount
from celery import Celery

QUEUE = os.environ.get("CBBENCH_QUEUE", "cbbench.celery")
PREFETCH = int(os.environ.get("CBBENCH_PREFETCH", "100"))
CONCURRENCY = int(os.environ.get("CBBENCH_CONCURRENCY", "1"))

app = Celery("cbbench", broker=os.environ.get("CBBENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1//"))
app.conf.update(
    # late acks: the message is acked after the task ran (documented as task_acks_late)
    task_acks_late=True,
    # Celery's prefetch is multiplier x pool size; keep the total at PREFETCH
    worker_prefetch_multiplier=max(1, PREFETCH // CONCURRENCY),
    task_ignore_result=True,
    result_backend=None,
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    task_serializer="json",
    accept_content=["json"],
    # no task events and no remote-control (pidbox) queues; the worker heartbeat stays on
    # (Celery's default), on an event exchange of the run's own
    worker_send_task_events=False,
    task_send_sent_event=False,
    worker_enable_remote_control=False,
    event_exchange=f"{QUEUE}.events",
    broker_connection_retry_on_startup=True,
    worker_cancel_long_running_tasks_on_connection_loss=True,
    worker_hijack_root_logger=False,
)

ackcount.install("amqp")


@app.task(name="noop")  # type: ignore[untyped-decorator]
def noop() -> None:
    """Does nothing: what is measured is Celery's consume, dispatch and ack around it."""
