"""Names and arguments of every exchange and queue, derived from the namespace.

Pure functions, so ``rabbitmq/definitions.json`` can be checked against them
and the broker module only declares what this module names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_PRIORITY = 9


@dataclass(frozen=True, slots=True)
class Topology:
    """The broker entities of one namespace."""

    namespace: str

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
        return f"{self.namespace}.unrouted"

    @property
    def dead_exchange(self) -> str:
        """Dead-letter exchange: a copy of every dead job and rejected message goes here."""
        return f"{self.namespace}.dlx"

    @property
    def dead_queue(self) -> str:
        return f"{self.namespace}.dead"

    def job_queue(self, queue: str, tenant: str) -> str:
        """The durable queue of one lane and tenant."""
        return f"{self.namespace}.q.{queue}.{tenant}"

    def job_queue_pair(self, name: str) -> tuple[str, str] | None:
        """The (lane, tenant) of a ``job_queue`` name of this namespace, else None."""
        prefix = f"{self.namespace}.q."
        if not name.startswith(prefix):
            return None
        queue, dot, tenant = name[len(prefix) :].partition(".")
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

    def jobs_exchange_arguments(self) -> dict[str, Any]:
        return {"alternate-exchange": self.unrouted_exchange}

    def job_queue_arguments(self) -> dict[str, Any]:
        return {
            "x-queue-type": "classic",
            "x-max-priority": MAX_PRIORITY,
            "x-dead-letter-exchange": self.dead_exchange,
        }

    def unrouted_queue_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "classic", "x-dead-letter-exchange": self.dead_exchange}

    def dead_queue_arguments(self) -> dict[str, Any]:
        return {"x-queue-type": "classic"}
