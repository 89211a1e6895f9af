"""The dashboard's charts: the last hour's throughput and backlog per lane, as inline SVG.

Server-side SVG needs no script, no library and no CDN, and passes the page's
strict CSP. The series come from the job table (``DashboardStore.throughput``
and ``backlog_edges``): a minute's throughput is the jobs that finished in it;
the backlog at the end of a minute is the jobs that had arrived and not yet
started (a retried job counts from its creation to its last start, so the
backlog of a lane with many retries is a slight over-estimate).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

MINUTES = 60
WIDTH, HEIGHT = 560, 180
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 44, 10, 12, 26
COLOURS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


@dataclass(frozen=True, slots=True)
class Chart:
    """One chart: a title, a unit and one series of MINUTES points per lane."""

    title: str
    unit: str
    series: Mapping[str, Sequence[int]]


def per_minute(rows: Iterable[tuple[str, int, int]]) -> dict[str, list[int]]:
    """``(lane, minute, count)`` → each lane's counts, minute 0 (an hour ago) to 59 (now)."""
    series: dict[str, list[int]] = {}
    for lane, minute, count in rows:
        points = series.setdefault(lane, [0] * MINUTES)
        points[min(max(minute, 0), MINUTES - 1)] += count
    return dict(sorted(series.items()))


def cumulative(rows: Iterable[tuple[str, int, int]]) -> dict[str, list[int]]:
    """``(lane, minute, change)`` → each lane's level at the end of each minute (never < 0)."""
    result = {}
    for lane, changes in per_minute(rows).items():
        level, points = 0, []
        for change in changes:
            level += change
            points.append(max(level, 0))
        result[lane] = points
    return result


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _scale(top: int) -> int:
    """A round axis maximum at or above ``top`` (1, 2 or 5 times a power of ten)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= top:
                return step * factor
        step *= 10


def _polyline(points: Sequence[int], top: int, colour: str) -> str:
    inner_w = WIDTH - PAD_LEFT - PAD_RIGHT
    inner_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    coords = " ".join(
        f"{PAD_LEFT + inner_w * i / (MINUTES - 1):.1f},{PAD_TOP + inner_h * (1 - value / top):.1f}"
        for i, value in enumerate(points)
    )
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>'


def svg(chart: Chart) -> str:
    """The chart as an ``<svg>`` element with a title, axes, one line per lane and a legend."""
    top = _scale(max((max(points, default=0) for points in chart.series.values()), default=0))
    bottom = HEIGHT - PAD_BOTTOM
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT + 18 * len(chart.series)}" '
        f'role="img" aria-label="{_e(chart.title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{_e(chart.title)}</title>",
        f'<line x1="{PAD_LEFT}" y1="{bottom}" x2="{WIDTH - PAD_RIGHT}" y2="{bottom}" '
        'stroke="#999"/>',
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{bottom}" stroke="#999"/>',
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 4}" text-anchor="end" font-size="11">{top}</text>',
        f'<text x="{PAD_LEFT - 4}" y="{bottom}" text-anchor="end" font-size="11">0</text>',
        f'<text x="{PAD_LEFT}" y="{bottom + 14}" font-size="11">-60 min</text>',
        f'<text x="{WIDTH - PAD_RIGHT}" y="{bottom + 14}" text-anchor="end" font-size="11">'
        "now</text>",
        f'<text x="{PAD_LEFT + 6}" y="{PAD_TOP + 4}" font-size="11" fill="#555">'
        f"{_e(chart.unit)}</text>",
    ]
    for index, (lane, points) in enumerate(chart.series.items()):
        colour = COLOURS[index % len(COLOURS)]
        parts.append(_polyline(points, top, colour))
        y = HEIGHT + 14 + 18 * index
        parts.append(
            f'<rect x="{PAD_LEFT}" y="{y - 9}" width="12" height="4" fill="{colour}"/>'
            f'<text x="{PAD_LEFT + 18}" y="{y}" font-size="12">{_e(lane)} '
            f"(now {points[-1]}, peak {max(points)})</text>"
        )
    if not chart.series:
        parts.append(
            f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="12" '
            'fill="#777">no jobs in the last hour</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
