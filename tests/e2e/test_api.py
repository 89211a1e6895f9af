"""`coldbrew api` as a user runs it: a subprocess, a real worker, HTTP over the wire."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from coldbrew.settings import Settings
from tests.e2e.test_cli import (
    ROOT,
    cli_env,
    one_line,
    run_cli,
    start_worker_process,
    stop_process,
    terminate,
)
from tests.helpers import free_port

KEY = "e2e-key-0123456789abcdef"


def tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


async def wait_listening(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    async with httpx.AsyncClient(base_url=base, timeout=2) as http:
        while True:
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if proc.poll() is not None or loop.time() > deadline:
                stop_process(proc)
                raise AssertionError(f"api not ready: {tail(log)}")
            await asyncio.sleep(0.05)


async def start_api(settings: Settings, key: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``coldbrew api --app tests.apps:app`` with ``key`` for tenant acme, once /readyz
    answers; returns the process and its base URL (output to ``log``)."""
    port = free_port()
    env = cli_env(settings, COLDBREW_API_KEYS=f"{key}:acme", COLDBREW_API_PORT=str(port))
    with log.open("wb") as out:
        api = subprocess.Popen(
            [sys.executable, "-m", "coldbrew", "api", "--app", "tests.apps:app"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    await wait_listening(base, api, log)
    return api, base


async def test_api_submits_and_long_polls_to_success(settings: Settings, tmp_path: Path) -> None:
    """A job submitted over HTTP to `coldbrew api` is run by a `coldbrew worker` and long-polled
    to succeeded; SIGTERM stops the API with exit 0."""
    log = tmp_path / "api.log"
    api, base = await start_api(settings, KEY, log)
    worker = None
    try:
        worker = await start_worker_process(settings, tmp_path / "worker.log")
        auth = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
            submitted = await http.post("/jobs", json={"type": "echo", "args": {"value": 42}})
            assert submitted.status_code == 202, submitted.text
            location = submitted.headers["location"]
            status, etag = submitted.json(), submitted.headers["etag"]
            for _ in range(20):
                if status["status"] == "succeeded":
                    break
                polled = await http.get(f"{location}?wait=20", headers={"If-None-Match": etag})
                assert polled.status_code == 200, polled.status_code
                status, etag = polled.json(), polled.headers["etag"]
            assert status["status"] == "succeeded"
            assert status["result"] == {"value": 42, "attempt": 1, "tenant": "acme"}
        api.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(api.wait, 30) == 0, tail(log)
        assert "Traceback" not in tail(log)
    finally:
        stop_process(api)
        if worker is not None:
            await terminate(worker)
            stop_process(worker.proc)


async def test_api_without_keys_refuses_to_start(settings: Settings) -> None:
    """`coldbrew api` with no keys and no opt-in exits 2 with one line naming the variable."""
    done = await run_cli(cli_env(settings, COLDBREW_API_PORT=str(free_port())), "api", limit=30)
    assert done.returncode == 2, done.stderr
    assert "COLDBREW_API_KEYS" in one_line(done.stderr)


async def test_sigterm_with_an_open_event_stream_exits_promptly(
    settings: Settings, tmp_path: Path
) -> None:
    """An event stream on a job that never finishes (no worker) does not hold SIGTERM off:
    the stream ends and `coldbrew api` exits 0 within seconds."""
    log = tmp_path / "api.log"
    api, base = await start_api(settings, KEY, log)
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=base, headers=auth, timeout=30) as http:
            submitted = await http.post("/jobs", json={"type": "echo", "args": {"value": 1}})
            assert submitted.status_code == 202, submitted.text
            async with http.stream("GET", f"{submitted.headers['location']}/events") as events:
                lines = events.aiter_lines()
                for _ in range(10):
                    if await anext(lines) == "event: status":
                        break
                started = asyncio.get_running_loop().time()
                api.send_signal(signal.SIGTERM)

                async def rest_of_stream() -> list[str]:
                    return [line async for line in lines]  # ends when the server ends it

                try:
                    rest = await asyncio.wait_for(rest_of_stream(), 15)
                except TimeoutError:
                    raise AssertionError("SIGTERM did not end the event stream") from None
        assert await asyncio.to_thread(api.wait, 30) == 0, tail(log)
        assert asyncio.get_running_loop().time() - started < 10, rest
        assert "Traceback" not in tail(log)
    finally:
        stop_process(api)
