"""``coldbrew plan --prometheus URL``: a lane's λ and W from the fleet's counters.

The job table is the truth, but a busy fleet's Prometheus already holds the
same figures over any window for the price of four queries. Arrivals are the
jobs that ended (succeeded, failed, dead, cancelled: in a steady state what
ends is what arrived); W is the lane's attempts weighted by the mean
duration of their type (the duration histogram is labelled by type only).
The waiting count still comes from PostgreSQL, as do the slots.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import httpx

from coldbrew.errors import ConfigurationError, ServiceUnavailable
from coldbrew.store.capacity import LaneFigures

_ENDED = 'outcome=~"succeeded|failed|dead|cancelled"'


def queries(window_seconds: float) -> dict[str, str]:
    """The PromQL of each figure, per lane (``queue``), over the window."""
    w = f"{max(1, round(window_seconds))}s"
    mean_by_type = (
        f"(sum by (type) (increase(coldbrew_job_duration_seconds_sum[{w}]))"
        f" / sum by (type) (increase(coldbrew_job_duration_seconds_count[{w}])))"
    )
    started = f"sum by (queue, type) (increase(coldbrew_jobs_started_total[{w}]))"
    return {
        "ended": f"sum by (queue) (increase(coldbrew_jobs_finished_total{{{_ENDED}}}[{w}]))",
        "attempts": f"sum by (queue) ({started})",
        "busy": f"sum by (queue) ({started} * on (type) group_left () {mean_by_type})",
    }


async def lane_figures(
    url: str, window_seconds: float, from_table: Sequence[LaneFigures]
) -> list[LaneFigures]:
    """The table's lanes with λ's and W's inputs replaced by Prometheus's."""
    results: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=30) as http:
        for name, expr in queries(window_seconds).items():
            results[name] = await _by_queue(http, url, expr)
    waiting = {lane.queue: lane.waiting for lane in from_table}
    lanes = sorted(set(waiting) | set(results["ended"]) | set(results["attempts"]))
    figures = []
    for queue in lanes:
        attempts = results["attempts"].get(queue, 0.0)
        busy = results["busy"].get(queue)
        figures.append(
            LaneFigures(
                queue=queue,
                submitted=round(results["ended"].get(queue, 0.0)),
                finished=round(results["ended"].get(queue, 0.0)),
                timed=round(attempts),
                service_mean_seconds=busy / attempts if busy is not None and attempts else None,
                service_stddev_seconds=None,  # a histogram's mean, not its spread
                service_p95_seconds=None,
                waiting=waiting.get(queue, 0),
            )
        )
    return figures


async def _by_queue(http: httpx.AsyncClient, url: str, expr: str) -> dict[str, float]:
    try:
        response = await http.get("/api/v1/query", params={"query": expr})
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"Prometheus at {url} did not answer: {exc}") from exc
    body: dict[str, Any] = {}
    with contextlib.suppress(ValueError):  # not JSON: reported below with the status
        body = response.json()
    if response.status_code != 200 or body.get("status") != "success":
        detail = body.get("error") or f"HTTP {response.status_code}"
        raise ConfigurationError(f"--prometheus {url}: the query failed ({detail}): {expr}")
    found: dict[str, float] = {}
    for series in body["data"]["result"]:
        value = float(series["value"][1])
        if value == value:  # NaN: a type with no finished attempt in the window
            found[series["metric"].get("queue", "")] = value
    return found
