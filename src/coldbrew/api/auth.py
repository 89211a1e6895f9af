"""Bearer API keys → tenants.

Each request's key is compared with every configured key in constant time
(digests of equal length, no early exit), so response timing tells nothing
about how much of a guessed key was right.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.requests import Request

from coldbrew.api.errors import ApiError

REALM = 'Bearer realm="coldbrew"'
DASHBOARD_COOKIE = "coldbrew_dashboard_key"
"""The dashboard's HTTP-only cookie: a browser cannot send a Bearer header by itself."""


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
        return Principal(tenant)

    def authenticate_browser(self, request: Request) -> Principal | None:
        """The caller from a Bearer header or else the dashboard cookie; None if neither is valid.

        Returns instead of raising so the dashboard can answer with its login form.
        """
        if self.insecure_no_auth:
            return Principal(None)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            token = request.cookies.get(DASHBOARD_COOKIE, "")
        if not token.strip():
            return None
        tenant = self.lookup(token.strip())
        return None if tenant is None else Principal(tenant)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
