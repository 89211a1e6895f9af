"""The dashboard's pages beyond the overview: search, one job, confirmations, tenants, audit.

Every value that came from a producer or an operator passes through
``render._e``; the job page's live updates come from one same-origin script
(``static/job.js``) that reads its event-stream URL from a data attribute.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from coldbrew.api.actions import Action
from coldbrew.api.render import NAV, _document, _e, _table, _when, confirm_link, notice
from coldbrew.batches import BatchRecord
from coldbrew.model import JobRecord, Status
from coldbrew.store import Attempt, AuditEntry, JobSummary, TenantSettings

JOB_SCRIPT = "/dashboard/static/job.js"


def _job_link(job_id: str) -> str:
    return f'<a href="/dashboard/jobs/{_e(quote(job_id, safe=""))}"><code>{_e(job_id)}</code></a>'


def _header(title: str, message: str | None = None) -> str:
    return f"<header><h1>{_e(title)}</h1></header>{NAV}{notice(message)}"


def _pre(value: Any, element_id: str = "") -> str:
    text = json.dumps(value, indent=2, default=str)
    attr = f' id="{element_id}"' if element_id else ""
    return f"<pre{attr}>{_e(text)}</pre>"


# --- search --------------------------------------------------------------------------


def _input(name: str, label: str, value: str, kind: str = "text") -> str:
    return (
        f'<label>{_e(label)} <input type="{kind}" name="{name}" value="{_e(value)}" '
        f'size="14"></label>'
    )


def _search_form(query: Mapping[str, str], fixed_tenant: str | None) -> str:
    statuses = "".join(
        f'<option value="{s.value}"{" selected" if query.get("status") == s.value else ""}>'
        f"{s.value}</option>"
        for s in Status
    )
    tenant = (
        f"<label>tenant <b>{_e(fixed_tenant)}</b></label>"
        if fixed_tenant is not None
        else _input("tenant", "tenant", query.get("tenant", ""))
    )
    return (
        '<form class="search" method="get" action="/dashboard/jobs">'
        + _input("job_id", "job id", query.get("job_id", ""))
        + _input("type", "type", query.get("type", ""))
        + tenant
        + f'<label>status <select name="status"><option value="">any</option>{statuses}'
        "</select></label>"
        + _input("from", "created from", query.get("from", ""), "datetime-local")
        + _input("to", "to", query.get("to", ""), "datetime-local")
        + _input("error", "error text", query.get("error", ""))
        + ' <button type="submit">Search</button></form>'
    )


def _summary_row(job: JobSummary) -> str:
    error = f"{job.error_kind}: {job.error_message or ''}" if job.error_kind else ""
    progress = "-" if job.progress is None else f"{job.progress:.0%}"
    return (
        f"<tr><td>{_job_link(job.id)}</td><td>{_e(job.type)}</td><td>{_e(job.queue)}</td>"
        f"<td>{_e(job.tenant)}</td><td>{_e(job.status)}</td>"
        f'<td class="n">{job.attempt}/{job.max_attempts}</td><td class="n">{progress}</td>'
        f"<td>{_e(_when(job.created_at))}</td>"
        f"<td>{_e(job.dead_reason or '')} <span class=err>{_e(error)}</span></td></tr>"
    )


def _replay_form(reason: str) -> str:
    return (
        '<h2>Replay dead jobs by reason</h2><form method="get" action="/dashboard/confirm">'
        '<input type="hidden" name="action" value="replay">'
        f'<label>reason or error contains <input name="reason" value="{_e(reason)}" '
        'required></label> <button type="submit">Replay…</button></form>'
    )


def search_page(
    rows: Sequence[JobSummary],
    query: Mapping[str, str],
    next_after: str | None,
    *,
    fixed_tenant: str | None,
    message: str | None = None,
) -> str:
    more = ""
    if next_after is not None:
        link = "/dashboard/jobs?" + urlencode({**query, "after": next_after})
        more = f'<p><a id="next-page" href="{_e(link)}">Next page &rarr;</a></p>'
    body = (
        _header("Jobs", message)
        + _search_form(query, fixed_tenant)
        + "<h2>Results</h2>"
        + _table(
            ("id", "type", "lane", "tenant", "status", "attempts", "progress", "created", "error"),
            (_summary_row(job) for job in rows),
            "No job matches.",
        )
        + more
        + (_replay_form(query.get("error", "")) if query.get("status") == "dead" else "")
    )
    return _document("coldbrew jobs", body)


# --- one job -------------------------------------------------------------------------


def _attempt_rows(
    job: JobRecord, attempts: Iterable[Attempt], worker_id: str | None
) -> Iterable[str]:
    for a in attempts:
        error = f"{a.error_kind}: {a.error_message or ''}" if a.error_kind else ""
        yield (
            f'<tr><td class="n">{a.attempt}</td><td>{_e(a.outcome)}</td>'
            f"<td>{_e(_when(a.started_at))}</td><td>{_e(_when(a.ended_at))}</td>"
            f"<td>{_e(a.worker_id or '-')}</td><td class=err>{_e(error)}</td></tr>"
        )
    if job.status in (Status.RUNNING, Status.SUCCEEDED):  # the trigger keeps the others
        error = f"{job.error_kind}: {job.error_message or ''}" if job.error_kind else ""
        end = job.finished_at if job.status.terminal else None
        yield (
            f'<tr><td class="n">{job.attempt}</td><td>{_e(job.status)} (latest)</td>'
            f"<td>{_e(_when(job.started_at))}</td><td>{_e(_when(end))}</td>"
            f"<td>{_e(worker_id or '-')}</td><td class=err>{_e(error)}</td></tr>"
        )


def _audit_rows(entries: Iterable[AuditEntry], *, with_target: bool) -> Iterable[str]:
    for entry in entries:
        target = f"<td>{_e(entry.target)}</td>" if with_target else ""
        detail = json.dumps(entry.detail, default=str) if entry.detail else ""
        yield (
            f"<tr><td>{_e(_when(entry.at))}</td><td>{_e(entry.actor)}</td>"
            f"<td>{_e(entry.action)}</td>{target}<td>{_e(detail)}</td>"
            f"<td>{_e(entry.outcome)}</td></tr>"
        )


def _job_actions(job: JobRecord) -> str:
    links = []
    if not job.status.terminal:
        links.append(confirm_link("Cancel job", action="cancel", job_id=job.id))
    if job.status in (Status.FAILED, Status.DEAD):
        links.append(confirm_link("Retry job", action="retry", job_id=job.id))
    return f"<p>{' · '.join(links)}</p>" if links else ""


@dataclass(frozen=True, slots=True)
class Family:
    """What a job's page shows of the jobs around it (issue #16's flow and batches): its
    first children, its batch and its chain, each read only when the job names one."""

    children: Sequence[tuple[str, str, str]] = ()
    """The first children: ``(id, type, status)``; their counts are ``job.children``."""
    batch: BatchRecord | None = None
    chain: Mapping[str, Any] | None = None


def _family(job: JobRecord, family: Family) -> str:
    """Parent, children by status, batch and chain step; empty for a job with none."""
    parts = []
    if job.parent_id is not None:
        parts.append(f"<p id=parent>Spawned by {_job_link(job.parent_id)}</p>")
    if job.children:
        counts = " · ".join(f"{_e(st)} {n}" for st, n in sorted(job.children.items()))
        total = sum(job.children.values())
        rows = (
            f"<tr><td>{_job_link(child)}</td><td>{_e(kind)}</td><td>{_e(st)}</td></tr>"
            for child, kind, st in family.children
        )
        more = total - len(family.children)
        parts.append(
            f"<h3>Children</h3><p id=children>{total} in all: {counts}"
            + (f" ({more} more not listed)" if more > 0 else "")
            + "</p>"
            + _table(("id", "type", "status"), rows, "")
        )
    if family.batch is not None:
        b = family.batch
        counts = " · ".join(f"{_e(st)} {n}" for st, n in b.counts.items() if n)
        parts.append(
            f"<p id=batch>Member of batch <code>{_e(b.id)}</code> "
            f"({_e(b.description or 'no description')}): {_e(b.status)}, "
            f"{b.total} members, {b.pending} pending, {b.progress:.0%} done · {counts}</p>"
        )
    if family.chain is not None and job.chain_step is not None:
        c = family.chain
        steps = " → ".join(
            _job_link(str(step["id"])) + f" {_e(step['status'])}" for step in c.get("jobs", [])
        )
        parts.append(
            f"<p id=chain>Step {job.chain_step + 1} of {c.get('step_count')} of chain "
            f"<code>{_e(c.get('id'))}</code> ({_e(c.get('status'))}): {steps}</p>"
        )
    return "<h2>Related jobs</h2>" + "".join(parts) if parts else ""


def job_page(
    job: JobRecord,
    attempts: Sequence[Attempt],
    audit: Sequence[AuditEntry],
    *,
    checkpoint: Any = None,
    worker_id: str | None = None,
    message: str | None = None,
    family: Family | None = None,
) -> str:
    """Status, progress bar, attempts, checkpoint, result, audit, live through job.js."""
    status = job.to_status_json()
    events = f"/dashboard/jobs/{quote(job.id, safe='')}/events"
    progress = "" if job.progress is None else f' value="{job.progress:.4f}"'
    error = f"{job.error_kind}: {job.error_message or ''}" if job.error_kind else ""
    body = (
        _header(f"Job {job.id}", message)
        + f'<main id="job" data-events="{_e(events)}" data-status="{_e(job.status)}">'
        + f'<p>Status <b id="status">{_e(job.status)}</b> · type {_e(job.type)} · lane '
        f"{_e(job.queue)} · tenant {_e(job.tenant)} · attempt <span id=attempt>{job.attempt}"
        f"</span>/{job.max_attempts}</p>"
        + f'<p><progress id="progress" max="1"{progress}></progress> '
        f'<span id="progress-message">{_e(job.progress_message or "")}</span></p>'
        + f'<p class=err id="error">{_e(error)}</p>'
        + _job_actions(job)
        + _family(job, family or Family())
        + "<h2>Attempts</h2>"
        + _table(
            ("attempt", "outcome", "started", "ended", "worker", "error"),
            _attempt_rows(job, attempts, worker_id),
            "Not started yet.",
        )
        + "<h2>Checkpoint</h2>"
        + (_pre(checkpoint) if checkpoint is not None else "<p class=muted>None.</p>")
        + "<h2>Audit</h2>"
        + _table(
            ("when", "who", "action", "detail", "outcome"),
            _audit_rows(audit, with_target=False),
            "No action was taken on this job from the dashboard.",
        )
        + "<h2>Status JSON</h2>"
        + f"<p class=muted>The same JSON as <code>GET /jobs/{_e(job.id)}</code>.</p>"
        + _pre(status, "status-json")
        + "</main>"
    )
    return _document(f"coldbrew job {job.id}", body, script=JOB_SCRIPT)


# --- confirmations, tenants, audit, errors -------------------------------------------


def confirm_page(action: Action, csrf: str) -> str:
    hidden = "".join(
        f'<input type="hidden" name="{_e(k)}" value="{_e(v)}">' for k, v in action.fields.items()
    )
    reason = ""
    if action.name == "cancel":
        reason = '<p><label>reason <input name="reason" size="40"></label></p>'
    body = (
        _header("Confirm")
        + f'<p id="question">{_e(action.describe())}</p>'
        + '<form method="post" action="/dashboard/act">'
        + hidden
        + f'<input type="hidden" name="csrf" value="{_e(csrf)}">'
        + reason
        + '<button type="submit" id="confirm">Confirm</button> '
        '<a href="/dashboard">Back</a></form>'
    )
    return _document("coldbrew: confirm", body)


def tenant_page(tenant: TenantSettings) -> str:
    cap = "none" if tenant.max_running is None else str(tenant.max_running)
    body = (
        _header(f"Tenant {tenant.name}")
        + f"<p>weight {tenant.weight:g} · max running {_e(cap)} · "
        + ("paused" if tenant.paused else "active")
        + "</p>"
        + '<form method="get" action="/dashboard/confirm">'
        '<input type="hidden" name="action" value="tenant_set">'
        f'<input type="hidden" name="tenant" value="{_e(tenant.name)}">'
        '<label>--weight <input name="weight" size="8"></label> '
        '<label>--max-running (N or none) <input name="max_running" size="8"></label> '
        '<button type="submit">Change…</button></form>'
    )
    return _document(f"coldbrew tenant {tenant.name}", body)


def audit_page(entries: Sequence[AuditEntry]) -> str:
    body = _header("Audit log") + _table(
        ("when", "who", "action", "target", "detail", "outcome"),
        _audit_rows(entries, with_target=True),
        "No action has been taken from the dashboard yet.",
    )
    return _document("coldbrew audit log", body)


def error_page(message: str) -> str:
    body = (
        _header("That did not work")
        + f'<p class="bad" id="problem">{_e(message)}</p>'
        + '<p><a href="/dashboard">Back to the dashboard</a></p>'
    )
    return _document("coldbrew: error", body)
