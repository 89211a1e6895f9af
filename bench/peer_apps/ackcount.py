"""Counts the acks a consumer process sends, in shared memory that the bench reads.

Why: the peers keep no job table, and RabbitMQ tells an AMQP client only how
many messages of a queue are *ready* (passive ``queue.declare``), not how many
are delivered but unacknowledged. Counting the ``basic.ack`` frames each
consumer process writes, at its client library's ``basic_ack``, gives every
side the same end of a drain (the N-th ack written to the broker's socket) for
well under a microsecond per ack: no syscall, no extra message, no extra
process. The bench reads the counters from ``/dev/shm``.

The app modules call ``install`` when they are imported; it does nothing
unless ``CBBENCH_ACK_DIR`` names a directory. Each consumer process then keeps
one little-endian 8-byte count in the file ``<dir>/<pid>``. Acks with
``multiple=True`` are counted as the number of tags they newly cover, so a
library that batches acks is counted right too. Only stdlib is imported here:
the peers' workers and the bench both load this module.
"""

from __future__ import annotations

import functools
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "CBBENCH_ACK_DIR"


class _Tags:
    """The delivery tags acked on one channel: every tag up to ``floor``, plus ``above``."""

    __slots__ = ("above", "floor")

    def __init__(self) -> None:
        self.floor = 0
        self.above: set[int] = set()

    def ack(self, tag: int, multiple: bool) -> int:
        """Record an ack; return how many tags it newly acknowledged."""
        if multiple:
            if tag <= self.floor:
                return 0
            covered = {t for t in self.above if t <= tag}
            self.above -= covered
            newly = tag - self.floor - len(covered)
            self.floor = tag
            return newly
        if tag <= self.floor or tag in self.above:
            return 0
        self.above.add(tag)
        while self.floor + 1 in self.above:  # keep the set as small as the acks out of order
            self.floor += 1
            self.above.discard(self.floor)
        return 1


class AckCounter:
    """This process's ack count, mapped into ``<directory>/<pid>`` on its first ack."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        """A forked child counts its own acks in its own file (Celery's prefork pool)."""
        self._lock = threading.Lock()
        self._count = 0
        self._view: memoryview | None = None
        self._channels: dict[int, _Tags] = {}

    def _open(self) -> memoryview:
        pid = os.getpid()
        final = self._directory / str(pid)
        staging = self._directory / f".{pid}"
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, 8)
            mapped = mmap.mmap(fd, 8)
        finally:
            os.close(fd)
        os.rename(staging, final)  # the reader never sees an empty file
        return memoryview(mapped).cast("q")

    def acked(self, channel: object, tag: int, multiple: bool) -> None:
        with self._lock:
            tags = self._channels.get(id(channel))
            if tags is None:
                tags = self._channels[id(channel)] = _Tags()
            newly = tags.ack(int(tag), bool(multiple))
            if newly:
                if self._view is None:
                    self._view = self._open()
                self._count += newly
                self._view[0] = self._count


def install(*libraries: str) -> bool:
    """Count the acks of the named client libraries (``aiormq``, ``pika``, ``amqp``) if asked to.

    Returns whether counting is on (``CBBENCH_ACK_DIR`` is set).
    """
    directory = os.environ.get(ENV)
    if not directory:
        return False
    counter = AckCounter(Path(directory))
    for name in libraries:
        _PATCHERS[name](counter)
    return True


def _patch_aiormq(counter: AckCounter) -> None:
    """aio-pika's ``IncomingMessage.ack`` ends in ``aiormq.Channel.basic_ack``."""
    from aiormq.channel import Channel

    original = Channel.basic_ack

    @functools.wraps(original)
    async def basic_ack(
        self: Channel, delivery_tag: int, multiple: bool = False, wait: bool = True
    ) -> None:
        await original(self, delivery_tag, multiple, wait)
        counter.acked(self, delivery_tag, multiple)

    Channel.basic_ack = basic_ack  # type: ignore[method-assign]


def _patch_pika(counter: AckCounter) -> None:
    """Dramatiq acks through pika's ``BlockingChannel``, which calls ``pika.channel.Channel``."""
    from pika.channel import Channel

    original = Channel.basic_ack

    @functools.wraps(original)
    def basic_ack(self: Channel, delivery_tag: int = 0, multiple: bool = False) -> None:
        original(self, delivery_tag, multiple)
        counter.acked(self, delivery_tag, multiple)

    Channel.basic_ack = basic_ack


def _patch_amqp(counter: AckCounter) -> None:
    """Celery (kombu's ``pyamqp`` transport) acks through py-amqp's ``Channel.basic_ack``."""
    from amqp.channel import Channel

    original = Channel.basic_ack

    @functools.wraps(original)
    def basic_ack(self: Channel, delivery_tag: int, multiple: bool = False, **kw: Any) -> Any:
        result = original(self, delivery_tag, multiple, **kw)
        counter.acked(self, delivery_tag, multiple)
        return result

    Channel.basic_ack = basic_ack


_PATCHERS: dict[str, Callable[[AckCounter], None]] = {
    "aiormq": _patch_aiormq,
    "pika": _patch_pika,
    "amqp": _patch_amqp,
}


class AckReader:
    """The bench's side: the sum of every consumer process's counter in one directory."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._maps: dict[str, tuple[mmap.mmap, memoryview]] = {}

    def total(self) -> int:
        with os.scandir(self._directory) as entries:
            for entry in entries:
                if entry.name.isdigit() and entry.name not in self._maps:
                    with open(entry.path, "r+b") as file:
                        mapped = mmap.mmap(file.fileno(), 8)
                    self._maps[entry.name] = (mapped, memoryview(mapped).cast("q"))
        return sum(view[0] for _, view in self._maps.values())

    def per_process(self) -> dict[int, int]:
        self.total()
        return {int(pid): view[0] for pid, (_, view) in self._maps.items()}

    def close(self) -> None:
        for mapped, view in self._maps.values():
            view.release()
            mapped.close()
        self._maps.clear()
