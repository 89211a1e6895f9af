"""Job types with ``unique_for``, for tests/integration/test_unique.py."""

from __future__ import annotations

import asyncio

from coldbrew import App, Context

app = App()


@app.job(unique_for=60)
async def sync_account(ctx: Context, account: str, full: bool = False) -> dict[str, str]:
    """Unique per args and tenant (the default parts) for a minute; runs for a moment,
    so raw duplicates arrive while it is queued, running or just succeeded."""
    await asyncio.sleep(0.2)
    return {"account": account, "tenant": ctx.tenant}


@app.job(unique_for=1, unique_by=("args",))
async def ping(ctx: Context, target: str) -> str:
    """A one-second window, across tenants (args only)."""
    return target


@app.job(unique_for="infinity", unique_keys=("domain",))
async def crawl(ctx: Context, domain: str, page: int = 0) -> int:
    """For ever, by one argument: any page of a domain is the same crawl."""
    return page


@app.job()
async def plain(ctx: Context, x: int = 0) -> int:
    """Not unique: only a submission's own unique options make it so."""
    return x
