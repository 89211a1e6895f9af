"""Tests for coldbrew.metrics: the metric set, scrape callbacks and the HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from coldbrew.batching import GroupCommit
from coldbrew.errors import ConfigurationError
from coldbrew.metrics import Metrics, MetricsServer


@dataclass
class Probe:
    """A mutable probe answer the server reads on every request."""

    ok: bool = True
    reason: str = ""

    def __call__(self) -> tuple[bool, str]:
        return self.ok, self.reason


@dataclass
class Served:
    metrics: Metrics
    server: MetricsServer
    healthy: Probe
    ready: Probe


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    registry = CollectorRegistry()
    healthy, ready = Probe(), Probe()
    server = MetricsServer(
        "127.0.0.1", 0, registry, is_healthy=healthy, is_ready=ready, read_timeout=0.5
    )
    async with server:
        yield Served(Metrics(registry), server, healthy, ready)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


async def send(port: int, raw: bytes) -> Reply:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout=5)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    return Reply(int(status_line.split(" ")[1]), headers, body)


def request(path: str, method: str = "GET", *extra: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", *extra, "", ""]
    return "\r\n".join(lines).encode()


async def test_metrics_text_contains_incremented_counters(served: Served) -> None:
    """A scrape shows counters and histograms incremented through job handles, as text 0.0.4."""
    handles = served.metrics.job_handles("default", "thumbnail")
    handles.started.inc()
    handles.finish("succeeded", 0.2)
    served.metrics.redeliveries.labels(cause="lease_expired").inc(2)

    reply = await send(served.server.port, request("/metrics"))

    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert reply.headers["connection"] == "close"
    assert int(reply.headers["content-length"]) == len(reply.body)
    text = reply.body.decode()
    assert 'coldbrew_jobs_started_total{queue="default",type="thumbnail"} 1.0' in text
    assert (
        'coldbrew_jobs_finished_total{outcome="succeeded",queue="default",type="thumbnail"} 1.0'
        in text
    )
    assert 'coldbrew_job_duration_seconds_count{type="thumbnail"} 1.0' in text
    assert 'coldbrew_redeliveries_total{cause="lease_expired"} 2.0' in text
    assert 'coldbrew_redeliveries_total{cause="broker_flag"} 0.0' in text


async def test_every_required_family_is_exported(served: Served) -> None:
    """Each metric named in the brief appears in the exposition (with HELP), even before use."""
    served.metrics.set_breaker_state("database", "open")
    text = (await send(served.server.port, request("/metrics"))).body.decode()
    for name in (
        "coldbrew_jobs_started_total",
        "coldbrew_jobs_finished_total",
        "coldbrew_job_duration_seconds",
        "coldbrew_jobs_in_flight",
        "coldbrew_duplicate_deliveries_total",
        "coldbrew_redeliveries_total",
        "coldbrew_dead_letters_total",
        "coldbrew_retries_total",
        "coldbrew_fenced_writes_total",
        "coldbrew_lease_extensions_total",
        "coldbrew_leases_lost_total",
        "coldbrew_heartbeat_lag_seconds",
        "coldbrew_relay_published_total",
        "coldbrew_tenants_provisioned_total",
        "coldbrew_priority_clamped_total",
        "coldbrew_breaker_state",
        "coldbrew_reconcile_passes_total",
        "coldbrew_reconcile_republished_total",
        "coldbrew_queues_redeclared_total",
        "coldbrew_lane_consumers",
        "coldbrew_rejected_jobs_failed_total",
    ):
        assert f"# HELP {name} " in text, name
    assert 'coldbrew_breaker_state{name="database"} 2.0' in text


async def test_openmetrics_is_served_when_asked_for(served: Served) -> None:
    """A scraper that accepts OpenMetrics gets it, with the matching content type."""
    reply = await send(
        served.server.port, request("/metrics", "GET", "Accept: application/openmetrics-text")
    )
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("application/openmetrics-text")
    assert reply.body.endswith(b"# EOF\n")


async def test_head_returns_headers_without_body(served: Served) -> None:
    """HEAD /metrics answers 200 with the GET's Content-Length and an empty body."""
    reply = await send(served.server.port, request("/metrics", "HEAD"))
    assert reply.status == 200
    assert int(reply.headers["content-length"]) > 0
    assert reply.body == b""


@pytest.mark.parametrize(("path", "probe_name"), [("/healthz", "healthy"), ("/readyz", "ready")])
async def test_probes_follow_their_callbacks(served: Served, path: str, probe_name: str) -> None:
    """A probe answers 200 ok while its callback is ok, and 503 with the reason otherwise."""
    probe: Probe = getattr(served, probe_name)

    ok = await send(served.server.port, request(path))
    assert (ok.status, json.loads(ok.body)) == (200, {"status": "ok"})
    assert ok.headers["content-type"] == "application/json"

    probe.ok, probe.reason = False, "draining"
    down = await send(served.server.port, request(path + "?verbose=1"))
    assert down.status == 503
    assert json.loads(down.body) == {"status": "unavailable", "reason": "draining"}

    probe.ok = True
    assert (await send(served.server.port, request(path))).status == 200


async def test_a_raising_probe_is_unavailable(served: Served) -> None:
    """A probe callback that raises yields 503 naming the exception type, not a dropped socket."""

    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    served.server._is_ready = broken  # type: ignore[method-assign]
    reply = await send(served.server.port, request("/readyz"))
    assert reply.status == 503
    assert json.loads(reply.body)["reason"] == "check raised RuntimeError"


async def test_unknown_path_is_404(served: Served) -> None:
    """A path the server does not serve is 404."""
    assert (await send(served.server.port, request("/nope"))).status == 404


async def test_other_methods_are_405_with_allow(served: Served) -> None:
    """POST to a served path is 405 and says which methods are allowed."""
    reply = await send(served.server.port, request("/metrics", "POST"))
    assert reply.status == 405
    assert reply.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics HTTP/2.0\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n",
    ],
)
async def test_malformed_requests_are_400(served: Served, raw: bytes) -> None:
    """A request line or header the server cannot parse is 400."""
    assert (await send(served.server.port, raw)).status == 400


async def test_oversized_request_head_is_431(served: Served) -> None:
    """Headers beyond the 8 KiB limit are refused with 431 rather than buffered."""
    reply = await send(served.server.port, request("/metrics", "GET", "X-Big: " + "a" * 9000))
    assert reply.status == 431


async def test_silent_client_is_timed_out(served: Served) -> None:
    """A client that never finishes its request gets 408 and is disconnected."""
    reply = await send(served.server.port, b"GET /met")
    assert reply.status == 408


async def test_port_in_use_is_a_configuration_error(served: Served) -> None:
    """Binding a port another server holds raises ConfigurationError naming port and variable."""
    taken = served.server.port
    second = MetricsServer(
        "127.0.0.1", taken, CollectorRegistry(), is_healthy=Probe(), is_ready=Probe()
    )
    with pytest.raises(ConfigurationError) as caught:
        await second.start()
    assert str(taken) in str(caught.value)
    assert "COLDBREW_METRICS_PORT" in str(caught.value)


async def test_close_stops_listening_and_is_idempotent() -> None:
    """After close() the port refuses connections, and a second close() is harmless."""
    server = MetricsServer(
        "127.0.0.1", 0, CollectorRegistry(), is_healthy=Probe(), is_ready=Probe()
    )
    await server.start()
    port = server.port
    assert port != 0
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(5):  # wait until the server has accepted it
        while not server._connections:  # noqa: ASYNC110 - polls a condition against a deadline
            await asyncio.sleep(0.01)
    await server.close()
    await server.close()
    assert await asyncio.wait_for(idle_reader.read(), timeout=5) == b""
    idle_writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_scrape_callback_values_appear(served: Served) -> None:
    """Samples returned by a scrape callback are exported as a gauge family."""

    def depth() -> Iterable[tuple[Sequence[str], float]]:
        return [(("default", "acme"), 3), (("slow", "default"), 0.5)]

    served.metrics.add_scrape_callback(
        "coldbrew_queue_depth", "Jobs waiting.", ("queue", "tenant"), depth
    )
    text = (await send(served.server.port, request("/metrics"))).body.decode()
    assert "# TYPE coldbrew_queue_depth gauge" in text
    assert 'coldbrew_queue_depth{queue="default",tenant="acme"} 3.0' in text
    assert 'coldbrew_queue_depth{queue="slow",tenant="default"} 0.5' in text


async def test_raising_scrape_callback_is_skipped_and_logged(served: Served) -> None:
    """A callback that raises (or returns bad labels) drops only its family and logs why."""

    def broken() -> Iterable[tuple[Sequence[str], float]]:
        raise RuntimeError("database gone")

    def wrong_arity() -> Iterable[tuple[Sequence[str], float]]:
        return [(("a", "b"), 1.0)]

    served.metrics.add_scrape_callback("coldbrew_broken", "Always fails.", (), broken)
    served.metrics.add_scrape_callback("coldbrew_wrong", "Bad labels.", ("queue",), wrong_arity)
    served.metrics.add_scrape_callback("coldbrew_fine", "Works.", (), lambda: [((), 7.0)])
    served.metrics.jobs_in_flight.inc()

    with capture_logs() as logs:
        reply = await send(served.server.port, request("/metrics"))

    assert reply.status == 200
    text = reply.body.decode()
    assert "coldbrew_broken" not in text
    assert "coldbrew_wrong" not in text
    assert "coldbrew_fine 7.0" in text
    assert "coldbrew_jobs_in_flight 1.0" in text
    failed = {e["metric"] for e in logs if e["event"] == "scrape_callback_failed"}
    assert failed == {"coldbrew_broken", "coldbrew_wrong"}


def test_scrape_callback_names_are_checked() -> None:
    """A callback family must carry the coldbrew_ prefix and must not clash with another metric."""
    metrics = Metrics(CollectorRegistry())
    with pytest.raises(ValueError, match="must start with"):
        metrics.add_scrape_callback("queue_depth", "x", (), list)
    with pytest.raises(ValueError, match="Duplicated"):
        metrics.add_scrape_callback("coldbrew_jobs_in_flight", "x", (), list)


def test_job_handles_are_cached_per_label_pair() -> None:
    """The same (queue, type) returns the very same handles; another pair gets its own."""
    metrics = Metrics(CollectorRegistry())
    first = metrics.job_handles("default", "thumbnail")
    assert metrics.job_handles("default", "thumbnail") is first
    other = metrics.job_handles("slow", "thumbnail")
    assert other is not first
    assert other.duration is first.duration  # the histogram is labelled by type only
    assert set(first.finished) == {
        "succeeded",
        "failed",
        "retrying",
        "dead",
        "cancelled",
        "fenced",
        "released",
    }


def test_two_registries_do_not_share_state() -> None:
    """Metrics on separate registries are independent, so each test can use its own."""
    one, two = CollectorRegistry(), CollectorRegistry()
    Metrics(one).leases_lost.inc()
    Metrics(two)
    assert one.get_sample_value("coldbrew_leases_lost_total") == 1.0
    assert two.get_sample_value("coldbrew_leases_lost_total") == 0.0


# --- drain rate and estimated wait ------------------------------------------------------


def test_drain_rate_needs_two_readings_then_follows_the_counter() -> None:
    from coldbrew.stats import DrainRates

    rates = DrainRates(window=60.0)
    key = ("default", "acme")
    rates.observe(key, 100, now=0.0)
    assert key not in rates.rates
    assert rates.estimated_wait(key, 10) == float("inf")  # no rate known: never, honestly
    rates.observe(key, 150, now=5.0)
    assert rates.rates[key] == 10.0  # the first sample is taken as is
    assert rates.estimated_wait(key, 40) == 4.0
    assert rates.estimated_wait(key, 0) == 0.0
    rates.observe(key, 150, now=10.0)  # nothing drained for 5 s: the rate decays, not drops
    assert 0 < rates.rates[key] < 10.0
    rates.observe(key, 20, now=15.0)  # counter went back (table recreated): ignored
    assert 0 < rates.rates[key] < 10.0


def test_drain_rate_average_converges_to_a_steady_rate() -> None:
    from coldbrew.stats import DrainRates

    rates = DrainRates(window=10.0)
    key = ("default", "b")
    for second in range(0, 200, 5):
        rates.observe(key, second * 7, now=float(second))
    assert abs(rates.rates[key] - 7.0) < 1e-6


async def test_group_commit_counts_are_counters_read_at_scrape(served: Served) -> None:
    async def flush(items: Sequence[int]) -> list[int]:
        return list(items)

    claims: GroupCommit[int, int] = GroupCommit("claim", flush)
    served.metrics.watch_group_commits([claims])
    await asyncio.gather(*(claims.submit(i) for i in range(5)))
    registry = served.metrics.registry
    batches = registry.get_sample_value("coldbrew_group_commit_batches_total", {"writer": "claim"})
    items = registry.get_sample_value("coldbrew_group_commit_items_total", {"writer": "claim"})
    assert items == 5
    assert batches == claims.batches >= 1
