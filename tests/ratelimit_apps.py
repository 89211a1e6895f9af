"""Job types for the rate-limit tests (tests/integration/test_ratelimit.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from coldbrew import App, Context

app = App()


@app.job()
async def quick(ctx: Context) -> None:
    """Does nothing: a limited tenant's rate is read from its rows' ``started_at``."""


@app.job()
async def nap(ctx: Context, seconds: float) -> None:
    """Holds a job slot for ``seconds``."""
    await asyncio.sleep(seconds)


@app.job(rate_limit="4/s", rate_burst=1, rate_key="domain")
async def fetch(ctx: Context, domain: str) -> None:
    """At most 4 starts a second per domain, fleet-wide."""


def _host(args: Mapping[str, Any]) -> str:
    return str(args["url"]).split("/")[2]


@app.job(rate_limit="1/h", rate_key=_host)
async def crawl(ctx: Context, url: str) -> None:
    """One start an hour per host: its second delivery per host waits (the drain test)."""
