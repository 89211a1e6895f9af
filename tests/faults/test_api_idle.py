"""`coldbrew api` under idle and slow clients: 200 silent connections and 20 slowloris.

Each silent connection must be closed by the server, and each slowloris (a
header line every 2 s, the head never finished) answered 408 and closed,
within the header timeout plus slack of its opening; meanwhile `GET /healthz`
and `POST /jobs`, over a kept-alive connection and over new ones, keep
answering promptly. The process's open descriptors come back down afterwards:
the connections are gone on the server's side, not only on ours. Traffic goes
only to 127.0.0.1; nothing is stopped or restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from coldbrew.settings import Settings
from tests.e2e.test_api import start_api, tail
from tests.e2e.test_cli import stop_process
from tests.faults.test_api_faults import our_errors
from tests.helpers import make_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

KEY = "idle-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
HEADER_TIMEOUT = 5.0
DRIP_EVERY = 2.0  # a slowloris line every 2 s: two lines land before the deadline
SLACK = 2.0  # seconds a close may come after its deadline on a busy 2-core machine
SILENT, SLOWLORIS = 200, 20
NORMAL_LATENCY_LIMIT = 2.0  # seconds; a normal request is answered well within this


@dataclass
class Closed:
    """How one hostile connection ended."""

    seconds: float  # from its opening to the server's close
    answer: bytes  # what the server sent before closing


@dataclass
class Normal:
    """What the well-behaved client saw while the hostile ones were open."""

    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def saw(self, status: int, seconds: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.latencies.append(seconds)


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def descriptors_reaching(pid: int, wanted: Callable[[int], bool]) -> int:
    """The process's open descriptors once ``wanted`` holds, or after 3 s (the caller checks)."""
    count = open_descriptors(pid)
    for _ in range(60):
        if wanted(count):
            break
        await asyncio.sleep(0.05)
        count = open_descriptors(pid)
    return count


async def until_closed(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, opened: float
) -> Closed:
    try:
        answer = await asyncio.wait_for(reader.read(), HEADER_TIMEOUT + SLACK + 5)
    except TimeoutError:
        answer = b"<still open>"
        seconds = float("inf")
    else:
        seconds = time.monotonic() - opened
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return Closed(seconds, answer)


async def silent(port: int) -> Closed:
    """Connect and send nothing."""
    opened = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return await until_closed(reader, writer, opened)


async def slowloris(port: int) -> Closed:
    """Send a request head one line every DRIP_EVERY seconds, never ending it."""
    opened = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def drip() -> None:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for number in range(20):  # 40 s at most: far past the deadline
            await asyncio.sleep(DRIP_EVERY)
            if writer.is_closing() or reader.at_eof():
                return
            writer.write(f"X-Drip-{number}: {'x' * 20}\r\n".encode())

    dripping = asyncio.create_task(drip())
    try:
        return await until_closed(reader, writer, opened)
    finally:
        dripping.cancel()
        await asyncio.gather(dripping, return_exceptions=True)


async def normal_traffic(base: str, stop: asyncio.Event, seen: Normal) -> None:
    """GET /healthz and POST /jobs in turn, on a kept-alive connection and on new ones."""
    kept = httpx.AsyncClient(base_url=base, headers=AUTH, timeout=10)
    fresh = httpx.AsyncClient(
        base_url=base,
        headers=AUTH,
        timeout=10,
        limits=httpx.Limits(max_keepalive_connections=0),
    )
    async with kept, fresh:
        for number in range(2000):  # bounded; ends at `stop` long before
            if stop.is_set():
                return
            http = kept if number % 2 else fresh
            started = time.monotonic()
            try:
                if number % 4 < 2:
                    response = await http.get("/healthz")
                else:
                    job = {"type": "echo", "args": {"value": number}}
                    response = await http.post("/jobs", json=job)
            except httpx.TransportError as exc:
                seen.errors.append(repr(exc))
            else:
                seen.saw(response.status_code, time.monotonic() - started)
            await asyncio.sleep(0.05)


def figures(closed: list[Closed]) -> str:
    seconds = sorted(c.seconds for c in closed)
    return f"min={seconds[0]:.2f}s median={statistics.median(seconds):.2f}s max={seconds[-1]:.2f}s"


async def test_idle_and_slowloris_connections_are_closed_while_normal_requests_answer(
    settings: Settings, tmp_path: Path
) -> None:
    limited = make_settings(
        settings.namespace,
        api_header_timeout_seconds=HEADER_TIMEOUT,
        api_body_timeout_seconds=HEADER_TIMEOUT,
        api_keepalive_seconds=30,  # the normal client's kept-alive connection stays up
    )
    log = tmp_path / "api.log"
    api, base = await start_api(limited, KEY, log)
    try:
        port = int(base.rsplit(":", 1)[1])
        descriptors_before = open_descriptors(api.pid)
        stop, seen = asyncio.Event(), Normal()
        load = asyncio.create_task(normal_traffic(base, stop, seen))
        started = time.monotonic()
        hostile = [asyncio.create_task(silent(port)) for _ in range(SILENT)]
        hostile += [asyncio.create_task(slowloris(port)) for _ in range(SLOWLORIS)]
        descriptors_peak = await descriptors_reaching(
            api.pid, lambda n: n >= descriptors_before + SILENT + SLOWLORIS
        )
        closed = await asyncio.gather(*hostile)
        flood_seconds = time.monotonic() - started
        await asyncio.sleep(1.0)  # normal traffic goes on a moment after the flood
        stop.set()
        await load
        descriptors_after = await descriptors_reaching(
            api.pid, lambda n: n <= descriptors_before + 5
        )

        silents, slows = closed[:SILENT], closed[SILENT:]
        print(
            f"[fault:api-idle] header_timeout={HEADER_TIMEOUT:g}s "
            f"silent={SILENT} closed {figures(silents)}; "
            f"slowloris={SLOWLORIS} closed {figures(slows)}; flood_s={flood_seconds:.1f}; "
            f"normal requests={len(seen.latencies)} statuses={seen.statuses} "
            f"errors={len(seen.errors)} latency median="
            f"{statistics.median(seen.latencies) * 1000:.1f}ms "
            f"max={max(seen.latencies) * 1000:.1f}ms; "
            f"server fds before={descriptors_before} peak={descriptors_peak} "
            f"after={descriptors_after}"
        )
        deadline = HEADER_TIMEOUT + SLACK
        assert all(c.seconds <= deadline for c in closed), [c.seconds for c in closed][-30:]
        assert all(c.seconds >= HEADER_TIMEOUT - 0.1 for c in closed), figures(closed)
        assert all(c.answer == b"" for c in silents)  # nothing sent, nothing answered
        for c in slows:
            assert c.answer.startswith(b"HTTP/1.1 408 "), c.answer[:200]
            assert b'"kind":"header_timeout"' in c.answer
        assert not seen.errors, seen.errors[:3]
        assert set(seen.statuses) <= {200, 202}, seen.statuses
        assert seen.statuses.get(200, 0) >= 20 and seen.statuses.get(202, 0) >= 20
        assert max(seen.latencies) < NORMAL_LATENCY_LIMIT, max(seen.latencies)
        assert descriptors_peak >= descriptors_before + SILENT + SLOWLORIS
        assert descriptors_after <= descriptors_before + 5
        api.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(api.wait, 30) == 0, tail(log)
        assert not our_errors(log), our_errors(log)[:3]
    finally:
        stop_process(api)
