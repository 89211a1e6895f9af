"""Unique jobs against the real services: every producer, races, windows, states, parts."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import httpx
import pytest
from prometheus_client import CollectorRegistry

from coldbrew.api import ApiConfig, create_app
from coldbrew.api.auth import KeyRing
from coldbrew.app import App, load_app
from coldbrew.client import Client
from coldbrew.errors import InvalidRequest
from coldbrew.metrics import Metrics
from coldbrew.model import JobFields
from coldbrew.settings import Settings
from coldbrew.store import UniqueKey
from coldbrew.topology import Topology
from tests.e2e.test_cli import cli_env, run_cli
from tests.helpers import DATABASE_URL, WorkerFactory, metric, publish_raw, wait_until


@pytest.fixture
def unique_app() -> App:
    return load_app("tests.unique_apps:app")


@pytest.fixture
async def uclient(settings: Settings, unique_app: App) -> AsyncIterator[Client]:
    async with Client.connect(settings, app=unique_app) as connected:
        connected.metrics = Metrics(CollectorRegistry())
        yield connected


async def count_jobs(settings: Settings, job_type: str) -> int:
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        return int(
            await conn.fetchval(
                f'SELECT count(*) FROM "{settings.namespace}".jobs WHERE type = $1', job_type
            )
        )
    finally:
        await conn.close()


def raw_body(job_type: str, args: dict[str, Any]) -> bytes:
    return json.dumps({"type": job_type, "args": args}).encode()


async def test_many_producers_at_once_make_one_job(
    settings: Settings,
    unique_app: App,
    uclient: Client,
    start_worker: WorkerFactory,
    amqp: aio_pika.abc.AbstractChannel,
) -> None:
    """Two Clients racing with raw AMQP producers: one job; every caller learns its id."""
    worker = await start_worker(app=unique_app)
    args = {"account": "a-1"}
    raw_ids = [str(uuid.uuid4()) for _ in range(6)]
    async with Client.connect(settings, app=unique_app) as other:
        records = await asyncio.gather(
            *[c.submit("sync_account", args) for c in (uclient, other) for _ in range(10)],
            *[
                publish_raw(
                    amqp,
                    settings.namespace,
                    raw_body("sync_account", args),
                    "default.default",
                    message_id=message_id,
                )
                for message_id in raw_ids
            ],
        )
    submitted = [r for r in records if r is not None]
    ids = {r.id for r in submitted}
    assert len(ids) == 1, ids
    (job_id,) = ids
    # the raw messages were all acked: each one a duplicate, or the one that created the job
    raw_dupes = len(raw_ids) - (job_id in raw_ids)
    await wait_until(
        lambda: _holds(
            metric(worker, "coldbrew_unique_duplicates_total", type="sync_account", source="amqp")
            == raw_dupes
        )
    )
    assert sum(r.duplicate for r in submitted) == len(submitted) - (job_id not in raw_ids)
    finished = await uclient.wait(job_id, timeout=20)
    assert finished.status == "succeeded"
    assert await count_jobs(settings, "sync_account") == 1
    for message_id in raw_ids:  # a raw duplicate's message id names the job it duplicated
        assert (await uclient.get(message_id)).id == job_id
    # succeeded within the window is still a duplicate (default states); the same raw
    # message id published again is still the same job
    again = await uclient.submit("sync_account", args)
    assert (again.id, again.duplicate) == (job_id, True)
    repeated = next(message_id for message_id in raw_ids if message_id != job_id)
    await publish_raw(
        amqp,
        settings.namespace,
        raw_body("sync_account", args),
        "default.default",
        message_id=repeated,
    )
    await wait_until(
        lambda: _holds(
            metric(worker, "coldbrew_unique_duplicates_total", type="sync_account", source="amqp")
            == raw_dupes + 1
        )
    )
    other_args = await uclient.submit("sync_account", {"account": "a-2"})
    assert not other_args.duplicate and other_args.id != job_id
    await uclient.wait(other_args.id, timeout=20)
    assert await count_jobs(settings, "sync_account") == 2
    client_dupes = uclient.metrics.registry.get_sample_value(  # type: ignore[union-attr]
        "coldbrew_unique_duplicates_total", {"type": "sync_account", "source": "client"}
    )
    assert client_dupes is not None and client_dupes >= 10


async def _holds(value: bool) -> bool:
    return value


async def test_a_new_job_after_the_window_or_outside_the_states(
    settings: Settings, uclient: Client
) -> None:
    """``ping`` is unique for 1 s; a cancelled job (not in the default states) frees its key."""
    first = await uclient.submit("ping", {"target": "db"})
    same = await uclient.submit("ping", {"target": "db"}, tenant="globex")  # args only
    assert (same.id, same.duplicate, first.duplicate) == (first.id, True, False)
    await asyncio.sleep(1.1)
    later = await uclient.submit("ping", {"target": "db"})
    assert not later.duplicate and later.id != first.id

    crawl = await uclient.submit("crawl", {"domain": "example.org", "page": 1})
    other_page = await uclient.submit("crawl", {"domain": "example.org", "page": 7})
    assert (other_page.id, other_page.duplicate) == (crawl.id, True)  # unique_keys=("domain",)
    await uclient.cancel(crawl.id)
    fresh = await uclient.submit("crawl", {"domain": "example.org", "page": 7})
    assert not fresh.duplicate and fresh.id != crawl.id
    # the submission's own states: a cancelled job counts when it says so
    await uclient.cancel(fresh.id)
    held = await uclient.submit(
        "crawl", {"domain": "example.org"}, unique_states=("queued", "cancelled")
    )
    assert (held.id, held.duplicate) == (fresh.id, True)


async def test_parts_tenant_queue_and_per_submission_options(
    settings: Settings, uclient: Client
) -> None:
    """Default parts are args and tenant; a submission may make any type unique."""
    acme = await uclient.submit("sync_account", {"account": "b"}, tenant="acme")
    globex = await uclient.submit("sync_account", {"account": "b"}, tenant="globex")
    full = await uclient.submit("sync_account", {"account": "b", "full": True}, tenant="acme")
    assert len({acme.id, globex.id, full.id}) == 3
    assert not any(r.duplicate for r in (acme, globex, full))
    by_queue = await uclient.submit(
        "sync_account", {"account": "c"}, unique_by=("args", "queue"), queue="slow"
    )
    other_lane = await uclient.submit(
        "sync_account", {"account": "c"}, unique_by=("args", "queue"), queue="default"
    )
    assert by_queue.id != other_lane.id

    plain = [await uclient.submit("plain", {"x": 1}) for _ in range(2)]
    assert plain[0].id != plain[1].id  # not unique unless asked
    once = [await uclient.submit("plain", {"x": 2}, unique_for="1h") for _ in range(2)]
    assert (once[1].id, once[1].duplicate) == (once[0].id, True)

    # another idempotency key is still a duplicate by args; but a key that names an
    # existing job returns that job, whoever holds the unique key (the explicit way wins)
    keyed = await uclient.submit("plain", {"x": 2}, unique_for="1h", idempotency_key="k-1")
    assert (keyed.id, keyed.duplicate) == (once[0].id, True)
    explicit = await uclient.submit("plain", {"x": 4}, idempotency_key="k-2")
    holder = await uclient.submit("plain", {"x": 4}, unique_for="1h")
    assert holder.id != explicit.id and not holder.duplicate  # explicit holds no unique key
    replay = await uclient.submit("plain", {"x": 4}, unique_for="1h", idempotency_key="k-2")
    assert (replay.id, replay.duplicate) == (explicit.id, False)

    for bad, mentions in (
        ({"unique_for": -1}, "positive"),
        ({"unique_for": "soon"}, "not a duration"),
        ({"unique_for": 5, "unique_by": ("colour",)}, "unknown 'colour'"),
        ({"unique_for": 5, "unique_states": ("done",)}, "unknown 'done'"),
        ({"unique_by": ("args",)}, "needs unique_for"),
    ):
        with pytest.raises(InvalidRequest, match=mentions):
            await uclient.submit("plain", {}, **bad)  # type: ignore[arg-type]


async def test_submit_without_unique_is_one_statement(uclient: Client) -> None:
    """The hot path: a submission of a type without unique_for sends only insert_job."""
    sent: list[str] = []
    jobs = uclient.store.jobs
    original = jobs._fetchrow

    async def counting(name: str, *args: Any) -> Any:
        sent.append(name)
        return await original(name, *args)

    jobs._fetchrow = counting  # type: ignore[method-assign]
    uclient.store.unique._fetchrow = counting  # type: ignore[method-assign]
    await uclient.submit("plain", {"x": 3})
    assert sent == ["insert_job"]
    sent.clear()
    await uclient.submit("sync_account", {"account": "hot"})
    assert sent == ["insert_unique_job"]  # a new unique job: one statement too


KEY = "acme-key-0123456789"
GLOBEX_KEY = "globex-key-0123456789"


async def test_http_duplicate_is_200_and_bad_options_422(uclient: Client) -> None:
    app = create_app(uclient, KeyRing({KEY: "acme", GLOBEX_KEY: "globex"}), ApiConfig())
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as http:
        body = {"type": "plain", "args": {"x": 9}, "unique_for": "10m", "unique_by": ["args"]}
        first = await http.post("/jobs", json=body, headers=headers)
        assert first.status_code == 202, first.text
        second = await http.post("/jobs", json=body, headers=headers)
        assert second.status_code == 200, second.text
        assert second.json()["id"] == first.json()["id"]
        assert second.headers["location"] == f"/jobs/{first.json()['id']}"
        registered = await http.post(
            "/jobs", json={"type": "crawl", "args": {"domain": "d"}}, headers=headers
        )
        again = await http.post(
            "/jobs", json={"type": "crawl", "args": {"domain": "d"}}, headers=headers
        )
        assert (registered.status_code, again.status_code) == (202, 200)
        # ping is unique by args only: across tenants, which a tenant's key must not see
        mine = await http.post(
            "/jobs", json={"type": "ping", "args": {"target": "t"}}, headers=headers
        )
        theirs = await http.post(
            "/jobs",
            json={"type": "ping", "args": {"target": "t"}},
            headers={"Authorization": f"Bearer {GLOBEX_KEY}"},
        )
        assert (mine.status_code, theirs.status_code) == (202, 409), theirs.text
        assert theirs.json()["error"]["kind"] == "unique_conflict"
        assert mine.json()["id"] not in theirs.text
        for bad, kind in (
            ({"unique_for": -5}, "invalid_body"),
            ({"unique_for": "later"}, "invalid_body"),
            ({"unique_for": 5, "unique_by": ["colour"]}, "invalid_body"),
            ({"unique_for": 5, "unique_states": ["finished"]}, "invalid_body"),
            ({"unique_for": True}, "invalid_body"),
            ({"unique_for": 5, "unique_by": "args"}, "invalid_body"),
        ):
            response = await http.post("/jobs", json={"type": "plain", **bad}, headers=headers)
            assert response.status_code == 422, (bad, response.text)
            assert response.json()["error"]["kind"] == kind, response.text


async def test_cli_unique_flags(settings: Settings) -> None:
    env = cli_env(settings)
    args = (
        "submit",
        "plain",
        "--args",
        '{"x": 5}',
        "--unique-for",
        "1h",
        "--unique-by",
        "args,tenant",
    )
    # the option checks are the Client's (tested above); the CLI turns them into exit 2
    bad_flags = ("submit", "plain", "--unique-for", "1h", "--unique-by", "colour")
    first, second, bad = await asyncio.gather(
        run_cli(env, *args), run_cli(env, *args), run_cli(env, *bad_flags)
    )
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    ids = {json.loads(first.stdout)["id"], json.loads(second.stdout)["id"]}
    assert len(ids) == 1
    assert "a duplicate of job" in first.stderr + second.stderr
    assert bad.returncode == 2, bad.stderr
    assert "unknown 'colour'" in bad.stderr and "Traceback" not in bad.stderr


async def test_raw_duplicates_of_a_capped_tenant(
    settings: Settings,
    unique_app: App,
    uclient: Client,
    start_worker: WorkerFactory,
    amqp: aio_pika.abc.AbstractChannel,
) -> None:
    """The capped claim path admits unique deliveries too: one job, the rest acked."""
    channel = Topology(settings.namespace).tenant_channel
    await uclient.store.tenants.set_tenant("capped", max_running=1, channel=channel)
    worker = await start_worker(app=unique_app)
    ids = [str(uuid.uuid4()) for _ in range(4)]
    for message_id in ids:
        await publish_raw(
            amqp,
            settings.namespace,
            raw_body("sync_account", {"account": "cap"}),
            "default.capped",
            message_id=message_id,
        )
    await wait_until(
        lambda: _holds(
            metric(worker, "coldbrew_unique_duplicates_total", type="sync_account", source="amqp")
            == 3
        )
    )
    jobs = {(await uclient.get(message_id)).id for message_id in ids}
    assert len(jobs) == 1
    (job_id,) = jobs
    assert (await uclient.wait(job_id, timeout=20)).status == "succeeded"
    assert await count_jobs(settings, "sync_account") == 1


async def test_admission_maps_a_duplicate_and_its_id_reaches_the_job(
    uclient: Client, unique_app: App
) -> None:
    """The worker's admission (store level, no worker): a free key inserts the row queued;
    a held one maps the message id, which then reads and cancels the job it names."""
    spec = unique_app.get("sync_account")
    assert spec.unique is not None
    held = await uclient.submit("sync_account", {"account": "adm"})

    def delivery(job_id: str, account: str) -> JobFields:
        args = spec.validate_args({"account": account})
        return JobFields(job_id, "sync_account", "default", "default", args, 0, 3, None, None)

    dup = delivery("raw-dup-1", "adm")
    admission = await uclient.store.unique.admit_delivery(dup, UniqueKey.of(dup, spec.unique))
    assert admission.duplicate_of == held.id
    again = await uclient.store.unique.admit_delivery(dup, UniqueKey.of(dup, spec.unique))
    assert again.duplicate_of == held.id  # a redelivery: the alias answers
    free = delivery("raw-new-1", "other")
    assert (
        await uclient.store.unique.admit_delivery(free, UniqueKey.of(free, spec.unique))
    ).duplicate_of is None
    assert (await uclient.get("raw-new-1")).status == "queued"  # the claim would run it
    assert (await uclient.get("raw-dup-1")).id == held.id
    cancelled = await uclient.cancel("raw-dup-1")
    assert (cancelled.id, cancelled.status) == (held.id, "cancelled")
