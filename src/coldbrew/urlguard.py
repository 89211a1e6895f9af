"""Which webhook URLs coldbrew may call: the syntax, and the addresses it refuses (SSRF).

A webhook URL comes from outside (a producer's ``x-webhook-url`` header, an
HTTP body, a tenant setting), and the worker that delivers it sits inside the
network. Without a guard, ``http://169.254.169.254/`` reads a cloud's
instance credentials and ``http://10.0.0.1/admin`` reaches what no producer
should. So a URL is checked twice: at submission its syntax, and its host
when that is a literal address (``check_webhook_url``); at delivery every
address its host resolves to (``refused_address``), and the delivery connects
to the address that passed, so a DNS answer that changes between the check
and the connection (rebinding) cannot switch it. Pure functions: resolving is
the caller's I/O (``coldbrew.webhooks.delivery``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from coldbrew.errors import ContractViolation

MAX_URL_LENGTH = 2048
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Target:
    """A checked webhook URL, split into what a connection needs."""

    url: str
    scheme: str
    host: str
    """The host as written, without brackets (a name, or a literal address)."""
    port: int
    path: str
    """Path and query, as sent in the request line."""

    @property
    def literal(self) -> IPAddress | None:
        """The host when it is an address, not a name."""
        return literal_address(self.host)

    @property
    def host_header(self) -> str:
        """The Host header: the name (or bracketed address) and a non-default port."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def url_for(self, address: IPAddress) -> str:
        """The URL with its host replaced by ``address``: what is connected to."""
        host = f"[{address}]" if address.version == 6 else str(address)
        return f"{self.scheme}://{host}:{self.port}{self.path}"


def literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def refused_address(address: IPAddress) -> str | None:
    """Why a webhook may not connect to ``address`` (None: it may): loopback, link-local,
    private, unique-local, multicast, unspecified, reserved; an IPv4-mapped or -translated
    IPv6 address is judged as the IPv4 address it carries."""
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return refused_address(mapped)
        if address in _NAT64:
            return refused_address(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    for kind in (
        "loopback",
        "link_local",
        "multicast",
        "unspecified",
        "private",
        "reserved",
    ):
        if getattr(address, f"is_{kind}"):
            return f"{address} is a {kind.replace('_', '-')} address"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return f"{address} is a shared (carrier-grade NAT) address"
    if not address.is_global:
        return f"{address} is not a global address"
    return None


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")


def check_webhook_url(
    value: object,
    *,
    allow_private: bool,
    what: str = "webhook_url",
    reason: str = "invalid_webhook_url",
) -> Target:
    """``value`` as a webhook URL, or ``ContractViolation(reason)`` naming what is wrong:
    http(s) only, a host, no credentials, at most 2048 characters, and (unless
    ``allow_private``: ``COLDBREW_WEBHOOK_ALLOW_PRIVATE``) no literal address that
    ``refused_address`` refuses. A host name is checked at delivery, after resolving."""
    if isinstance(value, bytes | bytearray):  # pamqp: an AMQP long string that is not UTF-8
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise ContractViolation(reason, f"{what} is not UTF-8 text") from None
    if not isinstance(value, str):
        raise ContractViolation(reason, f"{what} must be a string, not {type(value).__name__}")
    if not 0 < len(value) <= MAX_URL_LENGTH:
        raise ContractViolation(reason, f"{what} must be 1-{MAX_URL_LENGTH} characters")
    if not value.isascii() or not value.isprintable() or " " in value:
        raise ContractViolation(
            reason, f"{what} must be printable ASCII without spaces (percent-encode the rest)"
        )
    target = _split(value, what, reason)
    address = target.literal
    if address is not None and not allow_private:
        problem = refused_address(address)
        if problem is not None:
            raise ContractViolation(
                reason,
                f"{what} {value!r} is refused: {problem} "
                "(COLDBREW_WEBHOOK_ALLOW_PRIVATE=true allows it)",
            )
    return target


def _split(value: str, what: str, reason: str) -> Target:
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ContractViolation(reason, f"{what} {value!r} is not a URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ContractViolation(reason, f"{what} must start with http:// or https://")
    host = parts.hostname
    if not host:
        raise ContractViolation(reason, f"{what} {value!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise ContractViolation(
            reason, f"{what} must not carry credentials (user:password@); sign with the secret"
        )
    if port == 0:
        raise ContractViolation(reason, f"{what} {value!r} has port 0")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(
        url=value,
        scheme=scheme,
        host=host,
        port=port if port is not None else (443 if scheme == "https" else 80),
        path=path,
    )
