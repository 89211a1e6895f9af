"""Webhooks: a job submitted over the API and run by a real worker is announced, signed, retried."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from coldbrew.api import ApiConfig, create_app
from coldbrew.api.auth import KeyRing
from coldbrew.api.webhooks import SIGNATURE_HEADER, WebhookDispatcher, verify
from coldbrew.client import Client
from tests.helpers import WorkerFactory, wait_until

KEY = "hook-key-0123456789"
SECRET = "hook-secret-0123456789"


class Receiver:
    """A webhook endpoint that fails its first ``fail`` calls with 503, then accepts."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.calls: list[tuple[int, dict[str, str], bytes]] = []
        self.app = Starlette(routes=[Route("/hook", self.hook, methods=["POST"])])

    async def hook(self, request: Request) -> Response:
        status = 503 if len(self.calls) < self.fail else 204
        self.calls.append((status, dict(request.headers), await request.body()))
        return Response(status_code=status)


async def test_finished_job_is_announced_with_retries(
    client: Client, start_worker: WorkerFactory
) -> None:
    """The webhook for a succeeded job is retried after 503s and arrives signed and complete."""
    receiver = Receiver(fail=2)
    hooks = httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver.app))
    dispatcher = WebhookDispatcher(
        "http://receiver/hook", SECRET, poll_interval=0.05, retry_base=0.05, http=hooks
    )
    app = create_app(client, KeyRing({KEY: "acme"}), ApiConfig(), on_submitted=dispatcher.track)
    running = asyncio.create_task(dispatcher.run(client))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://api"
        ) as http:
            submitted = await http.post(
                "/jobs",
                json={"type": "echo", "args": {"value": "hi"}},
                headers={"Authorization": f"Bearer {KEY}"},
            )
            assert submitted.status_code == 202
            assert dispatcher.pending == 1
            await start_worker()

            async def delivered() -> bool:
                return any(status == 204 for status, _, _ in receiver.calls)

            await wait_until(delivered, timeout=20)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    assert [status for status, _, _ in receiver.calls] == [503, 503, 204]
    _, headers, body = receiver.calls[-1]
    assert verify(SECRET, headers[SIGNATURE_HEADER.lower()], body, now=time.time())
    assert not verify(
        "wrong-secret-0123456789", headers[SIGNATURE_HEADER.lower()], body, now=time.time()
    )
    event: dict[str, Any] = httpx.Response(200, content=body).json()
    assert event["event"] == "job.finished"
    assert event["job"]["id"] == submitted.json()["id"]
    assert event["job"]["status"] == "succeeded"
    assert event["job"]["result"]["value"] == "hi"
    assert dispatcher.pending == 0


async def test_refused_webhook_is_not_retried(client: Client) -> None:
    """A 4xx answer (other than 408/429) ends the delivery after one attempt."""
    calls: list[int] = []

    async def refuse(request: Request) -> Response:
        calls.append(1)
        return Response(status_code=410)

    hooks = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=Starlette(routes=[Route("/h", refuse, methods=["POST"])]))
    )
    dispatcher = WebhookDispatcher("http://receiver/h", SECRET, retry_base=0.01, http=hooks)
    record = await client.submit("echo", {})
    async with hooks:
        assert await dispatcher.deliver(hooks, record) is False
    assert calls == [1]
