"""The acting dashboard in process (httpx ASGI) on the real PostgreSQL and RabbitMQ:
sessions, CSRF, actions and their audit, attempts, search pages, the access log."""

from __future__ import annotations

import asyncio
import re
import uuid
from html import unescape

import asyncpg
import httpx
import pytest
import structlog

from coldbrew.api import accesslog
from coldbrew.api.auth import DASHBOARD_COOKIE, KeyRing
from coldbrew.client import Client
from coldbrew.flow import chain, chain_step_id, step
from coldbrew.model import Status
from coldbrew.settings import Settings
from coldbrew.store import ClaimRequest
from tests.helpers import DATABASE_URL, WorkerFactory, wait_until
from tests.integration.test_api import ACME, ACME_KEY, GLOBEX_KEY, api_client

CSRF_RE = re.compile(r'name="csrf" value="([0-9a-f]{64})"')
OPEN = KeyRing({}, insecure_no_auth=True)


async def sign_in(http: httpx.AsyncClient, key: str) -> dict[str, str]:
    """Log in; the cookie header of the new session."""
    response = await http.post("/dashboard/login", data={"key": key})
    assert response.status_code == 303
    return {"Cookie": f"{DASHBOARD_COOKIE}={response.cookies[DASHBOARD_COOKIE]}"}


async def confirm(http: httpx.AsyncClient, headers: dict[str, str], **params: str) -> str:
    """The confirmation page's CSRF token (asserting the page asks first)."""
    page = await http.get("/dashboard/confirm", params=params, headers=headers)
    assert page.status_code == 200, page.text
    assert 'id="question"' in page.text
    found = CSRF_RE.search(page.text)
    assert found is not None
    return found.group(1)


async def queued_job(client: Client, tenant: str = "acme", type: str = "echo") -> str:
    """A queued job no worker takes (its lane is not consumed)."""
    record = await client.submit(type, tenant=tenant, queue="parked")
    return record.id


async def test_an_action_needs_the_session_its_csrf_token_and_the_same_origin(
    client: Client,
) -> None:
    job_id = await queued_job(client)
    async with api_client(client) as http:
        cookie = await sign_in(http, ACME_KEY)
        token = await confirm(http, cookie, action="cancel", job_id=job_id)
        form = {"action": "cancel", "job_id": job_id}
        for headers, data in (
            (cookie, form),  # no token
            (cookie, {**form, "csrf": "0" * 64}),  # forged
            (ACME, {**form, "csrf": token}),  # a Bearer key, no session
            ({**cookie, "Origin": "https://evil.example"}, {**form, "csrf": token}),
        ):
            refused = await http.post("/dashboard/act", data=data, headers=headers)
            assert refused.status_code == 403, refused.text
        other = await sign_in(http, ACME_KEY)  # another session's token does not fit
        forged = await http.post("/dashboard/act", data={**form, "csrf": token}, headers=other)
        assert forged.status_code == 403
        assert (await client.get(job_id)).status is Status.QUEUED  # nothing happened

        done = await http.post("/dashboard/act", data={**form, "csrf": token}, headers=cookie)
        assert done.status_code == 303
        assert done.headers["location"].startswith(f"/dashboard/jobs/{job_id}?done=")
        assert (await client.get(job_id)).status is Status.CANCELLED
        page = await http.get(f"/dashboard/jobs/{job_id}", headers=cookie)
        assert "cancel" in page.text and "of acme" in page.text  # the audit entry: who, what
        audit = await client.store.dashboard.audit_for_job(job_id)
        assert [(a.action, a.outcome, a.tenant) for a in audit] == [("cancel", "cancelled", "acme")]
        assert audit[0].actor.startswith("api key ") and ACME_KEY not in audit[0].actor


async def test_another_tenants_job_and_tenant_are_out_of_reach(client: Client) -> None:
    theirs = await queued_job(client, tenant="globex")
    async with api_client(client) as http:
        cookie = await sign_in(http, ACME_KEY)
        page = await http.get(
            "/dashboard/confirm", params={"action": "cancel", "job_id": theirs}, headers=cookie
        )
        assert page.status_code == 404
        pause = await http.get(
            "/dashboard/confirm", params={"action": "pause", "tenant": "globex"}, headers=cookie
        )
        assert pause.status_code == 403
        search = await http.get("/dashboard/jobs", headers=cookie)
        assert theirs not in search.text
    assert (await client.get(theirs)).status is Status.QUEUED


async def test_retry_a_failed_job_replay_dead_ones_and_see_each_attempt(
    client: Client, start_worker: WorkerFactory
) -> None:
    await start_worker()
    failed = await client.submit("permanent", tenant="acme")
    dead = await client.submit("always_fails", tenant="acme", max_attempts=2)
    theirs = await client.submit("always_fails", tenant="globex", max_attempts=1)
    for job in (failed, dead, theirs):
        await client.wait(job.id, timeout=20)
    async with api_client(client) as http:
        cookie = await sign_in(http, ACME_KEY)
        token = await confirm(http, cookie, action="retry", job_id=failed.id)
        retried = await http.post(
            "/dashboard/act",
            data={"action": "retry", "job_id": failed.id, "csrf": token},
            headers=cookie,
        )
        assert retried.status_code == 303
        await wait_until(lambda: _attempt_is(client, failed.id, 2, Status.FAILED))
        page = unescape((await http.get(f"/dashboard/jobs/{failed.id}", headers=cookie)).text)
        rows = re.findall(r"<tr><td class=\"n\">(\d+)</td><td>(\w+)", page)
        assert rows == [("1", "failed"), ("2", "failed")]
        assert "retry" in page and "fresh attempt" in page  # the audit entry

        token = await confirm(http, cookie, action="replay", reason="always")
        replayed = await http.post(
            "/dashboard/act",
            data={"action": "replay", "reason": "always", "csrf": token},
            headers=cookie,
        )
        assert "replayed+1+dead" in replayed.headers["location"]
    last = 2 + client.settings.max_attempts  # the replay's fresh budget, all spent
    await wait_until(lambda: _attempt_is(client, dead.id, last, Status.DEAD))
    assert (await client.get(theirs.id)).status is Status.DEAD  # globex's: not replayed
    attempts = await client.store.dashboard.attempts(dead.id)
    outcomes = [(a.attempt, a.outcome) for a in attempts]
    assert outcomes[:2] == [(1, "retrying"), (2, "dead")]
    assert outcomes[-1] == (last, "dead") and len(outcomes) == last
    assert all(a.error_kind for a in attempts)


async def _attempt_is(client: Client, job_id: str, attempt: int, status: Status) -> bool:
    record = await client.get(job_id)
    return record.attempt == attempt and record.status is status


async def test_tenant_forms_refuse_with_the_cli_messages_then_apply(client: Client) -> None:
    async with api_client(client, OPEN) as http:
        for weight, message in (
            ("0", "--weight must be in (0, 1000], not 0"),
            ("abc", "--weight must be a number, not 'abc'"),
        ):
            page = await http.get(
                "/dashboard/confirm",
                params={"action": "tenant_set", "tenant": "acme", "weight": weight},
            )
            assert page.status_code == 422
            assert message in unescape(page.text)
        cap = await http.get(
            "/dashboard/confirm",
            params={"action": "tenant_set", "tenant": "acme", "max_running": "-1"},
        )
        assert "--max-running must be in 0..1000000, not -1" in unescape(cap.text)
        reason = await http.get("/dashboard/confirm", params={"action": "replay", "reason": ""})
        assert "say which dead jobs to replay" in unescape(reason.text)

        params = {"action": "tenant_set", "tenant": "acme", "weight": "2.5", "max_running": "3"}
        token = await confirm(http, {}, **params)
        done = await http.post("/dashboard/act", data={**params, "csrf": token})
        assert done.status_code == 303
        token = await confirm(http, {}, action="pause", tenant="acme")
        await http.post("/dashboard/act", data={"action": "pause", "tenant": "acme", "csrf": token})
        audit = (await http.get("/dashboard/audit")).text
    [acme] = [t for t in await client.store.tenants.list_tenants() if t.name == "acme"]
    assert (acme.weight, acme.max_running, acme.paused) == (2.5, 3, True)
    assert "tenant acme" in audit and "paused" in audit and "settings changed" in audit


async def test_search_filters_and_keyset_pages_cover_every_job_once(client: Client) -> None:
    store = client.store
    ids = []
    for index in range(120):
        job_id = f"search-{index:03d}-{uuid.uuid4().hex[:6]}"
        kind = "echo" if index % 3 else "permanent"
        request = ClaimRequest(job_id, kind, "parked", "acme", {}, 0, 3, None, None)
        await store.jobs.insert_job(request, relay_grace=600)
        ids.append(job_id)
    await queued_job(client, tenant="globex")
    async with api_client(client) as http:
        cookie = await sign_in(http, ACME_KEY)
        seen: list[str] = []
        url = "/dashboard/jobs"
        for _ in range(10):
            page = await http.get(url, headers=cookie)
            assert page.status_code == 200
            seen += re.findall(r'href="/dashboard/jobs/(search-[^"]+)"', page.text)
            more = re.search(r'id="next-page" href="([^"]+)"', page.text)
            if more is None:
                break
            url = unescape(more.group(1))
        assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
        typed = await http.get("/dashboard/jobs", params={"type": "permanent"}, headers=cookie)
        assert len(re.findall(r'href="/dashboard/jobs/search-', typed.text)) == 40
        jump = await http.get("/dashboard/jobs", params={"job_id": ids[5]}, headers=cookie)
        assert jump.headers["location"] == f"/dashboard/jobs/{ids[5]}"
        bad = await http.get("/dashboard/jobs", params={"status": "sleepy"}, headers=cookie)
        assert bad.status_code == 422


async def test_sessions_expire_and_each_request_is_logged(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    captured = structlog.testing.CapturingLogger()
    monkeypatch.setattr(accesslog, "log", captured)  # info lines: the tests log at warning
    async with api_client(client, session_seconds=1.0) as http:
        cookie = await sign_in(http, GLOBEX_KEY)
        assert (await http.get("/dashboard", headers=cookie)).status_code == 200
        traced = await http.get("/healthz", headers={"X-Request-ID": "req-42"})
        assert traced.headers["x-request-id"] == "req-42"
        lines = [c.kwargs for c in captured.calls if c.args == ("api_request",)]
        page = next(e for e in lines if e["path"] == "/dashboard")
        assert (page["method"], page["status"], page["tenant"]) == ("GET", 200, "globex")
        assert page["duration_ms"] >= 0 and len(page["request_id"]) == 32
        assert next(e for e in lines if e["path"] == "/healthz")["request_id"] == "req-42"
        assert next(e for e in lines if e["path"] == "/healthz")["tenant"] == "-"
        await asyncio.sleep(1.2)
        expired = await http.get("/dashboard", headers=cookie)
        assert (expired.status_code, expired.headers["location"]) == (303, "/dashboard/login")


async def test_a_form_signed_by_one_api_replica_is_accepted_by_another(client: Client) -> None:
    """Two API apps (two replicas behind a load balancer, each with its own state): the
    session opened and the form's CSRF token signed by one is accepted by the other, since
    the key is the namespace's (dashboard_secrets), not the process's; a forged token is
    still refused there."""
    job_id = await queued_job(client)
    async with api_client(client) as first, api_client(client) as second:
        cookie = await sign_in(first, ACME_KEY)
        token = await confirm(first, cookie, action="cancel", job_id=job_id)
        form = {"action": "cancel", "job_id": job_id}
        refused = await second.post(
            "/dashboard/act", data={**form, "csrf": "0" * 64}, headers=cookie
        )
        assert refused.status_code == 403
        done = await second.post("/dashboard/act", data={**form, "csrf": token}, headers=cookie)
        assert done.status_code == 303, done.text
    assert (await client.get(job_id)).status is Status.CANCELLED


async def test_pause_and_resume_a_lane_with_confirmation_csrf_and_audit(client: Client) -> None:
    """Every-tenant access pauses and resumes a lane through the confirm page, each step
    audited; a tenant's key is refused (a lane holds every tenant's jobs), and a bad lane
    name gets the CLI's message."""
    await client.submit("echo", tenant="acme", queue="parked")
    async with api_client(client) as http:
        cookie = await sign_in(http, ACME_KEY)
        refused = await http.get(
            "/dashboard/confirm", params={"action": "lane_pause", "lane": "parked"}, headers=cookie
        )
        assert refused.status_code == 403 and "lane_needs_every_tenant" in refused.text
    async with api_client(client, OPEN) as http:
        bad = await http.get("/dashboard/confirm", params={"action": "lane_pause", "lane": "a b"})
        assert bad.status_code == 422 and "lane name &#x27;a b&#x27; must match" in bad.text
        overview = (await http.get("/dashboard")).text
        assert "action=lane_pause&amp;lane=parked" in overview
        token = await confirm(http, {}, action="lane_pause", lane="parked")
        form = {"action": "lane_pause", "lane": "parked"}
        assert (await http.post("/dashboard/act", data=form)).status_code == 403  # no token
        done = await http.post("/dashboard/act", data={**form, "csrf": token})
        assert done.status_code == 303
        assert "Pause lane parked" in unescape(done.headers["location"].replace("+", " "))
        assert [
            lane.paused for lane in await client.store.tenants.list_lanes() if lane.name == "parked"
        ] == [True]
        data = (await http.get("/dashboard.json")).json()
        assert data["paused_lanes"] == ["parked"]
        assert "action=lane_resume&amp;lane=parked" in (await http.get("/dashboard")).text
        token = await confirm(http, {}, action="lane_resume", lane="parked")
        form = {"action": "lane_resume", "lane": "parked", "csrf": token}
        assert (await http.post("/dashboard/act", data=form)).status_code == 303
    lanes = {lane.name: lane.paused for lane in await client.store.tenants.list_lanes()}
    assert lanes["parked"] is False
    audit = await client.store.dashboard.audit_recent(None)
    assert [(a.action, a.target, a.outcome) for a in audit[:2]] == [
        ("lane_resume", "lane parked", "resumed"),
        ("lane_pause", "lane parked", "paused"),
    ]


async def test_a_jobs_page_shows_its_parent_children_batch_and_chain_step(
    client: Client, settings: Settings
) -> None:
    """Read from the existing columns: a parent's page counts its children by status and
    links them, a child's links its parent, a batch member's shows the batch's counts, and
    a chain step's says which step of how many; a plain job's page has none of it."""
    parent = await queued_job(client)
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:
        await conn.execute(
            "INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, parent_id)"
            " SELECT $1 || '-child-' || s, 'echo', 'parked', 'acme',"
            " (CASE WHEN s <= 2 THEN 'succeeded' ELSE 'queued' END)::job_status, 3, $1"
            " FROM generate_series(1, 3) AS s",
            parent,
        )
    finally:
        await conn.close()
    batch = await client.batch(
        [("echo", {"value": 1}), ("echo", {"value": 2})], tenant="acme", description="nightly"
    )
    chained = await client.submit_chain(
        chain(
            step("echo", {"value": 1}),
            step("echo", result_arg="value"),
            step("noop", result_arg=None),
            tenant="acme",
        )
    )
    first_step = chain_step_id(chained["id"], 0)
    async with api_client(client, OPEN) as http:
        page = unescape((await http.get(f"/dashboard/jobs/{parent}")).text)
        assert "3 in all: queued 1 · succeeded 2" in page
        assert f"/dashboard/jobs/{parent}-child-3" in page
        child = unescape((await http.get(f"/dashboard/jobs/{parent}-child-1")).text)
        assert f'id=parent>Spawned by <a href="/dashboard/jobs/{parent}"' in child
        member = unescape((await http.get(f"/dashboard/jobs/{batch.member_ids[0]}")).text)
        assert f"Member of batch <code>{batch.id}</code> (nightly): running, 2 members" in member
        assert "queued 2" in member
        step_page = unescape((await http.get(f"/dashboard/jobs/{first_step}")).text)
        assert f"Step 1 of 3 of chain <code>{chained['id']}</code> (running)" in step_page
        plain = (await http.get(f"/dashboard/jobs/{await queued_job(client)}")).text
        assert "Related jobs" not in plain


async def test_error_text_search_matches_literally_through_the_trigram_index(
    client: Client, settings: Settings
) -> None:
    """The error text is a literal, not a pattern (% and _ match only themselves), matched
    case-insensitively in the kind, message and dead reason, with the other filters; a text
    under three characters (no trigram) takes the walk and finds the same rows."""
    conn = await asyncpg.connect(DATABASE_URL, server_settings={"search_path": settings.namespace})
    try:
        await conn.execute(
            "INSERT INTO jobs (id, type, queue, tenant, status, max_attempts, error_kind,"
            " error_message, dead_reason) VALUES"
            " ('e1', 'echo', 'parked', 'acme', 'failed', 3, 'Sale', 'got 50%_OFF today', NULL),"
            " ('e2', 'echo', 'parked', 'acme', 'failed', 3, 'Sale', 'got 500 off today', NULL),"
            " ('e3', 'echo', 'parked', 'acme', 'dead', 3, NULL, NULL, 'Back\\slash 50%_off'),"
            " ('e4', 'echo', 'parked', 'globex', 'dead', 3, NULL, NULL, '50%_off')"
        )
        await conn.execute("SET enable_seqscan = off")  # a tiny table would be scanned
        explained = await conn.fetch(
            "EXPLAIN SELECT id FROM jobs WHERE lower(coalesce(error_kind, '') || ' ' ||"
            " coalesce(error_message, '') || ' ' || coalesce(dead_reason, ''))"
            " LIKE '%50\\%\\_off%' AND (error_kind IS NOT NULL OR error_message IS NOT NULL"
            " OR dead_reason IS NOT NULL)"
        )
        plan = "\n".join(row[0] for row in explained)
    finally:
        await conn.close()
    async with api_client(client) as http:
        cookie = await sign_in(http, ACME_KEY)

        async def found(**params: str) -> list[str]:
            page = await http.get("/dashboard/jobs", params=params, headers=cookie)
            assert page.status_code == 200, page.text
            return sorted(re.findall(r'href="/dashboard/jobs/(e\d)"', page.text))

        assert await found(error="50%_off") == ["e1", "e3"]
        assert await found(error="50%_off", status="dead") == ["e3"]
        assert await found(error="k\\slash") == ["e3"]
        assert await found(error="SALE") == ["e1", "e2"]
        assert await found(error="%") == ["e1", "e3"]  # one character: the walk, literally too
    assert "jobs_search_error" in plan
