"""One real worker process fed generated garbage, interleaved with good jobs (issue #13).

Hypothesis generates message bodies (NUL, lone surrogates escaped and raw,
NaN and Infinity, 1e-300 and 1e308, numbers past a double, huge integers,
deep nesting, bytes that are not UTF-8, empty and over-long strings), headers
(the same in x-idempotency-key, x-max-attempts, x-timeout-seconds and junk
headers, byte arrays, nested tables), routing keys and message ids, and jobs
whose own result, error, progress or checkpoint PostgreSQL cannot store. Each
example is published with one good job; it passes when every message ended
as a terminal job or a rejected message with a reason, the good job
succeeded, each misbehaving job ended as tests.apps.MISBEHAVIOURS says, and
the worker is still running. The issue's own messages are explicit examples.

Nothing here stops or restarts a service. Bounded: 200 examples, well
under 90 s on the 2-core machine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import pytest
from hypothesis import HealthCheck, Phase, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from coldbrew.settings import Settings
from tests.apps import MISBEHAVIOURS, POOL_MISBEHAVIOURS
from tests.faults.harness import Fleet, WorkerProcess, is_ready
from tests.helpers import DATABASE_URL, make_settings

pytestmark = pytest.mark.timeout(300)

_serial = itertools.count()


@dataclass
class Sent:
    """One published message and what it must end as."""

    tag: str  # the x-test-case header: finds its rejected row
    job_id: str | None  # the job it becomes if accepted
    must: str  # "succeed", "reject", "either", or "misbehave:<kind>"
    description: str = ""


@dataclass
class Case:
    """What one example publishes: garbage, a misbehaving job, and a good job."""

    garbage: list[tuple[bytes, str, dict[str, Any], str]] = field(default_factory=list)
    misbehave: tuple[str, str, bool] | None = None  # (kind, text, in the pool)

    def __repr__(self) -> str:  # short: a failing example's report, not 300 kB of it
        shown = [(_short(body), key, props, mode) for body, key, props, mode in self.garbage]
        return f"Case(garbage={shown!r}, misbehave={self.misbehave!r})"


def _short(body: bytes) -> bytes:
    return body if len(body) <= 160 else body[:120] + b"...(%d bytes)" % len(body)


# --- strategies ---------------------------------------------------------------------------

NASTY_TEXT = ["", "\x00", "a\x00b", "\ud800", "\udfff tail", "\\u0000", "é", "\U0001f600"]
_text = st.text(st.characters(codec=None), max_size=10) | st.sampled_from(NASTY_TEXT)
_number_text = st.sampled_from(
    ["1e-300", "1e308", "1e309", "-1e400", "NaN", "Infinity", "-Infinity", "-0", "9" * 5000]
)
_scalar = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats()
    | _text
)
_value = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=10,
)


def _dumps(value: Any, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only, allow_nan=True)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A job-ish body: JSON with garbage in it, or garbage that is barely JSON."""
    choice = draw(st.integers(0, 6))
    if choice == 0:  # raw bytes, maybe not UTF-8
        return draw(st.binary(max_size=40))
    if choice == 1:  # a number literal Python's json reads and jsonb does not (or does)
        return b'{"type":"echo","args":{"value":' + draw(_number_text).encode() + b"}}"
    if choice == 2:  # deep nesting: under, at and past 100 levels, and past json's own
        levels = draw(st.sampled_from([99, 100, 101, 150, 999, 5000]))
        return b'{"type":"echo","args":{"value":' + b"[" * levels + b"]" * levels + b"}}"
    if choice == 3:  # an over-long string: past COLDBREW_MAX_BODY_BYTES
        return b'{"type":"echo","args":{"value":"' + b"x" * 300_000 + b'"}}'
    if choice == 4:  # the wrong shape
        document: Any = draw(
            st.sampled_from(
                [[], "echo", {"args": {}}, {"type": ""}, {"type": 5}, {"type": "echo", "args": []}]
            )
        )
        return _dumps(document, True).encode()
    job_type = draw(st.sampled_from(["echo", "echo", "echo", "no_such_job", "echo\x00", "é"]))
    args: Any = {"value": draw(_value)}
    if draw(st.booleans()):
        args[draw(_text)] = draw(_value)  # an unexpected key: invalid_args, or NUL in it
    text = _dumps({"type": job_type, "args": args}, draw(st.booleans()))
    encoded = text.encode("utf-8", "surrogatepass")  # raw surrogates when not ASCII-escaped
    if choice == 5 and encoded:
        cut = draw(st.integers(0, len(encoded)))
        encoded = encoded[:cut] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b""]))
        encoded += text.encode("utf-8", "surrogatepass")[cut:]
    return encoded


# AMQP carries any UTF-8 in a header, NUL included; a lone surrogate has no UTF-8 form, so
# no producer can send one (pamqp cannot encode it): header text is drawn without them
_header_text = st.text(st.characters(codec="utf-8"), max_size=10) | st.sampled_from(
    ["", "\x00", "a\x00b", "\\u0000", "é", "\U0001f600"]
)
_header_value = (
    _header_text
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(min_value=-1e30, max_value=1e30)  # RabbitMQ refuses NaN; pamqp, floats past 3e38
    | st.sampled_from([1e-300, 5e-324, 0.001, True, False, None])
    | st.binary(max_size=6).map(bytearray)
    | st.sampled_from(["1e-300", "1e308", "nan", "inf", "-5", "0.0005", "many", "3"])
)


@st.composite
def headers(draw: st.DrawFn) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in draw(
        st.lists(
            st.sampled_from(["x-idempotency-key", "x-max-attempts", "x-timeout-seconds"]),
            unique=True,
            max_size=3,
        )
    ):
        found[name] = draw(
            _header_value | st.text(st.characters(codec="utf-8"), min_size=255, max_size=260)
        )
    if draw(st.booleans()):  # junk a rejected row must still store
        junk_key = draw(st.sampled_from(["x-junk", "x-junk\x00", "x-é", "x-\U0001f600"]))
        found[junk_key] = draw(
            _header_value
            | st.dictionaries(
                st.sampled_from(["a", "b\x00"]), _header_value | st.lists(_header_value, max_size=2)
            )
        )
    return found


_routing = st.sampled_from(
    ["default.default"] * 6 + ["default.t\x00", "default.Bad!", "nodot", "default.gen1", "slow.x\n"]
)


@st.composite
def garbage(draw: st.DrawFn) -> tuple[bytes, str, dict[str, Any], str]:
    """(body, routing key, properties, id mode) of one message a producer should not send."""
    props: dict[str, Any] = {"headers": draw(headers())}
    if draw(st.integers(0, 5)) == 0:
        props["priority"] = draw(st.integers(0, 255))
    if draw(st.integers(0, 4)) == 0:
        return draw(known_bad())
    id_mode = draw(st.sampled_from(["good"] * 5 + ["nul", "long", "space"]))
    return draw(bodies()), draw(_routing), props, id_mode


KNOWN_BAD: list[tuple[bytes, dict[str, Any]]] = [
    (b'{"type":"echo","args":{"value":"a\\u0000b"}}', {}),
    (b'{"type":"echo","args":{"value":{"k\\u0000":1}}}', {}),
    (b'{"type":"echo","args":{"value":"\\ud800"}}', {}),
    (b'{"type":"echo","args":{"value":"\xed\xa0\x80"}}', {}),
    (b'{"type":"echo","args":{"value":NaN}}', {}),
    (b'{"type":"echo","args":{"value":1e400}}', {}),
    (b'{"type":"echo","args":{"value":' + b"[" * 150 + b"]" * 150 + b"}}", {}),
    (b'{"type":"echo","args":{"value":' + b"[" * 5000 + b"]" * 5000 + b"}}", {}),
    (b'{"type":"echo","args":{}}', {"headers": {"x-idempotency-key": "k\x00"}}),
    (b'{"type":"echo","args":{}}', {"headers": {"x-idempotency-key": bytearray(b"\xff")}}),
    (b'{"type":"echo","args":{}}', {"headers": {"x-timeout-seconds": 1e-300}}),
    (b'{"type":"echo","args":{}}', {"headers": {"x-timeout-seconds": "1e308"}}),
    (b'{"type":"echo","args":{}}', {"headers": {"x-max-attempts": True}}),
]


@st.composite
def known_bad(draw: st.DrawFn) -> tuple[bytes, str, dict[str, Any], str]:
    """Messages that must be rejected (with junk headers, which must store too)."""
    body, props = draw(st.sampled_from(KNOWN_BAD))
    junk = {"x-junk\x00": draw(_header_value)} if draw(st.booleans()) else {}
    return body, "default.default", {"headers": {**props.get("headers", {}), **junk}}, "reject"


@st.composite
def cases(draw: st.DrawFn) -> Case:
    case = Case(garbage=draw(st.lists(garbage(), min_size=1, max_size=3)))
    if draw(st.booleans()):
        in_pool = draw(st.integers(0, 3)) == 0
        kinds = POOL_MISBEHAVIOURS if in_pool else list(MISBEHAVIOURS)
        safe_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8)
        case.misbehave = (draw(st.sampled_from(kinds)), draw(safe_text), in_pool)
    return case


ISSUE_13 = Case(
    garbage=[
        (KNOWN_BAD[0][0], "default.default", {}, "reject"),
        (KNOWN_BAD[8][0], "default.default", KNOWN_BAD[8][1], "reject"),
        (KNOWN_BAD[10][0], "default.default", KNOWN_BAD[10][1], "reject"),
    ],
    misbehave=("nul", "issue 13", False),
)


# --- the worker and the checks ----------------------------------------------------------


@pytest.fixture
def fault_settings(settings: Settings) -> Settings:
    return make_settings(settings.namespace, processes=1, concurrency=20)


@pytest.fixture
async def worker(fault_settings: Settings, tmp_path: Path) -> AsyncIterator[WorkerProcess]:
    fleet = Fleet(fault_settings, tmp_path, tmp_path, app="tests.apps:app")
    started = fleet.start_one()
    try:
        await fleet.wait_ready(started)
        yield started
        # after every example: still alive and ready, and it never logged a crash
        assert started.process.poll() is None, started.log.read_text()[-3000:]
        assert await asyncio.to_thread(is_ready, started.port)
        log = started.log.read_text()
        for sign in ("job_task_crashed", "outcome_write_failed", "claim_refused", "Traceback"):
            assert sign not in log, log[log.index(sign) - 2000 : log.index(sign) + 2000]
    finally:
        fleet.stop_all()


@pytest.fixture
async def db(fault_settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(
        DATABASE_URL, server_settings={"search_path": fault_settings.namespace}
    )
    yield conn
    await conn.close()


def _message_id(mode: str, serial: int) -> str:
    return {
        "good": f"gen-{serial}",
        "reject": f"bad-{serial}",  # a good id on a message that must be rejected
        "nul": f"gen\x00{serial}",
        "long": "g" * 129,
        "space": f"gen {serial}",
    }[mode]


def build(case: Case) -> Iterator[tuple[aio_pika.Message, str, Sent]]:
    """The messages of a case, each tagged, each with what it must end as."""
    for body, key, props, id_mode in case.garbage:
        serial = next(_serial)
        tag = f"case-{serial}"
        message_id = _message_id(id_mode, serial)
        accepted_id = message_id if id_mode in ("good", "reject") else None
        must = "either" if id_mode == "good" else "reject"
        all_headers = {**props.get("headers", {}), "x-test-case": tag}
        message = aio_pika.Message(
            body,
            message_id=message_id,
            headers=all_headers,
            priority=props.get("priority"),
        )
        yield message, key, Sent(tag, accepted_id, must, repr((body[:80], key, props, id_mode)))
    if case.misbehave is not None:
        kind, text, in_pool = case.misbehave
        serial = next(_serial)
        job_type = "misbehave_in_pool" if in_pool else "misbehave"
        body = json.dumps({"type": job_type, "args": {"kind": kind, "text": text}}).encode()
        message = aio_pika.Message(
            body, message_id=f"mis-{serial}", headers={"x-test-case": f"case-{serial}"}
        )
        key = "slow.default" if in_pool else "default.default"
        yield message, key, Sent(f"case-{serial}", f"mis-{serial}", f"misbehave:{kind}", job_type)
    serial = next(_serial)
    good = aio_pika.Message(
        json.dumps({"type": "echo", "args": {"value": serial}}).encode(),
        message_id=f"good-{serial}",
        headers={"x-test-case": f"case-{serial}"},
    )
    yield good, "default.default", Sent(f"case-{serial}", f"good-{serial}", "succeed", "good")


async def outcomes(
    db: asyncpg.Connection, sent: list[Sent]
) -> dict[str, tuple[str, str | None, str | None]]:
    """Each sent message's end so far: ("job", status, error kind) or ("rejected", reason, -)."""
    found: dict[str, tuple[str, str | None, str | None]] = {}
    ids = [s.job_id for s in sent if s.job_id is not None]
    rows = await db.fetch(
        "SELECT id, status, error_kind FROM jobs WHERE id = ANY($1)"
        " AND status IN ('succeeded', 'failed', 'dead', 'cancelled')",
        ids,
    )
    by_id = {row["id"]: row for row in rows}
    rejected = await db.fetch(
        "SELECT headers->>'x-test-case' AS tag, reason FROM rejected_messages"
        " WHERE headers->>'x-test-case' = ANY($1)",
        [s.tag for s in sent],
    )
    by_tag = {row["tag"]: row["reason"] for row in rejected}
    for s in sent:
        if s.tag in by_tag:
            found[s.tag] = ("rejected", by_tag[s.tag], None)
        elif s.job_id in by_id:
            row = by_id[s.job_id]
            found[s.tag] = ("job", row["status"], row["error_kind"])
    return found


def check(s: Sent, end: tuple[str, str | None, str | None]) -> None:
    what, first, second = end
    if s.must == "succeed":
        assert end == ("job", "succeeded", None), (s, end)
    elif s.must == "reject":
        assert what == "rejected" and first, (s, end)
    elif s.must.startswith("misbehave:"):
        status, kind = MISBEHAVIOURS[s.must.removeprefix("misbehave:")]
        assert end == ("job", status, kind), (s, end)
    else:  # garbage that may have been valid after all: a reason, or a job that ran
        assert (what == "rejected" and first) or (what == "job" and first == "succeeded"), (s, end)


COUNTS: dict[str, int] = {}


@hsettings(
    max_examples=200,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each run costs a live round trip
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(case=cases())
@example(case=ISSUE_13)
async def test_generated_garbage_never_stops_the_worker_or_the_good_jobs(
    worker: WorkerProcess,
    db: asyncpg.Connection,
    amqp: aio_pika.abc.AbstractChannel,
    fault_settings: Settings,
    case: Case,
) -> None:
    assert worker.process.poll() is None, f"the worker exited: {worker.log.read_text()[-3000:]}"
    exchange = await amqp.get_exchange(f"{fault_settings.namespace}.jobs")
    sent = []
    for message, key, expected in build(case):
        await exchange.publish(message, routing_key=key)
        sent.append(expected)
    deadline = time.monotonic() + 20
    while True:
        ends = await outcomes(db, sent)
        if len(ends) == len(sent):
            break
        if worker.process.poll() is not None:
            raise AssertionError(f"the worker exited: {worker.log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            missing = [s for s in sent if s.tag not in ends]
            raise AssertionError(f"not settled within 20 s: {missing}")
        await asyncio.sleep(0.02)
    for s in sent:
        check(s, ends[s.tag])
        label = ends[s.tag][0] if s.must == "either" else s.must.partition(":")[0]
        COUNTS[label] = COUNTS.get(label, 0) + 1
    assert worker.process.poll() is None, f"the worker exited: {worker.log.read_text()[-3000:]}"


def test_the_garbage_run_was_not_vacuous() -> None:
    """After the property (file order): garbage was both rejected and, some of it, run."""
    if not COUNTS:
        pytest.skip("the property did not run in this session")
    assert COUNTS.get("rejected", 0) + COUNTS.get("reject", 0) > 50, COUNTS
    assert COUNTS.get("succeed", 0) >= 100, COUNTS
    assert COUNTS.get("misbehave", 0) > 20, COUNTS
    print(f"garbage run: {COUNTS}")
