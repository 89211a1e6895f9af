"""Failover across several broker URLs and PostgreSQL hosts (issue #14), on the real services.

A "node" here is a TCP proxy this test owns (tests/failover_proxy.py) in
front of the real RabbitMQ or PostgreSQL, listed first; the real port is
listed second. Cutting the proxy is a node failure that only this test's
connections see: the worker must move to the next URL, declare its topology
and consume there again, and every job submitted before and after the cut
must succeed. The services themselves are never stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from coldbrew.client import Client
from coldbrew.errors import BrokerUnavailable
from coldbrew.metrics import Metrics
from coldbrew.settings import Settings
from coldbrew.store import JobStore
from coldbrew.topology import Topology
from coldbrew.transport import Broker
from coldbrew.transport.connection import BrokerConnection, start_index
from coldbrew.worker.reaper import Reaper
from tests.failover_proxy import TcpProxy, closed_port, readyz
from tests.helpers import AMQP_URL, DATABASE_URL, WorkerFactory, make_settings, wait_until

AMQP = urlsplit(AMQP_URL)
PG = urlsplit(DATABASE_URL)


def amqp_url_at(port: int) -> str:
    """``AMQP_URL`` with its port replaced (the host stays: the proxy is local too)."""
    user, at, _ = AMQP.netloc.rpartition("@")
    return AMQP._replace(netloc=f"{user}{at}127.0.0.1:{port}").geturl()


def first_key(count: int, index: int = 0, prefix: str = "failover") -> str:
    """A spread key (worker id) whose process starts at URL ``index`` of ``count``."""
    n = 0
    while start_index(f"{prefix}-{n}", count) != index:
        n += 1
    return f"{prefix}-{n}"


@pytest.fixture
async def amqp_proxy() -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy(AMQP.hostname or "127.0.0.1", AMQP.port or 5672).start()
    yield proxy
    await proxy.close()


@pytest.fixture
async def pg_proxy() -> AsyncIterator[TcpProxy]:
    proxy = await TcpProxy(PG.hostname or "127.0.0.1", PG.port or 5432).start()
    yield proxy
    await proxy.close()


async def test_dead_first_url_connects_to_the_next(namespace: str) -> None:
    """A list whose first URL is a closed port: the broker connects to the second."""
    dead = amqp_url_at(closed_port())
    broker = Broker(
        f"{dead},{AMQP_URL}", Topology(namespace), spread_key=first_key(2), reconnect_interval=0.3
    )
    await broker.connect()
    try:
        assert broker.connected
        assert broker.node == AMQP_URL.replace(":guest@", ":***@")
    finally:
        await broker.close()


async def test_every_url_dead_is_one_clear_error(namespace: str) -> None:
    """No URL answers: ``BrokerUnavailable`` names each (masked), not a raw aiormq error."""
    urls = [amqp_url_at(closed_port()), amqp_url_at(closed_port())]
    broker = Broker(",".join(urls), Topology(namespace), spread_key=first_key(2))
    with pytest.raises(BrokerUnavailable) as caught:
        await broker.connect()
    text = str(caught.value)
    assert all(url.replace(":guest@", ":***@") in text for url in urls), text
    assert "guest:guest" not in text


def _say_nothing(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    """A hung broker: the socket is accepted, no byte ever comes back."""


async def test_a_silent_node_is_given_up_after_the_connect_timeout() -> None:
    """Nodes that accept the socket and never answer (hung): each attempt ends at the connect
    timeout and the next URL is tried; none answering is ``BrokerUnavailable`` naming both."""
    silent = []
    for _ in range(2):
        silent.append(await asyncio.start_server(_say_nothing, "127.0.0.1", 0))
    urls = [amqp_url_at(server.sockets[0].getsockname()[1]) for server in silent]
    connection = BrokerConnection(",".join(urls), spread_key=first_key(2), connect_timeout=0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    error = await _open_error(connection)
    took = loop.time() - started
    for server in silent:
        server.close()
    assert took < 5
    assert all(url.replace(":guest@", ":***@") in error for url in urls), error


async def _open_error(connection: BrokerConnection) -> str:
    """The ``BrokerUnavailable`` message of ``connection.open()``."""
    with pytest.raises(BrokerUnavailable) as caught:
        await connection.open()
    return str(caught.value)


async def test_worker_fails_over_to_the_next_broker(
    settings: Settings, start_worker: WorkerFactory, client: Client, amqp_proxy: TcpProxy
) -> None:
    """Cut the node a worker consumes from: it moves to the next URL, declares and consumes
    there again, and jobs submitted before and after the cut all succeed; /readyz names
    the node before and after."""
    urls = f"{amqp_url_at(amqp_proxy.port)},{AMQP_URL}"
    worker = await start_worker(amqp_url=urls, worker_id=first_key(2, 0, settings.namespace))
    assert worker.metrics_port is not None
    status, body = await readyz(worker.metrics_port)
    assert status == 200, body
    assert body["broker"] == amqp_url_at(amqp_proxy.port).replace(":guest@", ":***@")
    assert body["database"]

    before = [await client.submit("echo", {"value": i}) for i in range(5)]
    for job in before:
        assert (await client.wait(job.id, timeout=30)).status == "succeeded"
    during = [await client.submit("sleep_for", {"seconds": 1.5}) for _ in range(3)]
    await asyncio.sleep(0.3)  # the sleepers are claimed through the proxy
    await amqp_proxy.cut()

    async def moved() -> bool:
        code, now = await readyz(worker.metrics_port or 0)
        return code == 200 and now["broker"] == AMQP_URL.replace(":guest@", ":***@")

    await wait_until(moved, timeout=30, interval=0.2)
    after = [await client.submit("echo", {"value": i}) for i in range(5)]
    for job in [*during, *after]:
        assert (await client.wait(job.id, timeout=60)).status == "succeeded", job.id


async def test_processes_spread_over_the_urls(namespace: str) -> None:
    """Two processes with different keys start at different URLs of the same list."""
    urls = [AMQP_URL, AMQP_URL.replace("127.0.0.1", "localhost")]
    nodes = set()
    for index in range(2):
        broker = Broker(",".join(urls), Topology(namespace), spread_key=first_key(2, index))
        await broker.connect()
        try:
            nodes.add(broker.node)
        finally:
            await broker.close()
    assert len(nodes) == 2


async def test_database_host_list_skips_a_dead_host(settings: Settings) -> None:
    """A multi-host URL whose first host refuses: the client reads and writes on the next."""
    dead = closed_port()
    url = PG._replace(netloc=f"127.0.0.1:{dead},{PG.netloc}").geturl()
    url += ("&" if PG.query else "?") + "target_session_attrs=read-write"
    multi = make_settings(settings.namespace, database_url=url)
    async with Client.connect(multi, broker=False) as client:
        node = await client.store.ping()
        assert node.endswith(f":{PG.port or 5432}")


async def test_worker_follows_the_database_to_the_next_host(
    settings: Settings, start_worker: WorkerFactory, client: Client, pg_proxy: TcpProxy
) -> None:
    """Cut the PostgreSQL "host" a worker is on: it reconnects to the next host of the list,
    re-takes its liveness lock there, holds its reaper for a lease, and keeps running jobs."""
    url = PG._replace(netloc=f"127.0.0.1:{pg_proxy.port},{PG.netloc}").geturl()
    url += ("&" if PG.query else "?") + "target_session_attrs=read-write"
    # a lease long enough that the hold it starts is still on when /readyz shows the move
    worker = await start_worker(database_url=url, lease_seconds=30.0)
    assert worker.metrics_port is not None
    _, body = await readyz(worker.metrics_port)
    assert body["database"] == f"127.0.0.1:{pg_proxy.port}"
    holder_before = await lock_holder(settings.namespace, worker.settings.worker_id)
    assert holder_before is not None
    first = await client.submit("echo", {"value": 1})
    assert (await client.wait(first.id, timeout=30)).status == "succeeded"

    await pg_proxy.cut()
    second = await client.submit("echo", {"value": 2})
    assert (await client.wait(second.id, timeout=60)).status == "succeeded"

    async def moved() -> bool:
        code, now = await readyz(worker.metrics_port or 0)
        return code == 200 and now["database"].endswith(f":{PG.port or 5432}")

    await wait_until(moved, timeout=30, interval=0.2)
    assert worker.parts.reaper.holding, "the reaper reaps nothing for a lease after the outage"

    async def relocked() -> bool:
        holder = await lock_holder(settings.namespace, worker.settings.worker_id)
        return holder is not None and holder != holder_before

    await wait_until(relocked, timeout=15, interval=0.2)


async def lock_holder(namespace: str, worker_id: str) -> int | None:
    """The server pid of the session holding the worker's liveness lock (on the real host)."""
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        pid: int | None = await conn.fetchval(
            "SELECT l.pid FROM pg_locks AS l WHERE l.locktype = 'advisory' AND l.granted"
            " AND l.objsubid = 1 AND (l.classid::int8 << 32) | l.objid::int8"
            " = hashtextextended($1 || ':worker:' || $2, 0)",
            namespace,
            worker_id,
        )
        return pid
    finally:
        await conn.close()


async def test_a_promotion_counts_as_a_server_start(settings: Settings) -> None:
    """A timeline after one already recorded (a promoted standby: same data, new timeline)
    is a server start: server_started() moves to when coldbrew first met it, so expired
    leases are neither reaped nor claimed for a lease, as after a restart."""
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:
        fresh = await conn.fetchval("SELECT server_started() = pg_postmaster_start_time()")
        assert fresh, "a fresh schema's first timeline is no promotion"
        async with JobStore.open(DATABASE_URL, settings.namespace, pool_size=2) as store:
            _, started = await store.liveness.server_clock()  # records the current timeline
            assert started == await conn.fetchval("SELECT pg_postmaster_start_time()")
            # the timeline before this one was recorded: the server we talk to now is the
            # standby promoted after it (timeline 0 stands for it: this server is on 1 or more)
            await conn.execute("INSERT INTO server_epochs VALUES (0, now() - interval '1 day')")
            await conn.execute("DELETE FROM server_epochs WHERE timeline > 0")
            before = await conn.fetchval("SELECT now()")
            now, started = await store.liveness.server_clock()
            assert started >= before, "a promotion met just now is a server start just now"
            assert await conn.fetchval("SELECT count(*) FROM server_epochs") == 2
            await conn.execute(
                "INSERT INTO jobs (id, type, queue, tenant, args, max_attempts, status, attempt,"
                " started_at, lease_expires_at, worker_id) VALUES ('p1', 'echo', 'default',"
                " 'default', '{}', 5, 'running', 1, now(), now() - interval '1 minute', 'w')"
            )
            assert await store.leases.reap_expired(lease_seconds=settings.lease_seconds) == []
            reaper = Reaper(
                store,
                None,  # type: ignore[arg-type]  # nothing is settled while it holds
                Metrics(CollectorRegistry()),
                interval=0.5,
                lease_seconds=settings.lease_seconds,
            )
            assert await reaper.reap_expired() == 0
            # once the promotion is a lease old, the expired lease is reaped as usual
            await conn.execute(
                "UPDATE server_epochs SET first_seen = now() - interval '1 hour' WHERE timeline > 0"
            )
            reaped = await store.leases.reap_expired(lease_seconds=settings.lease_seconds)
            assert [row["id"] for row in reaped] == ["p1"]
    finally:
        await conn.close()
