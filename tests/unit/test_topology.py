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


# --- quorum mode: priority bands (COLDBREW_QUEUE_TYPE=quorum) ---------------------------


@pytest.mark.parametrize(
    ("bands", "ranges"),
    [
        (1, [(0, 9)]),
        (2, [(0, 4), (5, 9)]),
        (3, [(0, 3), (4, 6), (7, 9)]),
        (4, [(0, 2), (3, 5), (6, 7), (8, 9)]),
        (10, [(p, p) for p in range(10)]),
    ],
)
def test_bands_split_the_ten_priorities(bands: int, ranges: list[tuple[int, int]]) -> None:
    """Contiguous, covering 0..9, the lowest bands taking the remainder."""
    topo = Topology("ns", "quorum", bands)
    assert topo.band_ranges() == ranges
    for band, (low, high) in enumerate(ranges):
        assert {topo.band_of(p) for p in range(low, high + 1)} == {band}
    assert topo.band_of(-3) == 0
    assert topo.band_of(42) == bands - 1


def test_quorum_names_differ_from_classic_and_parse_back() -> None:
    """A queue's type cannot change: quorum queues have names of their own, which the
    reconciler maps back to their (lane, tenant) like classic ones."""
    classic, quorum = Topology("ns"), Topology("ns", "quorum", 3)
    assert quorum.job_queues("slow", "acme") == [
        "ns.qq.slow.acme.p7-9",
        "ns.qq.slow.acme.p4-6",
        "ns.qq.slow.acme.p0-3",
    ]
    assert classic.job_queues("slow", "acme") == ["ns.q.slow.acme"]
    assert (quorum.unrouted_queue, quorum.dead_queue) == ("ns.qq.unrouted", "ns.qq.dead")
    assert not set(quorum.every_queue_name([])) - {
        "ns.unrouted",
        "ns.dead",
        "ns.qq.unrouted",
        "ns.qq.dead",
    }
    for name in quorum.job_queues("slow", "acme") + classic.job_queues("slow", "acme"):
        assert classic.job_queue_pair(name) == ("slow", "acme")
        assert quorum.job_queue_pair(name) == ("slow", "acme")
    for name in ["ns.qq.unrouted", "ns.qq.dead", "ns.qq.slow.acme", "ns.qq.slow.acme.x1-2"]:
        assert quorum.job_queue_pair(name) is None, name


def test_quorum_bindings_route_every_key_to_one_band() -> None:
    """Each banded key reaches exactly its priority's band; the plain key (a raw producer
    naming no band) reaches the lowest band; classic keeps the one plain binding."""
    topo = Topology("ns", "quorum", 3)
    bindings = topo.job_queue_bindings("default", "t")
    keys = [key for _, key in bindings]
    assert len(keys) == len(set(keys)) == 11
    routed = dict((key, queue) for queue, key in bindings)
    assert routed["default.t"] == "ns.qq.default.t.p0-3"
    for priority in range(10):
        band = topo.band_of(priority)
        assert routed[f"default.t.{priority}"] == topo.band_queue("default", "t", band)
        assert topo.routing_key("default", "t", priority) == f"default.t.{priority}"
    assert Topology("ns").job_queue_bindings("default", "t") == [("ns.q.default.t", "default.t")]
    assert Topology("ns").routing_key("default", "t", 7) == "default.t"


def test_banded_routing_keys_name_the_same_pair() -> None:
    """``<lane>.<tenant>.<digit>`` parses as (lane, tenant); anything else with a dot in the
    tenant is still refused."""
    assert model.split_routing_key("default.acme.7") == ("default", "acme")
    assert model.split_routing_key("default.acme") == ("default", "acme")
    for bad in ["default.acme.77", "default.acme.x", "default.acme.", "default.a.b.1"]:
        with pytest.raises(model.ContractViolation):
            model.split_routing_key(bad)


def test_quorum_arguments_never_drop_a_message() -> None:
    """Quorum queues: a delivery limit, and dead-lettering at least once to <ns>.dlx (which
    needs reject-publish); the dead queue (no target: a cycle) a limit nothing reaches;
    no x-max-priority (refused by quorum queues)."""
    topo = Topology("ns", "quorum")
    for arguments in (topo.job_queue_arguments(), topo.unrouted_queue_arguments()):
        assert arguments == {
            "x-queue-type": "quorum",
            "x-delivery-limit": 1000,
            "x-dead-letter-exchange": "ns.dlx",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
    assert topo.dead_queue_arguments() == {"x-queue-type": "quorum", "x-delivery-limit": 1_000_000}


def test_a_bad_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="queue type"):
        Topology("ns", "stream")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bands"):
        Topology("ns", "quorum", 11)
