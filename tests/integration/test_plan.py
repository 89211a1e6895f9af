"""`coldbrew plan` on a real backlog: too little data says how much more it needs, then
Little's law and Erlang C from the jobs a real worker ran, in JSON and as text.

The command runs in this process (`tests.integration.test_cron.cli`): a subprocess costs
seconds on a loaded machine.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from coldbrew.capacity import MIN_ARRIVALS
from coldbrew.cli import main
from coldbrew.client import Client
from coldbrew.settings import Settings
from tests.helpers import WorkerFactory, status_is, wait_until
from tests.integration.test_cron import cli

pytestmark = pytest.mark.timeout(120)
CONCURRENCY = 4


async def plan_json(
    capsys: pytest.CaptureFixture[str], settings: Settings, *args: str
) -> dict[str, object]:
    code, out, err = await cli(capsys, settings, "plan", "--json", *args)
    assert code == 0, err
    result: dict[str, object] = json.loads(out)
    return result


def lane(result: dict[str, object], queue: str) -> dict[str, object]:
    lanes = result["lanes"]
    assert isinstance(lanes, list)
    found = [row for row in lanes if row["queue"] == queue]
    assert found, f"no lane {queue!r} in {lanes}"
    return found[0]


async def finish(client: Client, count: int, seconds: float) -> None:
    jobs = await asyncio.gather(
        *(client.submit("sleep_for", {"seconds": seconds}) for _ in range(count))
    )
    for job in jobs:
        await wait_until(lambda job=job: status_is(client, job.id, "succeeded"), timeout=60)


async def test_plan_needs_data_then_sizes_the_lane(
    start_worker: WorkerFactory,
    settings: Settings,
    client: Client,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = await cli(capsys, settings, "plan")
    assert code == 0
    assert out == "(no lane had jobs submitted, finished or waiting in the last 1h)\n"
    await start_worker(concurrency=CONCURRENCY)
    await finish(client, 5, 0.05)
    thin = lane(await plan_json(capsys, settings, "--window", "10m"), "default")
    assert thin["status"] == "insufficient_data"
    assert thin["utilisation"] is None
    assert f"{MIN_ARRIVALS - 5} more submitted job(s)" in str(thin["needs"])

    await finish(client, MIN_ARRIVALS + 20, 0.1)
    result = await plan_json(capsys, settings, "--window", "10m", "--target-wait", "p95<=1s")
    figures = lane(result, "default")
    assert figures["status"] == "ok", figures
    assert figures["slots"] == CONCURRENCY
    assert figures["workers"] == 1
    arrival, service = float(figures["arrival_rate"]), float(figures["service_mean_seconds"])
    assert arrival == pytest.approx((MIN_ARRIVALS + 25) / 600, rel=0.01)
    assert 0.08 <= service <= 1.0, "the service time is about the jobs' 0.1 s"
    assert float(figures["load"]) == pytest.approx(arrival * service)
    assert float(figures["utilisation"]) == pytest.approx(arrival * service / CONCURRENCY)
    assert 0 <= float(figures["wait_probability"]) < 0.01
    assert figures["slots_needed"] == 1
    assert result["target_wait"] == "p95<=1s"
    assert result["source"] == "postgresql"

    grown = lane(
        await plan_json(capsys, settings, "--window", "10m", "--what-if-rate", "80/s"), "default"
    )
    assert grown["arrival_rate"] == 80.0
    assert float(grown["utilisation"]) > 1
    assert grown["mean_wait_seconds"] is None, "an overloaded lane's wait is unbounded"
    assert int(grown["slots_needed"]) > 80 * service

    code, text, _ = await cli(capsys, settings, "plan", "--window", "10m")
    assert code == 0
    assert "lane default:" in text
    assert "rho = λW/c" in text
    assert "for p95<=5s:" in text


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
