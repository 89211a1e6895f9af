"""The HTTP API in process (httpx's ASGI transport) against the real RabbitMQ and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.routing import Route

from coldbrew.api import ApiConfig, create_app
from coldbrew.api.app import ROUTES
from coldbrew.api.auth import KeyRing
from coldbrew.api.openapi import SPEC
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.e2e.test_cli import STATUS_KEYS
from tests.helpers import WorkerFactory, make_settings

ACME_KEY = "acme-key-0123456789"
GLOBEX_KEY = "globex-key-0123456789"
ACME = {"Authorization": f"Bearer {ACME_KEY}"}
GLOBEX = {"Authorization": f"Bearer {GLOBEX_KEY}"}
KEYS = {ACME_KEY: "acme", GLOBEX_KEY: "globex"}


def api_client(client: Client, keys: KeyRing | None = None, **config: Any) -> httpx.AsyncClient:
    app = create_app(client, keys or KeyRing(KEYS), ApiConfig(**config))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")


@pytest.fixture
async def http(client: Client) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(client, max_wait_seconds=10, sse_keepalive_seconds=0.3) as connected:
        yield connected


async def submit(http: httpx.AsyncClient, body: dict[str, Any], **headers: str) -> httpx.Response:
    return await http.post("/jobs", json=body, headers={**ACME, **headers})


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return dict(body["error"])


# --- submit ----------------------------------------------------------------------


async def test_submit_returns_202_location_and_status(http: httpx.AsyncClient) -> None:
    """POST /jobs answers 202 with the status JSON, a Location and the key's tenant."""
    response = await submit(http, {"type": "echo", "args": {"value": 1}, "priority": 3})
    assert response.status_code == 202, response.text
    status = response.json()
    assert set(status) == STATUS_KEYS
    assert (status["type"], status["tenant"], status["status"]) == ("echo", "acme", "queued")
    assert status["priority"] == 3
    assert response.headers["location"] == f"/jobs/{status['id']}"
    again = await http.get(response.headers["location"], headers=ACME)
    assert again.status_code == 200
    assert again.json()["id"] == status["id"]


async def test_idempotency_key_returns_the_same_job(http: httpx.AsyncClient) -> None:
    """The same Idempotency-Key twice gives one job; another key gives another."""
    first = await submit(http, {"type": "echo"}, **{"Idempotency-Key": "upload-1"})
    second = await submit(http, {"type": "echo"}, **{"Idempotency-Key": "upload-1"})
    other = await submit(http, {"type": "echo"}, **{"Idempotency-Key": "upload-2"})
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"] != other.json()["id"]


@pytest.mark.parametrize(
    ("content", "status", "kind", "mentions"),
    [
        (b"{not json", 400, "invalid_json", "not JSON"),
        (b"[1, 2]", 422, "invalid_body", "JSON object"),
        (b'{"args": {}}', 422, "invalid_body", "type"),
        (b'{"type": "echo", "prority": 1}', 422, "invalid_body", "prority"),
        (b'{"type": "echo", "priority": 12}', 422, "invalid_body", "priority"),
        (b'{"type": "echo", "priority": "5"}', 422, "invalid_body", "priority"),
        (b'{"type": "echo", "args": [1]}', 422, "invalid_body", "args"),
        (b'{"type": "echo", "tenant": "globex"}', 403, "tenant_mismatch", "globex"),
        (b'{"type": "no_such_job"}', 422, "unknown_type", "no_such_job"),
        (b'{"type": "echo", "args": {"nope": 1}}', 422, "invalid_args", "nope"),
    ],
    ids=[
        "not-json",
        "not-object",
        "no-type",
        "unknown-field",
        "priority-12",
        "priority-string",
        "args-array",
        "other-tenant",
        "unknown-type",
        "bad-args",
    ],
)
async def test_bad_submissions_get_specific_errors(
    http: httpx.AsyncClient, content: bytes, status: int, kind: str, mentions: str
) -> None:
    """Each kind of bad submission gets its own status, kind and a message naming the fault."""
    response = await http.post(
        "/jobs", content=content, headers={**ACME, "Content-Type": "application/json"}
    )
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["kind"] == kind
    assert mentions in error["message"]


async def test_oversize_body_is_413(client: Client) -> None:
    """A body over the limit is refused with 413 before it is parsed."""
    async with api_client(client, max_body_bytes=2048) as http:
        big = {"type": "echo", "args": {"value": "x" * 4096}}
        response = await submit(http, big)
        assert response.status_code == 413
        assert error_of(response)["kind"] == "too_large"
        small = await submit(http, {"type": "echo", "args": {"value": "x" * 100}})
        assert small.status_code == 202


async def test_form_body_is_415(http: httpx.AsyncClient) -> None:
    """A body that is not declared as JSON is refused with 415."""
    response = await http.post("/jobs", data={"type": "echo"}, headers=ACME)
    assert response.status_code == 415
    assert error_of(response)["kind"] == "unsupported_media_type"


# --- auth and tenants ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "challenge"),
    [
        ({}, 'Bearer realm="coldbrew"'),
        ({"Authorization": "Basic YWxhZGRpbjpvcGVu"}, 'Bearer realm="coldbrew"'),
        ({"Authorization": "Bearer wrong-key-0123456789"}, 'error="invalid_token"'),
    ],
    ids=["missing", "not-bearer", "wrong-key"],
)
async def test_missing_or_invalid_key_is_401(
    http: httpx.AsyncClient, headers: dict[str, str], challenge: str
) -> None:
    """Without a valid key every job endpoint answers 401 with a WWW-Authenticate challenge."""
    for method, path in [("POST", "/jobs"), ("GET", "/jobs/x"), ("DELETE", "/jobs/x")]:
        response = await http.request(method, path, json={"type": "echo"}, headers=headers)
        assert response.status_code == 401, (method, path)
        assert challenge in response.headers["www-authenticate"]
        assert error_of(response)["kind"] == "unauthorized"


async def test_other_tenants_job_is_404_like_a_missing_one(http: httpx.AsyncClient) -> None:
    """Globex's key gets 404 for acme's job on every endpoint, exactly as for a missing id."""
    job = (await submit(http, {"type": "echo"})).json()
    missing = await http.get("/jobs/no-such-job", headers=GLOBEX)
    assert missing.status_code == 404
    for method, path in [
        ("GET", f"/jobs/{job['id']}"),
        ("GET", f"/jobs/{job['id']}/events"),
        ("DELETE", f"/jobs/{job['id']}"),
    ]:
        response = await http.request(method, path, headers=GLOBEX)
        assert response.status_code == 404, (method, path, response.text)
        assert error_of(response)["kind"] == "not_found"
        assert acme_leak_free(response.text)
    still = await http.get(f"/jobs/{job['id']}", headers=ACME)
    assert still.json()["status"] == "queued"  # globex's DELETE did not cancel it


def acme_leak_free(text: str) -> bool:
    return "acme" not in text and "echo" not in text


async def test_insecure_mode_serves_every_tenant(client: Client) -> None:
    """With auth explicitly off, no key is needed and the body's tenant is used."""
    async with api_client(client, KeyRing({}, insecure_no_auth=True)) as http:
        response = await http.post("/jobs", json={"type": "echo", "tenant": "initech"})
        assert response.status_code == 202
        assert response.json()["tenant"] == "initech"
        assert (await http.get(response.headers["location"])).status_code == 200


# --- reads: ETag, long polls, events ----------------------------------------------


async def test_if_none_match_gives_304_with_the_same_etag(http: httpx.AsyncClient) -> None:
    """A GET with the job's current ETag answers 304 carrying that ETag; a stale one gets 200."""
    location = (await submit(http, {"type": "echo"})).headers["location"]
    first = await http.get(location, headers=ACME)
    etag = first.headers["etag"]
    assert etag.startswith('"') and etag.endswith('"')
    cached = await http.get(location, headers={**ACME, "If-None-Match": etag})
    assert cached.status_code == 304
    assert cached.headers["etag"] == etag
    assert cached.content == b""
    stale = await http.get(location, headers={**ACME, "If-None-Match": '"stale"'})
    assert stale.status_code == 200
    assert stale.json() == first.json()


async def test_long_poll_times_out_with_304_then_follows_to_success(
    http: httpx.AsyncClient, start_worker: WorkerFactory
) -> None:
    """?wait holds an unchanged job until the deadline (304), then returns each change (200)."""
    location = (await submit(http, {"type": "sleep_for", "args": {"seconds": 0.3}})).headers[
        "location"
    ]
    etag = (await http.get(location, headers=ACME)).headers["etag"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    held = await http.get(f"{location}?wait=0.6", headers={**ACME, "If-None-Match": etag})
    assert held.status_code == 304
    assert loop.time() - started >= 0.55
    await start_worker()
    seen = []
    for _ in range(20):
        response = await http.get(f"{location}?wait=8", headers={**ACME, "If-None-Match": etag})
        assert response.status_code == 200, response.status_code
        assert response.headers["etag"] != etag
        etag = response.headers["etag"]
        seen.append(response.json()["status"])
        if seen[-1] == "succeeded":
            break
    assert seen[-1] == "succeeded"
    assert response.json()["result"] == 0.3


async def test_long_poll_without_etag_returns_on_the_first_change(
    http: httpx.AsyncClient, start_worker: WorkerFactory
) -> None:
    """?wait without If-None-Match waits for a change from the state at the request."""
    location = (await submit(http, {"type": "echo", "args": {"value": 7}})).headers["location"]
    poll = asyncio.create_task(http.get(f"{location}?wait=8", headers=ACME))
    await asyncio.sleep(0.3)
    assert not poll.done()  # nothing changed yet: it is waiting
    await start_worker()
    response = await poll
    assert response.status_code == 200
    assert response.json()["status"] in ("running", "succeeded")


async def test_wait_out_of_range_is_422(http: httpx.AsyncClient) -> None:
    """?wait over the configured maximum, negative or not a number is a 422."""
    location = (await submit(http, {"type": "echo"})).headers["location"]
    for wait in ("11", "-1", "soon", "nan"):
        response = await http.get(f"{location}?wait={wait}", headers=ACME)
        assert response.status_code == 422, wait
        assert error_of(response)["kind"] == "invalid_wait"


def parse_events(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            events.append(fields)
    return events


async def test_events_stream_changes_until_terminal(
    http: httpx.AsyncClient, start_worker: WorkerFactory
) -> None:
    """/events sends a status event per change (progress included) and ends at the terminal one."""
    job = (
        await submit(http, {"type": "progress_steps", "args": {"steps": 3, "pause": 0.4}})
    ).json()
    await start_worker()
    response = await http.get(f"/jobs/{job['id']}/events", headers=ACME, timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = parse_events(response.text)
    statuses = [json.loads(event["data"]) for event in events]
    assert all(event["event"] == "status" for event in events)
    assert statuses[-1]["status"] == "succeeded"
    assert any(s["status"] == "running" and s["progress"] for s in statuses)
    ids = [event["id"] for event in events]
    assert len(ids) == len(set(ids)), "an unchanged state was sent twice"
    again = await http.get(f"/jobs/{job['id']}/events", headers={**ACME, "Last-Event-ID": ids[-1]})
    assert parse_events(again.text) == []  # it has the final state: nothing more to send


# --- cancel ---------------------------------------------------------------------------


async def test_delete_cancels_idempotently(http: httpx.AsyncClient) -> None:
    """DELETE cancels a queued job (200) with the reason given; repeating it changes nothing."""
    location = (await submit(http, {"type": "echo"})).headers["location"]
    first = await http.delete(f"{location}?reason=changed+my+mind", headers=ACME)
    assert first.status_code == 200
    assert first.json()["status"] == "cancelled"
    assert first.json()["error"]["message"] == "changed my mind"
    second = await http.delete(location, headers=ACME)
    assert second.status_code == 200
    assert second.json() == first.json()


async def test_delete_of_a_finished_job_is_409(
    http: httpx.AsyncClient, start_worker: WorkerFactory
) -> None:
    """DELETE of a job that already succeeded is 409, and the error carries the job's state."""
    location = (await submit(http, {"type": "echo"})).headers["location"]
    await start_worker()
    done = await http.get(f"{location}?wait=8", headers=ACME)
    while done.json()["status"] != "succeeded":
        done = await http.get(
            f"{location}?wait=8", headers={**ACME, "If-None-Match": done.headers["etag"]}
        )
    response = await http.delete(location, headers=ACME)
    assert response.status_code == 409
    error = error_of(response)
    assert error["kind"] == "already_finished"
    assert error["job"]["status"] == "succeeded"


# --- probes, OpenAPI, services down --------------------------------------------------


async def test_probes_and_openapi_need_no_key(http: httpx.AsyncClient) -> None:
    """/healthz, /readyz and /openapi.json answer without a key."""
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    assert (await http.get("/readyz")).status_code == 200
    spec = (await http.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.")


def test_openapi_documents_every_route() -> None:
    """Every route and method of the app is a path and operation of /openapi.json."""
    for route in ROUTES:
        assert isinstance(route, Route)
        methods = (route.methods or set()) - {"HEAD"}
        for method in methods:
            assert method.lower() in SPEC["paths"].get(route.path, {}), (method, route.path)
    documented = {(path, m) for path, ops in SPEC["paths"].items() for m in ops}
    served = {
        (r.path, m.lower()) for r in ROUTES if isinstance(r, Route) for m in (r.methods or ())
    }
    assert documented <= served, documented - served


class Proxy:
    """A TCP proxy to PostgreSQL that a test can cut: the database 'goes away' for this client."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writers += [writer, up_writer]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


async def test_database_down_is_503_without_traceback(settings: Settings) -> None:
    """With PostgreSQL unreachable, reads and submissions answer 503 with a clear JSON error."""
    proxy = Proxy(5432)
    port = await proxy.start()
    via_proxy = make_settings(
        settings.namespace, database_url=f"postgresql://127.0.0.1:{port}/coldbrew_test"
    )
    async with Client.connect(via_proxy) as client, api_client(client) as http:
        location = (await submit(http, {"type": "echo"})).headers["location"]
        await proxy.cut()
        for response in [
            await http.get(location, headers=ACME),
            await submit(http, {"type": "echo"}),
            await http.get("/readyz"),
        ]:
            assert response.status_code == 503, response.text
            assert "Traceback" not in response.text
        error = error_of(await http.get(location, headers=ACME))
        assert error["kind"] == "database_unavailable"
        assert "PostgreSQL" in error["message"]
