"""coldbrew_api_webhooks_total{outcome}: every delivery's outcome, and each retried attempt."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from coldbrew.api.server import webhooks
from coldbrew.client import Client
from coldbrew.metrics import WEBHOOK_OUTCOMES, ApiMetrics
from tests.helpers import make_settings

SECRET = "hook-secret-0123456789"


def receiver(*statuses: int) -> httpx.AsyncClient:
    """A webhook receiver answering ``statuses`` in turn (the last one from then on)."""
    answers = list(statuses)

    async def hook(_request: Request) -> Response:
        return Response(status_code=answers.pop(0) if len(answers) > 1 else answers[0])

    app = Starlette(routes=[Route("/h", hook, methods=["POST"])])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app))


def outcomes(metrics: ApiMetrics) -> dict[str, float]:
    return {
        outcome: metrics.registry.get_sample_value(
            "coldbrew_api_webhooks_total", {"outcome": outcome}
        )
        or 0.0
        for outcome in WEBHOOK_OUTCOMES
    }


async def test_webhook_outcomes_are_counted(client: Client) -> None:
    """delivered after two retried attempts; refused at once; gave up after its attempts.
    The dispatcher is the one `coldbrew api` builds from the settings, with its metrics."""
    metrics = ApiMetrics(CollectorRegistry())
    settings = make_settings(
        client.settings.namespace,
        webhook_url="http://receiver/h",
        webhook_secret=SECRET,
        webhook_max_attempts=3,
    )
    dispatcher = webhooks(settings, metrics)
    assert dispatcher is not None
    dispatcher.retry_base = 0.01
    record = await client.submit("echo", {})
    assert outcomes(metrics) == dict.fromkeys(WEBHOOK_OUTCOMES, 0.0)  # exported from the start
    async with receiver(503, 500, 200) as http:
        assert await dispatcher.deliver(http, record) is True
    async with receiver(410) as http:
        assert await dispatcher.deliver(http, record) is False
    async with receiver(503) as http:
        assert await dispatcher.deliver(http, record) is False
    assert outcomes(metrics) == {
        "delivered": 1,
        "refused": 1,
        "retried": 2 + 2,
        "gave_up": 1,
        "untracked": 0,
    }
