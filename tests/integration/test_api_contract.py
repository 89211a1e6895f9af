"""The API's HTTP contract in process: 405 with the full Allow, JSON 404s, /metrics by route."""

from __future__ import annotations

import asyncio
import platform
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from coldbrew.api import ApiConfig, create_app
from coldbrew.api.app import ROUTES, PathRoute
from coldbrew.api.auth import KeyRing
from coldbrew.client import Client
from coldbrew.metrics import ApiMetrics, coldbrew_version

KEY = "contract-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}

ALLOW = {
    "/jobs": "POST",
    "/jobs/{job_id}": "GET, HEAD, DELETE",
    "/jobs/{job_id}/events": "GET, HEAD",
    "/batches/{batch_id}": "GET, HEAD",
    "/healthz": "GET, HEAD",
    "/readyz": "GET, HEAD",
    "/metrics": "GET, HEAD",
    "/openapi.json": "GET, HEAD",
    "/": "GET, HEAD",
    "/dashboard": "GET, HEAD",
    "/dashboard.json": "GET, HEAD",
    "/dashboard/login": "GET, HEAD, POST",
    "/dashboard/logout": "POST",
    "/dashboard/jobs": "GET, HEAD",
    "/dashboard/jobs/{job_id}": "GET, HEAD",
    "/dashboard/jobs/{job_id}/events": "GET, HEAD",
    "/dashboard/static/job.js": "GET, HEAD",
    "/dashboard/tenants/{name}": "GET, HEAD",
    "/dashboard/audit": "GET, HEAD",
    "/dashboard/confirm": "GET, HEAD",
    "/dashboard/act": "POST",
}


@pytest.fixture
def metrics() -> ApiMetrics:
    return ApiMetrics(CollectorRegistry())


@pytest.fixture
async def http(client: Client, metrics: ApiMetrics) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(client, KeyRing({KEY: "acme"}), ApiConfig(max_wait_seconds=5), metrics=metrics)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as connected:
        yield connected


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples called ``name`` in a Prometheus text page, by their sorted labels."""
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_the_allow_table_covers_every_route() -> None:
    assert {route.path for route in ROUTES} == set(ALLOW)


@pytest.mark.parametrize(("path", "allow"), sorted(ALLOW.items()))
async def test_405_names_every_method_of_the_path(
    http: httpx.AsyncClient, path: str, allow: str
) -> None:
    """OPTIONS and PATCH on each path: 405, JSON, and Allow lists every method it serves."""
    url = path.replace("{job_id}", "some-job").replace("{batch_id}", "some-batch")
    for method in ("OPTIONS", "PATCH"):
        response = await http.request(method, url, headers=AUTH)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["allow"] == allow
        assert response.json()["error"]["kind"] == "method_not_allowed"
        for allowed in allow.split(", "):
            assert allowed in response.json()["error"]["message"]


async def test_every_allowed_method_is_served(http: httpx.AsyncClient) -> None:
    """What Allow names is really served (no 405) on every path."""
    for route in ROUTES:
        assert isinstance(route, PathRoute)
        for method in route.allow.split(", "):
            url = route.path.replace("{job_id}", "some-job")
            response = await http.request(method, url, headers=AUTH)
            assert response.status_code != 405, (method, route.path)


async def test_unknown_path_is_a_json_404(http: httpx.AsyncClient) -> None:
    response = await http.get("/no/such/route", headers=AUTH)
    assert response.status_code == 404
    assert response.json()["error"]["kind"] == "not_found"


async def test_metrics_count_requests_by_route_template(http: httpx.AsyncClient) -> None:
    """After a few requests, /metrics counts them by template (never the raw path), method
    and status, times them, and carries build_info; /metrics needs no key."""
    submitted = await http.post("/jobs", json={"type": "echo"}, headers=AUTH)
    job = submitted.json()["id"]
    assert (await http.get(f"/jobs/{job}", headers=AUTH)).status_code == 200
    assert (await http.get("/jobs/missing-1", headers=AUTH)).status_code == 404
    assert (await http.get("/jobs/missing-2", headers=AUTH)).status_code == 404
    assert (await http.get(f"/jobs/{job}")).status_code == 401
    assert (await http.request("BREW", "/jobs")).status_code == 405
    assert (await http.get("/nothing/here")).status_code == 404
    page = await http.get("/metrics")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/plain")
    counts = samples(page.text, "coldbrew_api_requests_total")
    by = {tuple(value for _, value in labels): count for labels, count in counts.items()}
    # sorted label names: method, route, status
    assert by[("POST", "/jobs", "202")] == 1
    assert by[("GET", "/jobs/{job_id}", "200")] == 1
    assert by[("GET", "/jobs/{job_id}", "404")] == 2
    assert by[("GET", "/jobs/{job_id}", "401")] == 1
    assert by[("other", "/jobs", "405")] == 1
    assert by[("GET", "unmatched", "404")] == 1
    assert not any(job in route or "missing" in route for _, route, _ in by)
    seconds = samples(page.text, "coldbrew_api_request_seconds_count")
    assert seconds[(("method", "GET"), ("route", "/jobs/{job_id}"))] == 4
    info = samples(page.text, "coldbrew_build_info")
    assert info == {(("python", platform.python_version()), ("version", coldbrew_version())): 1}


async def test_open_waiters_gauge_follows_long_polls(
    http: httpx.AsyncClient, metrics: ApiMetrics
) -> None:
    """coldbrew_api_open_waiters{kind="long_poll"} is 1 while a long poll waits, 0 after."""
    job = (await http.post("/jobs", json={"type": "echo"}, headers=AUTH)).json()["id"]

    def open_polls() -> float | None:
        return metrics.registry.get_sample_value("coldbrew_api_open_waiters", {"kind": "long_poll"})

    assert open_polls() == 0
    poll = asyncio.create_task(http.get(f"/jobs/{job}?wait=0.6", headers=AUTH))
    for _ in range(100):
        if open_polls() == 1:
            break
        await asyncio.sleep(0.01)
    assert open_polls() == 1
    assert (await poll).status_code in (200, 304)
    assert open_polls() == 0
    streams = metrics.registry.get_sample_value(
        "coldbrew_api_open_waiters", {"kind": "event_stream"}
    )
    assert streams == 0


async def test_the_trace_context_headers_are_declared_and_never_refused(
    http: httpx.AsyncClient,
) -> None:
    """``traceparent``/``tracestate`` on ``POST /jobs`` are in the contract (schemathesis
    sends them), as strings without constraint: a malformed one is ignored, not a 4xx."""
    spec = (await http.get("/openapi.json")).json()
    declared = {
        p["name"]: p for p in spec["paths"]["/jobs"]["post"]["parameters"] if p["in"] == "header"
    }
    for name in ("traceparent", "tracestate"):
        assert declared[name]["schema"] == {"type": "string"}, name
    garbled = {**AUTH, "traceparent": "00-not-a-trace-context-01", "tracestate": "\x7f"}
    response = await http.post("/jobs", json={"type": "echo"}, headers=garbled)
    assert response.status_code == 202, response.text
