"""Logging configuration: structlog for coldbrew, the standard library bridged into it.

Only the CLI (and test fixtures) call `configure`; every other module just
emits events with ``structlog.get_logger(__name__)``. Both coldbrew's events
and records from aio-pika, aiormq and asyncpg (which use `logging`) come out
as one stream on stderr, rendered alike, with passwords in URLs masked.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, Literal, TextIO

import structlog
from structlog.typing import EventDict, ExcInfo, Processor, WrappedLogger

__all__ = ["LogFormat", "LogLevel", "configure", "mask_urls", "redact_secrets"]

LogFormat = Literal["auto", "json", "console"]
LogLevel = Literal["debug", "info", "warning", "error"]

_LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# Chatty at INFO (connection chatter, per-frame debug); we want only their problems.
_NOISY_LIBRARIES: Final = ("aio_pika", "aiormq", "asyncpg", "pamqp")

# ``scheme://user:password@``. The password may hold ``@`` or ``:`` when a URL
# was written unencoded, so it runs to the last ``@`` before the path; masking
# a little too much is better than leaking the tail of a password.
_URL_PASSWORD: Final = re.compile(
    r"(?P<prefix>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*:)[^\s/?#]*@"
)
_MAX_DEPTH: Final = 4

# One lock for every line coldbrew writes, whether it came from structlog or logging.
_WRITE_LOCK: Final = threading.Lock()


def mask_urls(text: str) -> str:
    """Replace the password of every URL in ``text`` with ``***``, like `settings.mask_url`."""
    if "://" not in text:  # the common case, at C speed
        return text
    return _URL_PASSWORD.sub(r"\g<prefix>***@", text)


def _redact(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return mask_urls(value)
    if depth >= _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _redact(v, depth + 1) for k, v in value.items()}
    if type(value) in (list, tuple):  # not subclasses: a namedtuple cannot be rebuilt this way
        return type(value)(_redact(v, depth + 1) for v in value)
    return value


def redact_secrets(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Processor: mask URL passwords in string values (and inside dicts, lists, tuples).

    Connection errors love to quote the URL they failed on; this keeps the
    password out of the logs whoever wrote the event. Put it after
    ``format_exc_info`` so traceback text is covered too.
    """
    for key, value in event_dict.items():
        if key != "exc_info" and not isinstance(value, int | float | bool | None):
            event_dict[key] = _redact(value)
    return event_dict


def _add_logger_name(logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """Processor: ``logger`` is the `logging` record's name, or the name given to get_logger."""
    record = event_dict.get("_record")
    name = record.name if record is not None else getattr(logger, "name", "")
    if name:
        event_dict["logger"] = name
    return event_dict


def _write_line(line: str) -> None:
    """Write to whatever ``sys.stderr`` is *now*, so pytest's capture and redirections work."""
    stream = sys.stderr
    with _WRITE_LOCK:
        stream.write(line + "\n")
        stream.flush()


class _StderrLogger:
    """The wrapped logger for structlog: one rendered line per call, to stderr.

    It carries the name given to ``structlog.get_logger(name)`` so
    ``add_logger_name`` works without going through `logging`.
    """

    __slots__ = ("name",)

    def __init__(self, name: str = "") -> None:
        self.name = name

    def msg(self, message: str) -> None:
        _write_line(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _logger_factory(*args: Any) -> _StderrLogger:
    return _StderrLogger(args[0] if args and isinstance(args[0], str) else "")


class _StderrHandler(logging.Handler):
    """Root handler for `logging` records; its class marks it as ours for idempotency."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write_line(self.format(record))
        except Exception:  # noqa: BLE001 - logging's own contract: report, never raise
            self.handleError(record)


def _redacting(formatter: Callable[[TextIO, ExcInfo], None]) -> Callable[[TextIO, ExcInfo], None]:
    """Wrap a console exception formatter so tracebacks are masked like everything else."""

    def format_exception(sio: TextIO, exc_info: ExcInfo) -> None:
        buffer = io.StringIO()
        formatter(buffer, exc_info)
        sio.write(mask_urls(buffer.getvalue()))

    return format_exception


def _tail(fmt: LogFormat) -> list[Processor]:
    """The processors that turn an event dict into its line: exceptions, redaction, renderer."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    if fmt == "json":
        return [
            structlog.processors.format_exc_info,
            redact_secrets,
            structlog.processors.JSONRenderer(),
        ]
    colors = sys.stderr.isatty()
    # A plain traceback, whatever else is installed: structlog would pick rich's
    # formatter when rich is importable, and that prints every frame's locals
    # (secrets that are not URLs included) and differs from machine to machine.
    formatter = _redacting(structlog.dev.plain_traceback)
    renderer = structlog.dev.ConsoleRenderer(colors=colors, exception_formatter=formatter)
    return [redact_secrets, renderer]


def configure(fmt: LogFormat, level: LogLevel) -> None:
    """Set up structlog and `logging` for the process; safe to call again to change them.

    Events below ``level`` are dropped by a filtering bound logger before any
    processor runs, so per-job debug events cost one method call at ``info``.
    """
    numeric = _LEVELS[level]
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    tail = _tail(fmt)
    # Refill the configured list in place rather than replacing it: loggers
    # cached on first use hold a reference to it, so they follow a new format
    # (their level, baked into the wrapper class, stays).
    processors: list[Processor] = structlog.get_config()["processors"]
    processors[:] = [*shared, *tail]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        context_class=dict,
        logger_factory=_logger_factory,
        cache_logger_on_first_use=True,
    )
    _configure_stdlib(numeric, shared, tail)


def _configure_stdlib(numeric: int, shared: list[Processor], tail: list[Processor]) -> None:
    """Route `logging` records through the same processors, replacing our previous handler."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.ExtraAdder(), *shared],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    )
    handler = _StderrHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    library_level = logging.NOTSET if numeric <= logging.DEBUG else max(numeric, logging.WARNING)
    for name in _NOISY_LIBRARIES:
        logging.getLogger(name).setLevel(library_level)
