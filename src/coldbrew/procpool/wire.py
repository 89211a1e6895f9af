"""The parent's end of one child's socket: frames in and out without blocking the loop.

Why callbacks rather than asyncio streams: a job's frame goes out with one
``send`` on the loop's thread (no task, no await), and whole frames are
dispatched from the reader callback; ``drain()`` hands over what a dying
child wrote last, so a result that arrived wins over the death. The parent reads with
``loop.add_reader`` and non-blocking ``recv``, never a blocking read on the
loop; what the socket cannot take at once is kept and written when it
becomes writable.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from coldbrew.procpool.protocol import HEADER

__all__ = ["Wire"]

_READ_SIZE = 256 * 1024


class Wire:
    """The parent's end of one child's socket: non-blocking, frames parsed on the loop."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        on_message: Callable[[bytes], None],
        on_eof: Callable[[], None],
    ) -> None:
        sock.setblocking(False)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._on_message = on_message
        self._on_eof = on_eof
        self._inbox = bytearray()
        self._outbox = bytearray()
        self.closed = False
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        self._receive()

    def drain(self) -> None:
        """Dispatch whatever the peer wrote before it died (its last progress or its result)."""
        while not self.closed and self._receive():
            pass

    def _receive(self) -> bool:
        """Read what is available and dispatch whole frames; False when nothing more is ready."""
        try:
            data = self._sock.recv(_READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if not data:
            self._on_eof()
            return False
        inbox = self._inbox
        inbox += data
        size = HEADER.size
        while not self.closed and len(inbox) >= size:
            (length,) = HEADER.unpack_from(inbox)
            end = size + length
            if len(inbox) < end:
                break
            payload = bytes(inbox[size:end])
            del inbox[:end]
            self._on_message(payload)
        return True

    def write(self, data: bytes) -> None:
        """Send a frame without blocking; what the socket cannot take now is sent when it can."""
        if self.closed:
            return
        if self._outbox:
            self._outbox += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return  # the child is gone; the sentinel or EOF reports it
        if sent < len(data):
            self._outbox += memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self._sock.send(self._outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(self._outbox)
        del self._outbox[:sent]
        if not self._outbox:
            self._loop.remove_writer(self._fd)

    def close(self) -> None:
        """Stop watching the socket and close it; idempotent."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._outbox:
            self._loop.remove_writer(self._fd)
            self._outbox.clear()
        self._sock.close()
