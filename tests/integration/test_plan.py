"""`coldbrew plan` on a real backlog: too little data says how much more it needs, then
Little's law and Erlang C from the jobs a real worker ran, in JSON and as text."""

from __future__ import annotations

import asyncio
import json

import pytest

from coldbrew.capacity import MIN_ARRIVALS
from coldbrew.cli import main
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.e2e.test_cli import cli_env, run_cli
from tests.helpers import WorkerFactory, status_is, wait_until

pytestmark = pytest.mark.timeout(120)
CONCURRENCY = 4


async def plan_json(env: dict[str, str], *args: str) -> dict[str, object]:
    done = await run_cli(env, "plan", "--json", *args)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def lane(result: dict[str, object], queue: str) -> dict[str, object]:
    lanes = result["lanes"]
    assert isinstance(lanes, list)
    found = [row for row in lanes if row["queue"] == queue]
    assert found, f"no lane {queue!r} in {lanes}"
    return found[0]


async def test_plan_needs_data_then_sizes_the_lane(
    start_worker: WorkerFactory, settings: Settings, client: Client
) -> None:
    await start_worker(concurrency=CONCURRENCY)
    env = cli_env(settings)
    empty = await run_cli(env, "plan")
    assert empty.returncode == 0, empty.stderr
    assert "(no lane had jobs submitted, finished or waiting in the last 1h)" in empty.stdout
    few = [await client.submit("sleep_for", {"seconds": 0.05}) for _ in range(5)]
    await wait_until(lambda: status_is(client, few[-1].id, "succeeded"), timeout=30)
    thin = lane(await plan_json(env, "--window", "10m"), "default")
    assert thin["status"] == "insufficient_data"
    assert thin["utilisation"] is None
    assert f"{MIN_ARRIVALS - 5} more submitted job(s)" in str(thin["needs"])

    jobs = await asyncio.gather(
        *(client.submit("sleep_for", {"seconds": 0.2}) for _ in range(MIN_ARRIVALS + 20))
    )
    for job in jobs:
        await wait_until(lambda job=job: status_is(client, job.id, "succeeded"), timeout=60)
    result = await plan_json(env, "--window", "10m", "--target-wait", "p95<=1s")
    figures = lane(result, "default")
    assert figures["status"] == "ok", figures
    assert figures["slots"] == CONCURRENCY
    assert figures["workers"] == 1
    arrival, service = float(figures["arrival_rate"]), float(figures["service_mean_seconds"])
    assert arrival == pytest.approx((MIN_ARRIVALS + 25) / 600, rel=0.01)
    assert 0.15 <= service <= 1.5, "the service time is about the jobs' 0.2 s"
    assert float(figures["load"]) == pytest.approx(arrival * service)
    assert float(figures["utilisation"]) == pytest.approx(arrival * service / CONCURRENCY)
    assert 0 <= float(figures["wait_probability"]) < 0.01
    assert figures["slots_needed"] == 1
    assert result["target_wait"] == "p95<=1s"

    grown = lane(await plan_json(env, "--window", "10m", "--what-if-rate", "40/s"), "default")
    assert grown["arrival_rate"] == 40.0
    assert float(grown["utilisation"]) > 1
    assert grown["mean_wait_seconds"] is None, "an overloaded lane's wait is unbounded"
    assert int(grown["slots_needed"]) > 40 * service

    text = await run_cli(env, "plan", "--window", "10m")
    assert text.returncode == 0, text.stderr
    assert "lane default:" in text.stdout
    assert "rho = λW/c" in text.stdout
    assert "for p95<=5s:" in text.stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--target-wait", "soon"], "--target-wait must look like p95<=5s"),
        (["--what-if-rate", "double"], "--what-if-rate must be a multiplier like 2x"),
        (["--window", "forever"], "--window must be a duration"),
    ],
)
def test_plan_rejects_bad_flags_with_the_forms_it_accepts(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 and one line naming the flag and the accepted forms, before any connection."""
    assert main(["--namespace", "cb_plan_flags", "plan", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
