"""``RollupStore``: the per-minute rollup of finished jobs, and the histograms it keeps.

``coldbrew stats --since 1h`` computed its percentiles over every row finished
in the window (1.8M rows in an hour at 500 jobs/s). Migration 0024 keeps, per
minute, lane and tenant, the counts per final status and two sparse
histograms (run time, wait) over fixed log-scale buckets; a window sums them.
The fold runs off the hot path, in one worker per interval (worker/rollup.py),
up to a few seconds ago, where no write can still land (see ``fold_step``).

The bucket arithmetic is here, pure, beside the SQL function
``duration_bucket`` that assigns them (tests compare the two): bucket 0 holds
durations under ``FLOOR_SECONDS`` (0.1 ms; negative ones too), bucket
``k >= 1`` holds ``[FLOOR * 2**((k-1)/8), FLOOR * 2**(k/8))``. A percentile
is read as the geometric middle of its bucket, interpolated between two
buckets as ``percentile_cont`` interpolates between two rows, so it is within
``RELATIVE_ERROR`` (2**(1/16) - 1, 4.4%) of the exact value, or within
``FLOOR_SECONDS / 2`` in bucket 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from coldbrew.sql import QUERIES
from coldbrew.store.base import StoreBase

FLOOR_SECONDS = 1e-4
"""Durations below this (0.1 ms) share bucket 0."""
PER_DOUBLING = 8
"""Buckets per doubling of the duration."""
TOP_BUCKET = 320
"""The last bucket, open-ended: from ``FLOOR * 2**(319/8)`` (about 3.2 years) up."""
RELATIVE_ERROR = 2 ** (1 / (2 * PER_DOUBLING)) - 1
"""The most a percentile read from the buckets is off, relative to the exact value
(durations of at least ``FLOOR_SECONDS``): half a bucket on a log scale, 4.4%."""

FOLD_CHUNK = timedelta(hours=1)
"""The most minutes one fold statement takes: a first fold over weeks of kept rows, or
one after a long outage, goes an hour at a time (a step each), never all at once."""


def bucket_of(seconds: float) -> int:
    """The bucket of a duration: what the SQL function ``duration_bucket`` computes."""
    if not seconds >= FLOOR_SECONDS:  # negatives, and NaN, count as the shortest
        return 0
    return min(TOP_BUCKET, 1 + math.floor(PER_DOUBLING * math.log2(seconds / FLOOR_SECONDS)))


def bucket_middle(bucket: int) -> float:
    """The value a bucket stands for: the geometric middle of its bounds (half of
    ``FLOOR_SECONDS`` for bucket 0)."""
    if bucket <= 0:
        return FLOOR_SECONDS / 2
    return float(FLOOR_SECONDS * 2 ** ((bucket - 0.5) / PER_DOUBLING))


def percentile(buckets: Sequence[int], counts: Sequence[int], fraction: float) -> float | None:
    """The ``fraction`` percentile of a histogram (buckets ascending), as
    ``percentile_cont`` would compute it from the buckets' middles; None if empty.

    ``percentile_cont`` takes the values at 0-based ranks ``floor(h)`` and
    ``ceil(h)``, ``h = fraction * (n - 1)``, and interpolates linearly; each of
    those values is within ``RELATIVE_ERROR`` of its bucket's middle, so the
    interpolation of the middles is too.
    """
    total = sum(counts)
    if total == 0:
        return None
    rank = fraction * (total - 1)
    low = _value_at(buckets, counts, math.floor(rank))
    high = _value_at(buckets, counts, math.ceil(rank))
    return low + (rank - math.floor(rank)) * (high - low)


def _value_at(buckets: Sequence[int], counts: Sequence[int], rank: int) -> float:
    """The middle of the bucket holding the value of 0-based ``rank`` in ascending order."""
    seen = 0
    for bucket, count in zip(buckets, counts, strict=True):
        seen += count
        if rank < seen:
            return bucket_middle(bucket)
    return bucket_middle(buckets[-1])


MINUTE = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """How ``stats --since`` reads the window ``[since, now]`` exactly: the rollup rows of
    the minutes ``[rolled_from, rolled_to)``, plus the raw rows of ``add`` and those from
    ``tail`` on, minus the raw rows of ``subtract`` (half-open ranges; an empty one is
    ``(x, x)``). The folded minutes end at ``tail`` (where the fold stands)."""

    rolled_from: datetime
    rolled_to: datetime
    add: tuple[datetime, datetime]
    tail: datetime
    subtract: tuple[datetime, datetime]


def plan_window(since: datetime, folded_to: datetime | None) -> WindowPlan:
    """Split the window from ``since`` given that every finish before ``folded_to`` is in
    the rollup (pure).

    The window's first minute is usually partial. Its rows after ``since`` are read raw
    (``add``) when they are fewer than those before it; otherwise the minute's rollup row
    is taken and its rows before ``since`` are read raw and subtracted (``subtract``), so
    no more than half a minute of rows is read for the window's start, and the counts
    stay exact. When the fold has not passed the window's first whole minute (a short
    window, a fold behind, or none yet: ``None``), everything is read raw.
    """
    first = since.replace(second=0, microsecond=0)
    whole = since if first == since else first + MINUTE
    if folded_to is None or folded_to <= whole:
        return WindowPlan(whole, whole, (since, since), since, (since, since))
    if since - first < whole - since:
        return WindowPlan(first, folded_to, (since, since), folded_to, (first, since))
    return WindowPlan(whole, folded_to, (since, whole), folded_to, (since, since))


@dataclass(frozen=True, slots=True)
class FoldStep:
    """What one fold step did: the finish times ``[start, end)`` it folded (none when ``end``
    is None: another worker holds the lock, or nothing is due), the rollup rows written,
    and whether more minutes are due at once (a first fold catching up)."""

    start: datetime | None
    end: datetime | None
    rows: int
    more: bool


class RollupStore(StoreBase):
    """The fold of finished minutes (the prune service deletes old ones: history.py)."""

    async def fold_step(self, settle_seconds: float, max_wait_seconds: float) -> FoldStep:
        """Fold what finished since the last fold, up to ``FOLD_CHUNK`` of time, in one
        transaction under the namespace's rollup lock (one folder per fleet at a time).

        Every statement that finishes a job writes ``finished_at = now()``, the start of
        its transaction. The fold goes up to ``settle_seconds`` ago and not past the
        start of the oldest open transaction of this database (pg_stat_activity): a
        finishing write still to commit carries a later time, so nothing lands behind
        the fold. A transaction open longer than ``max_wait_seconds`` stops holding it
        back (a session idle in a transaction for hours must not stall it); a finishing
        write it commits later behind the fold is then not counted. (Sessions of another
        role show no ``xact_start`` unless this one has ``pg_read_all_stats``: only the
        settle time covers theirs.) The current minute
        is folded in parts, each added to its row. The first fold starts at the minute
        of the oldest kept finished row.
        """

        async def op(conn: asyncpg.Connection) -> FoldStep:
            async with conn.transaction():
                if not await conn.fetchval(QUERIES["rollup_lock"].text):
                    return FoldStep(None, None, 0, more=False)
                bounds = await conn.fetchrow(
                    QUERIES["rollup_bounds"].text, settle_seconds, max_wait_seconds
                )
                frontier: datetime = bounds["frontier"]
                start: datetime | None = bounds["folded_to"]
                if start is None:
                    oldest = await conn.fetchval(QUERIES["oldest_finished"].text)
                    start = frontier if oldest is None else _minute_of(min(oldest, frontier))
                end = min(frontier, start + FOLD_CHUNK)
                if end <= start:
                    if bounds["folded_to"] is None:
                        await conn.execute(QUERIES["set_folded_to"].text, start)
                    return FoldStep(None, None, 0, more=False)
                rows = await conn.fetchval(QUERIES["fold_finished_minutes"].text, start, end)
                await conn.execute(QUERIES["set_folded_to"].text, end)
                return FoldStep(start, end, rows, more=end < frontier)

        return await self._run(op)

    async def folded_to(self) -> datetime | None:
        """Every minute before this is in the rollup (None: never folded)."""
        folded: datetime | None = await self._fetchval("folded_to")
        return folded

    async def reset(self) -> None:
        """Forget the rollup: the next fold starts again from the oldest kept row. For
        ``bench/history.py``, whose generated rows carry past finish times."""
        await self._execute("reset_rollup")

    async def rollup_rows(self) -> int:
        """How many rollup rows are kept (minutes times lanes and tenants that finished jobs)."""
        return int(await self._fetchval("count_finished_minutes"))


def _minute_of(at: datetime) -> datetime:
    """The start of ``at``'s minute (timestamps from PostgreSQL are aware, in UTC)."""
    return at.replace(second=0, microsecond=0)
