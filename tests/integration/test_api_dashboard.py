"""The web dashboard in process (httpx ASGI transport) on the real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest

from coldbrew.api.auth import DASHBOARD_COOKIE, KeyRing
from coldbrew.client import Client
from coldbrew.model import Status
from coldbrew.store import ClaimRequest
from coldbrew.topology import Topology
from tests.helpers import WorkerFactory, wait_until
from tests.integration.test_api import ACME, ACME_KEY, GLOBEX, GLOBEX_KEY, api_client

XSS = "<script>alert(1)</script>"


class Tables(HTMLParser):
    """The page's tables as {section heading: [[cell text, ...], ...]}, links collected too."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.links: list[str] = []
        self._heading: str | None = None
        self._in_h2 = False
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._in_h2, self._heading = True, ""
        elif tag == "tr" and self._heading is not None:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "a":
            self.links += [value or "" for name, value in attrs if name == "href"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row and self._heading is not None:
            self.tables.setdefault(self._heading, []).append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._in_h2 and self._heading is not None:
            self._heading += data
        elif self._cell is not None:
            self._cell.append(data)


def tables_of(page: str) -> Tables:
    parser = Tables()
    parser.feed(page)
    return parser


@dataclass
class Populated:
    dead_acme: str
    dead_globex: str
    running: str


async def populate(client: Client, start_worker: WorkerFactory) -> Populated:
    """Acme: 2 queued (lane ``slow``, not consumed), 1 running, 1 retrying, 1 failed, 1 dead,
    1 succeeded; globex: 1 dead."""
    await start_worker(queues=["default"])
    for _ in range(2):
        await client.submit("echo", tenant="acme", queue="slow")
    running = await client.submit("cancellable", tenant="acme")
    retrying = await client.submit("retry_later", {"delay": 60}, tenant="acme")
    failed = await client.submit("permanent", tenant="acme")
    dead_acme = await client.submit("always_fails", tenant="acme", max_attempts=1)
    done = await client.submit("echo", tenant="acme")
    dead_globex = await client.submit("always_fails", tenant="globex", max_attempts=1)
    expected = {
        running.id: Status.RUNNING,
        retrying.id: Status.RETRYING,
        failed.id: Status.FAILED,
        dead_acme.id: Status.DEAD,
        done.id: Status.SUCCEEDED,
        dead_globex.id: Status.DEAD,
    }

    async def settled() -> bool:
        return all([(await client.get(i)).status is s for i, s in expected.items()])

    await wait_until(settled)
    channel = Topology(client.store.namespace).tenant_channel
    await client.store.tenants.set_tenant("acme", weight=2, max_running=5, channel=channel)
    await client.store.tenants.set_tenant("globex", weight=3, paused=True, channel=channel)
    return Populated(dead_acme.id, dead_globex.id, running.id)


async def test_page_shows_every_state_of_the_keys_tenant_only(
    client: Client, start_worker: WorkerFactory
) -> None:
    """Acme's page counts each of its states, links its dead job, and shows nothing of globex."""
    jobs = await populate(client, start_worker)
    async with api_client(client) as http:
        response = await http.get("/dashboard", headers=ACME)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        assert "script-src" not in response.headers["content-security-policy"]
        page = tables_of(response.text)
        lanes = {(row[0], row[1]): row[2:7] for row in page.tables["Lanes"]}
        # waiting, running, retrying, failed, dead
        assert lanes == {
            ("default", "acme"): ["0", "1", "1", "1", "1"],
            ("slow", "acme"): ["2", "0", "0", "0", "0"],
        }
        oldest = next(row for row in page.tables["Lanes"] if row[0] == "slow")[7]
        assert oldest.endswith(" s"), oldest
        assert page.tables["Tenants"] == [["acme", "2", "5", "active"]]
        dead = page.tables["Recent dead jobs"]
        assert [(row[0], row[1], row[2]) for row in dead] == [
            (jobs.dead_acme, "always_fails", "acme")
        ]
        assert "always fails" in dead[0][3]
        assert f"/dashboard/jobs/{jobs.dead_acme}" in page.links
        assert "globex" not in response.text
        assert jobs.dead_globex not in response.text

        job_page = await http.get(f"/dashboard/jobs/{jobs.dead_acme}", headers=ACME)
        assert job_page.status_code == 200
        assert "&quot;status&quot;: &quot;dead&quot;" in job_page.text
        other = await http.get(f"/dashboard/jobs/{jobs.dead_globex}", headers=ACME)
        assert other.status_code == 404
        await client.cancel(jobs.running, "test over")


async def test_json_is_scoped_per_key_and_gains_a_drain_rate(
    client: Client, start_worker: WorkerFactory
) -> None:
    """Each key's JSON has only its tenant; with auth off every tenant; a second load has a rate."""
    jobs = await populate(client, start_worker)
    async with api_client(client) as http:
        acme = (await http.get("/dashboard.json", headers=ACME)).json()
        globex = (await http.get("/dashboard.json", headers=GLOBEX)).json()
    assert acme["tenant"] == "acme"
    assert {lane["tenant"] for lane in acme["lanes"]} == {"acme"}
    assert [job["id"] for job in acme["dead_jobs"]] == [jobs.dead_acme]
    assert acme["tenants"] == [{"name": "acme", "weight": 2, "paused": False, "max_running": 5}]
    assert [(t["name"], t["paused"]) for t in globex["tenants"]] == [("globex", True)]
    assert globex["tenant"] == "globex"
    assert [(lane["queue"], lane["dead"]) for lane in globex["lanes"]] == [("default", 1)]
    assert [job["id"] for job in globex["dead_jobs"]] == [jobs.dead_globex]
    assert "acme" not in str(globex)

    async with api_client(client, KeyRing({}, insecure_no_auth=True)) as http:
        first = (await http.get("/dashboard.json")).json()
        assert {lane["tenant"] for lane in first["lanes"]} == {"acme", "globex"}
        assert {job["id"] for job in first["dead_jobs"]} == {jobs.dead_acme, jobs.dead_globex}
        assert all(lane["drain_rate_per_second"] is None for lane in first["lanes"])
        echo = await client.submit("echo", tenant="acme")
        await client.wait(echo.id, timeout=20)
        second = (await http.get("/dashboard.json")).json()
    lane = next(x for x in second["lanes"] if (x["queue"], x["tenant"]) == ("default", "acme"))
    assert lane["drain_rate_per_second"] > 0
    await client.cancel(jobs.running, "test over")


async def test_json_needs_a_key(client: Client) -> None:
    """/dashboard.json without a key (or with a wrong one) is the API's JSON 401."""
    async with api_client(client) as http:
        for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}):
            response = await http.get("/dashboard.json", headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["kind"] == "unauthorized"


async def test_producer_text_is_escaped(client: Client) -> None:
    """A tenant, lane row and rejected reason holding <script> are rendered as text, not markup."""
    store = client.store
    request = ClaimRequest(str(uuid.uuid4()), "echo", "default", XSS, {}, 0, 3, None, None)
    await store.jobs.insert_job(request, relay_grace=60)
    await store.tenants.set_tenant(XSS, channel=Topology(store.namespace).tenant_channel)
    await store.dead.insert_rejected([(XSS, "detail", None, f"default.{XSS}", None, b"x")])
    async with api_client(client, KeyRing({}, insecure_no_auth=True)) as http:
        response = await http.get("/dashboard")
    assert response.status_code == 200
    assert "<script" not in response.text
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert response.text.count(escaped) == 3  # the lane's tenant, the tenants table, the reason
    page = tables_of(response.text)
    assert page.tables["Rejected messages"] == [[XSS, "1"]]


# --- login and cookie ---------------------------------------------------------------


def cookie_attributes(response: httpx.Response) -> tuple[str, set[str]]:
    header = response.headers["set-cookie"]
    first, *attributes = (part.strip() for part in header.split(";"))
    name, _, value = first.partition("=")
    assert name == DASHBOARD_COOKIE
    return value, {a.lower() for a in attributes}


async def test_login_sets_a_strict_http_only_cookie_that_opens_the_page(client: Client) -> None:
    """No key → 303 to the form; a wrong key → 401 form; the right key → cookie → the page."""
    async with api_client(client) as http:
        assert (await http.get("/")).headers["location"] == "/dashboard"
        bounced = await http.get("/dashboard")
        assert (bounced.status_code, bounced.headers["location"]) == (303, "/dashboard/login")
        form = await http.get("/dashboard/login")
        assert form.status_code == 200
        assert '<form method="post" action="/dashboard/login">' in form.text

        wrong = await http.post("/dashboard/login", data={"key": "wrong-key-0123456789"})
        assert wrong.status_code == 401
        assert "That API key is not valid." in wrong.text
        assert "set-cookie" not in wrong.headers
        empty = await http.post("/dashboard/login", data={"key": ""})
        assert empty.status_code == 401

        right = await http.post("/dashboard/login", data={"key": GLOBEX_KEY})
        assert (right.status_code, right.headers["location"]) == (303, "/dashboard")
        value, attributes = cookie_attributes(right)
        assert GLOBEX_KEY not in right.headers["set-cookie"]  # a session token, not the key
        assert len(value) >= 40
        assert {"httponly", "samesite=strict", "path=/dashboard"} <= attributes
        assert "secure" not in attributes
        assert any(a.startswith("max-age=") for a in attributes)
        cookie = {"Cookie": f"{DASHBOARD_COOKIE}={value}"}
        page = await http.get("/dashboard", headers=cookie)
        assert page.status_code == 200
        assert "tenant globex" in page.text
        assert "Sign out" in page.text
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf is not None

        stale = await http.get("/dashboard", headers={"Cookie": f"{DASHBOARD_COOKIE}=nope"})
        assert stale.status_code == 303
        forged = await http.post("/dashboard/logout", data={"csrf": "0" * 64}, headers=cookie)
        assert forged.status_code == 403  # a forged logout does not end the session
        assert (await http.get("/dashboard", headers=cookie)).status_code == 200
        out = await http.post("/dashboard/logout", data={"csrf": csrf.group(1)}, headers=cookie)
        assert out.status_code == 303
        assert "max-age=0" in out.headers["set-cookie"].lower()
        revoked = await http.get("/dashboard", headers=cookie)  # the old cookie, replayed
        assert (revoked.status_code, revoked.headers["location"]) == (303, "/dashboard/login")


async def test_cookie_is_secure_over_https_and_cross_site_posts_are_refused(
    client: Client,
) -> None:
    """Over https the cookie is Secure; a login posted from another origin is 403."""
    async with api_client(client) as http:
        secure = await http.post("https://api/dashboard/login", data={"key": ACME_KEY})
        assert secure.status_code == 303
        assert "secure" in cookie_attributes(secure)[1]
        forged = await http.post(
            "/dashboard/login", data={"key": ACME_KEY}, headers={"Origin": "https://evil.example"}
        )
        assert forged.status_code == 403
        assert "set-cookie" not in forged.headers
        same = await http.post(
            "/dashboard/login", data={"key": ACME_KEY}, headers={"Origin": "http://api"}
        )
        assert same.status_code == 303


@pytest.mark.parametrize("body", [{"content": b'{"key": "x"}'}, {"content": b"k=" * 3000}])
async def test_login_refuses_other_bodies(client: Client, body: dict[str, Any]) -> None:
    """A login that is not a small urlencoded form is refused with a JSON error, not a 500."""
    async with api_client(client) as http:
        json_body = await http.post(
            "/dashboard/login", headers={"Content-Type": "application/json"}, **body
        )
        assert json_body.status_code == 415
        form = await http.post(
            "/dashboard/login",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            **body,
        )
        assert form.status_code in (400, 401, 413)
