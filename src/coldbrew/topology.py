"""Names and arguments of every exchange and queue, derived from the namespace.

Pure functions, so ``rabbitmq/definitions.json`` can be checked against them
and the broker module only declares what this module names.

Two queue layouts (``COLDBREW_QUEUE_TYPE``):

- **classic** (the default): one priority queue per (lane, tenant),
  ``<ns>.q.<lane>.<tenant>`` with ``x-max-priority`` 9, bound with ``<lane>.<tenant>``;
  ``<ns>.unrouted`` and ``<ns>.dead``.
- **quorum**: RabbitMQ 3.x quorum queues ignore message priorities (4.0 has two
  levels, 4.3 has 32), so each (lane, tenant) gets ``COLDBREW_PRIORITY_BANDS``
  FIFO queues, one per band of priorities, ``<ns>.qq.<lane>.<tenant>.p<lo>-<hi>``
  (3 bands: ``p0-3``, ``p4-6``, ``p7-9``), consumed together so the worker's
  scheduler sees every band's head. A band queue is bound with the banded
  routing key ``<lane>.<tenant>.<priority>`` of each priority it holds, and
  the lowest band also with the plain ``<lane>.<tenant>`` (a raw producer that
  names no band). ``<ns>.qq.unrouted`` and ``<ns>.qq.dead``. A queue's type
  cannot change, hence other names; they also let both layouts live side by
  side during a switch (``coldbrew queues migrate``).

Quorum queues carry a delivery limit and dead-letter at least once to
``<ns>.dlx`` (so ``<ns>.qq.dead``), so the broker never drops a message
silently (RabbitMQ 4.0 defaults the limit to 20 and drops what passes it when no
dead-letter target exists, rabbitmq-server#11937).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

MAX_PRIORITY = 9
PRIORITY_LEVELS = MAX_PRIORITY + 1

QueueType = Literal["classic", "quorum"]

DELIVERY_LIMIT = 1000
"""Returns a quorum queue accepts per message before it dead-letters it (to ``<ns>.dlx``).

A delivery is acked once its claim is durable, so every attempt is a message
of its own (the relay publishes retries afresh) and coldbrew's attempt budget
never touches this count. What counts is a message handed back unclaimed: a
drain, a delivery held past ``hold_limit``, a worker lost before its claim,
``<ns>.unrouted``'s requeue while PostgreSQL is away (about one a second per
consuming worker). 1000 is far above what happens in operation and still
ends a loop of crashes before the claim (a bug, not a job) within hours.
RabbitMQ 3.10 reads -1 and 0 literally, so "no limit" is written as a number.
"""

DEAD_DELIVERY_LIMIT = 1_000_000
"""The dead queue's limit: it has no dead-letter target of its own (a cycle), so what passes
its limit would be dropped; a number that nothing reaches (RabbitMQ 4.0's default is 20)."""

_BAND_QUEUE_RE = re.compile(r"p(\d)-(\d)")


@dataclass(frozen=True, slots=True)
class Topology:
    """The broker entities of one namespace."""

    namespace: str
    queue_type: QueueType = "classic"
    bands: int = 3
    """Priority bands per (lane, tenant) in quorum mode (1-10); unused for classic."""

    def __post_init__(self) -> None:
        if self.queue_type not in ("classic", "quorum"):
            raise ValueError(f"queue type must be classic or quorum, not {self.queue_type!r}")
        if not 1 <= self.bands <= PRIORITY_LEVELS:
            raise ValueError(f"priority bands must be 1..{PRIORITY_LEVELS}, not {self.bands}")

    @property
    def quorum(self) -> bool:
        return self.queue_type == "quorum"

    def other(self, queue_type: QueueType, bands: int | None = None) -> Topology:
        """The same namespace in another layout (a switch's source or target)."""
        return Topology(self.namespace, queue_type, self.bands if bands is None else bands)

    @property
    def jobs_exchange(self) -> str:
        """Topic exchange producers publish to, with routing key ``<queue>.<tenant>``."""
        return f"{self.namespace}.jobs"

    @property
    def unrouted_exchange(self) -> str:
        """Alternate exchange of the jobs exchange: catches jobs for tenants with no queue yet."""
        return f"{self.namespace}.unrouted"

    @property
    def unrouted_queue(self) -> str:
        return f"{self.namespace}.qq.unrouted" if self.quorum else f"{self.namespace}.unrouted"

    @property
    def dead_exchange(self) -> str:
        """Dead-letter exchange: a copy of every dead job and rejected message goes here."""
        return f"{self.namespace}.dlx"

    @property
    def dead_queue(self) -> str:
        return f"{self.namespace}.qq.dead" if self.quorum else f"{self.namespace}.dead"

    def job_queue(self, queue: str, tenant: str) -> str:
        """The classic durable queue of one lane and tenant (``job_queues`` for either mode)."""
        return f"{self.namespace}.q.{queue}.{tenant}"

    # --- priority bands (quorum) -------------------------------------------------------

    def band_ranges(self) -> list[tuple[int, int]]:
        """The bands' priority ranges, lowest first: 10 levels split as evenly as they go,
        the lowest bands taking the remainder (3 bands: 0-3, 4-6, 7-9; 2: 0-4, 5-9, the
        split RabbitMQ 4.0's two quorum priorities make)."""
        size, extra = divmod(PRIORITY_LEVELS, self.bands)
        ranges: list[tuple[int, int]] = []
        low = 0
        for band in range(self.bands):
            high = low + size + (1 if band < extra else 0) - 1
            ranges.append((low, high))
            low = high + 1
        return ranges

    def band_of(self, priority: int) -> int:
        """The band (0 = lowest) a priority belongs to; out of range is clamped."""
        priority = min(max(priority, 0), MAX_PRIORITY)
        for band, (low, high) in enumerate(self.band_ranges()):
            if low <= priority <= high:
                return band
        raise AssertionError("the bands cover 0..9")  # pragma: no cover

    def band_queue(self, queue: str, tenant: str, band: int) -> str:
        """The quorum queue of one band of one lane and tenant."""
        low, high = self.band_ranges()[band]
        return f"{self.namespace}.qq.{queue}.{tenant}.p{low}-{high}"

    def job_queues(self, queue: str, tenant: str) -> list[str]:
        """Every queue of one lane and tenant in this layout (quorum: highest band first)."""
        if not self.quorum:
            return [self.job_queue(queue, tenant)]
        return [self.band_queue(queue, tenant, band) for band in reversed(range(self.bands))]

    def job_queue_bindings(self, queue: str, tenant: str) -> list[tuple[str, str]]:
        """(queue name, routing key) of every binding of one lane and tenant on the jobs
        exchange: classic, the plain key; quorum, each band its priorities' banded keys and
        the lowest band the plain key too (raw producers that name no band)."""
        plain = f"{queue}.{tenant}"
        if not self.quorum:
            return [(self.job_queue(queue, tenant), plain)]
        bindings = [(self.band_queue(queue, tenant, 0), plain)]
        for priority in range(PRIORITY_LEVELS):
            name = self.band_queue(queue, tenant, self.band_of(priority))
            bindings.append((name, f"{plain}.{priority}"))
        return bindings

    def routing_key(self, queue: str, tenant: str, priority: int | None) -> str:
        """The key coldbrew publishes a job with: ``<lane>.<tenant>`` (classic, or no
        priority), else the banded ``<lane>.<tenant>.<priority>`` (quorum)."""
        if not self.quorum or priority is None:
            return f"{queue}.{tenant}"
        return f"{queue}.{tenant}.{min(max(priority, 0), MAX_PRIORITY)}"

    def job_queue_pair(self, name: str) -> tuple[str, str] | None:
        """The (lane, tenant) of a job queue name of this namespace (classic, or a quorum
        band queue of any band layout), else None."""
        classic, quorum = f"{self.namespace}.q.", f"{self.namespace}.qq."
        if name.startswith(classic):
            rest = name[len(classic) :]
        elif name.startswith(quorum):
            rest, dot, band = name[len(quorum) :].rpartition(".")
            if not (dot and _BAND_QUEUE_RE.fullmatch(band)):
                return None
        else:
            return None
        queue, dot, tenant = rest.partition(".")
        if not (queue and dot and tenant) or "." in tenant:
            return None
        return queue, tenant

    @property
    def tenant_channel(self) -> str:
        """PostgreSQL NOTIFY channel that announces a newly provisioned tenant queue."""
        return f"{self.namespace}.tenants"

    @property
    def caps_channel(self) -> str:
        """PostgreSQL NOTIFY channel naming capped scopes that freed a place.

        ``complete_batch`` builds the same name in SQL (``current_schema() || '.caps'``;
        the namespace is the schema).
        """
        return f"{self.namespace}.caps"

    @property
    def relay_channel(self) -> str:
        """PostgreSQL NOTIFY channel that wakes the relays: a row became due in a
        transaction that just committed (a submission in the caller's transaction, child
        jobs, a chain's next step; SQL builds it as ``current_schema() || '.relay'``)."""
        return f"{self.namespace}.relay"

    def every_queue_name(self, pairs: list[tuple[str, str]]) -> list[str]:
        """Every queue of this namespace in either layout (with ``bands`` bands) for the given
        (lane, tenant) pairs: what a clean-up deletes (a missing queue deletes as a no-op)."""
        classic, quorum = self.other("classic"), self.other("quorum")
        names = [classic.unrouted_queue, classic.dead_queue]
        names += [quorum.unrouted_queue, quorum.dead_queue]
        for lane, tenant in pairs:
            names += classic.job_queues(lane, tenant) + quorum.job_queues(lane, tenant)
        return names

    def jobs_exchange_arguments(self) -> dict[str, Any]:
        return {"alternate-exchange": self.unrouted_exchange}

    def job_queue_arguments(self) -> dict[str, Any]:
        if self.quorum:
            return self._quorum_dead_lettered()
        return {
            "x-queue-type": "classic",
            "x-max-priority": MAX_PRIORITY,
            "x-dead-letter-exchange": self.dead_exchange,
        }

    def unrouted_queue_arguments(self) -> dict[str, Any]:
        if self.quorum:
            return self._quorum_dead_lettered()
        return {"x-queue-type": "classic", "x-dead-letter-exchange": self.dead_exchange}

    def dead_queue_arguments(self) -> dict[str, Any]:
        if self.quorum:
            return {"x-queue-type": "quorum", "x-delivery-limit": DEAD_DELIVERY_LIMIT}
        return {"x-queue-type": "classic"}

    def _quorum_dead_lettered(self) -> dict[str, Any]:
        """A quorum queue that dead-letters at least once: the strategy needs
        ``x-overflow=reject-publish`` (with ``drop-head`` it falls back to at-most-once)."""
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": DELIVERY_LIMIT,
            "x-dead-letter-exchange": self.dead_exchange,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
