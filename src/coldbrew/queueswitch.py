"""Switching a namespace's queues between classic and quorum, or between band layouts.

``coldbrew queues migrate --to quorum|classic`` (cli/queues.py). A queue's
type cannot change, and the two layouts have names of their own
(topology.py), so the switch is: declare the target layout (the fixed queues,
and every recorded (lane, tenant)'s queues with their bindings), then retire
each queue of the source layout: unbind it, move its messages to the target
(a tenant queue's messages by their priority to the right band; the unrouted
queue's back to the jobs exchange with their own keys; the dead queue's to the
new dead queue), delete it. No job is lost: a message is moved with a confirm
before its ack, and PostgreSQL's rows stay the truth (the reconciler
republishes a waiting row whose message is in no queue).

It refuses (changing nothing) while a source queue still has consumers: a
worker of the old layout would re-declare a deleted queue it consumes. Roll
the workers to the new ``COLDBREW_QUEUE_TYPE`` first, then run it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coldbrew.errors import ConfigurationError
from coldbrew.store import JobStore
from coldbrew.topology import Topology
from coldbrew.transport import Broker, Retired


class SourceInUse(ConfigurationError):
    """A queue of the layout being retired still has consumers (workers of that layout)."""


@dataclass(slots=True)
class SwitchReport:
    """What one switch did."""

    source: str
    target: str
    pairs: int = 0
    retired: list[Retired] = field(default_factory=list)

    @property
    def moved(self) -> int:
        return sum(item.moved for item in self.retired)

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "target": self.target,
            "tenant_queues": self.pairs,
            "queues_retired": sum(1 for item in self.retired if item.deleted),
            "queues_left": [item.name for item in self.retired if not item.deleted],
            "messages_moved": self.moved,
            "messages_dropped": sum(item.dropped for item in self.retired),
            "moved_by_queue": {item.name: item.moved for item in self.retired if item.moved},
        }


def describe(topology: Topology) -> str:
    return f"quorum ({topology.bands} bands)" if topology.quorum else "classic"


async def switch_queues(
    store: JobStore, broker: Broker, source: Topology, *, force: bool = False
) -> SwitchReport:
    """Move the namespace from ``source``'s layout to the broker's (already connected, so its
    fixed queues are declared). Refuses with ``SourceInUse`` while any source queue has
    consumers, unless ``force``."""
    target = broker.topology
    if source == target:
        raise ConfigurationError(f"the queues are already {describe(target)}: nothing to switch")
    report = SwitchReport(describe(source), describe(target))
    pairs = await store.tenants.list_tenant_queues()
    report.pairs = len(pairs)
    job_queues = {name: pair for pair in pairs for name in source.job_queues(*pair)}
    fixed = [source.unrouted_queue, source.dead_queue]
    present: list[str] = []
    busy: list[str] = []
    kept = {target.unrouted_queue, target.dead_queue} | _target_names(target, pairs)
    for name in [*fixed, *job_queues]:
        if name in kept:
            continue  # in both layouts (quorum to quorum: a band of the same range)
        counts = await broker.queue_counts(name)
        if counts is None:
            continue
        present.append(name)
        if counts.consumers:
            busy.append(f"{name} ({counts.consumers})")
    if busy and not force:
        raise SourceInUse(
            f"{len(busy)} queue(s) of the {describe(source)} layout still have consumers: "
            f"{', '.join(busy[:5])}{' ...' if len(busy) > 5 else ''}; stop or restart those "
            f"workers with COLDBREW_QUEUE_TYPE={target.queue_type} first (or --force)"
        )
    for pair in pairs:  # the target first, so moved messages have somewhere to go
        await broker.declare_job_queue(*pair)
    for name in present:  # all unbound before any is emptied (switch.py)
        await broker.unbind_queue(name, _bindings(source, name, job_queues.get(name)))
    for name in present:
        report.retired.append(await _retire(broker, source, name, job_queues.get(name)))
    return report


def _target_names(target: Topology, pairs: list[tuple[str, str]]) -> set[str]:
    return {name for pair in pairs for name in target.job_queues(*pair)}


def _bindings(source: Topology, name: str, pair: tuple[str, str] | None) -> list[tuple[str, str]]:
    """(exchange, key) of every binding ``name`` has in the source layout."""
    if name == source.unrouted_queue:
        return [(source.unrouted_exchange, "#")]
    if name == source.dead_queue:
        return [(source.dead_exchange, "#")]
    if pair is None:
        raise AssertionError(f"{name} is neither fixed nor a tenant queue")  # pragma: no cover
    bindings = source.job_queue_bindings(*pair)
    return [(source.jobs_exchange, key) for queue, key in bindings if queue == name]


async def _retire(
    broker: Broker, source: Topology, name: str, pair: tuple[str, str] | None
) -> Retired:
    target = broker.topology
    if name == source.unrouted_queue:  # back through the jobs exchange: provisioned anew
        return await broker.retire_queue(
            name, move_to=target.jobs_exchange, key_for=lambda key, _priority: key or ""
        )
    if name == source.dead_queue:
        dead = target.dead_queue
        return await broker.retire_queue(name, move_to="", key_for=lambda _key, _p: dead)
    if pair is None:
        raise AssertionError(f"{name} is neither fixed nor a tenant queue")  # pragma: no cover
    lane, tenant = pair
    return await broker.retire_queue(
        name,
        move_to=target.jobs_exchange,
        key_for=lambda _key, priority: target.routing_key(lane, tenant, priority or 0),
    )
