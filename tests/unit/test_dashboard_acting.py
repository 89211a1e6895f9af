"""The acting dashboard's pure parts: pages escape, charts add up, inputs are checked with
the CLI's messages, CSRF tokens are per session."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from coldbrew.api import charts, pages
from coldbrew.api.actions import Action, parse_action
from coldbrew.api.auth import BrowserUser, CsrfSigner, Principal
from coldbrew.api.errors import ApiError
from coldbrew.api.search import next_cursor, parse_search
from coldbrew.errors import ConfigurationError, InvalidRequest
from coldbrew.model import JobRecord, Status
from coldbrew.operations import check_weight, parse_cap, parse_weight
from coldbrew.store import Attempt, AuditEntry, JobSummary

XSS = '<script>alert("x")</script>'
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
EVERY = BrowserUser(Principal(None), "operator", "session-token")
ACME = BrowserUser(Principal("acme"), "api key 1234 of acme", "session-token")


def record(**changes: object) -> JobRecord:
    values: dict[str, object] = {
        "id": XSS,
        "type": XSS,
        "queue": XSS,
        "tenant": XSS,
        "status": Status.RUNNING,
        "priority": 0,
        "attempt": 2,
        "max_attempts": 5,
        "progress": 0.25,
        "progress_message": XSS,
        "result": None,
        "error_kind": XSS,
        "error_message": XSS,
        "dead_reason": None,
        "created_at": NOW,
        "started_at": NOW,
        "finished_at": None,
        "run_at": NOW,
        "cancel_requested": False,
        "args": {},
    }
    values.update(changes)
    return JobRecord(**values)  # type: ignore[arg-type]


def test_job_page_escapes_everything_and_loads_only_its_same_origin_script() -> None:
    attempt = Attempt(1, "retrying", XSS, XSS, NOW, NOW, XSS)
    entry = AuditEntry(1, NOW, XSS, None, "cancel", XSS, XSS, {"reason": XSS}, XSS)
    page = pages.job_page(record(), [attempt], [entry], checkpoint={"k": XSS}, worker_id=XSS)
    assert "<script>" not in page
    assert re.findall(r"<script[^>]*>", page) == [f'<script src="{pages.JOB_SCRIPT}" defer>']
    assert '<progress id="progress" max="1" value="0.2500">' in page
    assert 'data-events="/dashboard/jobs/%3Cscript%3Ealert%28%22x%22%29%3C%2Fscript%3E/events"' in (
        page
    )
    assert "Cancel job" in page and "Retry job" not in page  # running: cancel only
    dead = pages.job_page(record(status=Status.DEAD), [], [])
    assert "Retry job" in dead and "Cancel job" not in dead


def test_search_and_confirm_pages_escape_and_carry_the_csrf_token() -> None:
    row = JobSummary(XSS, XSS, XSS, XSS, "dead", 1, 1, None, NOW, NOW, XSS, XSS, XSS)
    page = pages.search_page([row], {"error": XSS, "status": "dead"}, "x~y", fixed_tenant=None)
    assert "<script" not in page
    assert 'id="next-page"' in page and "Replay dead jobs by reason" in page
    action = Action("replay", reason=XSS, fields={"action": "replay", "reason": XSS})
    confirm = pages.confirm_page(action, "c0ffee")
    assert "<script" not in confirm
    assert '<input type="hidden" name="csrf" value="c0ffee">' in confirm
    assert '<form method="post" action="/dashboard/act">' in confirm


def test_throughput_and_backlog_series() -> None:
    done = charts.per_minute([("fast", 0, 2), ("fast", 59, 3), ("fast", 75, 1), ("slow", 3, 4)])
    assert done["fast"][0] == 2 and done["fast"][59] == 4  # a late row is clamped to now
    assert sum(done["slow"]) == 4 and list(done) == ["fast", "slow"]
    level = charts.cumulative([("a", 0, 5), ("a", 10, -2), ("a", 20, -3), ("a", 30, 1)])
    a = level["a"]
    assert (a[0], a[9], a[10], a[19], a[20], a[30], a[59]) == (5, 5, 3, 3, 0, 1, 1)


def test_svg_is_escaped_scaled_and_says_when_empty() -> None:
    svg = charts.svg(charts.Chart(XSS, "jobs", {XSS: [0] * 59 + [7]}))
    assert "<script" not in svg and svg.startswith("<svg") and svg.endswith("</svg>")
    assert ">10</text>" in svg  # 7 rounds up to the axis maximum 10
    assert "now 7, peak 7" in svg
    assert "no jobs in the last hour" in charts.svg(charts.Chart("t", "u", {}))


def test_dashboard_forms_reject_what_the_cli_rejects_with_its_messages() -> None:
    """Weights, caps and replay reasons: the same function and so the same message."""
    for text in ("0", "-1", "1001", "nan"):
        with pytest.raises(ConfigurationError, match=r"--weight must be"):
            parse_action({"action": "tenant_set", "tenant": "acme", "weight": text}, EVERY)
    with pytest.raises(ConfigurationError) as caught:
        check_weight(0)
    with pytest.raises(ConfigurationError) as form:
        parse_weight("0")
    assert str(caught.value) == str(form.value) == "--weight must be in (0, 1000], not 0"
    with pytest.raises(ConfigurationError, match="--max-running must be a whole number"):
        parse_action({"action": "tenant_set", "tenant": "acme", "max_running": "x"}, EVERY)
    with pytest.raises(ConfigurationError, match=r"--max-running must be in 0\.\.1000000"):
        parse_cap("-3")
    with pytest.raises(ConfigurationError, match="say which dead jobs to replay"):
        parse_action({"action": "replay", "reason": " "}, EVERY)
    with pytest.raises(ConfigurationError, match="tenants set needs"):
        parse_action({"action": "tenant_set", "tenant": "acme"}, EVERY)
    with pytest.raises(InvalidRequest):
        parse_action({"action": "cancel", "job_id": "a b"}, EVERY)
    ok = parse_action({"action": "tenant_set", "tenant": "acme", "max_running": "none"}, EVERY)
    assert ok.uncap and ok.describe() == "Set tenant acme: no cap on running jobs?"


def test_a_tenant_session_acts_on_its_own_tenant_only_and_sets_no_weight() -> None:
    assert parse_action({"action": "pause", "tenant": "acme"}, ACME).tenant == "acme"
    with pytest.raises(ApiError) as other:
        parse_action({"action": "pause", "tenant": "globex"}, ACME)
    assert other.value.status == 403
    with pytest.raises(ApiError) as weight:
        parse_action({"action": "tenant_set", "tenant": "acme", "weight": "5"}, ACME)
    assert weight.value.kind == "weight_needs_every_tenant"
    with pytest.raises(ApiError) as unknown:
        parse_action({"action": "drop_table"}, EVERY)
    assert unknown.value.status == 400


def test_csrf_tokens_are_per_session_and_per_process() -> None:
    signer = CsrfSigner(b"k" * 32)
    token = signer.token("session-a")
    signer.check("session-a", token)
    for given in (None, "", signer.token("session-b"), CsrfSigner().token("session-a")):
        with pytest.raises(ApiError) as refused:
            signer.check("session-a", given)
        assert (refused.value.status, refused.value.kind) == (403, "csrf_failed")


def test_search_input_is_checked_and_a_tenant_is_forced_to_its_own() -> None:
    search = parse_search({"status": "dead", "from": "2026-12-01T20:00"}, Principal("acme"))
    assert search.where.tenant == "acme" and search.where.status == "dead"
    assert search.where.created_from == datetime(2026, 12, 1, 20, 0, tzinfo=UTC)
    for params, field in (
        ({"status": "sleeping"}, "status"),
        ({"from": "yesterday"}, "from"),
        ({"after": "no-separator"}, "after"),
        ({"error": "x" * 201}, "error"),
    ):
        with pytest.raises(ApiError) as bad:
            parse_search(params, Principal(None))
        assert bad.value.status == 422 and bad.value.message.startswith(field)
    with pytest.raises(ApiError) as other:
        parse_search({"tenant": "globex"}, Principal("acme"))
    assert other.value.status == 403
    row = JobSummary("j1", "t", "q", "acme", "dead", 1, 1, None, NOW, NOW, None, None, None)
    cursor = next_cursor([row], more=True)
    assert cursor is not None
    assert parse_search({"after": cursor}, Principal(None)).cursor == (NOW, "j1")
    assert next_cursor([row], more=False) is None
