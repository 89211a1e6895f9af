"""Where a job's publish->start latency goes, stage by stage (``latency.py --stages``).

Imported by ``bench/latency_app.py`` inside the coldbrew worker when
``CBBENCH_STAGES`` names an output file. It wraps four worker methods at
import (bench-only instrumentation, never in a measured round) and stamps each
job, on the ``CLOCK_MONOTONIC`` clock the publisher's ``sent`` is on:

* ``on_message`` -- the consumer callback got the delivery;
* ``process`` -- the job's task began (``JobRunner.process``);
* ``claim`` -- the claim was handed to the claims' group commit;
* ``flush`` / ``flushed`` -- the claim batch holding it was sent / returned;
* ``claimed`` -- the job's task had its claim back;
* ``started`` -- the job's first statement (the UDP report's stamp).

The stamps ride a context variable set in the consumer callback: the job's
task is created there and inherits it. Rows go to the output file every
1,000 jobs and at exit; ``summarize`` turns them into per-stage percentiles.
A wrapped method that changes its name makes the worker fail at import (the
bench then reports the side failed) rather than record nonsense.
"""

from __future__ import annotations

import atexit
import contextvars
import json
import os
import time
from collections.abc import Sequence
from typing import Any

STAGES = (
    ("delivery", "sent -> on_message: publish, broker, aiormq (the raw loop's share)"),
    ("intake", "on_message -> process: parse, schedule, the job task's first turn"),
    ("to claim", "process -> claim submitted"),
    ("claim wait", "submitted -> batch sent: a flush in flight, gathering turns"),
    ("claim SQL", "batch sent -> returned: the claim statement's round trip"),
    ("resume", "returned -> the job's task resumed"),
    ("start", "claim back -> the job's first statement"),
    ("total", "sent -> started"),
)


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


_stamps: contextvars.ContextVar[dict[str, float]] = contextvars.ContextVar("cbbench_stamps")
_rows: list[list[float]] = []
_flushes: dict[int, tuple[float, float, int]] = {}
_out = ""


def install(out: str) -> None:
    """Wrap the worker's methods; rows go to ``out`` (JSON)."""
    global _out
    from coldbrew.batching import GroupCommit
    from coldbrew.store.claims import ClaimStore
    from coldbrew.worker.intake import Intake
    from coldbrew.worker.runner import JobRunner

    _out = out
    on_message = Intake.on_message
    process = JobRunner.process
    flush_one = GroupCommit._flush_one
    claim = ClaimStore.claim

    async def on_message_(self: Any, message: Any) -> None:
        _stamps.set({"on_message": _now()})
        await on_message(self, message)

    async def process_(self: Any, delivery: Any) -> None:
        stamps = _stamps.get(None)
        if stamps is not None:
            stamps["process"] = _now()
        await process(self, delivery)

    async def flush_one_(self: Any, batch: Any) -> None:
        sent = _now()
        await flush_one(self, batch)
        if self.name == "claim":
            returned = _now()
            for item, _ in batch:
                _flushes[id(item)] = (sent, returned, len(batch))

    async def claim_(self: Any, request: Any) -> Any:
        stamps = _stamps.get(None)
        if stamps is not None:
            stamps["claim"] = _now()
        result = await claim(self, request)
        flushed = _flushes.pop(id(request), None)
        if stamps is not None and flushed is not None:
            stamps["claimed"] = _now()
            stamps["flush"], stamps["flushed"], stamps["batch"] = flushed
        return result

    Intake.on_message = on_message_  # type: ignore[method-assign]
    JobRunner.process = process_  # type: ignore[method-assign]
    GroupCommit._flush_one = flush_one_  # type: ignore[method-assign]
    ClaimStore.claim = claim_  # type: ignore[method-assign]
    atexit.register(dump)


def job_started(sent: float, started: float) -> None:
    """The job's first statement: one row of stamps (jobs without a claim stamp are skipped)."""
    stamps = _stamps.get(None)
    if stamps is None or "claimed" not in stamps:
        return
    keys = ("on_message", "process", "claim", "flush", "flushed", "claimed")
    _rows.append([sent, *(stamps[k] for k in keys), started, stamps["batch"]])
    if len(_rows) % 1000 == 0:
        dump()


def dump() -> None:
    if _out:
        with open(_out, "w") as f:
            json.dump(_rows, f)


def summarize(rows: Sequence[Sequence[float]], warmup: float) -> dict[str, Any]:
    """Per-stage p50/p90/p99 (ms) over the rows sent ``warmup`` seconds after the first."""
    if not rows:
        return {"jobs": 0}
    first = min(row[0] for row in rows)
    kept = [row for row in rows if row[0] >= first + warmup]
    columns: list[list[float]] = [[] for _ in STAGES]
    for sent, on_message, process, claim, flush, flushed, claimed, started, _ in kept:
        marks = (sent, on_message, process, claim, flush, flushed, claimed, started)
        for i in range(len(marks) - 1):
            columns[i].append((marks[i + 1] - marks[i]) * 1000)
        columns[-1].append((started - sent) * 1000)
    sizes = [row[-1] for row in kept]

    def pct(values: list[float], fraction: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0

    return {
        "jobs": len(kept),
        "claim_batch_mean": sum(sizes) / len(sizes) if sizes else 0.0,
        "claim_batch_over_1": sum(1 for s in sizes if s > 1) / len(sizes) if sizes else 0.0,
        "stages": [
            {
                "stage": name,
                "what": what,
                "mean": sum(col) / len(col) if col else 0.0,
                "p50": pct(col, 0.5),
                "p90": pct(col, 0.9),
                "p99": pct(col, 0.99),
            }
            for (name, what), col in zip(STAGES, columns, strict=True)
        ],
    }


def render(summary: dict[str, Any]) -> list[str]:
    """Text lines for ``summarize``'s result."""
    if not summary.get("jobs"):
        return ["stages: no job reported its stamps"]
    mean, over_1 = summary["claim_batch_mean"], summary["claim_batch_over_1"] * 100
    lines = [
        f"stages of {summary['jobs']:,} jobs (ms; claim batches of {mean:.2f} on average, "
        f"{over_1:.0f}% of jobs in a batch of more than one):",
        f"  {'stage':<11} {'mean':>7} {'p50':>7} {'p90':>7} {'p99':>7}  what",
    ]
    for stage in summary["stages"]:
        lines.append(
            f"  {stage['stage']:<11} {stage['mean']:>7.3f} {stage['p50']:>7.3f} "
            f"{stage['p90']:>7.3f} {stage['p99']:>7.3f}  {stage['what']}"
        )
    return lines


if os.environ.get("CBBENCH_STAGES"):  # in the worker: latency_app imports this module
    install(os.environ["CBBENCH_STAGES"])
