"""The dashboard's HTML renderer: every producer-supplied value is escaped."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime

from coldbrew.api import render
from coldbrew.api.overview import DeadJob, Lane, Overview
from coldbrew.store import QueueStats, TenantSettings, WorkerRow

XSS = '<script>alert("x")</script>'
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def overview() -> Overview:
    stats = QueueStats(XSS, XSS, 3, 1, 0, 1, 0, 42.0, 7)
    dead = DeadJob(XSS, XSS, XSS, XSS, XSS, XSS, 3, 3, NOW)
    tenant = TenantSettings(XSS, 1.0, None, True, NOW)
    return Overview(XSS, NOW, [Lane(stats, 0.5, math.inf)], [tenant], [dead], {XSS: 2})


def test_every_producer_value_is_escaped() -> None:
    """Job id, type, lane, tenant, reason, error and rejected reason never become markup."""
    page = render.dashboard_page(overview(), logout_csrf="0123abcd")
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 9
    assert 'href="/dashboard/jobs/%3Cscript%3Ealert%28%22x%22%29%3C%2Fscript%3E"' in page


def test_login_message_is_escaped() -> None:
    assert "<script" not in render.login_page(XSS)


def test_waits_read_as_people_say_them() -> None:
    """Unknown is '-', a lane that does not drain is 'never', long waits change unit."""
    page = render.dashboard_page(overview(), logout_csrf=None)
    assert "never" in page
    assert "0.50/s" in page
    assert "Sign out" not in page
    assert [render._seconds(v) for v in (None, 5.0, 600.0, 7200.0)] == [
        "-",
        "5.0 s",
        "10.0 min",
        "2.0 h",
    ]


def test_workers_are_escaped_and_their_load_shown_only_to_every_tenant() -> None:
    """Worker ids, hosts, versions and lanes never become markup; a tenant's page has no
    jobs-in-flight column (that would show the other tenants' load)."""
    worker = WorkerRow(XSS, XSS, 42, XSS, [XSS], 10, 7, NOW, NOW, 1.5, True)
    base = overview()
    for tenant, shows in ((XSS, False), (None, True)):
        page = render.dashboard_page(
            dataclasses.replace(base, tenant=tenant, workers=[worker]), logout_csrf=None
        )
        assert "<script" not in page
        section = page.split("<h2>Workers</h2>", 1)[1]
        assert section.count("&lt;script&gt;") == 4  # id, host, version, lanes
        assert ("jobs in flight" in section) is shows
        assert "1.5 s ago" in section
