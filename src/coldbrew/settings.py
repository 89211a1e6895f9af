"""Typed settings, built once at the edge (the CLI) and passed down.

Every setting is an environment variable ``COLDBREW_<NAME>``, also read from a
``.env`` file; any of them may instead come from a file named by
``COLDBREW_<NAME>_FILE`` (container secrets). The names are flat because they
are part of the contract (DESIGN §1); modules take the fields they need.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from coldbrew.crontab import CronSpec, parse_config
from coldbrew.durations import DurationError, parse_duration
from coldbrew.errors import ConfigurationError, ContractViolation
from coldbrew.topology import Topology
from coldbrew.urlguard import check_webhook_url

ENV_PREFIX = "COLDBREW_"
NAME_PATTERN = r"^[a-z0-9_-]{1,64}$"
NAMESPACE_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"


_SECRET_PARAMS = frozenset({"password", "sslpassword"})
# fields whose value must never be echoed in an error message
_SECRET_FIELDS = frozenset({"api_keys", "webhook_secret"})
MIN_SECRET_LENGTH = 16
DEFAULT_HOLD_CAP = 1000
"""The consumers' prefetch cap when ``COLDBREW_PREFETCH`` is 0 (a no-op drain's hold)."""


def parse_api_keys(text: str) -> dict[str, str]:
    """``key:tenant,key:tenant`` → ``{key: tenant}``; errors never quote a key.

    A tenant may hold several keys (rotation); a key maps to exactly one tenant.
    """
    keys: dict[str, str] = {}
    for position, entry in enumerate(filter(None, (e.strip() for e in text.split(","))), 1):
        key, colon, tenant = entry.rpartition(":")
        if not colon or not key:
            raise ValueError(f"entry {position} is not key:tenant")
        if len(key) < MIN_SECRET_LENGTH:
            raise ValueError(
                f"the key of entry {position} is shorter than {MIN_SECRET_LENGTH} characters"
            )
        if not re.fullmatch(NAME_PATTERN, tenant):
            raise ValueError(f"tenant {tenant!r} of entry {position} must match {NAME_PATTERN}")
        if key in keys:
            raise ValueError(f"the key of entry {position} is listed twice")
        keys[key] = tenant
    return keys


# A comma that starts another URL (``…,amqp://…``): commas inside one URL (libpq's
# ``host1:5432,host2:5432``, or an unencoded one in a password) do not split it.
_NEXT_URL = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")
TARGET_SESSION_ATTRS = frozenset(
    {"any", "primary", "standby", "prefer-standby", "read-write", "read-only"}
)


def split_urls(text: str) -> list[str]:
    """``COLDBREW_AMQP_URL``'s list: the URLs in order, blanks dropped."""
    return [part.strip(" ,") for part in _NEXT_URL.split(text) if part.strip(" ,")]


def mask_url(url: str) -> str:
    """Return ``url`` with its password (userinfo or libpq ``?password=``) shown as ``***``.

    A comma-separated list of URLs is masked one by one; a libpq multi-host
    URL (``user:pw@h1:5432,h2:5432``) is one URL with one password.
    """
    urls = split_urls(url)
    if len(urls) > 1:
        return ",".join(_mask_one(one) for one in urls)
    return _mask_one(url)


def _mask_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    masked = parts
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        masked = masked._replace(netloc=f"{parts.username or ''}:***@{host}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key.lower() in _SECRET_PARAMS for key, _ in query):
        query = [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in query]
        masked = masked._replace(query=urlencode(query, safe="*"))
    return url if masked is parts else urlunsplit(masked)


def _check_amqp_one(url: str, position: int) -> None:
    """One broker URL of the list (``position`` 0 when it is alone), or ``ValueError``."""
    where = f"URL {position} " if position else ""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{where}is not a valid URL ({exc})") from None
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"{where}must start with amqp:// or amqps://")
    if not parts.hostname:
        raise ValueError(f"{where}names no host")
    if port == 0:
        raise ValueError(f"{where}has port 0")


def check_database_url(url: str) -> None:
    """A libpq URL, one host or several (``postgresql://h1:5432,h2:5432/db``), or ``ValueError``.

    Each host's port must be a number, and ``target_session_attrs`` one that
    asyncpg knows (``read-write`` picks the primary of a list).
    """
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("must start with postgresql://")
    hosts = parts.netloc.rpartition("@")[2]
    for position, host in enumerate(hosts.split(",") if hosts else [], 1):
        name, port = host, ""
        if ":" in host and not host.endswith("]"):  # [::1] alone is an address, no port
            name, _, port = host.rpartition(":")
        if not name:
            raise ValueError(f"host {position} of the host list is empty")
        if port and not (port.isdigit() and 0 < int(port) < 65_536):
            raise ValueError(f"host {position} has an invalid port {port!r}")
    attrs = os.environ.get("PGTARGETSESSIONATTRS")  # libpq's (and asyncpg's) default
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key == "target_session_attrs":
            if value not in TARGET_SESSION_ATTRS:
                allowed = ", ".join(sorted(TARGET_SESSION_ATTRS))
                raise ValueError(f"target_session_attrs must be one of {allowed}, not {value!r}")
            attrs = value
    if hosts and "," in hosts and attrs not in ("read-write", "primary"):
        # asyncpg's default (any) would stay on the first host that answers, a standby
        # included, where every write fails; after a failover, the old primary back as one
        raise ValueError(
            "lists several hosts: add ?target_session_attrs=read-write so that coldbrew "
            "connects to the primary among them"
        )


RETENTION_FIELDS = (
    "retention_succeeded",
    "retention_failed",
    "retention_dead",
    "retention_cancelled",
)
KEEP_FOREVER = frozenset({"off", "never", "forever", "none"})


def parse_retention(value: Any) -> float | None:
    """A retention setting: a duration (``7d``, ``12h``, seconds) or ``off`` (keep forever)."""
    if value is None or isinstance(value, int | float):
        return None if value is None else float(parse_duration(str(value)))
    if not isinstance(value, str):
        # ValueError, not TypeError: pydantic turns only the former into a validation error
        raise ValueError(f"a retention must be a duration like 7d or 'off', not {value!r}")  # noqa: TRY004
    if value.strip().lower() in KEEP_FOREVER:
        return None
    try:
        return parse_duration(value)
    except DurationError as exc:
        raise ValueError(f"{exc}; or 'off' to keep these jobs forever") from None


class _FileSecretsSource(PydanticBaseSettingsSource):
    """Reads ``COLDBREW_<NAME>_FILE``: the value is the file's content, stripped."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        env_name = f"{ENV_PREFIX}{field_name.upper()}_FILE"
        path = os.environ.get(env_name)
        if not path:
            return None, field_name, False
        try:
            return Path(path).read_text(encoding="utf-8").strip(), field_name, False
        except OSError as exc:
            raise ConfigurationError(f"{env_name}: cannot read {path}: {exc.strerror}") from exc

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field, name)
            if value is not None:
                values[key] = value
        return values


class Settings(BaseSettings):
    """All of coldbrew's settings; see ``config/coldbrew.example.env`` for each one."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        validate_default=True,
    )

    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    database_url: str = "postgresql://127.0.0.1:5432/coldbrew"
    namespace: Annotated[str, Field(pattern=NAMESPACE_PATTERN)] = "coldbrew"

    concurrency: Annotated[int, Field(ge=1, le=100_000)] = 100
    processes: Annotated[int, Field(ge=0, le=1024)] = Field(
        default_factory=lambda: os.cpu_count() or 1
    )
    # 0 = no limit / never recycle: what a pool child may need depends on the
    # jobs (a thumbnail, a 4K transcode), so any fixed default would either kill
    # legitimate jobs after an upgrade or be too large to protect anything.
    process_max_memory_mb: Annotated[int, Field(ge=0, le=16 * 1024 * 1024)] = 0
    process_max_jobs: Annotated[int, Field(ge=0, le=1_000_000_000)] = 0
    # how long a process-pool job's claim or outcome may wait to share a commit while
    # the job would wait for a child anyway (worker/runner.py); 0: never
    pool_linger_seconds: Annotated[float, Field(ge=0, le=1)] = 0.05
    prefetch: Annotated[int, Field(ge=0, le=65_535)] = 0
    hold_seconds: Annotated[float, Field(ge=0, le=60)] = 0.25
    consume_channels: Annotated[int, Field(ge=1, le=1024)] = 64
    queues: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # --- quorum queues (topology.py): the layout of every queue this namespace declares ---
    queue_type: Literal["classic", "quorum"] = "classic"
    priority_bands: Annotated[int, Field(ge=1, le=10)] = 3

    lease_seconds: Annotated[float, Field(gt=0)] = 30.0
    claim_commit: Literal["sync", "async"] = "async"
    claim_barrier_seconds: Annotated[float, Field(ge=0, le=60)] = 0.005
    heartbeat_seconds: Annotated[float, Field(gt=0)] = 10.0
    reaper_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    liveness_seconds: Annotated[float, Field(ge=0, le=60)] = 0.5
    liveness_grace_seconds: Annotated[float, Field(gt=0, le=600)] = 1.0
    relay_interval_seconds: Annotated[float, Field(gt=0)] = 1.0
    relay_grace_seconds: Annotated[float, Field(ge=0)] = 10.0
    progress_flush_seconds: Annotated[float, Field(gt=0)] = 1.0
    tenant_resync_seconds: Annotated[float, Field(gt=0)] = 10.0
    shutdown_grace_seconds: Annotated[float, Field(ge=0)] = 30.0
    aging_seconds: Annotated[float, Field(gt=0)] = 10.0
    aging_sweep_limit: Annotated[int, Field(ge=0, le=100_000)] = 1000
    amqp_heartbeat_seconds: Annotated[int, Field(ge=1, le=600)] = 10
    broker_consumer_timeout_seconds: Annotated[float, Field(gt=0)] = 1800.0
    breaker_failure_threshold: Annotated[int, Field(ge=1)] = 5
    breaker_reset_seconds: Annotated[float, Field(gt=0)] = 30.0
    metrics_max_tenants: Annotated[int, Field(ge=1, le=10_000)] = 100
    stats_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    # The rollup of finished jobs (worker/rollup.py): how often one worker of the fleet folds
    # the minutes due, and how long after a minute ends it may be folded (a finishing write
    # carries its transaction's start; open transactions hold the fold back too). `stats
    # --since` reads the raw rows after the fold: these two's worth at most.
    stats_rollup_interval_seconds: Annotated[float, Field(gt=0, le=3600)] = 5.0
    stats_rollup_settle_seconds: Annotated[float, Field(ge=0, le=3600)] = 2.0
    reconcile_seconds: Annotated[float, Field(ge=0.3, le=86_400)] = 60.0

    max_attempts: Annotated[int, Field(ge=1, le=1000)] = 5
    retry_base_seconds: Annotated[float, Field(gt=0)] = 1.0
    retry_max_seconds: Annotated[float, Field(gt=0)] = 600.0
    max_body_bytes: Annotated[int, Field(ge=1024, le=128 * 1024 * 1024)] = 256 * 1024

    db_pool_size: Annotated[int, Field(ge=2, le=200)] = 10
    metrics_host: str = "0.0.0.0"  # noqa: S104 - a container's metrics must be reachable
    metrics_port: Annotated[int, Field(ge=0, le=65_535)] = 9464
    api_host: str = "127.0.0.1"
    api_port: Annotated[int, Field(ge=0, le=65_535)] = 8080
    api_keys: str = Field(default="", repr=False)
    api_insecure_no_auth: bool = False
    api_max_wait_seconds: Annotated[float, Field(gt=0, le=600)] = 60.0
    api_header_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 10.0
    api_body_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 30.0
    api_keepalive_seconds: Annotated[int, Field(ge=1, le=300)] = 5
    api_max_connections: Annotated[int, Field(ge=1, le=100_000)] = 1000
    api_max_waiters: Annotated[int, Field(ge=1, le=100_000)] = 500
    # --- the dashboard (api/dashboard.py): how long a browser's sign-in lasts ---
    dashboard_session_seconds: Annotated[float, Field(ge=60, le=30 * 86_400)] = 12 * 3600.0
    # --- webhooks (coldbrew/webhooks/, migration 0012): a delivery is a job ---
    # deprecated: the URL `coldbrew api` gives its POST /jobs submissions that name none
    # (prefer a submission's webhook_url or `coldbrew tenants set T --webhook-url URL`)
    webhook_url: str = ""
    # signs every delivery (workers deliver: set it on the workers)
    webhook_secret: str = Field(default="", repr=False)
    # attempts of a delivery job before it is dead (retried with the normal backoff)
    webhook_max_attempts: Annotated[int, Field(ge=1, le=100)] = 8
    # read (and write) time-out of one attempt, and its connect time-out
    webhook_timeout_seconds: Annotated[float, Field(gt=0, le=300)] = 10.0
    webhook_connect_timeout_seconds: Annotated[float, Field(gt=0, le=60)] = 5.0
    # the most of a receiver's answer read (the rest is not read)
    webhook_max_response_bytes: Annotated[int, Field(ge=0, le=16 * 1024 * 1024)] = 64 * 1024
    # allow webhooks to loopback, private, link-local, unique-local, ... addresses (SSRF guard)
    webhook_allow_private: bool = False

    # --- cron (worker/cron.py) ---
    # schedules for jobs registered without @app.cron: a JSON list of objects with
    # @app.cron's keywords plus "type" (COLDBREW_CRON_FILE names a file holding it)
    cron: str = ""
    # how often at most the cron service looks (it also wakes at each next tick)
    cron_poll_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0
    # a tick at most this late is on time; older ones are "missed" (the catch_up policy)
    cron_grace_seconds: Annotated[float, Field(ge=0, le=86_400)] = 5.0
    # --- scheduled jobs (worker/relay.py) ---
    # Rows the relay publishes per pass (it passes again at once while they are full):
    # a larger batch turns a burst of jobs due in the same second into fewer round trips.
    relay_batch: Annotated[int, Field(ge=1, le=100_000)] = 500
    # --- bounded history (worker/prune.py, `coldbrew prune`) ---
    # How long finished jobs are kept, per final status: a duration (90s, 12h, 7d, 2w) or
    # "off" to keep them forever. Defaults as River's (completed 24 h; cancelled and
    # discarded 7 d), with dead jobs kept 30 d: they wait in the dead letters for a replay.
    # Rejected messages (`coldbrew dlq list --rejected`) are kept as long as dead jobs.
    retention_succeeded: float | None = 86_400.0
    retention_failed: float | None = 7 * 86_400.0
    retention_dead: float | None = 30 * 86_400.0
    retention_cancelled: float | None = 7 * 86_400.0
    # The dashboard's audit log (who did what, from the dashboard) is kept this long; its
    # expired sessions go a day after they expire, whatever this says.
    retention_audit: float | None = 90 * 86_400.0
    # The finished jobs' per-minute rollup (`coldbrew stats --since`, migration 0024): one
    # row per minute, lane and tenant that finished jobs, kept this long ("off": forever).
    # 30 d, as long as dead jobs: a `--since 7d` a month later still has its minutes.
    retention_rollup: float | None = 30 * 86_400.0
    # how often the prune service looks, and the rows one of its statements deletes at most
    prune_interval_seconds: Annotated[float, Field(gt=0, le=86_400)] = 30.0
    prune_batch: Annotated[int, Field(ge=1, le=100_000)] = 1000

    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """A plain variable beats ``*_FILE``, which beats ``.env``."""
        return (init_settings, env_settings, _FileSecretsSource(settings_cls), dotenv_settings)

    def topology(self) -> Topology:
        """This namespace's broker names and arguments, in its queue layout."""
        return Topology(self.namespace, self.queue_type, self.priority_bands)

    @field_validator("queues", mode="before")
    @classmethod
    def _split_queues(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("queues")
    @classmethod
    def _check_queue_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(NAME_PATTERN, name):
                raise ValueError(f"queue name {name!r} must match {NAME_PATTERN}")
        return value

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, value: str) -> str:
        try:
            parse_config(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc).removeprefix("COLDBREW_CRON").lstrip(": ")) from None
        return value

    @field_validator(*RETENTION_FIELDS, "retention_audit", "retention_rollup", mode="before")
    @classmethod
    def _parse_retention(cls, value: Any) -> Any:
        return parse_retention(value)

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, value: str) -> str:
        urls = split_urls(value)
        if not urls:
            raise ValueError("must name at least one amqp:// or amqps:// URL")
        for position, url in enumerate(urls, 1):
            _check_amqp_one(url, position if len(urls) > 1 else 0)
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        check_database_url(value)
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys(cls, value: str) -> str:
        parse_api_keys(value)
        return value

    @field_validator("webhook_url")
    @classmethod
    def _check_webhook_url(cls, value: str) -> str:
        if value and urlsplit(value).scheme not in ("http", "https"):
            raise ValueError("must start with http:// or https://")
        return value

    @model_validator(mode="after")
    def _check_webhook_target(self) -> Settings:
        if self.webhook_url:
            try:
                check_webhook_url(self.webhook_url, allow_private=self.webhook_allow_private)
            except ContractViolation as exc:
                raise ValueError(f"COLDBREW_WEBHOOK_URL: {exc.detail}") from None
        return self

    @model_validator(mode="after")
    def _check_webhook_secret(self) -> Settings:
        if self.webhook_url and len(self.webhook_secret) < MIN_SECRET_LENGTH:
            raise ValueError(
                f"COLDBREW_WEBHOOK_SECRET must be at least {MIN_SECRET_LENGTH} characters "
                "when COLDBREW_WEBHOOK_URL is set (webhooks are always signed)"
            )
        return self

    @model_validator(mode="after")
    def _check_api_limits(self) -> Settings:
        # every waiter holds a connection: a larger waiter cap could never be reached
        if self.api_max_waiters > self.api_max_connections:
            raise ValueError(
                f"COLDBREW_API_MAX_WAITERS ({self.api_max_waiters}) must not exceed "
                f"COLDBREW_API_MAX_CONNECTIONS ({self.api_max_connections})"
            )
        return self

    @model_validator(mode="after")
    def _check_timing(self) -> Settings:
        if self.heartbeat_seconds >= self.lease_seconds / 2:
            raise ValueError(
                f"COLDBREW_HEARTBEAT_SECONDS ({self.heartbeat_seconds:g}) must be less than "
                f"half of COLDBREW_LEASE_SECONDS ({self.lease_seconds:g})"
            )
        if self.liveness_seconds and not (
            2 * self.liveness_seconds <= self.liveness_grace_seconds < self.lease_seconds
        ):
            raise ValueError(
                f"COLDBREW_LIVENESS_GRACE_SECONDS ({self.liveness_grace_seconds:g}) must be at "
                f"least twice COLDBREW_LIVENESS_SECONDS ({self.liveness_seconds:g}) and less "
                f"than COLDBREW_LEASE_SECONDS ({self.lease_seconds:g})"
            )
        if self.retry_base_seconds > self.retry_max_seconds:
            raise ValueError(
                "COLDBREW_RETRY_BASE_SECONDS must not exceed COLDBREW_RETRY_MAX_SECONDS"
            )
        return self

    @property
    def effective_prefetch(self) -> int:
        """The most messages an aging sweep keeps per queue (aging_sweep.py), and what the
        reconciler allows for them (``keep``).

        It was the consumers' fixed prefetch until the hold followed the start
        rate (``hold_cap``, holdsize.py); ``COLDBREW_PREFETCH``, when set, is
        both. The default (``0``) is ``min(concurrency, 32)``, doubled with
        asynchronous claims, the old default prefetch.
        """
        if self.prefetch:
            return self.prefetch
        waiting = min(self.concurrency, 32)
        return 2 * waiting if self.claim_commit == "async" else waiting

    @property
    def hold_cap(self) -> int:
        """The most deliveries one tenant queue's consumer holds unacked (``COLDBREW_PREFETCH``,
        or ``DEFAULT_HOLD_CAP``); below it the hold follows the start rate (holdsize.py)."""
        return self.prefetch or DEFAULT_HOLD_CAP

    @property
    def cron_schedules(self) -> list[CronSpec]:
        """``COLDBREW_CRON`` parsed (checked when the settings were built)."""
        return parse_config(self.cron)

    @property
    def api_key_map(self) -> dict[str, str]:
        """``COLDBREW_API_KEYS`` parsed: API key → tenant."""
        return parse_api_keys(self.api_keys)

    @property
    def amqp_urls(self) -> list[str]:
        """``COLDBREW_AMQP_URL`` as its list of broker URLs, in failover order."""
        return split_urls(self.amqp_url)

    def safe_amqp_url(self) -> str:
        return mask_url(self.amqp_url)

    def safe_database_url(self) -> str:
        return mask_url(self.database_url)


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment, turning validation errors into one clear line."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigurationError(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        if loc:
            name = f"{ENV_PREFIX}{loc[0].upper()}"
            given = error.get("input")
            if loc[0] in _SECRET_FIELDS:
                given = {}  # never echo a secret
            elif isinstance(given, str):
                given = mask_url(given)
            shown = "" if isinstance(given, dict) else f" (got {given!r})"
            problems.append(f"{name}: {error['msg']}{shown}")
        else:
            problems.append(error["msg"].removeprefix("Value error, "))
    return "invalid configuration: " + "; ".join(problems)
