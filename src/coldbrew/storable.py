"""What PostgreSQL can store: checks for values bound for text and jsonb, with no I/O.

PostgreSQL's ``text`` cannot hold U+0000 and ``jsonb`` refuses the ``\\u0000``
escape; a lone surrogate (``"\\ud800"`` is valid JSON, and Python keeps it)
has no UTF-8 form, so asyncpg cannot even send it; ``jsonb`` has no NaN or
Infinity, which Python's ``json.dumps`` writes by default (and ``json.loads``
reads, ``1e400`` included). Any one of them fails the whole statement it is
in, and under group commit that statement carries other jobs' claims or
outcomes. So every value from outside -- a message's args and headers, a
submission, a job's result, checkpoint, error and progress message -- is
checked here before a statement is built, and the error names the field and
what is wrong with it.

Limits (README, "Limits"):

- ``MAX_DEPTH``: objects and arrays nest at most 100 levels. Python's json
  gives up near 1,000 (``RecursionError``, which no caller expects), and
  nothing real nests a tenth as deep.
- ``MAX_INT_DIGITS``: an integer has at most 4,300 digits, the limit of
  Python's own int-to-text conversion (jsonb's numeric holds 131,072); past
  it ``json.dumps`` fails, and the limit must not depend on whether an app
  changed ``sys.set_int_max_str_digits``.
- ``MAX_JSON_BYTES``: a job's result or checkpoint is at most 1 MiB of JSON.
  A completion batch carries up to 500 outcomes in one statement, and
  PostgreSQL caps a message at 1 GB; big outputs belong in object storage,
  with a reference in the result.

Checking costs about a microsecond for a typical small args dict (measured
in the commit that added this module); the walk is the only per-value work
on the hot path and it allocates nothing unless something is wrong.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final

from coldbrew.errors import UnstorableValue

MAX_DEPTH: Final = 100
MAX_INT_DIGITS: Final = 4300
MAX_JSON_BYTES: Final = 1 << 20

_INT_LIMIT: Final = 10**MAX_INT_DIGITS  # |n| must be below it
_SURE_INT_BITS: Final = 14_000  # 2**14000 < 10**4215: shorter integers need no exact test
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_UNSTORABLE_CHAR: Final = re.compile("[\x00\ud800-\udfff]")
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
REPLACEMENT: Final = "\ufffd"


class _Bad(Exception):
    """What ``_walk`` found; the path is collected while the stack unwinds."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str | int] = []

    def where(self, field: str) -> str:
        steps = [_step(step) for step in reversed(self.path)]
        if len(steps) > 12:  # a nesting error's path: its start and its end say enough
            steps = [*steps[:8], "\u2026", *steps[-2:]]
        return field + "".join(steps)


def _step(step: str | int) -> str:
    if isinstance(step, int):
        return f"[{step}]"
    if _IDENTIFIER.match(step):
        return f".{step}"
    return f"[{step!r}]"  # repr: the path itself stays storable


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as PostgreSQL text, or None when it can."""
    if "\x00" in text:
        return "contains NUL (U+0000), which PostgreSQL text and jsonb cannot hold"
    if not text.isascii() and (found := _SURROGATE.search(text)) is not None:
        return (
            f"contains a lone surrogate (U+{ord(found.group()):04X}), "
            "which has no UTF-8 form and so cannot be stored"
        )
    return None


def check_text(text: str, field: str, *, max_chars: int | None = None) -> None:
    """Raise ``UnstorableValue`` unless ``text`` fits a text column (and ``max_chars``)."""
    problem = text_problem(text)
    if problem is None and max_chars is not None and len(text) > max_chars:
        problem = f"is {len(text)} characters long; the limit is {max_chars}"
    if problem is not None:
        raise UnstorableValue(field, problem)


def check_json(value: Any, field: str) -> None:
    """Raise ``UnstorableValue`` naming the first part of ``value`` that jsonb would refuse.

    Types that JSON has no form for (a set, a datetime) are left to
    ``json.dumps``, which raises ``TypeError`` for them.
    """
    try:
        _walk(value, 0)
    except _Bad as bad:
        raise UnstorableValue(bad.where(field), bad.problem) from None


def dump_json(value: Any, field: str, *, max_bytes: int = MAX_JSON_BYTES) -> str:
    """``value`` as JSON text that jsonb accepts, at most ``max_bytes`` long.

    Raises ``UnstorableValue`` for what PostgreSQL cannot store and
    ``TypeError`` / ``ValueError`` (from ``json.dumps``) for what is not JSON.
    """
    check_json(value, field)
    text = json.dumps(value, allow_nan=False)  # ensure_ascii: one character, one byte
    if len(text) > max_bytes:
        raise UnstorableValue(
            field, f"is {len(text)} bytes as JSON; the limit is {max_bytes} ({max_bytes >> 10} KiB)"
        )
    return text


def clean_text(text: str, *, say: bool = True) -> str:
    """``text`` with NUL and lone surrogates replaced by U+FFFD, saying so at the end.

    For messages that describe something (an error, progress): losing a
    character is better than losing the message, or the statement it is in.
    ``say=False`` for short codes (an error kind), where a note would not fit.
    """
    if "\x00" not in text and (text.isascii() or _SURROGATE.search(text) is None):
        return text
    cleaned, count = _UNSTORABLE_CHAR.subn(REPLACEMENT, text)
    if not say:
        return cleaned
    return f"{cleaned} [coldbrew: {count} character(s) PostgreSQL cannot store replaced by U+FFFD]"


def storable_json(value: Any, *, _depth: int = 0) -> Any:
    """A lossy copy of ``value`` that jsonb always accepts, for diagnostics.

    Rejected messages are stored for people to read: their headers may hold
    anything a producer sent, and storing them must never fail. Bad
    characters become U+FFFD, non-finite numbers and unknown types their
    ``repr``, and what nests too deep a truncated ``repr``.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _UNSTORABLE_CHAR.sub(REPLACEMENT, value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _UNSTORABLE_CHAR.sub(REPLACEMENT, bytes(value).decode("utf-8", "replace"))
    if isinstance(value, int):
        return int(value) if abs(value) < _INT_LIMIT else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(value)
    if _depth < MAX_DEPTH:
        if isinstance(value, Mapping):
            return {
                storable_json(str(key)): storable_json(item, _depth=_depth + 1)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [storable_json(item, _depth=_depth + 1) for item in value]
    return _UNSTORABLE_CHAR.sub(REPLACEMENT, repr(value)[:1000])


# Rejected messages (store.insert_rejected): reason, detail, message_id, routing_key,
# headers (jsonb), body (bytea: any bytes).
RejectedRow = tuple[str, str, str | None, str, dict[str, Any] | None, bytes]

MAX_DETAIL_CHARS: Final = 4000


def storable_rejected(row: RejectedRow) -> RejectedRow:
    """A rejected message's row with every text and jsonb field made storable.

    The message was rejected *because* it may hold anything (a NUL in its
    routing key, message id or headers); storing it must not fail the
    insert, which would stop the worker's dead-letter loop.
    """
    reason, detail, message_id, routing_key, headers, body = row
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[: MAX_DETAIL_CHARS - 1] + "\u2026"
    return (
        clean_text(reason),
        clean_text(detail),
        None if message_id is None else _UNSTORABLE_CHAR.sub(REPLACEMENT, message_id),
        _UNSTORABLE_CHAR.sub(REPLACEMENT, routing_key),
        None if headers is None else storable_json(headers),
        bytes(body),
    )


# --- the walk ---------------------------------------------------------------------


def _walk(value: Any, depth: int) -> None:
    kind = type(value)
    if kind is dict:
        _walk_object(value, depth)
    elif kind is list or kind is tuple:
        _walk_array(value, depth)
    elif kind is str:
        if "\x00" in value or (not value.isascii() and _SURROGATE.search(value) is not None):
            raise _Bad(text_problem(value) or "")
    elif kind is int:
        if value.bit_length() > _SURE_INT_BITS and abs(value) >= _INT_LIMIT:
            raise _Bad(f"is an integer of more than {MAX_INT_DIGITS} digits")
    elif kind is float:
        if not math.isfinite(value):
            raise _Bad(f"is {value!r}: JSON and jsonb have no NaN or Infinity")
    elif kind is not bool and value is not None:
        _walk_subclass(value, depth)


# The two loops test the common scalars inline, without a call per node (most of a
# walk's nodes); anything else, or anything that looks wrong, goes through _walk.


def _walk_object(value: dict[Any, Any], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _Bad(f"nests deeper than {MAX_DEPTH} levels of objects and arrays")
    for key, item in value.items():
        if type(key) is not str or "\x00" in key or not key.isascii():
            try:
                _key(key)
            except _Bad as bad:
                bad.path.append(key if isinstance(key, str | int) else repr(key))
                raise
        kind = type(item)
        if kind is str:
            if "\x00" not in item and item.isascii():
                continue
        elif kind is int:
            if item.bit_length() <= _SURE_INT_BITS:
                continue
        elif kind is float:
            if item - item == 0.0:  # False for NaN and both infinities
                continue
        elif kind is bool or item is None:
            continue
        try:
            _walk(item, depth + 1)
        except _Bad as bad:
            bad.path.append(key if isinstance(key, str | int) else repr(key))
            raise


def _walk_array(value: list[Any] | tuple[Any, ...], depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise _Bad(f"nests deeper than {MAX_DEPTH} levels of objects and arrays")
    for index, item in enumerate(value):
        kind = type(item)
        if kind is str:
            if "\x00" not in item and item.isascii():
                continue
        elif kind is int:
            if item.bit_length() <= _SURE_INT_BITS:
                continue
        elif kind is float:
            if item - item == 0.0:
                continue
        elif kind is bool or item is None:
            continue
        try:
            _walk(item, depth + 1)
        except _Bad as bad:
            bad.path.append(index)
            raise


def _key(key: Any) -> None:
    """An object key: text, or a number or constant that ``json.dumps`` turns into text."""
    if isinstance(key, str):
        if (problem := text_problem(key)) is not None:
            raise _Bad(f"as a key {problem}")
    elif isinstance(key, float) and not math.isfinite(key):
        raise _Bad(f"as a key is {key!r}: JSON and jsonb have no NaN or Infinity")


def _walk_subclass(value: Any, depth: int) -> None:
    """Subclasses of the JSON types (an ``IntEnum``, an ``OrderedDict``), as ``json.dumps``
    sees them; anything else is left to it."""
    if isinstance(value, str):
        _walk(str(value), depth)
    elif isinstance(value, bool):
        return
    elif isinstance(value, int):
        _walk(int(value), depth)
    elif isinstance(value, float):
        _walk(float(value), depth)
    elif isinstance(value, dict):
        _walk(dict(value), depth)
    elif isinstance(value, list | tuple):
        _walk(list(value), depth)
