"""A lane that no worker of the app serves is refused up front (#13, item 7)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from coldbrew.client import Client
from coldbrew.errors import InvalidRequest, JobNotFound
from tests.integration.test_api import ACME, api_client, error_of


@pytest.fixture
async def http(client: Client) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(client, max_wait_seconds=1) as connected:
        yield connected


async def test_the_client_refuses_a_lane_no_worker_of_the_app_serves(client: Client) -> None:
    """With the app known, a job sent to a lane none of its jobs uses would wait forever."""
    with pytest.raises(InvalidRequest, match="lane 'nowhere'") as refused:
        await client.submit("echo", {"value": 1}, queue="nowhere", job_id="lost-1")
    assert refused.value.reason == "unknown_lane"
    with pytest.raises(JobNotFound):  # nothing was written
        await client.get("lost-1")
    accepted = await client.submit("echo", {"value": 1}, queue="default")
    assert accepted.status == "queued"


async def test_the_api_answers_422_for_an_unknown_lane(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/jobs", json={"type": "echo", "args": {"value": 1}, "queue": "nowhere"}, headers=ACME
    )
    assert response.status_code == 422, response.text
    assert error_of(response)["kind"] == "unknown_lane"
