"""``coldbrew tenants set T --rate`` / ``types set TYPE --rate``: set, shown, removed, refused."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from coldbrew.cli import main
from coldbrew.settings import Settings
from tests.helpers import worker_env


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


def test_rate_commands_set_list_unset_and_refuse_bad_rates(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In process (``main(argv)``), so that eighteen commands take a second, not a minute."""
    for name in [k for k in os.environ if k.startswith("COLDBREW_")]:
        monkeypatch.delenv(name)
    for name, value in worker_env(settings).items():
        if name.startswith("COLDBREW_"):
            monkeypatch.setenv(name, value)

    def run(*argv: str) -> Ran:
        code = main(list(argv))
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    assert run("tenants", "set", "acme", "--rate", "10/s").returncode == 0
    assert run("tenants", "set", "acme", "--burst", "4").returncode == 0  # the rate stays
    assert run("types", "set", "fetch", "--rate", "600/min", "--burst", "3").returncode == 0
    assert run("types", "set", "fetch", "--max-running", "2").returncode == 0  # the rate stays
    tenants = json.loads(run("tenants", "list", "--json").stdout)
    assert [(t["name"], t["rate_per_second"], t["rate_burst"]) for t in tenants] == [
        ("acme", 10.0, 4)
    ]
    listed = run("types", "list")
    assert "max running 2" in listed.stdout and "rate 10/s burst 3" in listed.stdout
    assert "rate 10/s burst 4" in run("tenants", "list").stdout

    assert run("tenants", "set", "acme", "--rate", "none").returncode == 0
    assert run("types", "set", "fetch", "--rate", "none").returncode == 0
    tenants = json.loads(run("tenants", "list", "--json").stdout)
    assert (tenants[0]["rate_per_second"], tenants[0]["rate_burst"]) == (None, None)
    types = json.loads(run("types", "list", "--json").stdout)
    assert (types[0]["max_running"], types[0]["rate_per_second"]) == (2, None)
    assert "no rate limit" in run("tenants", "list").stdout

    for argv, what in [
        (("tenants", "set", "acme", "--rate", "10"), "--rate"),
        (("tenants", "set", "acme", "--rate", "fast/s"), "--rate"),
        (("types", "set", "fetch", "--rate", "0/min"), "--rate"),
        (("types", "set", "fetch", "--rate", "5/s", "--burst", "0"), "--burst"),
        (("tenants", "set", "acme", "--rate", "none", "--burst", "2"), "--burst"),
        (("types", "set", "fetch"), "--max-running, --rate or --burst"),
    ]:
        refused = run(*argv)
        assert refused.returncode == 2 and what in refused.stderr, (argv, refused.stderr)
