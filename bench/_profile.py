"""py-spy for the benchmarks: sample a worker while it runs and summarize its stacks.

Shared by ``throughput.py --profile``, ``inflight.py --profile`` and
``procpool.py --profile``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import BenchError

LOOP_FRAME = "Runner.run (asyncio/runners.py"
LOOP_SELF = "<event loop: uvloop's C code>"

PROFILE_RATE = 500  # Hz; throughput.py samples at 250 (a busier process, a shorter run)


@dataclass(frozen=True, slots=True)
class Spy:
    process: asyncio.subprocess.Process
    folded: Path
    rate: int


async def start_profile(
    out_dir: Path | None, pid: int, name: str, *, rate: int = PROFILE_RATE
) -> Spy:
    """``py-spy record`` of ``pid`` into the existing ``out_dir``; non-blocking, no pauses."""
    beside = Path(sys.executable).parent / "py-spy"  # the venv's, when it is not on PATH
    py_spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if py_spy is None or out_dir is None:
        raise BenchError("--profile needs py-spy (pip install py-spy)")
    folded = out_dir / f"{name}.folded"
    process = await asyncio.create_subprocess_exec(
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--format",
        "raw",
        "--function",
        "--nonblocking",
        "--rate",
        str(rate),
        "--output",
        str(folded),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return Spy(process, folded, rate)


async def stop_profile(spy: Spy) -> dict[str, Any] | None:
    """Stop py-spy (it writes on SIGINT) and summarize its stacks like ``throughput --profile``."""
    with contextlib.suppress(ProcessLookupError):
        spy.process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(spy.process.wait(), timeout=30)
    except TimeoutError:
        spy.process.kill()
        await spy.process.wait()
        return None
    if not spy.folded.exists():
        return None
    summary = summarize_stacks(spy.folded.read_text())
    summary |= {"folded": str(spy.folded), "rate_hz": spy.rate}
    return summary


def render_profile(profile: dict[str, Any], what: str, top: int = 15) -> list[str]:
    """Text lines for a ``stop_profile`` summary."""
    lines = [
        f"py-spy of {what} ({profile['samples']:,} busy samples at {profile['rate_hz']} Hz; "
        f"{profile['folded']}):",
    ]
    if profile.get("package_self_percent"):
        lines.append(
            "  self % by package: "
            + ", ".join(f"{name} {pct:.0f}" for name, pct in profile["package_self_percent"][:10])
        )
    lines.append("  what the loop was running (first frame under it), %:")
    lines += [f"    {pct:5.1f}  {name}" for name, pct in profile["entry_percent"][:top]]
    lines.append("  top functions by inclusive %:")
    lines += [f"    {pct:5.1f}  {name}" for name, pct in profile["inclusive_percent"][:top]]
    lines.append("  top functions by self %:")
    lines += [f"    {pct:5.1f}  {name}" for name, pct in profile["self_percent"][:top]]
    return lines


def summarize_stacks(text: str, top: int = 25) -> dict[str, Any]:
    """Sample shares from py-spy's collapsed stacks, with the event loop's own frames cut off.

    Frames down to ``Runner.run`` (the loop) are dropped, so the first frame
    left is the callback or task the loop was running (the "entry"); samples
    with nothing under the loop are uvloop's own C code.
    """
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        cut = next((i for i, f in enumerate(frames) if f.startswith(LOOP_FRAME)), None)
        if cut is not None:
            frames = frames[cut + 1 :] or [LOOP_SELF]
        total += count
        own[frames[-1]] += count
        entries[frames[0]] += count
        packages[_package(frames[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count

    def shares(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(name, n / total * 100) for name, n in counter.most_common(top)] if total else []

    return {
        "samples": total,
        "self_percent": shares(own),
        "inclusive_percent": shares(inclusive),
        "entry_percent": shares(entries),
        "package_self_percent": shares(packages),
    }


def _package(frame: str) -> str:
    """``func (aiormq/connection.py:12)`` -> ``aiormq``; stdlib modules by their top name."""
    if frame == LOOP_SELF:
        return "uvloop"
    where = frame[frame.rfind("(") + 1 :].rstrip(")")
    path = where.split(":")[0]
    if "/" not in path:
        return path.removesuffix(".py")
    return path.split("/")[0]
