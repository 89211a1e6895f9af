"""Job apps with cron schedules (tests/integration/test_cron.py, tests/faults/test_cron_fleet.py).

Second-granularity schedules (six fields, seconds last) keep the tests short:
an "outage" of a few seconds is several missed ticks.
"""

from __future__ import annotations

from coldbrew import App, Context

# every second, every tick kept (catch_up="all"): the exactly-once fleet tests
app = App()


@app.cron("* * * * * *", name="every-second", catch_up="all", max_catch_up=1000)
@app.job()
async def tick(ctx: Context) -> None:
    """Does nothing: a tick's job only has to exist once."""


# the three catch-up policies side by side, one job type
policies = App()


@policies.cron("* * * * * *", name="latest", catch_up="latest")
@policies.cron("* * * * * *", name="all", catch_up="all", max_catch_up=3)
@policies.cron("* * * * * *", name="none", catch_up="none")
@policies.job()
async def beat(ctx: Context, label: str = "") -> None:
    """Does nothing."""


# one schedule, then the same name with a new expression (an edit across a deploy)
before_edit = App()
after_edit = App()


@before_edit.cron("* * * * * *", name="edited", catch_up="all", max_catch_up=1000)
@before_edit.job()
async def report(ctx: Context) -> None:
    """Does nothing."""


@after_edit.cron("* * * * * */2", name="edited", catch_up="all", max_catch_up=1000)
@after_edit.job(name="report")
async def report_again(ctx: Context) -> None:
    """The same job type in the new release."""


# a daily schedule nobody waits for: the CLI tests (list, pause, resume, trigger)
daily = App()


@daily.cron("0 6 * * *", tz="Europe/Paris", name="morning", args={"label": "am"})
@daily.job()
async def greet(ctx: Context, label: str) -> str:
    return label
