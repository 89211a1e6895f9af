"""The per-lane layout of ``bench/quorum_layout.py`` routes every key coldbrew publishes to
the band the per-tenant layout would: the two sides of the bench carry the same messages."""

from __future__ import annotations

import pytest
from bench.quorum_layout import LANE, Layout

from coldbrew.topology import PRIORITY_LEVELS, Topology


def topic_match(pattern: str, key: str) -> bool:
    """AMQP topic matching for the patterns used here (``*`` is one word; no ``#``)."""
    words, parts = pattern.split("."), key.split(".")
    return len(words) == len(parts) and all(
        w in ("*", p) for w, p in zip(words, parts, strict=True)
    )


def routes(layout: Layout, key: str) -> set[str]:
    return {queue for queue, pattern in layout.bindings() if topic_match(pattern, key)}


@pytest.mark.parametrize("bands", [1, 2, 3, 10])
def test_per_lane_routes_each_key_to_the_same_band_as_per_tenant(bands: int) -> None:
    topo = Topology("ns", "quorum", bands)
    per_tenant = Layout("per-tenant", topo, tenants=3)
    per_lane = Layout("per-lane", topo, tenants=3)
    assert len(per_tenant.queues()) == 3 * bands
    assert len(per_lane.queues()) == bands
    for tenant in ("t0", "t2"):
        keys = [f"{LANE}.{tenant}"] + [f"{LANE}.{tenant}.{p}" for p in range(PRIORITY_LEVELS)]
        for key in keys:
            (tenant_queue,) = routes(per_tenant, key)
            (lane_queue,) = routes(per_lane, key)
            band = tenant_queue.rsplit(".", 1)[1]
            assert lane_queue == f"ns.qq.{LANE}.{band}", key
            assert tenant_queue == f"ns.qq.{LANE}.{tenant}.{band}", key
