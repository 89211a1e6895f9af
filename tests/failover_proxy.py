"""A TCP proxy a test can cut: a broker or database "node" that dies on demand.

Failover tests put one in front of the real RabbitMQ or PostgreSQL and list
its port first in ``COLDBREW_AMQP_URL`` / ``COLDBREW_DATABASE_URL``; cutting it
is a node failure seen only by this test's connections (the real services are
never stopped). After ``cut()`` the port refuses connections, like a dead node.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any


class TcpProxy:
    """Forwards TCP on a free local port to ``host:port`` until ``cut()``; ``start()`` resumes."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.port = 0
        self.connections = 0  # accepted so far
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> TcpProxy:
        """Listen (again, after ``cut()``: on the same port, as a node that came back)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        """Close the listening socket and abort every open connection (no FIN: a crash)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        await self.cut()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pipe = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass  # the other side was cut
        finally:
            sink.close()


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """The worker's /readyz: status code and JSON body."""

    def get() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:  # noqa: S310 - a local test URL
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    return await asyncio.to_thread(get)
