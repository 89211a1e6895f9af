"""Cron schedules as values: what one declares, which ticks are due, what each tick's job is.

Pure (no I/O): the worker's cron service (worker/cron.py) reads the
watermark and PostgreSQL's clock, asks ``plan`` what the catch-up policy
makes of the ticks since, and writes the answer in one compare-and-swap.

Expressions are croniter's: five fields, or six with *seconds last*
(``"* * * * * */5"`` is every five seconds), read in the schedule's time
zone (zoneinfo). A tick is a UTC instant; its job id is derived from the
schedule's name and that instant, so every worker that fires it makes the
same job (``tick_job_id``).

Daylight saving time: a wall-clock time that does not exist (spring forward)
fires at the first instant after the gap (croniter's rule); a wall-clock time
that happens twice (fall back) fires once, at its first occurrence, for a
schedule whose hour is fixed (``"30 2 * * *"``), and at both for one whose hour
field is a wildcard or a step (``"*/30 * * * *"`` keeps its real half hours) --
the rule of Vixie cron.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from coldbrew.errors import ConfigurationError

CatchUp = Literal["latest", "all", "none"]
CATCH_UP: Final[tuple[CatchUp, ...]] = ("latest", "all", "none")
TickOutcome = Literal["fired", "caught_up", "skipped"]
TICK_OUTCOMES: Final[tuple[TickOutcome, ...]] = ("fired", "caught_up", "skipped")

SCHEDULE_NAME_RE: Final = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
"""Schedule names: at most 64 characters, so that every job id fits in 128."""
MAX_CATCH_UP: Final = 1000
COUNT_LIMIT: Final = 1000
"""Missed ticks counted one by one at most; past it, a log says "at least"."""
_TICK_ID_RE: Final = re.compile(r"^cron:(.+):(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$")
_FIXED_MACROS: Final = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight"}
)
_SECOND: Final = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class CronSpec:
    """One schedule as declared (``@app.cron`` or ``COLDBREW_CRON``), checked."""

    name: str
    expression: str
    tz: str
    type: str
    args: Mapping[str, Any] = field(default_factory=dict)
    catch_up: CatchUp = "latest"
    max_catch_up: int = 10
    tenant: str = "default"
    priority: int = 0

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    def next_tick(self, after: datetime) -> datetime:
        """The first tick strictly after ``after`` (UTC)."""
        return next(self.ticks_after(after))

    def ticks_after(self, after: datetime) -> Iterator[datetime]:
        """Ticks strictly after ``after``, in order, as UTC instants (DST rule applied)."""
        zone = self.zone
        it = croniter(self.expression, after.astimezone(zone))
        while True:
            tick = it.get_next(datetime).astimezone(UTC)
            if not self._repeated_wall_time(tick, zone):
                yield tick

    def ticks_before(self, until: datetime) -> Iterator[datetime]:
        """Ticks at or before ``until`` (UTC), latest first."""
        zone = self.zone
        start = until.replace(microsecond=0) + _SECOND  # croniter's get_prev is strict
        it = croniter(self.expression, start.astimezone(zone))
        while True:
            tick = it.get_prev(datetime).astimezone(UTC)
            if tick <= until and not self._repeated_wall_time(tick, zone):
                yield tick

    def _repeated_wall_time(self, tick: datetime, zone: ZoneInfo) -> bool:
        """Whether ``tick`` is the second occurrence of a wall time repeated by a fall-back
        and the schedule's hour is fixed (it already fired at the first occurrence)."""
        local = tick.astimezone(zone)
        if local.fold == 0 or local.replace(fold=0).utcoffset() == local.utcoffset():
            return False
        return _fixed_hour(self.expression)


def _fixed_hour(expression: str) -> bool:
    if expression.startswith("@"):
        return expression.lower() in _FIXED_MACROS
    fields = expression.split()
    return len(fields) >= 2 and "*" not in fields[1]


@dataclass(frozen=True, slots=True)
class Plan:
    """What the policy makes of the ticks in ``(watermark, now]``.

    ``fire``: the ticks to enqueue, oldest first, with ``fired`` (on time:
    at most ``grace`` late) or ``caught_up`` (missed, run by the policy);
    ``skipped``: how many missed ticks the policy drops (``skipped_more``:
    at least that many, the count stopped at ``COUNT_LIMIT``); ``watermark``:
    the latest tick decided, the schedule's new ``last_tick``.
    """

    fire: tuple[tuple[datetime, TickOutcome], ...]
    skipped: int
    skipped_more: bool
    missed: int
    watermark: datetime

    @property
    def caught_up(self) -> int:
        return sum(1 for _, outcome in self.fire if outcome == "caught_up")


def plan(spec: CronSpec, watermark: datetime, now: datetime, grace: float) -> Plan | None:
    """The decision for ``spec`` at ``now``; None when no tick is due since ``watermark``."""
    latest = next(spec.ticks_before(now))
    if latest <= watermark:
        return None
    boundary = max(watermark, now - timedelta(seconds=grace))
    on_time: list[datetime] = []
    for tick in spec.ticks_after(boundary):
        if tick > now:
            break
        on_time.append(tick)
    missed_count, more = _count_missed(spec, watermark, boundary)
    chosen: list[datetime] = []
    if missed_count and spec.catch_up == "all":
        chosen = _latest_missed(spec, watermark, boundary, spec.max_catch_up)
    elif missed_count and spec.catch_up == "latest" and not on_time:
        chosen = _latest_missed(spec, watermark, boundary, 1)
    fire: list[tuple[datetime, TickOutcome]] = [(tick, "caught_up") for tick in chosen]
    fire += [(tick, "fired") for tick in on_time]
    return Plan(
        fire=tuple(fire),
        skipped=missed_count - len(chosen),
        skipped_more=more,
        missed=missed_count,
        watermark=latest,
    )


def _count_missed(spec: CronSpec, watermark: datetime, boundary: datetime) -> tuple[int, bool]:
    """Ticks in ``(watermark, boundary]``, counted up to ``COUNT_LIMIT``."""
    if boundary <= watermark:
        return 0, False
    for count, tick in enumerate(spec.ticks_after(watermark)):
        if tick > boundary:
            return count, False
        if count + 1 >= COUNT_LIMIT:
            return count + 1, True
    raise AssertionError("unreachable: ticks_after never ends")  # pragma: no cover


def _latest_missed(
    spec: CronSpec, watermark: datetime, boundary: datetime, limit: int
) -> list[datetime]:
    """The latest ``limit`` ticks in ``(watermark, boundary]``, oldest first."""
    found: list[datetime] = []
    for tick in spec.ticks_before(boundary):
        if tick <= watermark or len(found) >= limit:
            break
        found.append(tick)
    return sorted(found)


# --- job ids -------------------------------------------------------------------------------


def tick_job_id(name: str, tick: datetime) -> str:
    """The one job id of ``name``'s tick at ``tick``: ``cron:<name>:<UTC, to the second>Z``."""
    return f"cron:{name}:{tick.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


def manual_job_id(name: str) -> str:
    """A manual run's id (``coldbrew cron trigger``): never one of a tick's."""
    return f"cron:{name}:manual:{uuid.uuid4()}"


def parse_tick_id(job_id: str) -> tuple[str, datetime] | None:
    """``(schedule, tick)`` of a tick's job id; None for any other id (a manual run too)."""
    if not job_id.startswith("cron:"):
        return None
    match = _TICK_ID_RE.match(job_id)
    if match is None:
        return None
    tick = datetime.strptime(match.group(2), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return match.group(1), tick


# --- declaring -----------------------------------------------------------------------------


def make_spec(
    *,
    name: str,
    expression: Any,
    tz: Any = "UTC",
    type: str,
    args: Any = None,
    catch_up: Any = "latest",
    max_catch_up: Any = 10,
    tenant: Any = "default",
    priority: Any = 0,
) -> CronSpec:
    """Check every field and build the spec; ``ConfigurationError`` names the schedule."""
    if not isinstance(name, str) or not SCHEDULE_NAME_RE.match(name):
        raise ConfigurationError(
            f"cron schedule name {name!r} must match {SCHEDULE_NAME_RE.pattern} "
            "(a job type longer than 64 characters needs name=)"
        )
    where = f"cron schedule {name!r}"
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"{where}: the expression must be a non-empty string")
    expression = " ".join(expression.split())
    _check_expression(where, expression)
    zone = _check_zone(where, tz)
    _check_policy(where, catch_up, max_catch_up)
    if not isinstance(tenant, str) or not re.fullmatch(r"[a-z0-9_-]{1,64}", tenant):
        raise ConfigurationError(f"{where}: tenant {tenant!r} must match [a-z0-9_-]{{1,64}}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise ConfigurationError(f"{where}: priority must be an integer 0..9, not {priority!r}")
    args = {} if args is None else args
    if not isinstance(args, dict) or not all(isinstance(key, str) for key in args):
        raise ConfigurationError(f"{where}: args must be an object with string keys")
    try:
        json.dumps(args, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"{where}: args must be JSON ({exc})") from None
    return CronSpec(
        name, expression, zone, type, dict(args), catch_up, max_catch_up, tenant, priority
    )


def _check_expression(where: str, expression: str) -> None:
    fields = expression.split()
    if not expression.startswith("@") and len(fields) not in (5, 6):
        raise ConfigurationError(
            f"{where}: {expression!r} must have 5 fields, or 6 with seconds last "
            f"(found {len(fields)})"
        )
    try:
        croniter(expression, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except (CroniterError, ValueError, KeyError) as exc:
        raise ConfigurationError(
            f"{where}: invalid cron expression {expression!r}: {exc}"
        ) from None


def _check_zone(where: str, tz: Any) -> str:
    if not isinstance(tz, str) or not tz:
        raise ConfigurationError(f"{where}: tz must be an IANA time zone name such as 'UTC'")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(f"{where}: unknown time zone {tz!r} ({exc})") from None
    return tz


def _check_policy(where: str, catch_up: Any, max_catch_up: Any) -> None:
    if catch_up not in CATCH_UP:
        raise ConfigurationError(
            f"{where}: catch_up must be one of {', '.join(CATCH_UP)}, not {catch_up!r}"
        )
    if (
        isinstance(max_catch_up, bool)
        or not isinstance(max_catch_up, int)
        or not 1 <= max_catch_up <= MAX_CATCH_UP
    ):
        raise ConfigurationError(
            f"{where}: max_catch_up must be an integer 1..{MAX_CATCH_UP}, not {max_catch_up!r}"
        )


_CONFIG_KEYS: Final = frozenset(
    {"name", "expression", "tz", "type", "args", "catch_up", "max_catch_up", "tenant", "priority"}
)


def parse_config(text: str) -> list[CronSpec]:
    """``COLDBREW_CRON``: a JSON list of objects, each ``{"type", "expression", ...}``
    with the keyword arguments of ``@app.cron`` (``name`` defaults to ``type``)."""
    if not text.strip():
        return []
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ConfigurationError(f"COLDBREW_CRON is not JSON: {exc}") from None
    if not isinstance(entries, list):
        raise ConfigurationError("COLDBREW_CRON must be a JSON list of schedule objects")
    specs: list[CronSpec] = []
    for position, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise ConfigurationError(f"COLDBREW_CRON entry {position} is not an object")
        unknown = sorted(set(entry) - _CONFIG_KEYS)
        if unknown:
            raise ConfigurationError(f"COLDBREW_CRON entry {position}: unknown keys {unknown}")
        job_type = entry.get("type")
        if not isinstance(job_type, str) or not job_type:
            raise ConfigurationError(f'COLDBREW_CRON entry {position} needs a job "type"')
        if "expression" not in entry:
            raise ConfigurationError(f'COLDBREW_CRON entry {position} needs an "expression"')
        spec = make_spec(**{"name": job_type, **entry})
        if any(other.name == spec.name for other in specs):
            raise ConfigurationError(
                f"COLDBREW_CRON: schedule {spec.name!r} is declared twice (give one a name)"
            )
        specs.append(spec)
    return specs
