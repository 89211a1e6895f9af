"""The web dashboard's routes: the page, its JSON twin, one job, and the API-key login.

A browser cannot attach a Bearer header to a page load, so ``POST
/dashboard/login`` checks the key with the same ``KeyRing`` as the API and
keeps it in an HTTP-only, SameSite=Strict cookie scoped to ``/dashboard``
(``Secure`` over https). A Bearer header works too, for scripts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from coldbrew.api import render
from coldbrew.api.auth import DASHBOARD_COOKIE, Principal
from coldbrew.api.errors import ApiError
from coldbrew.api.overview import collect
from coldbrew.errors import JobNotFound

if TYPE_CHECKING:
    from coldbrew.api.app import ApiState

LOGIN_BODY_LIMIT = 4096
LOGIN_MAX_FIELDS = 10  # more is not a login form: 400 invalid_form
COOKIE_MAX_AGE_SECONDS = 12 * 3600
# no scripts, no external assets, no framing: escaping is not the only line of defence
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def _html(text: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status, headers=PAGE_HEADERS)


def _to_login() -> RedirectResponse:
    return RedirectResponse(
        "/dashboard/login", status_code=303, headers={"Cache-Control": "no-store"}
    )


async def home(_request: Request) -> Response:
    """``/``: the dashboard is the only page."""
    return RedirectResponse("/dashboard", status_code=303)


async def dashboard(request: Request) -> Response:
    """The page; a browser without a valid key is sent to the login form (303)."""
    state = _state(request)
    principal = state.keys.authenticate_browser(request)
    if principal is None:
        response = _to_login()
        if DASHBOARD_COOKIE in request.cookies:  # a key that is no longer configured
            response.delete_cookie(DASHBOARD_COOKIE, path="/dashboard")
        return response
    overview = await collect(state.client.store, principal, state.rates)
    signed_in = DASHBOARD_COOKIE in request.cookies and not state.keys.insecure_no_auth
    return _html(render.dashboard_page(overview, signed_in=signed_in))


async def dashboard_json(request: Request) -> Response:
    """The page's data as JSON for scripts: Bearer key (or the cookie); 401 without one."""
    state = _state(request)
    principal = _principal_or_401(request)
    overview = await collect(state.client.store, principal, state.rates)
    return JSONResponse(overview.to_json(), headers={"Cache-Control": "no-store"})


async def dashboard_job(request: Request) -> Response:
    """One job's status JSON as a page; another tenant's job is 404, as a missing one."""
    state = _state(request)
    principal = state.keys.authenticate_browser(request)
    if principal is None:
        return _to_login()
    job_id = request.path_params["job_id"]
    record = await state.client.get(job_id)
    if not principal.may_see(record.tenant):
        raise JobNotFound(job_id)
    return _html(render.job_page(record.to_status_json()))


async def login_form(request: Request) -> Response:
    if _state(request).keys.insecure_no_auth:
        return RedirectResponse("/dashboard", status_code=303)
    return _html(render.login_page())


async def login(request: Request) -> Response:
    """Check the posted key in constant time; set the cookie (303) or show the form again (401)."""
    keys = _state(request).keys
    _same_origin(request)
    key = await _posted_key(request)
    tenant = keys.lookup(key) if key else None
    if tenant is None:
        message = "Enter an API key." if not key else "That API key is not valid."
        return _html(render.login_page(message), status=401)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        DASHBOARD_COOKIE,
        key,
        max_age=COOKIE_MAX_AGE_SECONDS,
        path="/dashboard",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


async def logout(request: Request) -> Response:
    _same_origin(request)
    response = _to_login()
    response.delete_cookie(DASHBOARD_COOKIE, path="/dashboard", httponly=True, samesite="strict")
    return response


def _principal_or_401(request: Request) -> Principal:
    keys = _state(request).keys
    return keys.authenticate_browser(request) or keys.authenticate(request)


def _same_origin(request: Request) -> None:
    """Refuse a form posted from another site (login CSRF); browsers send Origin on POST."""
    origin = request.headers.get("origin")
    if origin is not None and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        raise ApiError(403, "cross_origin", "the form was posted from another site")


async def _posted_key(request: Request) -> str:
    """The ``key`` field of a small urlencoded form (parsed here: no multipart dependency)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise ApiError(415, "unsupported_media_type", "post the form as urlencoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > LOGIN_BODY_LIMIT:
            raise ApiError(413, "too_large", f"the form is over {LOGIN_BODY_LIMIT} bytes")
    try:
        fields = parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=LOGIN_MAX_FIELDS)
    except ValueError as exc:  # more fields than a login form has
        raise ApiError(400, "invalid_form", "the form has too many fields") from exc
    if unknown := sorted(set(fields) - {"key"}):  # the form has one field (OpenAPI says so)
        raise ApiError(400, "invalid_form", f"the login form has only a `key` field, not {unknown}")
    return (fields.get("key") or [""])[0].strip()
