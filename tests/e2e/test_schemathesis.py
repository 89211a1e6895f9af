"""schemathesis `--checks all` against a real `coldbrew api` process and a real worker.

The API is a subprocess on a free port with one API key (sent on every
request, so the routes past 401 are explored), without ``--app``: a submitted
job of any well-formed type is accepted, as the document says, and the worker
dead-letters the types it does not know. The run is bounded (examples per
operation and per phase in ``schemathesis.toml``, a fixed seed, no example
database) so it is the same run every time: about 560 cases in under a minute
on two cores. Every check is on (``checks.enabled`` in the file; its one
exception, use_after_free on the reads of a cancelled job, is held to those
operations by tests/unit/test_openapi.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coldbrew.settings import Settings
from tests.e2e.test_api import tail, wait_listening
from tests.e2e.test_cli import ROOT, cli_env, start_worker_process, stop_process, terminate
from tests.helpers import free_port

KEY = "schemathesis-key-0123456789"
SEED = 18  # issue #18
ST = Path(sys.executable).with_name("st")
CONFIG = Path(__file__).with_name("schemathesis.toml")

pytestmark = pytest.mark.timeout(240)


async def start_plain_api(settings: Settings, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``coldbrew api`` (no ``--app``) with ``KEY`` for tenant acme, once /readyz answers."""
    port = free_port()
    env = cli_env(
        settings,
        COLDBREW_API_KEYS=f"{KEY}:acme",
        COLDBREW_API_PORT=str(port),
        COLDBREW_API_MAX_WAIT_SECONDS="2",  # generated long polls end quickly
    )
    with log.open("wb") as out:
        api = subprocess.Popen(
            [sys.executable, "-m", "coldbrew", "api"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    await wait_listening(base, api, log)
    return api, base


def schemathesis(base: str, report: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(ST),
        "--config-file",
        str(CONFIG),
        "run",
        f"{base}/openapi.json",
        "--seed",
        str(SEED),
        "--generation-database",
        "none",
        "--header",
        f"Authorization: Bearer {KEY}",
        "--request-timeout",
        "10",
        "--workers",
        "1",  # hypothesis's lambda-source cache is not thread-safe (a Runtime Error at 2)
        "--no-color",
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
    ]
    return subprocess.run(
        command, cwd=report.parent, capture_output=True, text=True, timeout=200, check=False
    )


async def request_counts(base: str) -> dict[tuple[str, str, str], float]:
    """``coldbrew_api_requests_total`` of the API process, by (route, method, status)."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
        text = (await http.get("/metrics")).text
    return {
        (sample.labels["route"], sample.labels["method"], sample.labels["status"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "coldbrew_api_requests"
        for sample in family.samples
        if sample.name == "coldbrew_api_requests_total"
    }


async def test_schemathesis_finds_no_failure(settings: Settings, tmp_path: Path) -> None:
    """Every check of schemathesis passes on every operation of /openapi.json, and the
    run really exercised the API (routes past 401 answered, per the API's own metrics)."""
    api_log = tmp_path / "api.log"
    api, base = await start_plain_api(settings, api_log)
    worker = None
    try:
        worker = await start_worker_process(settings, tmp_path / "worker.log")
        result = await asyncio.to_thread(schemathesis, base, tmp_path / "junit.xml")
        output = result.stdout[-12000:] + result.stderr[-3000:]
        assert result.returncode == 0, f"{output}\n--- api log ---\n{tail(api_log)}"
        counts = await request_counts(base)
        # the key was used: accepted submissions, reads and cancels, not only 401s
        assert counts.get(("/jobs", "POST", "202"), 0) > 10, counts
        assert counts.get(("/jobs/{job_id}", "GET", "200"), 0) > 0, counts
        # cancels reached real jobs: cancelled (200) or already finished (409: the worker
        # refuses the generated job types at once, so most are failed before the DELETE)
        cancels = sum(counts.get(("/jobs/{job_id}", "DELETE", code), 0) for code in ("200", "409"))
        assert cancels > 0, counts
        assert sum(counts.values()) > 500, counts
        print(f"schemathesis: {sum(counts.values())} requests;", output[-400:])
    finally:
        api.terminate()
        try:
            await asyncio.to_thread(api.wait, 30)
        finally:
            stop_process(api)  # killed if SIGTERM did not end it
            if worker is not None:
                await terminate(worker)
