"""``RateTokens``: the SQL of rate limits' GCRA buckets, on a claim's own connection.

A job with a single rate limit (and no cap) is claimed first and then takes
its token with one upsert (``take_rate_token``: the row moves on only if it
conforms), in one transaction that is rolled back when there is no token --
so the bucket's row lock is held only from that upsert to the commit. Any
other limited claim is one short transaction (``CapStore.claim_session``):
lock the job's buckets and read their backlogs (``lock_rate_buckets``, one
statement that also creates missing buckets), claim (``claim_batch``), and,
when the job was claimed, store the buckets' new arrival times
(``take_rate_tokens``). The row locks serialize the fleet's claims of one
bucket, so two workers cannot take the same token. A contested bucket is first
read without a lock (``peek_rate_bucket``): a backlog past the tolerance is a
refusal that no claim can undo, so it needs no claim and waits for no lock.
What the backlogs mean is
decided in ``coldbrew.ratelimit`` (pure) and ``coldbrew.rates.claim``.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from coldbrew.sql import QUERIES

__all__ = ["RateTokens"]


class RateTokens:
    """The token statements of one claim, on its connection and inside its transaction."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def lock_buckets(self, keys: Sequence[str]) -> dict[str, float]:
        """Lock the buckets ``keys`` (sorted by the caller) and read their backlogs (s)."""
        rows = await self._conn.fetch(QUERIES["lock_rate_buckets"].text, list(keys))
        return {row["key"]: float(row["backlog"]) for row in rows}

    async def peek(self, key: str) -> float:
        """Bucket ``key``'s backlog (s) now, read without a lock (0: no bucket yet). Claims
        only move a bucket's time on, so a backlog past the tolerance stays a refusal."""
        backlog = await self._conn.fetchval(QUERIES["peek_rate_bucket"].text, key)
        return float(backlog or 0.0)

    async def take_first(
        self, key: str, interval: float, tau: float
    ) -> tuple[float | None, float | None, float | None]:
        """Take a token of bucket ``key`` before the claim, unless another claim holds its
        row: ``(backlog left or None, backlog under our lock or None: locked elsewhere,
        last committed backlog or None: no bucket yet)``."""
        row = await self._conn.fetchrow(QUERIES["take_rate_token_first"].text, key, interval, tau)
        if row is None:  # a SELECT of three subqueries always has its row
            raise RuntimeError("take_rate_token_first returned no row")
        return row["taken_backlog"], row["mine_backlog"], row["seen_backlog"]

    async def take_one(self, key: str, interval: float, tau: float) -> tuple[float | None, float]:
        """Take a token of bucket ``key`` if one is due (GCRA: emission interval and
        tolerance in seconds): ``(backlog left, _)``, or ``(None, backlog seen)`` refused."""
        row = await self._conn.fetchrow(QUERIES["take_rate_token"].text, key, interval, tau)
        if row is None:  # a SELECT of two subqueries always has its row
            raise RuntimeError("take_rate_token returned no row")
        seen = row["seen_backlog"]
        return row["taken_backlog"], 0.0 if seen is None else float(seen)

    async def take(self, keys: Sequence[str], backlogs: Sequence[float]) -> None:
        """Store the buckets' new backlogs (seconds from now): the tokens are taken."""
        await self._conn.execute(QUERIES["take_rate_tokens"].text, list(keys), list(backlogs))
