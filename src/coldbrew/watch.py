"""Following jobs to their end: ``coldbrew submit --wait`` and ``coldbrew demo`` show it.

``follow`` polls the jobs' rows (one statement for all of them, every
``POLL_SECONDS``) and hands each reading to a renderer until every job is
terminal. Two renderers: ``LiveBars`` (rich progress bars, one per job, for a
terminal) and ``PlainLines`` (one line per change of a job, each starting with
its id, for logs, pipes and ``--json``). Both show the same facts: id, type,
tenant, lane, attempt, status, progress and its message, and the result or
error once it is known; a value too long for a line is shortened as a value
(``shorten``), so what is shown of a result is still JSON.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence
from datetime import UTC
from typing import IO, Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.text import Text

from coldbrew.client import Client
from coldbrew.model import JobRecord, Status

POLL_SECONDS = 0.25
"""How often ``follow`` reads the rows: a progress flush lands every 0.2-1 s."""

STATUS_STYLES = {
    Status.QUEUED: "dim",
    Status.RUNNING: "cyan",
    Status.RETRYING: "yellow",
    Status.SUCCEEDED: "green",
    Status.FAILED: "red",
    Status.DEAD: "bold red",
    Status.CANCELLED: "magenta",
}


def shorten(value: Any, *, text: int = 32, items: int = 4, depth: int = 3) -> Any:
    """``value`` with long strings cut to ``text`` characters (ending in "…"), lists
    and objects past ``items`` entries cut (a last entry says how many more), and
    nesting past ``depth`` replaced by "…": still JSON, never cut mid-token."""
    if isinstance(value, str):
        return value if len(value) <= text else value[: max(1, text - 1)] + "…"
    if isinstance(value, dict):
        if depth <= 0:
            return "{…}"
        entries = list(value.items())
        kept = {
            str(key): shorten(item, text=text, items=items, depth=depth - 1)
            for key, item in entries[:items]
        }
        if len(entries) > items:
            kept["…"] = f"{len(entries) - items} more"
        return kept
    if isinstance(value, list):
        if depth <= 0:
            return "[…]"
        shown = [shorten(item, text=text, items=items, depth=depth - 1) for item in value[:items]]
        if len(value) > items:
            shown.append(f"… {len(value) - items} more")
        return shown
    return value


def value_text(value: Any, width: int = 96) -> str:
    """Compact JSON of ``value`` in about ``width`` characters, shortening values (not the
    JSON text) harder until it fits or cannot shrink further."""
    ladder = ((48, 6, 3), (24, 4, 3), (12, 3, 3), (8, 3, 3), (12, 3, 1), (8, 1, 1))
    for text, items, depth in ladder:
        shortened = shorten(value, text=text, items=items, depth=depth)
        shown = json.dumps(shortened, default=str, ensure_ascii=False)
        if len(shown) <= width:
            return shown
    return shown


def detail(job: JobRecord, width: int = 96) -> str:
    """What a line says after the status: the progress message, the error, the result,
    in about ``width`` characters (a result shortened as a value, text with "…")."""
    if job.status is Status.SUCCEEDED:
        return "→ " + value_text(job.result, width - 2)
    text = _detail_text(job)
    return text if len(text) <= width else text[: width - 1] + "…"


def _detail_text(job: JobRecord) -> str:
    if job.status is Status.CANCELLED:
        return job.error_message or "cancelled"
    error = f"{job.error_kind}: {job.error_message or ''}".rstrip(": ")
    if job.status is Status.RETRYING and job.error_kind:
        # the time, not a countdown: a reading changes only when the job does
        return f"{error} (next attempt at {job.run_at.astimezone(UTC):%H:%M:%S.%f}"[:-4] + "Z)"
    if job.status in (Status.FAILED, Status.DEAD) and job.error_kind:
        return error
    return job.progress_message or ""


def percent(job: JobRecord) -> str:
    return "" if job.progress is None else f"{math.floor(job.progress * 100):d}%"


def plain_line(job: JobRecord) -> str:
    """One line for one reading of a job; its id comes first, so lines can be grepped."""
    return (
        f"{job.id}  {job.type} {job.tenant}@{job.queue}  attempt {job.attempt}/"
        f"{job.max_attempts}  {job.status.value:<9} {percent(job):>4}  {detail(job)}".rstrip()
    )


class Renderer(Protocol):
    """Shows successive readings of the followed jobs."""

    def update(self, jobs: Sequence[JobRecord]) -> None: ...

    def close(self) -> None: ...


class PlainLines:
    """One line per change of a job (status, attempt, progress or its message, outcome);
    a reading that would print the same line again prints nothing."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self._last: dict[str, str] = {}

    def update(self, jobs: Sequence[JobRecord]) -> None:
        for job in jobs:
            line = plain_line(job)
            if self._last.get(job.id) != line:
                self._last[job.id] = line
                print(line, file=self.out, flush=True)

    def close(self) -> None:
        return None


class LiveBars:
    """A rich progress bar per job, redrawn in place; left on screen at the end."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.fields[short_id]}"),
            TextColumn("{task.fields[type]:<10} {task.fields[tenant]:<8}"),
            TextColumn("[dim]{task.fields[lane]:<7} attempt {task.fields[attempt]}"),
            BarColumn(bar_width=20, complete_style="cyan", finished_style="green"),
            TextColumn("{task.fields[percent]:>4}"),
            TextColumn("{task.fields[status]}"),
            TextColumn("{task.fields[detail]}", markup=False),
            console=console,
            refresh_per_second=8,
        )
        self._tasks: dict[str, TaskID] = {}
        self.progress.start()

    def update(self, jobs: Sequence[JobRecord]) -> None:
        for job in jobs:
            fields: dict[str, Any] = {
                "short_id": job.id[:8],
                "type": job.type,
                "tenant": job.tenant,
                "lane": job.queue,
                "attempt": f"{job.attempt}/{job.max_attempts}",
                "percent": percent(job),
                "status": Text(f"{job.status.value:<9}", style=STATUS_STYLES[job.status]),
                "detail": detail(job, width=56),
            }
            done = 100 if job.status is Status.SUCCEEDED else round(100 * (job.progress or 0.0))
            task = self._tasks.get(job.id)
            if task is None:
                added = self.progress.add_task("", total=100, completed=done, **fields)
                self._tasks[job.id] = added
            else:
                self.progress.update(task, completed=done, **fields)

    def close(self) -> None:
        self.progress.stop()


def renderer_for(console: Console, *, plain: bool) -> Renderer:
    """Live bars on a terminal, plain lines otherwise (or when ``plain``)."""
    if plain or not console.is_terminal or console.is_dumb_terminal:
        return PlainLines(console.file)
    return LiveBars(console)


async def follow(
    client: Client,
    ids: Sequence[str],
    renderer: Renderer,
    *,
    timeout: float,
    poll: float = POLL_SECONDS,
) -> list[JobRecord]:
    """Read the jobs every ``poll`` seconds and show each reading until all are terminal;
    return their final records (in ``ids`` order). ``TimeoutError`` after ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while True:
            found = {job.id: job for job in await client.store.jobs.get_jobs(ids)}
            jobs = [found[job_id] for job_id in ids if job_id in found]
            renderer.update(jobs)
            if len(jobs) == len(ids) and all(job.status.terminal for job in jobs):
                return jobs
            if loop.time() >= deadline:
                waiting = [job for job in jobs if not job.status.terminal]
                state = waiting[0].status.value if waiting else "not found"
                raise TimeoutError(
                    f"job {(waiting[0].id if waiting else ids[0])} is still {state} after "
                    f"{timeout:g} s"
                )
            await asyncio.sleep(min(poll, max(0.0, deadline - loop.time())))
    finally:
        renderer.close()
