"""``coldbrew stats``' rows: what waits now beside what finished in the window, per lane
and tenant, as one list for the table and for ``--json`` (pure: no I/O)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from coldbrew.cli.common import format_duration
from coldbrew.store import FinishedStats, QueueStats
from coldbrew.store.rollup import RELATIVE_ERROR


@dataclass(frozen=True, slots=True)
class StatsRow:
    """One lane and tenant: its waiting gauges (zeros when nothing waits) and its window."""

    waiting: QueueStats
    finished: FinishedStats | None
    rate: float | None
    wait: float | None

    @property
    def depth(self) -> int:
        return self.waiting.queued + self.waiting.retrying


def merge_rows(
    waiting: Sequence[QueueStats],
    finished: Sequence[FinishedStats],
    rates: Mapping[tuple[str, str], float],
    waits: Mapping[tuple[str, str], float],
) -> list[StatsRow]:
    """Every lane and tenant with jobs waiting, running, failed or dead now, or finished
    in the window (a lane whose jobs all succeeded is a row too), sorted."""
    by_key = {(row.queue, row.tenant): row for row in waiting}
    done = {(row.queue, row.tenant): row for row in finished}
    rows = []
    for key in sorted(by_key.keys() | done.keys()):
        now = by_key.get(key) or QueueStats(key[0], key[1], 0, 0, 0, 0, 0, 0.0)
        rows.append(StatsRow(now, done.get(key), rates.get(key), waits.get(key)))
    return rows


def row_json(row: StatsRow, since_seconds: float, consumers: Mapping[str, int]) -> dict[str, Any]:
    """A row of ``stats --json``: the waiting gauges as before, and ``window``."""
    wait = row.wait
    window = dataclasses.asdict(row.finished) if row.finished is not None else None
    if window is None:
        window = {
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "dead": 0,
            "run_p50_seconds": None,
            "run_p95_seconds": None,
            "wait_p50_seconds": None,
            "percentile_relative_error": RELATIVE_ERROR,
        }
    window = {"seconds": since_seconds} | {
        k: v for k, v in window.items() if k not in ("queue", "tenant")
    }
    return dataclasses.asdict(row.waiting) | {
        "depth": row.depth,
        "drain_rate_per_second": row.rate,
        "estimated_wait_seconds": None if wait is None or math.isinf(wait) else wait,
        "lane_consumers": consumers.get(row.waiting.queue),
        "window": window,
    }


COLUMNS = (
    ("queue", "<12"),
    ("tenant", "<16"),
    ("queued", ">7"),
    ("running", ">7"),
    ("retrying", ">8"),
    ("scheduled", ">9"),
    ("oldest", ">7"),
    ("drain/s", ">7"),
    ("est.wait", ">8"),
    ("│", "^1"),
    ("succeeded", ">9"),
    ("failed", ">6"),
    ("cancelled", ">9"),
    ("dead", ">5"),
    ("run p50", ">7"),
    ("run p95", ">7"),
)


def _cells(row: StatsRow) -> list[str]:
    now, done = row.waiting, row.finished
    wait = row.wait
    wait_text = "-" if wait is None else ("never" if math.isinf(wait) else format_duration(wait))
    oldest = format_duration(now.oldest_waiting_seconds) if row.depth else "-"
    return [
        now.queue,
        now.tenant,
        str(now.queued),
        str(now.running),
        str(now.retrying),
        str(now.scheduled),
        oldest,
        "-" if row.rate is None else f"{row.rate:.1f}",
        wait_text,
        "│",
        str(done.succeeded if done else 0),
        str(done.failed if done else 0),
        str(done.cancelled if done else 0),
        str(done.dead if done else 0),
        format_duration(done.run_p50_seconds if done else None),
        format_duration(done.run_p95_seconds if done else None),
    ]


def stats_lines(rows: Sequence[StatsRow], since_text: str) -> list[str]:
    """The table: a title naming both halves, a header, a line per lane and tenant."""
    widths = [max(len(name), int(spec[1:])) for name, spec in COLUMNS]
    cells = [_cells(row) for row in rows]
    for line in cells:
        widths = [max(w, len(cell)) for w, cell in zip(widths, line, strict=True)]

    def fmt(values: Sequence[str]) -> str:
        return " ".join(
            f"{value:{spec[0]}{width}}"
            for value, (_, spec), width in zip(values, COLUMNS, widths, strict=True)
        ).rstrip()

    split = [name for name, _ in COLUMNS].index("│")
    left = sum(widths[:split]) + split
    title = (
        f"{'waiting and running now':<{left}} │ finished in the last {since_text}"
        f" (run times within {RELATIVE_ERROR:.1%})"
    )
    return [title, fmt([name for name, _ in COLUMNS]), *(fmt(line) for line in cells)]
