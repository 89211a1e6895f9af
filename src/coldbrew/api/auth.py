"""Bearer API keys → tenants, and the dashboard's sessions and CSRF tokens.

Each request's key is compared with every configured key in constant time
(digests of equal length, no early exit), so response timing tells nothing
about how much of a guessed key was right.

A browser signs in once with a key (``POST /dashboard/login``) and then holds a
session: a random token in an HTTP-only cookie, stored server-side only as its
SHA-256 (``dashboard_sessions``), so the cookie never carries the API key,
logout revokes it, and it expires (``COLDBREW_DASHBOARD_SESSION_SECONDS``).
Each session's CSRF token is an HMAC of its token under a secret stored once per
namespace in PostgreSQL (``dashboard_secrets``, drawn by the first replica that
needs it), so any ``coldbrew api`` replica behind a load balancer, or one
restarted, checks a form another signed, and no other site can compute it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from coldbrew.api.accesslog import note_tenant
from coldbrew.api.errors import ApiError

if TYPE_CHECKING:
    from coldbrew.store import DashboardStore

REALM = 'Bearer realm="coldbrew"'
DASHBOARD_COOKIE = "coldbrew_session"
"""The dashboard's HTTP-only cookie: a session token (a browser cannot send a Bearer header)."""
OPEN_SESSION = "open"
"""What the CSRF token of an unauthenticated dashboard (``COLDBREW_API_INSECURE_NO_AUTH``) signs."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: one tenant, or every tenant (``None``) when auth is off."""

    tenant: str | None

    def may_see(self, tenant: str) -> bool:
        return self.tenant is None or self.tenant == tenant


class KeyRing:
    """The configured keys, kept only as SHA-256 digests."""

    def __init__(self, keys: Mapping[str, str], *, insecure_no_auth: bool = False) -> None:
        self._digests = [(_digest(key), tenant) for key, tenant in keys.items()]
        self.insecure_no_auth = insecure_no_auth

    def fingerprint(self, key: str) -> str:
        """A key's public name in the audit log: the first 8 hex digits of its SHA-256."""
        return _digest(key).hex()[:8]

    def lookup(self, token: str) -> str | None:
        """The tenant of ``token``, or None; the cost does not depend on where it differs."""
        given = _digest(token)
        found: str | None = None
        for digest, tenant in self._digests:
            if hmac.compare_digest(given, digest):
                found = tenant
        return found

    def authenticate(self, request: Request) -> Principal:
        """The caller; 401 with ``WWW-Authenticate`` when the key is missing or wrong."""
        if self.insecure_no_auth:
            note_tenant(request, None)
            return Principal(None)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "unauthorized",
                "send an API key as `Authorization: Bearer <key>`",
                headers={"WWW-Authenticate": REALM},
            )
        tenant = self.lookup(token.strip())
        if tenant is None:
            raise ApiError(
                401,
                "unauthorized",
                "the API key is not valid",
                headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
            )
        note_tenant(request, tenant)
        return Principal(tenant)

    def bearer_principal(self, request: Request) -> Principal | None:
        """The caller of a valid Bearer header, else None (the dashboard then tries the cookie)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        tenant = self.lookup(token.strip())
        return None if tenant is None else Principal(tenant)


@dataclass(frozen=True, slots=True)
class BrowserUser:
    """Who uses the dashboard: the principal, the name the audit log gives them, and the
    session token their CSRF token signs (``None``: a Bearer script, which has no cookie
    a forged form could ride on)."""

    principal: Principal
    actor: str
    session_token: str | None


def new_session_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class CsrfSigner:
    """CSRF tokens: HMAC-SHA256 of the session token under a secret (see ``CsrfKeys``)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def token(self, session_token: str) -> str:
        return hmac.new(self._secret, session_token.encode(), hashlib.sha256).hexdigest()

    def check(self, session_token: str, given: str | None) -> None:
        """403 unless ``given`` is this session's token (constant-time comparison)."""
        if not given or not hmac.compare_digest(self.token(session_token), given):
            raise ApiError(
                403,
                "csrf_failed",
                "the form's CSRF token is missing or wrong: reload the page and try again",
            )


CSRF_SECRET = "csrf"  # noqa: S105 - the name of a stored secret, not a secret
"""The name of the CSRF key in ``dashboard_secrets``."""


class CsrfKeys:
    """The CSRF signer under the namespace's shared secret, read once, on first use.

    ``load`` reads (or, first of all replicas, draws and stores) the secret;
    a failed read is retried at the next request, never cached.
    """

    def __init__(self, load: Callable[[], Awaitable[bytes]]) -> None:
        self._load = load
        self._signer: CsrfSigner | None = None
        self._lock = asyncio.Lock()

    async def signer(self) -> CsrfSigner:
        if self._signer is None:
            async with self._lock:
                if self._signer is None:
                    self._signer = CsrfSigner(await self._load())
        return self._signer


async def browser_user(
    request: Request, keys: KeyRing, sessions: DashboardStore
) -> BrowserUser | None:
    """The dashboard's caller: auth off, a Bearer header, or a live session cookie; else None.

    Returns instead of raising so the dashboard can answer with its login form.
    """
    if keys.insecure_no_auth:
        note_tenant(request, None)
        return BrowserUser(Principal(None), "anonymous (auth off)", OPEN_SESSION)
    bearer = keys.bearer_principal(request)
    if bearer is not None:
        note_tenant(request, bearer.tenant)
        return BrowserUser(bearer, f"api key of {bearer.tenant} (Bearer)", None)
    token = request.cookies.get(DASHBOARD_COOKIE, "")
    if not token:
        return None
    session = await sessions.session(token_hash(token))
    if session is None:
        return None
    note_tenant(request, session.tenant)
    return BrowserUser(Principal(session.tenant), session.actor, token)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
