"""Durable webhooks: a delivery is a job, enqueued with the outcome, run by any worker.

A real receiver (an HTTP server on this machine's loopback, which the SSRF
guard allows only with COLDBREW_WEBHOOK_ALLOW_PRIVATE=true), real workers, the
real API app, a raw AMQP producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest

from coldbrew.api import ApiConfig, create_app
from coldbrew.api.auth import KeyRing
from coldbrew.app import App
from coldbrew.client import Client
from coldbrew.context import Context
from coldbrew.settings import Settings
from coldbrew.topology import Topology
from coldbrew.webhooks import SIGNATURE_HEADER, WEBHOOK_TYPE, verify
from coldbrew.worker import Worker
from tests.helpers import DATABASE_URL, make_settings, metric, publish_raw, status_is, wait_until

KEY = "hook-key-0123456789"
SECRET = "hook-secret-0123456789"


hooks_app = App()
"""Coroutine jobs only: a worker of it starts no process pool (seconds per test saved)."""


@hooks_app.job()
async def echo(ctx: Context, value: object = None) -> dict[str, object]:
    return {"value": value, "attempt": ctx.attempt}


@pytest.fixture
def test_app() -> App:
    return hooks_app


class Receiver:
    """A webhook endpoint on 127.0.0.1 (and ::1, same port): answers 503 to its first
    ``fail`` calls, then 204; ``on_call`` runs as each call arrives, before the answer."""

    def __init__(self, fail: int = 0, on_call: Callable[[int], None] | None = None) -> None:
        self.fail = fail
        self.on_call = on_call
        self.calls: list[tuple[int, dict[str, str], bytes]] = []
        self.port = 0
        self._servers: list[asyncio.base_events.Server] = []

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}/hook?from=coldbrew"

    @property
    def accepted(self) -> list[tuple[int, dict[str, str], bytes]]:
        return [call for call in self.calls if call[0] == 204]

    async def __aenter__(self) -> Receiver:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._servers.append(server)
        with contextlib.suppress(OSError):  # "localhost" may resolve to ::1 first
            self._servers.append(await asyncio.start_server(self._serve, "::1", self.port))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            status = 503 if len(self.calls) < self.fail else 204
            self.calls.append((status, headers, body))
            if self.on_call is not None:
                self.on_call(len(self.calls))
            reason = b"Service Unavailable" if status == 503 else b"No Content"
            writer.write(
                b"HTTP/1.1 %d %s\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                % (status, reason)
            )
            await writer.drain()
        finally:
            writer.close()


def hook_settings(namespace: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"webhook_secret": SECRET, "webhook_allow_private": True}
    values.update(overrides)
    return make_settings(namespace, **values)


@contextlib.asynccontextmanager
async def running(app: App, settings: Settings, worker_id: str) -> AsyncIterator[Worker]:
    """A worker for the block; stopped (drained) at its end."""
    worker = Worker(app, settings.model_copy(update={"worker_id": worker_id}))
    task = asyncio.create_task(worker.run())
    await worker.wait_ready(task)
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, timeout=30)


@contextlib.asynccontextmanager
async def sql(namespace: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": namespace})
    try:
        yield conn
    finally:
        await conn.close()


async def deliveries(client: Client, job_id: str) -> list[dict[str, Any]]:
    """The delivery jobs the trigger enqueued for ``job_id``."""
    async with sql(client.settings.namespace) as conn:
        rows = await conn.fetch(
            "SELECT id, status::text AS status, tenant, args::text AS args FROM jobs"
            " WHERE type = $1 AND args->'job'->>'id' = $2",
            WEBHOOK_TYPE,
            job_id,
        )
    return [dict(row, args=json.loads(row["args"])) for row in rows]


def event_of(body: bytes) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(body)
    return document


async def test_delivery_survives_api_and_worker_restarts(settings: Settings, test_app: App) -> None:
    """A receiver that fails twice then accepts gets exactly one accepted, validly signed
    delivery, though the API that took the job is gone and the worker that made the first
    attempt stopped after it."""
    config = hook_settings(settings.namespace)
    first_worker: list[Worker] = []
    async with Receiver(fail=2, on_call=lambda n: n == 1 and first_worker[0].stop()) as receiver:
        async with Client.connect(config, app=test_app) as api_client:  # the first API process
            api = create_app(api_client, KeyRing({KEY: "acme"}), ApiConfig())
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=api), base_url="http://api"
            ) as http:
                submitted = await http.post(
                    "/jobs",
                    json={"type": "echo", "args": {"value": "hi"}, "webhook_url": receiver.url},
                    headers={"Authorization": f"Bearer {KEY}"},
                )
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["id"]
        async with running(test_app, config, "hooks-1") as worker:
            first_worker.append(worker)  # stops itself as the first attempt arrives
            await wait_until(lambda: _has_calls(receiver, 1), timeout=30)
        assert len(receiver.calls) == 1
        async with Client.connect(config, app=test_app) as client:  # a second API process
            assert [d["status"] for d in await deliveries(client, job_id)] == ["retrying"]
            async with running(test_app, config, "hooks-2") as worker:
                await wait_until(lambda: _has_calls(receiver, 3), timeout=30)
                (delivery,) = await deliveries(client, job_id)
                await wait_until(lambda: status_is(client, delivery["id"], "succeeded"))
                assert metric(worker, "coldbrew_webhook_deliveries_total", outcome="retried") == 1
                assert metric(worker, "coldbrew_webhook_deliveries_total", outcome="delivered") == 1
            record = await client.get(delivery["id"])
    assert [status for status, _, _ in receiver.calls] == [503, 503, 204]
    assert len(receiver.accepted) == 1
    _, headers, body = receiver.accepted[0]
    assert verify(SECRET, headers[SIGNATURE_HEADER.lower()], body, now=time.time())
    assert not verify(
        "another-secret-0123456789", headers[SIGNATURE_HEADER.lower()], body, now=time.time()
    )
    assert headers["coldbrew-event"] == "job.finished"
    assert headers["coldbrew-delivery"] == job_id
    assert headers["coldbrew-webhook-id"] == delivery["id"]
    assert headers["host"] == f"localhost:{receiver.port}"
    event = event_of(body)
    assert event["event"] == "job.finished"
    assert event["job"]["id"] == job_id
    assert event["job"]["status"] == "succeeded"
    assert event["job"]["tenant"] == "acme"
    assert event["job"]["result"]["value"] == "hi"
    assert record.attempt == 3 and record.tenant == "acme"  # visible like any job


async def _has_calls(receiver: Receiver, count: int) -> bool:
    return len(receiver.calls) >= count


async def test_raw_producer_header_and_garbage_header(
    settings: Settings, test_app: App, amqp: aio_pika.abc.AbstractChannel
) -> None:
    """``x-webhook-url`` from a producer that uses no coldbrew code is delivered; a garbage
    value is rejected with reason invalid_webhook_url, and its job never runs."""
    config = hook_settings(settings.namespace)
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    body = json.dumps({"type": "echo", "args": {"value": "raw"}}).encode()
    async with Receiver() as receiver, Client.connect(config, app=test_app) as client:
        async with running(test_app, config, "hooks-raw") as worker:
            await publish_raw(
                amqp,
                settings.namespace,
                body,
                "default.default",
                message_id=good,
                headers={"x-webhook-url": receiver.url},
            )
            await publish_raw(
                amqp,
                settings.namespace,
                body,
                "default.default",
                message_id=bad,
                headers={"x-webhook-url": "javascript:alert(1)"},
            )
            await wait_until(lambda: _has_calls(receiver, 1))
            rejected = "coldbrew_rejected_messages_total"

            async def counted() -> bool:
                return metric(worker, rejected, reason="invalid_webhook_url") == 1

            await wait_until(counted)
        rows = await client.store.dead.list_rejected("invalid_webhook_url", 10)
        assert [row["message_id"] for row in rows] == [bad]
        assert "http:// or https://" in rows[0]["detail"]
        assert await status_is(client, good, "succeeded")
        assert not await status_is(client, bad, "succeeded")
    ((_, _, sent),) = receiver.calls
    assert event_of(sent)["job"]["id"] == good


async def test_tenant_setting_and_cancel(settings: Settings, test_app: App) -> None:
    """A tenant's webhook URL covers its jobs that name none; a cancelled job is announced
    too, once; a tenant without one gets no delivery job at all."""
    config = hook_settings(settings.namespace)
    channel = Topology(settings.namespace).tenant_channel
    async with Receiver() as receiver, Client.connect(config, app=test_app) as client:
        await client.store.tenants.set_tenant_webhook("globex", receiver.url, channel=channel)
        done = await client.submit("echo", {"value": 1}, tenant="globex")
        quiet = await client.submit("echo", {"value": 2}, tenant="initech")
        cancelled = await client.submit("echo", {}, tenant="globex", delay=3600)
        await client.cancel(cancelled.id, reason="changed my mind")
        await client.cancel(cancelled.id, reason="again")  # no second transition
        async with running(test_app, config, "hooks-tenant"):
            await wait_until(lambda: _has_calls(receiver, 2))
            await wait_until(lambda: status_is(client, quiet.id, "succeeded"))
        assert await deliveries(client, quiet.id) == []
        assert len(await deliveries(client, cancelled.id)) == 1
    announced = {
        event_of(body)["job"]["id"]: event_of(body)["job"] for _, _, body in receiver.calls
    }
    assert set(announced) == {done.id, cancelled.id}
    assert announced[cancelled.id]["status"] == "cancelled"
    assert announced[cancelled.id]["error"]["message"] == "changed my mind"


async def test_outcome_rolled_back_enqueues_nothing(client: Client) -> None:
    """The delivery job is written in the outcome's transaction: a rolled-back terminal
    update leaves none, a committed one exactly one (with a deterministic id)."""
    job = await client.submit("echo", {}, webhook_url="https://hooks.example.com/x", delay=3600)
    async with sql(client.settings.namespace) as conn:
        with contextlib.suppress(RuntimeError):
            async with conn.transaction():
                await conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = $1", job.id)
                enqueued = "SELECT count(*) FROM jobs WHERE type = $1"
                assert await conn.fetchval(enqueued, WEBHOOK_TYPE) == 1
                raise RuntimeError("roll back")
    assert await deliveries(client, job.id) == []
    await client.cancel(job.id)
    (delivery,) = await deliveries(client, job.id)
    assert (
        delivery["status"] == "queued" and delivery["args"]["url"] == "https://hooks.example.com/x"
    )
    assert delivery["args"]["job"]["status"] == "cancelled"


async def test_guard_refuses_a_name_that_resolves_to_loopback(
    settings: Settings, test_app: App
) -> None:
    """Without COLDBREW_WEBHOOK_ALLOW_PRIVATE, a URL whose host resolves to loopback is
    refused at delivery: the delivery job fails with the reason, nothing is sent."""
    config = hook_settings(settings.namespace, webhook_allow_private=False)
    async with Receiver() as receiver, Client.connect(config, app=test_app) as client:
        job = await client.submit("echo", {}, webhook_url=receiver.url)
        async with running(test_app, config, "hooks-guard") as worker:

            async def failed() -> bool:
                found = await deliveries(client, job.id)
                return bool(found) and found[0]["status"] == "failed"

            await wait_until(failed)
            assert metric(worker, "coldbrew_webhook_deliveries_total", outcome="blocked") == 1
        (delivery,) = await deliveries(client, job.id)
        record = await client.get(delivery["id"])
    assert record.error_message is not None and "loopback" in record.error_message
    assert receiver.calls == []


@pytest.mark.parametrize("address", ["127.0.0.1", "169.254.169.254", "10.0.0.1", "[::1]"])
async def test_submission_refuses_literal_private_addresses(client: Client, address: str) -> None:
    """Client.submit refuses a literal loopback, link-local or private address at once."""
    from coldbrew.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="refused") as caught:
        await client.submit("echo", {}, webhook_url=f"http://{address}/hook")
    assert caught.value.reason == "invalid_webhook_url"
