"""The latency bench's coldbrew app: one coroutine job that reports the moment it starts.

``ping(seq, sent)`` sends ``"seq sent started"`` in one UDP datagram to
``CBBENCH_UDP`` (``host:port``, the bench's listener) as its first action, so
the bench sees publish-to-start latency with no extra round trip through the
job store. ``sent`` and ``started`` are ``CLOCK_MONOTONIC`` seconds, one clock
for every process on the machine.
"""

from __future__ import annotations

import os
import socket
import time

from coldbrew import App, Context

app = App()

_udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_udp.setblocking(False)
_host, _, _port = os.environ.get("CBBENCH_UDP", "127.0.0.1:9").rpartition(":")
_address = (_host, int(_port))
_stages = None
if os.environ.get("CBBENCH_STAGES"):  # latency.py --stages: stamp each job's path (unmeasured run)
    from bench import _latency_stages as _stages


@app.job()
async def ping(ctx: Context, seq: int, sent: float) -> None:
    """Report the start: one non-blocking ``sendto`` on loopback, a few microseconds."""
    started = time.clock_gettime(time.CLOCK_MONOTONIC)
    _udp.sendto(f"{seq} {sent!r} {started!r}".encode(), _address)
    if _stages is not None:
        _stages.job_started(sent, started)
