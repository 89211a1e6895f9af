"""``coldbrew batch status|cancel`` as a subprocess, and ``GET /batches/{id}`` across tenants."""

from __future__ import annotations

import json
from typing import Any

import pytest

from coldbrew import Job
from coldbrew.app import load_app
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.e2e.test_cli import cli_env, run_cli
from tests.integration.test_api import ACME, GLOBEX, api_client


@pytest.fixture
def test_app() -> Any:
    return load_app("tests.batch_apps:app")


async def test_batch_status_and_cancel_on_the_command_line(
    settings: Settings, client: Client
) -> None:
    """``batch status`` prints the counts (lines, or the status JSON with --json); ``batch
    cancel`` cancels the waiting members; an unknown id is exit 1 with one clear line."""
    batch = await client.batch(
        [Job("member", {"n": i}) for i in range(3)],
        on_complete=Job("record"),
        description="three squares",
        tenant="acme",
    )
    env = cli_env(settings)
    shown = await run_cli(env, "batch", "status", batch.id)
    assert shown.returncode == 0, shown.stderr
    assert f"batch {batch.id}  running  3 members, 3 pending" in shown.stdout
    assert "three squares" in shown.stdout and "queued 3" in shown.stdout
    assert "on_complete: record" in shown.stdout and "not enqueued" in shown.stdout
    as_json = await run_cli(env, "batch", "status", batch.id, "--json")
    status = json.loads(as_json.stdout)
    assert (status["id"], status["total"], status["counts"]["queued"]) == (batch.id, 3, 3)
    cancelled = await run_cli(env, "batch", "cancel", batch.id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    after = json.loads(cancelled.stdout)
    assert (after["status"], after["counts"]["cancelled"], after["pending"]) == ("cancelled", 3, 0)
    assert after["callbacks"]["on_complete"]["status"] == "queued"  # enqueued by the last cancel
    again = await run_cli(env, "batch", "cancel", batch.id)
    assert again.returncode == 1 and "nothing to cancel" in again.stderr
    missing = await run_cli(env, "batch", "status", "no-such-batch")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "coldbrew: no batch with id 'no-such-batch'"
    assert missing.stdout == ""


async def test_get_batch_is_isolated_by_tenant(client: Client) -> None:
    """A key sees its tenant's batch; another tenant's key gets the same 404 as a missing one."""
    batch = await client.batch([Job("member", {"n": 1})], tenant="acme")
    async with api_client(client) as http:
        mine = await http.get(f"/batches/{batch.id}", headers=ACME)
        assert mine.status_code == 200, mine.text
        assert (mine.json()["id"], mine.json()["tenant"]) == (batch.id, "acme")
        theirs = await http.get(f"/batches/{batch.id}", headers=GLOBEX)
        missing = await http.get("/batches/no-such-batch", headers=GLOBEX)
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json()["error"]["kind"] == "not_found"
        assert batch.id in theirs.json()["error"]["message"]  # the id asked for, nothing more
        assert (await http.get(f"/batches/{batch.id}")).status_code == 401
        assert (await http.get("/batches/a%20b", headers=ACME)).status_code == 422
        member = await http.get(f"/jobs/{batch.member_ids[0]}", headers=ACME)
        assert member.json()["batch_id"] == batch.id
