"""Pure pieces of the HTTP API: key parsing and lookup, ETags, backoff, settings checks."""

from __future__ import annotations

import os

import pytest

from coldbrew.api.auth import KeyRing, Principal
from coldbrew.api.etag import etag_of, if_none_match
from coldbrew.api.server import key_ring
from coldbrew.api.watch import Backoff
from coldbrew.api.webhooks import sign, verify
from coldbrew.errors import ConfigurationError
from coldbrew.settings import load_settings, parse_api_keys

KEY_A = "a" * 16
KEY_B = "b" * 20


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("COLDBREW_"):
            monkeypatch.delenv(name)


def test_api_keys_parse_to_key_tenant_pairs() -> None:
    """``key:tenant`` entries, blanks ignored; a key may contain colons (the tenant is last)."""
    assert parse_api_keys(f" {KEY_A}:acme , ,{KEY_B}:globex") == {KEY_A: "acme", KEY_B: "globex"}
    assert parse_api_keys(f"{KEY_A}:x:acme") == {f"{KEY_A}:x": "acme"}
    assert parse_api_keys("") == {}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (KEY_A, "entry 1 is not key:tenant"),
        (f"{KEY_A}:acme,short:acme", "entry 2 is shorter than 16"),
        (f"{KEY_A}:Acme", "tenant 'Acme' of entry 1"),
        (f"{KEY_A}:acme,{KEY_A}:globex", "entry 2 is listed twice"),
    ],
)
def test_bad_api_keys_fail_at_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, text: str, problem: str
) -> None:
    """COLDBREW_API_KEYS errors name the variable and the entry, and never echo a key."""
    monkeypatch.setenv("COLDBREW_API_KEYS", text)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    message = str(caught.value)
    assert "COLDBREW_API_KEYS" in message
    assert problem in message
    assert KEY_A not in message


def test_api_keys_come_from_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]
) -> None:
    """COLDBREW_API_KEYS_FILE holds the keys (a container secret)."""
    path = os.path.join(tmp_path, "keys")
    with open(path, "w", encoding="utf-8") as out:
        out.write(f"{KEY_A}:acme\n")
    monkeypatch.setenv("COLDBREW_API_KEYS_FILE", path)
    assert load_settings().api_key_map == {KEY_A: "acme"}


def test_api_refuses_to_start_without_keys_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """No keys and no opt-in is an error; the opt-in alone, or keys alone, are fine; both is not."""
    with pytest.raises(ConfigurationError, match="COLDBREW_API_KEYS is empty"):
        key_ring(load_settings())
    assert key_ring(load_settings(api_insecure_no_auth=True)).insecure_no_auth
    assert key_ring(load_settings(api_keys=f"{KEY_A}:acme")).lookup(KEY_A) == "acme"
    with pytest.raises(ConfigurationError, match="choose one"):
        key_ring(load_settings(api_keys=f"{KEY_A}:acme", api_insecure_no_auth=True))


def test_key_ring_finds_exact_keys_only() -> None:
    """Only the exact key maps to its tenant: prefixes, extensions and case changes do not."""
    ring = KeyRing({KEY_A: "acme", KEY_B: "globex"})
    assert ring.lookup(KEY_A) == "acme"
    assert ring.lookup(KEY_B) == "globex"
    for wrong in (KEY_A[:-1], KEY_A + "a", KEY_A.upper(), "", KEY_B + KEY_A):
        assert ring.lookup(wrong) is None


def test_principal_sees_only_its_tenant() -> None:
    assert Principal("acme").may_see("acme")
    assert not Principal("acme").may_see("globex")
    assert Principal(None).may_see("globex")  # auth off


def test_etag_changes_with_any_field_and_not_with_key_order() -> None:
    """The ETag is a strong tag over the whole status JSON."""
    status = {"id": "j", "status": "running", "progress": 0.5}
    tag = etag_of(status)
    assert tag.startswith('"') and tag.endswith('"')
    assert etag_of(dict(reversed(list(status.items())))) == tag
    assert etag_of({**status, "progress": 0.6}) != tag
    assert etag_of({**status, "status": "succeeded"}) != tag


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (None, False),
        ('"abc"', True),
        ('W/"abc"', True),
        ('"x", "abc"', True),
        ("*", True),
        ('"abd"', False),
        ("abc", False),
    ],
)
def test_if_none_match(header: str | None, matches: bool) -> None:
    assert if_none_match(header, '"abc"') is matches


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.05, 0.3)
    assert [backoff.next() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    backoff.reset()
    assert backoff.next() == 0.05


# --- webhook signatures -------------------------------------------------------------

SECRET = "webhook-secret-0123456789"


def test_webhook_signature_verifies_and_tampering_fails() -> None:
    """A signature verifies for its body and time; another body, secret or time fails."""
    body = b'{"event":"job.finished"}'
    header = sign(SECRET, 1_700_000_000, body)
    assert header.startswith("t=1700000000,v1=")
    assert verify(SECRET, header, body, now=1_700_000_010)
    assert not verify(SECRET, header, body + b" ", now=1_700_000_010)
    assert not verify("another-secret-0123456789", header, body, now=1_700_000_010)
    assert not verify(SECRET, header, body, now=1_700_000_000 + 301)  # a replay, too late
    forged = header.replace("t=1700000000", "t=1700000300")
    assert not verify(SECRET, forged, body, now=1_700_000_300)
    assert not verify(SECRET, "garbage", body, now=1_700_000_000)
