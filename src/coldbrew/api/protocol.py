"""uvicorn's h11 protocol with the read timeouts and the connection cap it lacks.

uvicorn bounds only an idle keep-alive connection (``timeout_keep_alive``,
armed after a response and cancelled by the first byte of the next request).
A connection that never sends anything, or that sends its request head one
line every few seconds (a slowloris), or a body that trickles in, is kept
for good; and ``limit_concurrency`` answers plain text without
``Retry-After``, counting idle connections and requests alike. This protocol
adds, per connection:

- a head deadline: the request head must be complete within
  ``header_timeout_seconds`` of the connection opening (first request) or of
  the first byte of a later request; more bytes do not extend it. Past it, a
  connection that sent part of a head is answered 408 and closed, one that
  sent nothing is closed (RFC 9110 §15.5.9 allows either; there is no request
  to answer);
- a body deadline: the body must be complete within ``body_timeout_seconds``
  of the end of its head, else 408 (if no answer has started) and close; the
  app then sees the client gone;
- admission: a connection opened while ``max_connections`` admitted ones are
  open is not admitted: its first request head is read (under the same head
  deadline) and answered 503 with ``Retry-After`` and the JSON error body,
  then the connection is closed. It never reaches the app, so a flood costs no
  task and no store query.

It relies on ``H11Protocol``'s documented-by-source internals (``conn``,
``cycle``, ``handle_events``), stable across uvicorn 0.30-0.54; the tests in
``tests/integration/test_api_limits.py`` and ``tests/faults/test_api_idle.py``
hold it to that on a real socket.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import h11
import structlog
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol
from uvicorn.server import ServerState

from coldbrew.api.errors import RETRY_AFTER_SECONDS, error_document
from coldbrew.api.limits import ConnectionLimits, OverloadLog

log = structlog.get_logger("coldbrew.api")


@dataclass(slots=True)
class ConnectionGate:
    """Shared by every connection of one server: the admitted count and what was cut."""

    limits: ConnectionLimits
    admitted: int = 0
    head_timeouts: int = 0
    body_timeouts: int = 0
    overload: OverloadLog = field(
        default_factory=lambda: OverloadLog("api_connection_limit_reached")
    )

    def admit(self) -> bool:
        if self.admitted >= self.limits.max_connections:
            self.overload.refused(limit=self.limits.max_connections)
            return False
        self.admitted += 1
        return True

    def leave(self) -> None:
        self.admitted -= 1


class GuardedH11Protocol(H11Protocol):
    """One HTTP/1.1 connection under ``gate``'s limits (see the module docstring)."""

    gate: ClassVar[ConnectionGate]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._admitted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol --------------------------------------------------------------

    def connection_made(  # type: ignore[override]  # uvicorn narrows the transport type too
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(transport)
        self._admitted = self.gate.admit()
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self._admitted:
            self._admitted = False
            self.gate.leave()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # the first byte of a request after a keep-alive pause starts its head deadline
        if self.conn.their_state is h11.IDLE:
            self._arm_head_timer()
        super().data_received(data)

    # --- H11Protocol -------------------------------------------------------------------

    def handle_events(self) -> None:
        """Parse what arrived, then start or stop the deadlines for the new state."""
        if not self._admitted:
            self._refuse_at_head()
            return
        super().handle_events()
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            # waiting for a request: part of a pipelined head is already here, or
            # no keep-alive timer bounds the wait (the body ended after our answer)
            if self.conn.trailing_data[0] or self.timeout_keep_alive_task is None:
                self._arm_head_timer()
        else:
            self._cancel_head_timer()
        if state is h11.SEND_BODY:
            self._arm_body_timer()
        else:
            self._cancel_body_timer()

    # --- the deadlines -----------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.gate.limits.header_timeout_seconds, self._head_timed_out
            )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _arm_body_timer(self) -> None:
        if self._body_timer is None:
            self._body_timer = self.loop.call_later(
                self.gate.limits.body_timeout_seconds, self._body_timed_out
            )

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        self.gate.head_timeouts += 1
        if self.conn.trailing_data[0]:
            limit = self.gate.limits.header_timeout_seconds
            self._answer(
                408,
                "header_timeout",
                f"the request head did not arrive within {limit:g} s "
                "(COLDBREW_API_HEADER_TIMEOUT_SECONDS)",
            )
        log.debug(
            "api_header_timeout", client=self.client, partial=bool(self.conn.trailing_data[0])
        )
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        self.gate.body_timeouts += 1
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            limit = self.gate.limits.body_timeout_seconds
            self._answer(
                408,
                "body_timeout",
                f"the request body did not arrive within {limit:g} s "
                "(COLDBREW_API_BODY_TIMEOUT_SECONDS)",
            )
        if cycle is not None:
            # what connection_lost would do, now: the app's receive() reports a
            # disconnect and its send() becomes a no-op, so it cannot write after us
            cycle.disconnected = True
            cycle.message_event.set()
        log.debug("api_body_timeout", client=self.client, path=self.scope["path"])
        self.transport.close()

    # --- answers made here -------------------------------------------------------------

    def _refuse_at_head(self) -> None:
        """Not admitted: wait for the request head, answer it 503, close."""
        try:
            event = self.conn.next_event()
        except h11.RemoteProtocolError:
            self.send_400_response("Invalid HTTP request received.")
            return
        if isinstance(event, h11.Request):
            self._cancel_head_timer()
            limit = self.gate.limits.max_connections
            self._answer(
                503,
                "too_many_connections",
                f"this API process already holds {limit} connections "
                f"(COLDBREW_API_MAX_CONNECTIONS); retry after {RETRY_AFTER_SECONDS} s",
                [(b"retry-after", RETRY_AFTER_SECONDS.encode())],
            )
            self.transport.close()

    def _answer(
        self,
        status: int,
        kind: str,
        message: str,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Write one JSON error response with ``Connection: close`` (the caller closes)."""
        body = json.dumps(error_document(kind, message), separators=(",", ":")).encode()
        head = [
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *(headers or []),
        ]
        try:
            chunks = [
                self.conn.send(
                    h11.Response(status_code=status, headers=head, reason=STATUS_PHRASES[status])
                ),
                self.conn.send(h11.Data(data=body)),
                self.conn.send(h11.EndOfMessage()),
            ]
        except h11.LocalProtocolError as exc:  # h11's state allows no response now
            log.debug("api_answer_not_sent", status=status, error=str(exc))
            return
        self.transport.write(b"".join(chunk for chunk in chunks if chunk))


def protocol_class(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A protocol class for one server: its connections share one ``ConnectionGate``."""

    class ServerProtocol(GuardedH11Protocol):
        gate = ConnectionGate(limits)

    return ServerProtocol
