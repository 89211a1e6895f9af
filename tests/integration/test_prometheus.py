"""A real Prometheus (the Debian binary) scrapes a real worker under load, evaluates
deploy/prometheus/alerts.yml, and answers every alert's and dashboard panel's query.

Its own port, configuration and data directory; scrape and rule interval 1 s. A
paused tenant's oldest job ages (coldbrew_oldest_job_age_seconds rises) while another
tenant's jobs run, and the age falls back to zero after the resume. Skipped, with the
reason, where the binary is absent; .ci/run installs it, so CI runs it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from coldbrew.api import ApiConfig, create_app
from coldbrew.api.auth import KeyRing
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import WorkerFactory, free_port, make_settings, wait_until
from tests.integration.test_cron import cli
from tests.promql_names import ALERTS, all_exprs, referenced_names, scraped_names

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="no prometheus binary (apt-get install prometheus; .ci/run installs it)",
    ),
    pytest.mark.timeout(180),
    # exclusive: a Prometheus, a worker under load and rising/falling gauges within bounds
    pytest.mark.exclusive,
]

# what Grafana substitutes before it sends a panel's query
GRAFANA_VARIABLES = {"$__rate_interval": "5s", "$queue": ".*", "$tenant": ".*"}

Query = Callable[[str], Awaitable[list[dict[str, Any]]]]


@asynccontextmanager
async def prometheus(tmp_path: Path, worker_port: int) -> AsyncIterator[httpx.AsyncClient]:
    """A Prometheus of our own scraping the worker every second, with alerts.yml loaded."""
    assert PROMETHEUS is not None
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "coldbrew-worker",
                "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}],
            }
        ],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await wait_until(lambda: _ready(http, process), timeout=30)
            yield http
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def _ready(http: httpx.AsyncClient, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"prometheus exited with {process.returncode} at start-up")
    try:
        return (await http.get("/-/ready")).status_code == 200
    except httpx.TransportError:
        return False


def querier(http: httpx.AsyncClient) -> Query:
    async def query(expr: str) -> list[dict[str, Any]]:
        response = await http.get("/api/v1/query", params={"query": expr})
        body = response.json()
        assert body["status"] == "success", f"{expr!r}: {body.get('error')}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    return query


async def scalar(query: Query, expr: str) -> float | None:
    result = await query(expr)
    return float(result[0]["value"][1]) if result else None


async def above(query: Query, expr: str, threshold: float) -> bool:
    value = await scalar(query, expr)
    return value is not None and value > threshold


async def test_prometheus_scrapes_a_worker_under_load_and_answers_every_query(
    start_worker: WorkerFactory,
    settings: Settings,
    test_app: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fast = make_settings(settings.namespace, stats_interval_seconds=0.5)
    worker = await start_worker(stats_interval_seconds=0.5)
    assert worker.metrics_port is not None
    async with (
        Client.connect(fast, app=test_app) as client,
        prometheus(tmp_path, worker.metrics_port) as http,
    ):
        query = querier(http)
        await wait_until(lambda: above(query, 'up{job="coldbrew-worker"}', 0.5), timeout=30)
        assert (await cli(capsys, fast, "tenants", "pause", "acme"))[0] == 0
        for _ in range(3):
            await client.submit("noop", {}, tenant="acme")
        load = asyncio.create_task(_load(client, seconds=4.0))
        oldest = 'max(coldbrew_oldest_job_age_seconds{tenant="acme"})'
        await wait_until(lambda: above(query, oldest, 1.0), timeout=30)
        first = await scalar(query, oldest)
        await asyncio.sleep(2.0)
        second = await scalar(query, oldest)
        assert first is not None
        assert second is not None
        assert second > first, "the paused tenant's oldest job ages"
        await _check_load_is_seen(query, worker.settings.concurrency)
        await _check_every_query(query, http)  # while one tenant waits and another runs
        await load
        await _check_plan_reads_prometheus(capsys, fast, str(http.base_url))
        assert (await cli(capsys, fast, "tenants", "resume", "acme"))[0] == 0
        # the tenant's row leaves the gauges once nothing of it waits: absent counts as 0
        await wait_until(lambda: _at_most(query, f"{oldest} or vector(0)", 0.5), timeout=30)
        await _check_rules_and_alerts(query, http)
        await _check_names(worker.metrics_port, client)


async def _load(client: Client, seconds: float) -> None:
    """Quick jobs for another tenant, a few every tenth of a second."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.gather(*(client.submit("noop", {}, tenant="globex") for _ in range(5)))
        await asyncio.sleep(0.1)


async def _at_most(query: Query, expr: str, limit: float) -> bool:
    value = await scalar(query, expr)
    return value is not None and value <= limit


async def _check_load_is_seen(query: Query, slots: int) -> None:
    """The load: throughput, busy slots and the fleet's slots, as the dashboard reads them."""
    throughput = 'sum(rate(coldbrew_jobs_finished_total{outcome="succeeded"}[5s]))'
    await wait_until(lambda: above(query, throughput, 1.0), timeout=20)
    assert await scalar(query, "sum(coldbrew_worker_slots)") == float(slots)
    utilisation = await scalar(query, "coldbrew:fleet_utilisation")
    assert utilisation is not None
    assert 0.0 <= utilisation <= 1.0
    depth = await scalar(query, 'coldbrew:lane_depth{queue="default"}')
    assert depth is not None
    assert depth >= 3, "the paused tenant's jobs are backlog"


async def _check_every_query(query: Query, http: httpx.AsyncClient) -> None:
    """Every alert and panel expression evaluates without error; the panels that must have
    data under load have it."""
    empty = []
    for where, expr in all_exprs():
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        if not await query(expr) and where.startswith("panel"):
            empty.append(where)
    for must in ("Throughput by outcome", "Backlog per lane and tenant", "Load L", "Utilisation"):
        assert not [w for w in empty if must in w], f"panels without data: {empty}"
    ranged = await http.get(
        "/api/v1/query_range",
        params={
            "query": "sum by (outcome) (rate(coldbrew_jobs_finished_total[5s]))",
            "start": time.time() - 20,
            "end": time.time(),
            "step": "1s",
        },
    )
    assert ranged.json()["status"] == "success"


async def _check_rules_and_alerts(query: Query, http: httpx.AsyncClient) -> None:
    """Prometheus loaded every rule, none errs; a healthy worker is up, ready, reachable."""
    groups = (await http.get("/api/v1/rules")).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == sum(len(g["rules"]) for g in yaml.safe_load(ALERTS.read_text())["groups"])
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] not in ("ok", "unknown")]
    assert bad == []
    for name in ("coldbrew_worker_ready", "coldbrew_database_up", "coldbrew_broker_up"):
        assert await scalar(query, name) == 1.0, name
    firing = await query('ALERTS{alertname=~"ColdbrewWorker.*|Coldbrew.*Unavailable"}')
    assert firing == []


async def _check_names(worker_port: int, client: Client) -> None:
    """Every metric alerts.yml and the dashboard name is in a real worker's or API's /metrics."""
    async with httpx.AsyncClient(timeout=10) as plain:
        worker_text = (await plain.get(f"http://127.0.0.1:{worker_port}/metrics")).text
    app = create_app(client, KeyRing({"key-0123456789abcdef": "acme"}), ApiConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
        api_text = (await api.get("/metrics")).text
    exported = scraped_names(worker_text) | scraped_names(api_text)
    assert "coldbrew_api_requests_total" in exported
    assert "coldbrew_pool_children_replaced_total" in exported
    missing = {
        name: where
        for name, where in referenced_names().items()
        if name.startswith("coldbrew_") and name not in exported
    }
    assert missing == {}


async def _check_plan_reads_prometheus(
    capsys: pytest.CaptureFixture[str], settings: Settings, url: str
) -> None:
    """`coldbrew plan --prometheus` takes λ and W from the counters this Prometheus holds."""
    code, out, err = await cli(
        capsys, settings, "plan", "--prometheus", url, "--window", "30s", "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["source"] == "prometheus"
    lane = next(row for row in result["lanes"] if row["queue"] == "default")
    assert lane["status"] == "ok", lane
    assert lane["arrival_rate"] > 1.0, "the load's jobs ended, a few dozen a second"
    assert 0 < lane["service_mean_seconds"] < 1.0, "noop jobs take milliseconds"
    assert lane["slots"] > 0
    code, _, err = await cli(
        capsys, settings, "plan", "--prometheus", url + "/nothing-here", "--window", "30s"
    )
    assert code == 2
    assert "--prometheus" in err
