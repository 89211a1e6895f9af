"""Settings from the environment, `.env` and `*_FILE` secrets, and the example env file."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import PydanticUndefined

from coldbrew.errors import ConfigurationError
from coldbrew.settings import ENV_PREFIX, Settings, load_settings, mask_url

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "coldbrew.example.env"
SECTIONS = [
    "Connections",
    "Worker",
    "Leases & retries",
    "Limits",
    "HTTP API",
    "Cron",
    "Observability",
    "Bounded history",
]

_ASSIGNMENT_RE = re.compile(r"^#\s?(?P<name>COLDBREW_[A-Z0-9_]+)=(?P<value>.*)$")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No developer's COLDBREW_* variables or `.env` leak into a test."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def example_lines() -> list[str]:
    return EXAMPLE.read_text(encoding="utf-8").splitlines()


def example_assignments() -> list[tuple[int, str, str]]:
    """``(line index, name, value)`` of every commented-out ``COLDBREW_X=value`` line."""
    found = []
    for index, line in enumerate(example_lines()):
        match = _ASSIGNMENT_RE.match(line)
        if match:
            found.append((index, match["name"], match["value"]))
    return found


def setting_assignments() -> dict[str, str]:
    """The example's settings (not their ``_FILE`` variants), by variable name."""
    return {name: value for _, name, value in example_assignments() if not _is_file_variant(name)}


def _is_file_variant(name: str) -> bool:
    return name.endswith("_FILE") and _field_of(name.removesuffix("_FILE")) is not None


def _field_of(variable: str) -> str | None:
    name = variable.removeprefix(ENV_PREFIX).lower()
    return name if name in Settings.model_fields else None


def _static_default(name: str) -> Any:
    """A field's default, or PydanticUndefined when it is computed (CPU count, host name)."""
    return Settings.model_fields[name].default


def config_error(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    return str(caught.value)


# --- the example env file -----------------------------------------------------------


def test_example_lists_exactly_the_settings_fields() -> None:
    """Every Settings field appears once in the example as COLDBREW_<FIELD>, and nothing else."""
    names = [name for _, name, _ in example_assignments() if not _is_file_variant(name)]
    assert len(names) == len(set(names)), "a variable is listed twice"
    expected = {f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields}
    assert set(names) == expected


def test_example_file_variants_name_real_settings() -> None:
    """Every ``*_FILE`` line in the example belongs to a setting, and the URLs have one."""
    variants = {name for _, name, _ in example_assignments() if name.endswith("_FILE")}
    for name in variants:
        assert _field_of(name.removesuffix("_FILE")) is not None, name
    assert {"COLDBREW_AMQP_URL_FILE", "COLDBREW_DATABASE_URL_FILE"} <= variants


def test_example_documents_every_variable() -> None:
    """Each variable line has a comment line directly above it that describes it."""
    lines = example_lines()
    for index, name, _ in example_assignments():
        above = lines[index - 1]
        assert above.startswith("# "), f"{name} has no comment above it"
        assert not _ASSIGNMENT_RE.match(above), f"{name} shares its comment with another line"
        assert len(above) > len("# ") + 10, f"{name}'s comment says nothing"


def test_example_is_grouped_by_topic() -> None:
    """The example's sections: connections, worker, leases & retries, limits, API, observability."""
    headers = [line[3:].split(" --")[0] for line in example_lines() if line.startswith("## ")]
    assert headers == SECTIONS


def test_example_mentions_file_secrets() -> None:
    """The example tells operators that secrets may come from ``*_FILE`` variables."""
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "COLDBREW_<NAME>_FILE" in text


def test_example_values_parse_and_are_the_defaults(tmp_path: Path) -> None:
    """Uncommented, the example loads through Settings, and each fixed default it shows is real."""
    env_file = tmp_path / "example.env"
    assignments = setting_assignments()
    env_file.write_text(
        "".join(f"{name}={value}\n" for name, value in assignments.items()), encoding="utf-8"
    )
    settings = Settings(_env_file=env_file)  # type: ignore[call-arg]
    for name in Settings.model_fields:
        default = _static_default(name)
        if default is not PydanticUndefined:
            assert getattr(settings, name) == default, f"{ENV_PREFIX}{name.upper()}"
    assert settings.queues == []
    assert settings.processes == 4
    assert settings.worker_id == "worker-1"


def test_example_as_shipped_changes_nothing(tmp_path: Path) -> None:
    """Loaded as it is (every line commented), the example yields the plain defaults."""
    settings = Settings(_env_file=EXAMPLE)  # type: ignore[call-arg]
    assert settings.model_dump(exclude={"worker_id"}) == Settings().model_dump(
        exclude={"worker_id"}
    )


# --- defaults and parsing -----------------------------------------------------------


def test_defaults_match_the_design_table() -> None:
    """The defaults DESIGN §1 documents are the ones Settings uses."""
    settings = load_settings()
    assert settings.amqp_url == "amqp://guest:guest@127.0.0.1:5672/"
    assert settings.database_url == "postgresql://127.0.0.1:5432/coldbrew"
    assert settings.namespace == "coldbrew"
    assert settings.concurrency == 100
    assert settings.processes == (os.cpu_count() or 1)
    assert settings.lease_seconds == 30
    assert settings.heartbeat_seconds == 10
    assert settings.shutdown_grace_seconds == 30
    assert settings.metrics_port == 9464


def test_queues_parse_to_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """COLDBREW_QUEUES=fast,slow is a list of lanes, with blanks and spaces dropped."""
    monkeypatch.setenv("COLDBREW_QUEUES", "fast,slow")
    assert load_settings().queues == ["fast", "slow"]
    monkeypatch.setenv("COLDBREW_QUEUES", " fast , ,slow, ")
    assert load_settings().queues == ["fast", "slow"]
    monkeypatch.setenv("COLDBREW_QUEUES", "")
    assert load_settings().queues == []


def test_environment_values_are_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Numbers and choices given as text become the field's type."""
    monkeypatch.setenv("COLDBREW_CONCURRENCY", "7")
    monkeypatch.setenv("COLDBREW_LEASE_SECONDS", "12.5")
    monkeypatch.setenv("COLDBREW_HEARTBEAT_SECONDS", "2")
    monkeypatch.setenv("COLDBREW_LOG_FORMAT", "console")
    settings = load_settings()
    assert settings.concurrency == 7
    assert settings.lease_seconds == 12.5
    assert settings.log_format == "console"


def test_dotenv_in_the_working_directory_is_read(tmp_path: Path) -> None:
    """A `.env` in the current directory supplies settings."""
    (tmp_path / ".env").write_text("COLDBREW_NAMESPACE=from_dotenv\n", encoding="utf-8")
    assert load_settings().namespace == "from_dotenv"


def test_effective_prefetch_is_small_per_tenant_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefetch 0 means min(concurrency, 32) waiting deliveries per queue, doubled with
    asynchronous claims (deliveries stay unacked until the claim is durable); a set value wins."""
    monkeypatch.setenv("COLDBREW_CONCURRENCY", "5000")
    monkeypatch.setenv("COLDBREW_CLAIM_COMMIT", "sync")
    assert load_settings().effective_prefetch == 32
    monkeypatch.setenv("COLDBREW_CONCURRENCY", "4")
    assert load_settings().effective_prefetch == 4
    monkeypatch.setenv("COLDBREW_CLAIM_COMMIT", "async")
    assert load_settings().effective_prefetch == 8
    monkeypatch.setenv("COLDBREW_CONCURRENCY", "5000")
    assert load_settings().effective_prefetch == 64
    monkeypatch.setenv("COLDBREW_PREFETCH", "3")
    assert load_settings().effective_prefetch == 3


# --- invalid values name the variable -----------------------------------------------


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"COLDBREW_CONCURRENCY": "-1"}, ["COLDBREW_CONCURRENCY"]),
        ({"COLDBREW_CONCURRENCY": "many"}, ["COLDBREW_CONCURRENCY"]),
        ({"COLDBREW_PROCESSES": "-2"}, ["COLDBREW_PROCESSES"]),
        ({"COLDBREW_LEASE_SECONDS": "0"}, ["COLDBREW_LEASE_SECONDS"]),
        ({"COLDBREW_LEASE_SECONDS": "soon"}, ["COLDBREW_LEASE_SECONDS"]),
        (
            {"COLDBREW_LEASE_SECONDS": "10", "COLDBREW_HEARTBEAT_SECONDS": "5"},
            ["COLDBREW_HEARTBEAT_SECONDS", "COLDBREW_LEASE_SECONDS"],
        ),
        (
            {"COLDBREW_HEARTBEAT_SECONDS": "20"},
            ["COLDBREW_HEARTBEAT_SECONDS", "COLDBREW_LEASE_SECONDS"],
        ),
        ({"COLDBREW_NAMESPACE": "Bad-Namespace"}, ["COLDBREW_NAMESPACE"]),
        ({"COLDBREW_NAMESPACE": "1st"}, ["COLDBREW_NAMESPACE"]),
        ({"COLDBREW_AMQP_URL": "http://127.0.0.1:5672/"}, ["COLDBREW_AMQP_URL"]),
        ({"COLDBREW_DATABASE_URL": "mysql://127.0.0.1/coldbrew"}, ["COLDBREW_DATABASE_URL"]),
        ({"COLDBREW_QUEUES": "fast,Slow!"}, ["COLDBREW_QUEUES"]),
        ({"COLDBREW_LOG_FORMAT": "xml"}, ["COLDBREW_LOG_FORMAT"]),
        ({"COLDBREW_METRICS_PORT": "70000"}, ["COLDBREW_METRICS_PORT"]),
        ({"COLDBREW_MAX_BODY_BYTES": "10"}, ["COLDBREW_MAX_BODY_BYTES"]),
        ({"COLDBREW_API_HEADER_TIMEOUT_SECONDS": "0"}, ["COLDBREW_API_HEADER_TIMEOUT_SECONDS"]),
        ({"COLDBREW_API_BODY_TIMEOUT_SECONDS": "-1"}, ["COLDBREW_API_BODY_TIMEOUT_SECONDS"]),
        ({"COLDBREW_API_KEEPALIVE_SECONDS": "0.5"}, ["COLDBREW_API_KEEPALIVE_SECONDS"]),
        ({"COLDBREW_API_MAX_CONNECTIONS": "0"}, ["COLDBREW_API_MAX_CONNECTIONS"]),
        ({"COLDBREW_API_MAX_WAITERS": "none"}, ["COLDBREW_API_MAX_WAITERS"]),
        (
            {"COLDBREW_API_MAX_CONNECTIONS": "100", "COLDBREW_API_MAX_WAITERS": "101"},
            ["COLDBREW_API_MAX_WAITERS", "COLDBREW_API_MAX_CONNECTIONS"],
        ),
        (
            {"COLDBREW_RETRY_BASE_SECONDS": "700"},
            ["COLDBREW_RETRY_BASE_SECONDS", "COLDBREW_RETRY_MAX_SECONDS"],
        ),
        ({"COLDBREW_LIVENESS_SECONDS": "-1"}, ["COLDBREW_LIVENESS_SECONDS"]),
        (
            {"COLDBREW_LIVENESS_SECONDS": "1", "COLDBREW_LIVENESS_GRACE_SECONDS": "1.5"},
            ["COLDBREW_LIVENESS_GRACE_SECONDS", "COLDBREW_LIVENESS_SECONDS"],
        ),
        (
            {"COLDBREW_LIVENESS_GRACE_SECONDS": "30"},
            ["COLDBREW_LIVENESS_GRACE_SECONDS", "COLDBREW_LEASE_SECONDS"],
        ),
    ],
)
def test_invalid_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: list[str]
) -> None:
    """An invalid value fails with one line that names the variable(s) at fault."""
    message = config_error(monkeypatch, **env)
    for name in named:
        assert name in message
    assert "\n" not in message


def test_heartbeat_exactly_half_the_lease_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat must be strictly less than half the lease."""
    message = config_error(
        monkeypatch, COLDBREW_LEASE_SECONDS="20", COLDBREW_HEARTBEAT_SECONDS="10"
    )
    assert "COLDBREW_HEARTBEAT_SECONDS" in message
    monkeypatch.setenv("COLDBREW_HEARTBEAT_SECONDS", "9.9")
    assert load_settings().heartbeat_seconds == 9.9


def test_liveness_off_lifts_its_timing_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """With COLDBREW_LIVENESS_SECONDS=0 (off) the grace is not checked against it."""
    monkeypatch.setenv("COLDBREW_LIVENESS_GRACE_SECONDS", "0.1")
    assert "COLDBREW_LIVENESS_GRACE_SECONDS" in config_error(monkeypatch)
    monkeypatch.setenv("COLDBREW_LIVENESS_SECONDS", "0")
    assert load_settings().liveness_seconds == 0


def test_amqps_and_postgres_schemes_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """TLS AMQP and the short postgres:// scheme are valid URLs."""
    monkeypatch.setenv("COLDBREW_AMQP_URL", "amqps://u:p@broker.example:5671/")
    monkeypatch.setenv("COLDBREW_DATABASE_URL", "postgres://u:p@db.example/coldbrew")
    settings = load_settings()
    assert settings.amqp_url.startswith("amqps://")
    assert settings.database_url.startswith("postgres://")


def test_invalid_url_message_masks_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rejected URL is shown with its password masked, like every other URL coldbrew prints."""
    message = config_error(monkeypatch, COLDBREW_AMQP_URL="http://user:s3cret@broker:5672/")
    assert "COLDBREW_AMQP_URL" in message
    assert "s3cret" not in message


# --- *_FILE secrets -----------------------------------------------------------------


def test_file_secret_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """COLDBREW_DATABASE_URL_FILE names a file whose stripped content is the URL."""
    secret = tmp_path / "database_url"
    secret.write_text("postgresql://app:pw@db.example:5432/jobs\n", encoding="utf-8")
    monkeypatch.setenv("COLDBREW_DATABASE_URL_FILE", str(secret))
    assert load_settings().database_url == "postgresql://app:pw@db.example:5432/jobs"


def test_plain_variable_beats_file_secret(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """When both COLDBREW_X and COLDBREW_X_FILE are set, the plain variable wins."""
    secret = tmp_path / "database_url"
    secret.write_text("postgresql://from-file/jobs", encoding="utf-8")
    monkeypatch.setenv("COLDBREW_DATABASE_URL_FILE", str(secret))
    monkeypatch.setenv("COLDBREW_DATABASE_URL", "postgresql://from-env/jobs")
    assert load_settings().database_url == "postgresql://from-env/jobs"


def test_file_secret_beats_dotenv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A ``*_FILE`` secret wins over the same setting in `.env`."""
    (tmp_path / ".env").write_text("COLDBREW_AMQP_URL=amqp://from-dotenv/\n", encoding="utf-8")
    secret = tmp_path / "amqp_url"
    secret.write_text("amqp://from-file/", encoding="utf-8")
    monkeypatch.setenv("COLDBREW_AMQP_URL_FILE", str(secret))
    assert load_settings().amqp_url == "amqp://from-file/"


def test_file_secret_values_are_validated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A value read from a file is checked like any other and the error names the setting."""
    secret = tmp_path / "amqp_url"
    secret.write_text("redis://cache/", encoding="utf-8")
    monkeypatch.setenv("COLDBREW_AMQP_URL_FILE", str(secret))
    with pytest.raises(ConfigurationError, match="COLDBREW_AMQP_URL"):
        load_settings()


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_file_secret_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    """A ``*_FILE`` that cannot be read fails with ConfigurationError naming the variable."""
    path = tmp_path / "nope" if kind == "missing" else tmp_path
    monkeypatch.setenv("COLDBREW_DATABASE_URL_FILE", str(path))
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert "COLDBREW_DATABASE_URL_FILE" in str(caught.value)
    assert str(path) in str(caught.value)


# --- masking ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:***@127.0.0.1:5672/"),
        ("postgresql://app:pw@db:5432/jobs", "postgresql://app:***@db:5432/jobs"),
        ("postgresql://app:p%40ss@db/jobs", "postgresql://app:***@db/jobs"),
        ("postgresql://app:p@ss@db/jobs", "postgresql://app:***@db/jobs"),
        ("amqps://:token@broker/", "amqps://:***@broker/"),
        ("postgresql://127.0.0.1:5432/coldbrew", "postgresql://127.0.0.1:5432/coldbrew"),
        ("amqp://guest@127.0.0.1/", "amqp://guest@127.0.0.1/"),
        ("amqp://[::1", "<unparseable url>"),
    ],
)
def test_mask_url_hides_passwords(url: str, masked: str) -> None:
    """mask_url replaces the password with *** and leaves everything else as it was."""
    assert mask_url(url) == masked


def test_settings_print_urls_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The safe_* accessors used in messages never show a password."""
    monkeypatch.setenv("COLDBREW_AMQP_URL", "amqp://user:hunter2@broker/")
    monkeypatch.setenv("COLDBREW_DATABASE_URL", "postgresql://user:hunter2@db/jobs")
    settings = load_settings()
    assert "hunter2" not in settings.safe_amqp_url()
    assert "hunter2" not in settings.safe_database_url()


def test_mask_url_hides_password_query_parameter() -> None:
    """A password given as libpq's ``?password=`` parameter is masked too."""
    assert "hunter2" not in mask_url("postgresql://app@db/jobs?password=hunter2")
