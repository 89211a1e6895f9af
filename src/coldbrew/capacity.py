"""Capacity planning for one lane: Little's law and Erlang C (M/M/c), pure arithmetic.

`coldbrew plan` reads live figures (arrivals and service times from the job
table, slots from the ``workers`` table) and asks this module what they mean:
the load L = λW (jobs in service on average), utilisation rho = λW / c, the
probability that a job waits for a slot (Erlang C), its mean wait and a wait
quantile, and the fewest slots that meet a wait target. It assumes Poisson
arrivals and exponential service (M/M/c); the service time's spread is
reported beside it (its coefficient of variation: near 1 the model fits, far
above it real waits are longer) so the figures are not taken for more than
they are. With too few samples it says how many more it needs instead of
computing numbers from noise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Final, Literal

from coldbrew.durations import DurationError, parse_duration
from coldbrew.errors import ConfigurationError

MIN_ARRIVALS: Final = 20
"""Submissions a window needs before its arrival rate is trusted."""
MIN_TIMED: Final = 20
"""Finished first attempts a window needs before the mean service time is trusted."""
MAX_SLOTS: Final = 1_000_000
"""The largest fleet `slots_needed` sizes (Erlang C at a million slots takes ~0.3 s)."""

_TARGET = re.compile(r"^\s*(mean|p(\d{1,2}(?:\.\d+)?))\s*<=?\s*(\S+)\s*$", re.IGNORECASE)
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:(x)|/\s*(s|m|h))\s*$", re.IGNORECASE)
_PER: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class WaitTarget:
    """``--target-wait``: the mean wait, or a quantile of it, at most ``seconds``."""

    quantile: float | None  # None: the mean
    seconds: float

    def __str__(self) -> str:
        what = "mean" if self.quantile is None else f"p{self.quantile * 100:g}"
        return f"{what}<={self.seconds:g}s"


def parse_target(text: str) -> WaitTarget:
    """``p95<=5s``, ``p99<=500ms``, ``mean<=2s`` → a `WaitTarget`; anything else is a usage
    error saying what is accepted."""
    match = _TARGET.match(text)
    usage = f"--target-wait must look like p95<=5s, p99<=500ms or mean<=2s, not {text!r}"
    if match is None:
        raise ConfigurationError(usage)
    try:
        seconds = parse_duration(match.group(3))
    except DurationError as exc:
        raise ConfigurationError(f"{usage} ({exc})") from None
    if match.group(2) is None:
        return WaitTarget(None, seconds)
    quantile = float(match.group(2)) / 100
    if not 0 < quantile < 1:
        raise ConfigurationError(f"--target-wait's quantile must be p1..p99.9, not {text!r}")
    return WaitTarget(quantile, seconds)


@dataclass(frozen=True, slots=True)
class RateChange:
    """``--what-if-rate``: arrivals multiplied (``2x``) or set (``30/s``, ``600/m``)."""

    factor: float | None
    per_second: float | None

    def apply(self, rate: float) -> float:
        return rate * self.factor if self.factor is not None else float(self.per_second or 0)


def parse_rate_change(text: str) -> RateChange:
    """``2x``, ``1.5x``, ``30/s``, ``600/m``, ``5000/h`` → a `RateChange`."""
    match = _RATE.match(text)
    if match is None:
        raise ConfigurationError(
            f"--what-if-rate must be a multiplier like 2x or a rate like 30/s, 600/m or 5000/h, "
            f"not {text!r}"
        )
    number = float(match.group(1))
    if match.group(2):
        if not 0 < number <= 1000:
            raise ConfigurationError(
                f"--what-if-rate's multiplier must be in (0, 1000], not {text!r}"
            )
        return RateChange(number, None)
    return RateChange(None, number / _PER[match.group(3).lower()])


def erlang_c(slots: int, load: float) -> float:
    """The probability that an arrival waits, for ``slots`` servers offered ``load`` erlangs.

    Through the Erlang B recursion (B₀ = 1, Bₖ = A·Bₖ₋₁ / (k + A·Bₖ₋₁)), then
    C = c·B / (c - A·(1 - B)): no factorials, so it stays exact for a
    hundred thousand slots. 1.0 when the load is at or above the slots.
    """
    if slots < 1:
        raise ValueError("slots must be at least 1")
    if load <= 0:
        return 0.0
    if load >= slots:
        return 1.0
    b = 1.0
    for k in range(1, slots + 1):
        b = load * b / (k + load * b)
    return slots * b / (slots - load * (1 - b))


def mean_wait(slots: int, load: float, service_seconds: float) -> float:
    """The mean time a job waits for a slot (Wq = C·W / (c - A)); +Inf when overloaded."""
    if load >= slots:
        return math.inf
    return erlang_c(slots, load) * service_seconds / (slots - load)


def wait_quantile(slots: int, load: float, service_seconds: float, quantile: float) -> float:
    """The wait that ``quantile`` of jobs stay under: P(Wq > t) = C·e^(-(c-A)t/W)."""
    if load >= slots:
        return math.inf
    waits = erlang_c(slots, load)
    if waits <= 1 - quantile:
        return 0.0
    return service_seconds / (slots - load) * math.log(waits / (1 - quantile))


def predicted_wait(slots: int, load: float, service_seconds: float, target: WaitTarget) -> float:
    """The wait the target speaks of (its quantile, or the mean) at ``slots``."""
    if target.quantile is None:
        return mean_wait(slots, load, service_seconds)
    return wait_quantile(slots, load, service_seconds, target.quantile)


def slots_needed(load: float, service_seconds: float, target: WaitTarget) -> int:
    """The fewest slots whose predicted wait meets ``target`` (at least one more than the load).

    The wait falls as slots are added, so an exponential search then a bisection
    finds it in a few dozen Erlang C evaluations even for a hundred thousand slots.
    """

    def meets(slots: int) -> bool:
        return predicted_wait(slots, load, service_seconds, target) <= target.seconds

    low = max(1, math.floor(load) + 1)
    if low > MAX_SLOTS:
        raise ValueError(f"a load of {load:g} slots is beyond the {MAX_SLOTS} this plans for")
    if meets(low):
        return low
    step = 1
    while not meets(min(low + step, MAX_SLOTS)):
        if low + step >= MAX_SLOTS:
            raise ValueError(f"no fleet of up to {MAX_SLOTS} slots meets {target}")
        step *= 2
    failing, passing = low + step // 2, min(low + step, MAX_SLOTS)
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if meets(middle):
            passing = middle
        else:
            failing = middle
    return passing


@dataclass(frozen=True, slots=True)
class LaneSample:
    """What was measured of one lane over a window (store/capacity.py reads it)."""

    queue: str
    window_seconds: float
    submitted: int
    finished: int
    timed: int  # finished at their first attempt, with a start: the service-time sample
    service_mean_seconds: float | None
    service_stddev_seconds: float | None
    service_p95_seconds: float | None
    waiting: int
    slots: int  # Σ concurrency of the live workers serving the lane
    workers: int


@dataclass(frozen=True, slots=True)
class LanePlan:
    """The figures of one lane, or the shortfall that keeps them from being computed."""

    queue: str
    status: Literal["ok", "insufficient_data", "no_workers"]
    arrival_rate: float
    finish_rate: float
    service_mean_seconds: float | None
    service_cv: float | None
    slots: int
    workers: int
    waiting: int
    load: float | None = None
    utilisation: float | None = None
    wait_probability: float | None = None
    mean_wait_seconds: float | None = None
    predicted_wait_seconds: float | None = None
    """The target's statistic (its quantile, or the mean) at the current slots."""
    target_wait_seconds: float | None = None
    slots_needed: int | None = None
    workers_needed: int | None = None
    needs: str | None = None

    def to_json(self) -> dict[str, object]:
        return {k: _finite(getattr(self, k)) for k in self.__dataclass_fields__}


def _finite(value: object) -> object:
    """JSON has no Infinity: an unbounded wait is ``null`` (with utilisation ≥ 1 beside it)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def shortfall(sample: LaneSample) -> str | None:
    """What more the window needs before its figures mean anything, or ``None``."""
    missing = []
    if sample.submitted < MIN_ARRIVALS:
        missing.append(f"{MIN_ARRIVALS - sample.submitted} more submitted job(s)")
    if sample.timed < MIN_TIMED or sample.service_mean_seconds is None:
        missing.append(f"{MIN_TIMED - sample.timed} more job(s) finished at their first attempt")
    if not missing:
        return None
    return (
        f"{' and '.join(missing)} in the window (has {sample.submitted} submitted, "
        f"{sample.timed} timed; needs {MIN_ARRIVALS} and {MIN_TIMED}): use a longer --window"
    )


def plan_lane(
    sample: LaneSample, target: WaitTarget, rate_change: RateChange | None = None
) -> LanePlan:
    """Little's law, utilisation and Erlang C for one lane at its (or the planned) rate."""
    arrival = sample.submitted / sample.window_seconds
    if rate_change is not None:
        arrival = rate_change.apply(arrival)
    service = sample.service_mean_seconds
    cv = None
    if service and sample.service_stddev_seconds is not None:
        cv = sample.service_stddev_seconds / service
    base = LanePlan(
        queue=sample.queue,
        status="ok",
        arrival_rate=arrival,
        finish_rate=sample.finished / sample.window_seconds,
        service_mean_seconds=service,
        service_cv=cv,
        slots=sample.slots,
        workers=sample.workers,
        waiting=sample.waiting,
    )
    needs = shortfall(sample)
    if needs is not None or service is None:
        return replace(base, status="insufficient_data", needs=needs)
    load = arrival * service
    per_worker = max(1, round(sample.slots / sample.workers)) if sample.workers else None
    try:
        needed: int | None = slots_needed(load, service, target) if load > 0 else 1
    except ValueError as exc:  # a what-if rate far beyond any fleet: say so, size nothing
        needed, base = None, replace(base, needs=str(exc))
    figures = replace(
        base,
        load=load,
        target_wait_seconds=target.seconds,
        slots_needed=needed,
        workers_needed=math.ceil(needed / per_worker) if per_worker and needed else None,
    )
    if sample.slots < 1:
        return replace(figures, status="no_workers", needs="no live worker serves this lane")
    return replace(
        figures,
        utilisation=load / sample.slots,
        wait_probability=erlang_c(sample.slots, load),
        mean_wait_seconds=mean_wait(sample.slots, load, service),
        predicted_wait_seconds=predicted_wait(sample.slots, load, service, target),
    )
