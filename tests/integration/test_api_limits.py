"""The API's read timeouts and caps on a real socket: uvicorn in process, real PostgreSQL.

The server here is the one ``coldbrew api`` runs (``api.server.http_server``
with ``api.protocol``), bound to 127.0.0.1 on a free port; the clients are raw
TCP sockets (to send nothing, or a head line by line) and httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from structlog.testing import capture_logs

from coldbrew.api import ApiConfig, create_app
from coldbrew.api.app import stop_waiting
from coldbrew.api.auth import KeyRing
from coldbrew.api.limits import ConnectionLimits
from coldbrew.api.server import http_server, listen
from coldbrew.client import Client

KEY = "limits-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
SLACK = 1.5  # seconds a close may come after its deadline on a busy 2-core machine


@dataclass(frozen=True)
class Served:
    base: str
    port: int
    app: Starlette

    async def wait_for_waiters(self, count: int) -> None:
        """Until ``count`` long polls or streams hold a slot (at most 5 s): no fixed sleep."""
        for _ in range(100):
            if self.app.state.api.waiters.busy == count:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{count} waiters never held their slots")


@asynccontextmanager
async def serving(
    client: Client, limits: ConnectionLimits | None = None, **config: Any
) -> AsyncIterator[Served]:
    """The API on 127.0.0.1:<free port> until the block ends (then shut down, bounded)."""
    app = create_app(client, KeyRing({KEY: "acme"}), ApiConfig(**config))
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = http_server(app, limits or ConnectionLimits())
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(200):  # at most 10 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.05)
        assert server.started, "the server did not start"
        yield Served(f"http://127.0.0.1:{port}", port, app)
    finally:
        stop_waiting(app)  # what `coldbrew api` does at SIGTERM
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except TimeoutError:
            server.force_exit = True
            await asyncio.wait_for(task, 10)
        sock.close()


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def read_until_closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sends until it closes; fails if it has not closed ``within`` s."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open past {within} s") from None


async def queued_jobs(client: Client) -> int:
    return sum(lane.queued for lane in await client.store.stats.queue_stats())


def parse(raw: bytes) -> tuple[int, dict[str, str], Any]:
    """Status, headers (lower-case names) and JSON body of one raw HTTP/1.1 response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, json.loads(body) if body else None


# --- read timeouts ------------------------------------------------------------------


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(
    client: Client,
) -> None:
    """No bytes at all: closed (without an answer) once the header timeout has passed."""
    async with serving(client, ConnectionLimits(header_timeout_seconds=0.5)) as api:
        started = time.monotonic()
        reader, writer = await connect(api.port)
        assert await read_until_closed(reader, 0.5 + SLACK) == b""
        assert time.monotonic() - started >= 0.45
        await close(writer)


async def test_a_slowloris_head_is_answered_408_at_the_deadline_however_it_dribbles(
    client: Client,
) -> None:
    """A header line every 0.3 s does not extend the 1 s deadline: 408 header_timeout, closed."""
    async with serving(client, ConnectionLimits(header_timeout_seconds=1.0)) as api:
        started = time.monotonic()
        reader, writer = await connect(api.port)
        sent = 0

        async def dribble() -> None:
            nonlocal sent
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: api\r\n")
            for number in range(20):  # 6 s at most, far past the deadline
                await asyncio.sleep(0.3)
                if writer.is_closing():
                    return
                writer.write(f"X-Drip-{number}: 1\r\n".encode())
                sent += 1

        dripping = asyncio.create_task(dribble())
        try:
            raw = await read_until_closed(reader, 1.0 + SLACK)
        finally:
            dripping.cancel()
            await asyncio.gather(dripping, return_exceptions=True)
        elapsed = time.monotonic() - started
        status, headers, body = parse(raw)
        assert status == 408
        assert headers["connection"] == "close"
        assert body["error"]["kind"] == "header_timeout"
        assert "COLDBREW_API_HEADER_TIMEOUT_SECONDS" in body["error"]["message"]
        assert sent >= 2, "the client kept sending lines before the deadline"
        assert 0.95 <= elapsed <= 1.0 + SLACK
        await close(writer)


async def test_a_slow_body_is_answered_408_and_logged_as_no_error(client: Client) -> None:
    """POST /jobs whose body stops halfway: 408 body_timeout, no job, no error in the log;
    the server goes on answering."""
    async with serving(client, ConnectionLimits(body_timeout_seconds=0.5)) as api:
        body = json.dumps({"type": "echo", "args": {"value": 1}}).encode()
        reader, writer = await connect(api.port)
        with capture_logs() as logs:
            writer.write(
                b"POST /jobs HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body[:10]
            )
            raw = await read_until_closed(reader, 0.5 + SLACK)
            await close(writer)
            async with httpx.AsyncClient(base_url=api.base, timeout=5) as http:
                assert (await http.get("/healthz")).status_code == 200
        status, headers, error = parse(raw)
        assert status == 408
        assert headers["connection"] == "close"
        assert error["error"]["kind"] == "body_timeout"
        assert not [e for e in logs if e["log_level"] in {"error", "critical"}], logs
        assert await queued_jobs(client) == 0


async def test_an_idle_keep_alive_connection_is_closed_after_keepalive_seconds(
    client: Client,
) -> None:
    """After its answer, a kept-alive connection that sends nothing more is closed."""
    limits = ConnectionLimits(header_timeout_seconds=30, keepalive_seconds=1)
    async with serving(client, limits) as api:
        reader, writer = await connect(api.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")
        started = time.monotonic()
        raw = await read_until_closed(reader, 1 + SLACK)
        assert parse(raw)[0] == 200
        assert time.monotonic() - started >= 0.9
        await close(writer)


async def test_a_request_after_a_keep_alive_pause_gets_the_whole_header_timeout(
    client: Client,
) -> None:
    """A second request on the connection is served; its head deadline starts at its first
    byte, and a second slow head on the same connection is cut like the first."""
    limits = ConnectionLimits(header_timeout_seconds=1.0, keepalive_seconds=5)
    async with serving(client, limits) as api:
        reader, writer = await connect(api.port)
        for _ in range(2):  # two full requests, 0.7 s apart: together past one head deadline
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            await asyncio.wait_for(reader.readexactly(len(b'{"status":"ok"}')), 5)
            await asyncio.sleep(0.7)
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # then a head that never ends
        started = time.monotonic()
        status, _, body = parse(await read_until_closed(reader, 1.0 + SLACK))
        assert (status, body["error"]["kind"]) == (408, "header_timeout")
        assert time.monotonic() - started >= 0.95
        await close(writer)


# --- the connection cap -------------------------------------------------------------


async def test_past_max_connections_a_request_gets_503_with_retry_after(client: Client) -> None:
    """Three admitted connections (one httpx keep-alive, two idle sockets): a fourth gets 503
    too_many_connections with Retry-After and the JSON body, while the admitted httpx
    connection goes on being served; once one leaves, new connections are served again."""
    limits = ConnectionLimits(header_timeout_seconds=30, keepalive_seconds=30, max_connections=3)
    async with (
        serving(client, limits) as api,
        httpx.AsyncClient(base_url=api.base, headers=AUTH, timeout=5) as admitted,
    ):
        assert (await admitted.get("/healthz")).status_code == 200  # its connection stays open
        idle = [await connect(api.port) for _ in range(2)]
        await asyncio.sleep(0.2)  # let the server accept them
        limits_http = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=api.base, headers=AUTH, timeout=5, limits=limits_http
        ) as newcomer:
            for response in (
                await newcomer.get("/healthz"),
                await newcomer.post("/jobs", json={"type": "echo", "args": {"value": 1}}),
            ):
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "5"
                assert response.headers["connection"] == "close"
                error = response.json()["error"]
                assert error["kind"] == "too_many_connections"
                assert "COLDBREW_API_MAX_CONNECTIONS" in error["message"]
            submitted = await admitted.post("/jobs", json={"type": "echo", "args": {"value": 2}})
            assert submitted.status_code == 202, submitted.text
            await close(idle.pop()[1])
            for _ in range(50):  # the server sees the close within a few loop turns
                response = await newcomer.get("/healthz")
                if response.status_code == 200:
                    break
                await asyncio.sleep(0.05)
            assert response.status_code == 200, response.text
        for _, writer in idle:
            await close(writer)
    assert await queued_jobs(client) == 1  # the admitted client's job, not the refused one


# --- the waiter cap -----------------------------------------------------------------


async def test_past_max_waiters_long_polls_and_streams_get_503(client: Client) -> None:
    """One waiter slot, held by a long poll: another long poll and an event stream get 503
    too_many_waiters with Retry-After; a plain read is still served; once the long poll
    answers, the slot is free again."""
    async with (
        serving(client, max_waiters=1, max_wait_seconds=10) as api,
        httpx.AsyncClient(base_url=api.base, headers=AUTH, timeout=15) as http,
    ):
        submitted = await http.post("/jobs", json={"type": "echo", "args": {"value": 1}})
        job, etag = submitted.headers["location"], submitted.headers["etag"]  # stays queued
        unchanged = {"If-None-Match": etag}
        holder = asyncio.create_task(http.get(f"{job}?wait=4", headers=unchanged))
        await api.wait_for_waiters(1)
        refused = await http.get(f"{job}?wait=2", headers=unchanged)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["kind"] == "too_many_waiters"
        assert "COLDBREW_API_MAX_WAITERS" in refused.json()["error"]["message"]
        stream = await http.get(f"{job}/events")
        assert stream.status_code == 503
        assert stream.headers["content-type"].startswith("application/json")
        assert stream.json()["error"]["kind"] == "too_many_waiters"
        plain = await http.get(job)  # no wait: no slot needed
        assert plain.status_code == 200
        held = await holder
        assert held.status_code == 304  # the holder waited its 4 s: it was not cut short
        again = await http.get(f"{job}?wait=0.2", headers=unchanged)
        assert again.status_code == 304


async def test_an_event_stream_gives_its_slot_back_when_the_client_leaves(client: Client) -> None:
    """With one slot, a stream the client closes frees it for the next waiter."""
    async with (
        serving(client, max_waiters=1, max_wait_seconds=10, sse_keepalive_seconds=0.2) as api,
        httpx.AsyncClient(base_url=api.base, headers=AUTH, timeout=10) as http,
    ):
        submitted = await http.post("/jobs", json={"type": "echo", "args": {"value": 1}})
        job, etag = submitted.headers["location"], submitted.headers["etag"]
        async with http.stream("GET", f"{job}/events") as events:
            assert events.status_code == 200
            lines = events.aiter_lines()  # kept, not broken out of: that could close the stream
            for _ in range(10):
                if await anext(lines) == "event: status":
                    break
            busy = await http.get(f"{job}?wait=0.05", headers={"If-None-Match": etag})
            assert busy.status_code == 503
        await api.wait_for_waiters(0)  # the stream notices at its next poll (at most 1 s)
        freed = await http.get(f"{job}?wait=0.05", headers={"If-None-Match": etag})
        assert freed.status_code == 304


async def test_at_shutdown_long_polls_answer_and_streams_end_at_once(client: Client) -> None:
    """stop_waiting (SIGTERM): a 30 s long poll answers 304 and an event stream ends, each
    within about a second, so that open waiters cannot hold the shutdown off."""
    async with (
        serving(client, max_wait_seconds=30) as api,
        httpx.AsyncClient(base_url=api.base, headers=AUTH, timeout=40) as http,
    ):
        submitted = await http.post("/jobs", json={"type": "echo", "args": {"value": 1}})
        job, etag = submitted.headers["location"], submitted.headers["etag"]

        async def stream() -> list[str]:
            async with http.stream("GET", f"{job}/events") as events:
                return [line async for line in events.aiter_lines()]

        polling = asyncio.create_task(http.get(f"{job}?wait=30", headers={"If-None-Match": etag}))
        streaming = asyncio.create_task(stream())
        await api.wait_for_waiters(2)
        started = time.monotonic()
        stop_waiting(api.app)
        polled, lines = await asyncio.wait_for(asyncio.gather(polling, streaming), 5)
        assert time.monotonic() - started < 2.5
        assert polled.status_code == 304
        assert "event: status" in lines  # the state it had, then the end of the stream
        await api.wait_for_waiters(0)
