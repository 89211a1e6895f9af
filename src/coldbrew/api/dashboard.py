"""The web dashboard's routes: overview, search, a job's page, actions, sessions.

A browser cannot attach a Bearer header to a page load, so ``POST
/dashboard/login`` checks the key with the same ``KeyRing`` as the API and
opens a session (``api.auth``): the HTTP-only, SameSite=Strict cookie scoped to
``/dashboard`` (``Secure`` over https) holds a random token, never the key. A
Bearer header still reads every page, for scripts; acting needs a session.

Every action is two steps: a GET of ``/dashboard/confirm`` (checks the input
with the CLI's messages, changes nothing, shows the question and a form
carrying the session's CSRF token), then a POST of ``/dashboard/act`` (403
without the right token or from another origin), recorded in the audit log.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from coldbrew.api import charts, pages, render
from coldbrew.api.actions import Action, carry_out, parse_action
from coldbrew.api.auth import (
    DASHBOARD_COOKIE,
    BrowserUser,
    Principal,
    browser_user,
    new_session_token,
    token_hash,
)
from coldbrew.api.errors import ApiError
from coldbrew.api.overview import collect
from coldbrew.api.routes import event_stream
from coldbrew.api.search import PAGE_SIZE, next_cursor, parse_search
from coldbrew.errors import (
    BatchNotFound,
    ChainNotFound,
    ConfigurationError,
    InvalidRequest,
    JobNotFound,
)
from coldbrew.model import JobRecord

if TYPE_CHECKING:
    from coldbrew.api.app import ApiState

CHART_SECONDS = 15.0
FORM_BODY_LIMIT = 4096
FORM_MAX_FIELDS = 10  # more is not one of the dashboard's forms: 400 invalid_form
LOGIN_FIELDS = frozenset({"key"})
ACTION_FIELDS = frozenset(
    {"csrf", "action", "job_id", "tenant", "lane", "reason", "weight", "max_running"}
)
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
# no scripts, no external assets, no framing: escaping is not the only line of defence
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# the job page runs its one same-origin script and opens its same-origin event stream
JOB_PAGE_HEADERS = PAGE_HEADERS | {
    "Content-Security-Policy": CSP + "; script-src 'self'; connect-src 'self'"
}


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def _html(text: str, status: int = 200, headers: dict[str, str] = PAGE_HEADERS) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=headers)


def _to_login() -> RedirectResponse:
    return RedirectResponse(
        "/dashboard/login", status_code=303, headers={"Cache-Control": "no-store"}
    )


async def _user(request: Request) -> BrowserUser | None:
    state = _state(request)
    return await browser_user(request, state.keys, state.client.store.dashboard)


async def _csrf_of(request: Request, user: BrowserUser) -> str | None:
    """The CSRF token of the user's session; None for a Bearer script (it cannot act)."""
    if user.session_token is None:
        return None
    return (await _state(request).csrf.signer()).token(user.session_token)


def _done(request: Request) -> str | None:
    """The outcome of the action that redirected here (``?done=``), shown as a notice."""
    text = request.query_params.get("done")
    return None if text is None else text[:300]


async def home(_request: Request) -> Response:
    """``/``: the dashboard."""
    return RedirectResponse("/dashboard", status_code=303)


async def dashboard(request: Request) -> Response:
    """The overview; a browser without a live session is sent to the login form (303)."""
    state = _state(request)
    user = await _user(request)
    if user is None:
        response = _to_login()
        if DASHBOARD_COOKIE in request.cookies:  # expired or revoked: drop the cookie
            response.delete_cookie(DASHBOARD_COOKIE, path="/dashboard")
        return response
    overview = await collect(state.client.store, user.principal, state.rates)
    csrf = None if state.keys.insecure_no_auth else await _csrf_of(request, user)
    page = render.dashboard_page(
        overview,
        logout_csrf=csrf,
        charts=await _charts(state, user.principal),
        message=_done(request),
    )
    return _html(page)


async def _charts(state: ApiState, principal: Principal) -> str:
    """The two charts, drawn at most every CHART_SECONDS per scope: the backlog read walks
    every waiting and running row, and the overview reloads every 5 s in every tab."""
    cached = state.charts.get(principal.tenant)
    now = time.monotonic()
    if cached is not None and now - cached[0] < CHART_SECONDS:
        return cached[1]
    drawn = await _draw_charts(state, principal)
    state.charts[principal.tenant] = (now, drawn)
    return drawn


async def _draw_charts(state: ApiState, principal: Principal) -> str:
    since = datetime.now(UTC) - timedelta(minutes=charts.MINUTES)
    store = state.client.store.dashboard
    done = charts.per_minute(await store.throughput(since, principal.tenant))
    backlog = charts.cumulative(await store.backlog_edges(since, principal.tenant))
    return charts.svg(
        charts.Chart("Throughput per lane (jobs finished per minute)", "jobs/min", done)
    ) + charts.svg(charts.Chart("Backlog per lane (jobs waiting)", "jobs waiting", backlog))


async def dashboard_json(request: Request) -> Response:
    """The overview's data as JSON for scripts: Bearer key (or the session); 401 without."""
    state = _state(request)
    user = await _user(request)
    principal = user.principal if user is not None else state.keys.authenticate(request)
    overview = await collect(state.client.store, principal, state.rates)
    return JSONResponse(overview.to_json(), headers={"Cache-Control": "no-store"})


async def jobs(request: Request) -> Response:
    """The job search: filters, keyset pages; a job id opens that job's page."""
    user = await _user(request)
    if user is None:
        return _to_login()
    search = parse_search(request.query_params, user.principal)
    if search.job_id is not None:
        return RedirectResponse(f"/dashboard/jobs/{quote(search.job_id, safe='')}", 303)
    rows = await _state(request).client.store.dashboard.search(
        search.where, search.cursor, PAGE_SIZE + 1
    )
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    page = pages.search_page(
        rows,
        search.query,
        next_cursor(rows, more),
        fixed_tenant=user.principal.tenant,
        message=_done(request),
    )
    return _html(page)


async def dashboard_job(request: Request) -> Response:
    """One job's page; another tenant's job is 404, as a missing one."""
    state = _state(request)
    user = await _user(request)
    if user is None:
        return _to_login()
    job_id = request.path_params["job_id"]
    record = await state.client.get(job_id)
    if not user.principal.may_see(record.tenant):
        raise JobNotFound(job_id)
    store = state.client.store.dashboard
    attempts = await store.attempts(job_id)
    audit = await store.audit_for_job(job_id)
    checkpoint, worker_id = await store.job_extras(job_id)
    page = pages.job_page(
        record,
        attempts,
        audit,
        checkpoint=checkpoint,
        worker_id=worker_id,
        message=_done(request),
        family=await _family(state, record, user.principal),
    )
    return _html(page, headers=JOB_PAGE_HEADERS)


CHILDREN_LISTED = 50


async def _family(state: ApiState, record: JobRecord, principal: Principal) -> pages.Family:
    """The job's first children, its batch and its chain, each read only when it names one
    (a plain job costs nothing more); a batch or chain of another tenant is not shown."""
    store = state.client.store
    children = []
    if record.children:
        children = await store.dashboard.children(record.id, CHILDREN_LISTED)
    batch = None
    if record.batch_id is not None:
        try:
            batch = await store.batches.get(record.batch_id)
        except BatchNotFound:
            batch = None  # pruned, or not committed yet
        if batch is not None and not principal.may_see(batch.tenant):
            batch = None
    chain = None
    if record.chain_id is not None:
        try:
            chain = await store.flow.get_chain(record.chain_id)
        except ChainNotFound:
            chain = None
        if chain is not None and not principal.may_see(str(chain["tenant"])):
            chain = None
    return pages.Family(children, batch, chain)


async def dashboard_job_events(request: Request) -> Response:
    """The job page's event stream, authenticated by the session cookie (EventSource sends
    no Authorization header)."""
    user = await _user(request)
    if user is None:
        raise ApiError(401, "unauthorized", "sign in to the dashboard first")
    return await event_stream(request, user.principal)


@cache
def _job_script() -> bytes:
    return resources.files("coldbrew.api").joinpath("static/job.js").read_bytes()


async def job_script(_request: Request) -> Response:
    """The job page's script: a same-origin file, so the CSP needs no inline script."""
    return Response(
        _job_script(),
        media_type="text/javascript",
        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"},
    )


async def tenant(request: Request) -> Response:
    """A tenant's settings and the form to change its weight and cap."""
    user = await _user(request)
    if user is None:
        return _to_login()
    name = request.path_params["name"]
    rows = [t for t in await _state(request).client.store.tenants.list_tenants() if t.name == name]
    if not rows or not user.principal.may_see(name):
        raise ApiError(404, "not_found", f"no tenant {name!r}")
    return _html(pages.tenant_page(rows[0]))


async def audit(request: Request) -> Response:
    """The newest actions taken from the dashboard, by this tenant's sessions (or all)."""
    user = await _user(request)
    if user is None:
        return _to_login()
    entries = await _state(request).client.store.dashboard.audit_recent(user.principal.tenant)
    return _html(pages.audit_page(entries))


async def confirm(request: Request) -> Response:
    """Step one of an action: check it (the CLI's messages) and ask; nothing changes."""
    user = await _user(request)
    if user is None:
        return _to_login()
    csrf = await _csrf_of(request, user)
    if csrf is None:
        return _html(pages.error_page("acting needs a signed-in session (not a Bearer key)"), 403)
    try:
        action = parse_action(dict(request.query_params), user)
    except (ConfigurationError, InvalidRequest) as exc:
        return _html(pages.error_page(_message(exc)), 422)
    if action.job_id is not None:
        record = await _state(request).client.get(action.job_id)
        if not user.principal.may_see(record.tenant):
            raise JobNotFound(action.job_id)
    return _html(pages.confirm_page(action, csrf))


async def act(request: Request) -> Response:
    """Step two: the posted, confirmed action; 403 on a forged or missing CSRF token."""
    state = _state(request)
    _same_origin(request)
    form = await _posted_form(request, ACTION_FIELDS)
    user = await _user(request)
    if user is None or user.session_token is None:
        raise ApiError(403, "csrf_failed", "acting needs a signed-in dashboard session")
    (await state.csrf.signer()).check(user.session_token, form.get("csrf"))
    try:
        action = parse_action(form, user)
        outcome = await carry_out(action, state.client, user)
    except (ConfigurationError, InvalidRequest) as exc:
        return _html(pages.error_page(_message(exc)), 422)
    return RedirectResponse(_after(action, outcome), status_code=303)


def _message(exc: ConfigurationError | InvalidRequest) -> str:
    return exc.detail if isinstance(exc, InvalidRequest) else str(exc)


def _after(action: Action, outcome: str) -> str:
    """Where an action's redirect goes: the job, the dead jobs, or the overview."""
    done = urlencode({"done": f"{action.describe().rstrip('?')}: {outcome}"})
    if action.job_id is not None:
        return f"/dashboard/jobs/{quote(action.job_id, safe='')}?{done}"
    if action.name == "replay":
        return f"/dashboard/jobs?status=dead&{done}"
    return f"/dashboard?{done}"


async def login_form(request: Request) -> Response:
    if _state(request).keys.insecure_no_auth:
        return RedirectResponse("/dashboard", status_code=303)
    return _html(render.login_page())


async def login(request: Request) -> Response:
    """Check the posted key in constant time; open a session (303) or show the form (401)."""
    state = _state(request)
    _same_origin(request)
    key = (await _posted_form(request, LOGIN_FIELDS)).get("key", "").strip()
    tenant = state.keys.lookup(key) if key else None
    if tenant is None:
        message = "Enter an API key." if not key else "That API key is not valid."
        return _html(render.login_page(message), status=401)
    token = new_session_token()
    lifetime = state.config.session_seconds
    actor = f"api key {state.keys.fingerprint(key)} of {tenant}"
    await state.client.store.dashboard.create_session(token_hash(token), tenant, actor, lifetime)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        DASHBOARD_COOKIE,
        token,
        max_age=int(lifetime),
        path="/dashboard",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


async def logout(request: Request) -> Response:
    """Revoke the session (CSRF-checked: a forged logout is refused too), drop the cookie."""
    state = _state(request)
    _same_origin(request)
    form = await _posted_form(request, frozenset({"csrf"}))
    token = request.cookies.get(DASHBOARD_COOKIE, "")
    if token:
        (await state.csrf.signer()).check(token, form.get("csrf"))
        await state.client.store.dashboard.revoke_session(token_hash(token))
    response = _to_login()
    response.delete_cookie(DASHBOARD_COOKIE, path="/dashboard", httponly=True, samesite="strict")
    return response


def _same_origin(request: Request) -> None:
    """Refuse a form posted from another site; browsers send Origin on POST."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        raise ApiError(403, "cross_origin", "the form was posted from another site")


async def _posted_form(request: Request, allowed: frozenset[str]) -> dict[str, str]:
    """A small urlencoded form (parsed here: no multipart dependency), its fields checked."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if not content_type and request.headers.get("content-length", "0") == "0":
        return {}  # no body at all: an empty form (a sign-out button without fields)
    if content_type != "application/x-www-form-urlencoded":
        raise ApiError(415, "unsupported_media_type", "post the form as urlencoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_BODY_LIMIT:
            raise ApiError(413, "too_large", f"the form is over {FORM_BODY_LIMIT} bytes")
    try:
        fields = parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=FORM_MAX_FIELDS)
    except ValueError as exc:  # more fields than the form has
        raise ApiError(400, "invalid_form", "the form has too many fields") from exc
    if unknown := sorted(set(fields) - allowed):
        raise ApiError(
            400, "invalid_form", f"the form has only {sorted(allowed)} fields, not {unknown}"
        )
    return {name: values[0] for name, values in fields.items()}
