"""Broker names and queue arguments derived from the namespace."""

from __future__ import annotations

import dataclasses
import re

import pytest

from coldbrew import model
from coldbrew.settings import NAME_PATTERN, NAMESPACE_PATTERN
from coldbrew.topology import MAX_PRIORITY, Topology


@pytest.mark.parametrize("namespace", ["coldbrew", "staging", "cbt_ab12cd_7"])
def test_names_are_derived_from_the_namespace(namespace: str) -> None:
    """Every exchange, queue and NOTIFY channel is ``<namespace>.<role>``."""
    topo = Topology(namespace)
    assert topo.jobs_exchange == f"{namespace}.jobs"
    assert topo.unrouted_exchange == f"{namespace}.unrouted"
    assert topo.unrouted_queue == f"{namespace}.unrouted"
    assert topo.dead_exchange == f"{namespace}.dlx"
    assert topo.dead_queue == f"{namespace}.dead"
    assert topo.tenant_channel == f"{namespace}.tenants"
    assert topo.job_queue("slow", "acme") == f"{namespace}.q.slow.acme"


def test_two_namespaces_share_no_name() -> None:
    """Environments on one broker never collide: no name of one is a name of the other."""

    def names(topo: Topology) -> set[str]:
        return {
            topo.jobs_exchange,
            topo.unrouted_exchange,
            topo.unrouted_queue,
            topo.dead_exchange,
            topo.dead_queue,
            topo.tenant_channel,
            topo.job_queue("default", "default"),
        }

    assert not names(Topology("prod")) & names(Topology("staging"))


def test_job_queue_name_ends_with_the_routing_key() -> None:
    """A tenant queue's name carries the routing key it is bound with."""
    topo = Topology("coldbrew")
    assert topo.job_queue("fast", "acme").endswith("." + model.routing_key("fast", "acme"))


def test_job_queue_arguments_have_priorities_and_the_dlx() -> None:
    """Job queues are classic, with x-max-priority 9 and the namespace's dead-letter exchange."""
    topo = Topology("coldbrew")
    arguments = topo.job_queue_arguments()
    assert arguments["x-max-priority"] == 9
    assert arguments["x-max-priority"] == MAX_PRIORITY == model.MAX_PRIORITY
    assert arguments["x-dead-letter-exchange"] == "coldbrew.dlx"
    assert arguments["x-queue-type"] == "classic"


def test_jobs_exchange_falls_back_to_the_unrouted_exchange() -> None:
    """The jobs exchange's alternate exchange catches jobs for tenants without a queue."""
    topo = Topology("ns")
    assert topo.jobs_exchange_arguments() == {"alternate-exchange": "ns.unrouted"}


def test_unrouted_and_dead_queue_arguments() -> None:
    """The unrouted queue dead-letters to the DLX; the dead queue has no DLX (no cycle)."""
    topo = Topology("ns")
    assert topo.unrouted_queue_arguments() == {
        "x-queue-type": "classic",
        "x-dead-letter-exchange": "ns.dlx",
    }
    assert topo.dead_queue_arguments() == {"x-queue-type": "classic"}


def test_arguments_are_fresh_copies() -> None:
    """Callers may change a returned dict without changing what the next caller gets."""
    topo = Topology("ns")
    topo.job_queue_arguments()["x-max-priority"] = 1
    assert topo.job_queue_arguments()["x-max-priority"] == MAX_PRIORITY


def test_topology_is_immutable() -> None:
    """A Topology cannot be re-pointed at another namespace after creation."""
    topo = Topology("ns")
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.namespace = "other"  # type: ignore[misc]


def test_longest_names_fit_amqp_limits() -> None:
    """The longest namespace, lane and tenant still give a queue name within AMQP's 255 bytes."""
    namespace, name = "n" * 48, "x" * 64
    assert re.fullmatch(NAMESPACE_PATTERN, namespace)
    assert not re.fullmatch(NAMESPACE_PATTERN, namespace + "n")
    assert re.fullmatch(NAME_PATTERN, name)
    assert not re.fullmatch(NAME_PATTERN, name + "x")
    assert len(Topology(namespace).job_queue(name, name).encode()) <= 255
