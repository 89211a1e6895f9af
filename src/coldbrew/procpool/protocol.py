"""What crosses a child's socketpair: the frame format, and exceptions on the wire.

Wire: one socketpair per child carrying length-prefixed pickle frames (an
8-byte big-endian length, then the pickle). A job costs one frame each way;
progress and the ``checkpoint``/``once`` RPCs add frames only when used.

Messages, as tuples whose first item is the tag:

* parent -> child: ``("job", type, args, info)``, ``("reply", ok, value)``
  (the answer to an RPC), ``("exit",)``;
* child -> parent: ``("ready", pid)``, ``("boot_error", text)``,
  ``("progress", fraction, message)``, ``("rpc", method, argument)``, and one
  outcome per job: ``("ok", value)``, ``("retry", message, delay)``,
  ``("permanent", message)``, ``("snooze", seconds)`` or
  ``("error", kind, message, traceback)``.

Why both sides share this module: the child (``child.py``) and the parent
(``wire.py``, ``handle.py``) must agree on the header and the tags, and an
exception must be turned into something that survives pickling on either
side of the pipe.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

from coldbrew.errors import Permanent, Retry, Snooze
from coldbrew.procpool.errors import RemoteJobError

__all__ = ["EXIT_FRAME", "HEADER", "PROTOCOL", "error_kind", "frame", "outcome_error", "portable"]

HEADER = struct.Struct("!Q")
"""The length prefix of every frame."""
PROTOCOL = pickle.HIGHEST_PROTOCOL


def frame(message: tuple[Any, ...]) -> bytes:
    """``message`` pickled and length-prefixed, ready for ``sendall``."""
    payload = pickle.dumps(message, PROTOCOL)
    return HEADER.pack(len(payload)) + payload


EXIT_FRAME = frame(("exit",))
"""Built once: telling a child to exit allocates nothing."""


def error_kind(exc: BaseException) -> str:
    """``module.QualName`` of ``exc``: how a remote error names its class (retry.py reads it)."""
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


def outcome_error(message: tuple[Any, ...]) -> Exception:
    """The parent-side exception for a job's failure frame."""
    tag = message[0]
    if tag == "permanent":
        return Permanent(message[1])
    if tag == "retry":
        return Retry(message[1], delay=message[2])
    if tag == "snooze":
        return Snooze(message[1])
    return RemoteJobError(message[1], message[2], message[3])


def portable(exc: Exception) -> BaseException:
    """``exc`` if it survives pickling, else a ``RemoteJobError`` with the same message."""
    try:
        pickle.loads(pickle.dumps(exc, PROTOCOL))  # noqa: S301 - round trip of our own bytes
    except Exception:  # noqa: BLE001 - any pickling failure
        return RemoteJobError(error_kind(exc), str(exc), "")
    return exc
