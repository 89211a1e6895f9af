"""The dashboard's HTML: plain server-rendered pages, no external assets, no inline script.

The overview, the login form and the confirmation pages have no script at
all; the job page loads one same-origin file (``/dashboard/static/job.js``)
for its live updates, allowed by ``script-src 'self'`` on that page only.

Job types, tenants, reasons and error messages come from producers, so every
value passes through ``_e`` (``html.escape`` with quotes) before it reaches
the page; only the fixed markup in this module is written unescaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from urllib.parse import quote

from coldbrew.api.overview import DeadJob, Lane, Overview
from coldbrew.store import LaneSettings, TenantSettings, WorkerRow

REFRESH_SECONDS = 5

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#222;background:#fafafa}
h1{font-size:1.3rem;margin:0 0 .2rem}h2{font-size:1.05rem;margin:1.5rem 0 .4rem}
table{border-collapse:collapse;background:#fff;min-width:30rem}
th,td{border:1px solid #ddd;padding:.25rem .6rem;text-align:left;vertical-align:top}
th{background:#f0f0f0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#777}.bad{color:#b00020;font-weight:600}.err{color:#b00020}
header{display:flex;justify-content:space-between;align-items:baseline}
form.inline{display:inline}code{font-size:.9em}
nav a{margin-right:1rem}.notice{background:#e7f6e7;border:1px solid #9c9;padding:.4rem .6rem}
.charts{display:flex;flex-wrap:wrap;gap:1rem}
.chart{width:560px;background:#fff;border:1px solid #ddd}
progress{width:20rem}form.search label{margin-right:.6rem}pre{background:#fff;border:1px solid #ddd;
padding:.5rem;overflow:auto;max-height:20rem}
"""


def _e(value: object) -> str:
    """Escape any value for HTML text and attribute contexts."""
    return html.escape(str(value), quote=True)


def _document(title: str, body: str, *, refresh: bool = False, script: str | None = None) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' if refresh else ""
    tag = f'<script src="{_e(script)}" defer></script>' if script else ""
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{_e(title)}</title><style>{_CSS}</style>{tag}</head>"
        f"<body>{body}</body></html>\n"
    )


NAV = (
    '<nav><a href="/dashboard">Overview</a><a href="/dashboard/jobs">Jobs</a>'
    '<a href="/dashboard/jobs?status=dead">Dead jobs</a>'
    '<a href="/dashboard/audit">Audit log</a></nav>'
)


def confirm_link(text: str, **params: str) -> str:
    """A link to the confirmation page of an action (a GET: nothing changes until confirmed)."""
    from urllib.parse import urlencode

    return f'<a class="act" href="/dashboard/confirm?{_e(urlencode(params))}">{_e(text)}</a>'


def notice(text: str | None) -> str:
    return f'<p class="notice" id="notice">{_e(text)}</p>' if text else ""


def _table(headers: Sequence[str], rows: Iterable[str], empty: str) -> str:
    body = "".join(rows)
    if not body:
        return f'<p class="muted">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "never"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S %Z")


def _num(value: object, *, alarm: bool = False) -> str:
    cls = "n bad" if alarm and value else "n"
    return f'<td class="{cls}">{_e(value)}</td>'


def _lane_row(lane: Lane) -> str:
    s = lane.stats
    rate = "-" if lane.drain_rate is None else f"{lane.drain_rate:.2f}/s"
    return (
        f"<tr><td>{_e(s.queue)}</td><td>{_e(s.tenant)}</td>"
        f"{_num(s.queued)}{_num(s.running)}{_num(s.retrying)}"
        f"{_num(s.failed, alarm=True)}{_num(s.dead, alarm=True)}"
        f'<td class="n">{_e(_seconds(s.oldest_waiting_seconds if lane.depth else None))}</td>'
        f'<td class="n">{_e(rate)}</td>'
        f'<td class="n">{_e(_seconds(lane.estimated_wait))}</td></tr>'
    )


def _tenant_row(tenant: TenantSettings) -> str:
    cap = "no cap" if tenant.max_running is None else tenant.max_running
    state = '<span class="bad">paused</span>' if tenant.paused else "active"
    verb = "resume" if tenant.paused else "pause"
    actions = (
        confirm_link(verb.capitalize(), action=verb, tenant=tenant.name)
        + " · "
        + f'<a href="/dashboard/tenants/{_e(quote(tenant.name, safe=""))}">Settings</a>'
    )
    return (
        f"<tr><td>{_e(tenant.name)}</td>{_num(f'{tenant.weight:g}')}"
        f'<td class="n">{_e(cap)}</td><td>{state}</td><th>{actions}</th></tr>'
    )


def _lane_state_row(lane: LaneSettings, *, may_act: bool) -> str:
    state = '<span class="bad">paused</span>' if lane.paused else "active"
    verb = "lane_resume" if lane.paused else "lane_pause"
    label = "Resume" if lane.paused else "Pause"
    act = confirm_link(label, action=verb, lane=lane.name) if may_act else "-"
    return f"<tr><td>{_e(lane.name)}</td><td>{state}</td><th>{act}</th></tr>"


def _dead_row(job: DeadJob) -> str:
    link = f"/dashboard/jobs/{quote(job.id, safe='')}"
    return (
        f'<tr><td><a href="{_e(link)}"><code>{_e(job.id)}</code></a></td>'
        f"<td>{_e(job.type)}</td><td>{_e(job.tenant)}</td>"
        f"<td>{_e(job.reason or '-')}<br><span class=err>{_e(job.error)}</span></td>"
        f'<td class="n">{_e(job.attempt)}/{_e(job.max_attempts)}</td>'
        f"<td>{_e(_when(job.finished_at))}</td></tr>"
    )


def _worker_row(worker: WorkerRow, *, load: bool) -> str:
    in_flight = f"{_num(worker.jobs_in_flight)}" if load else ""
    return (
        f"<tr><td><code>{_e(worker.id)}</code></td><td>{_e(worker.host)}</td>"
        f"{_num(worker.pid)}<td>{_e(worker.version)}</td>"
        f"<td>{_e(', '.join(worker.lanes))}</td>{in_flight}"
        f"<td>{_e(_when(worker.started_at))}</td>"
        f'<td class="n">{_e(_seconds(worker.heartbeat_age_seconds))} ago</td></tr>'
    )


def _workers(overview: Overview) -> str:
    load = overview.shows_load
    headers = ["id", "host", "pid", "version", "lanes"]
    headers += ["jobs in flight"] if load else []
    headers += ["started", "last heartbeat"]
    return _table(
        headers,
        (_worker_row(worker, load=load) for worker in overview.workers),
        "No live workers.",
    )


def _logout(csrf: str | None) -> str:
    """The sign-out button of a session (its CSRF token in the form); none without one."""
    if csrf is None:
        return ""
    return (
        '<form class="inline" method="post" action="/dashboard/logout">'
        f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
        '<button type="submit" id="logout">Sign out</button></form>'
    )


def dashboard_page(
    overview: Overview, *, logout_csrf: str | None, charts: str = "", message: str | None = None
) -> str:
    """The whole dashboard for one load; it reloads itself every few seconds."""
    scope = "every tenant" if overview.tenant is None else f"tenant {overview.tenant}"
    rejected = (
        f"<tr><td>{_e(reason)}</td>{_num(count)}</tr>"
        for reason, count in sorted(overview.rejected.items())
    )
    body = (
        f"<header><div><h1>coldbrew</h1><span class=muted>{_e(scope)} · "
        f"{_e(_when(overview.generated_at))} · refreshes every {REFRESH_SECONDS} s · "
        '<a href="/dashboard.json">JSON</a></span></div>'
        f"{_logout(logout_csrf)}</header>{NAV}{notice(message)}"
        f"<h2>Last hour</h2><div class=charts>{charts}</div>"
        "<h2>Lanes</h2>"
        + _table(
            (
                "lane",
                "tenant",
                "waiting",
                "running",
                "retrying",
                "failed",
                "dead",
                "oldest waiting",
                "drain rate",
                "est. wait",
            ),
            (_lane_row(lane) for lane in overview.lanes),
            "No jobs waiting, running, failed or dead.",
        )
        + "<h2>Lane state</h2>"
        + _table(
            ("lane", "state", "act"),
            (
                _lane_state_row(lane, may_act=overview.tenant is None)
                for lane in overview.lane_states
            ),
            "No lanes known yet.",
        )
        + "<h2>Tenants</h2>"
        + _table(
            ("tenant", "weight", "max running", "state", "act"),
            (_tenant_row(t) for t in overview.tenants),
            "No tenants yet: one is recorded when its first job arrives.",
        )
        + "<h2>Recent dead jobs</h2>"
        + _table(
            ("id", "type", "tenant", "reason / error", "attempts", "finished"),
            (_dead_row(job) for job in overview.dead_jobs),
            "No dead jobs.",
        )
        + "<h2>Rejected messages</h2>"
        + _table(("reason", "count"), rejected, "No rejected messages.")
        + "<h2>Workers</h2>"
        + _workers(overview)
    )
    return _document("coldbrew dashboard", body, refresh=True)


def login_page(message: str | None = None) -> str:
    """The API-key form; ``message`` says why it is shown again."""
    note = f'<p class="bad">{_e(message)}</p>' if message else ""
    body = (
        "<h1>coldbrew</h1><p>Sign in with an API key (as in <code>COLDBREW_API_KEYS</code>): "
        "you see your tenant's jobs only.</p>"
        f"{note}"
        '<form method="post" action="/dashboard/login">'
        '<label>API key <input type="password" name="key" autocomplete="current-password" '
        'required autofocus></label> <button type="submit">Sign in</button></form>'
    )
    return _document("coldbrew: sign in", body)
