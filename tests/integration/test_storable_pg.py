"""``storable``'s verdicts against a real PostgreSQL: what it passes, PostgreSQL stores.

The other direction holds for the characters and numbers PostgreSQL itself
refuses (NUL, lone surrogates, NaN and Infinity); the depth and integer
limits are ours and stricter than PostgreSQL's, so they are not compared.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from coldbrew import storable
from coldbrew.errors import UnstorableValue
from tests.helpers import DATABASE_URL


@pytest.fixture
async def conn() -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(DATABASE_URL)
    # the store's own codec: json.dumps as Python writes it by default (NaN included)
    await connection.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )
    yield connection
    await connection.close()


async def postgresql_refuses(conn: asyncpg.Connection, sql: str, value: Any) -> str | None:
    """The SQLSTATE (or asyncpg's own refusal) for storing ``value``, or None if stored."""
    try:
        await conn.fetchval(sql, value)
    except asyncpg.DataError as exc:
        return str(exc.sqlstate)
    return None


_text = st.text(st.characters(codec=None), max_size=10) | st.sampled_from(
    ["\x00", "a\x00b", "\ud800", "x\udfff", "\U0001f600", "\u2028", "\\u0000"]
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats()
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=15,
)
PROPERTY = hsettings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _refused_by_postgresql(problem: str) -> bool:
    """The problems PostgreSQL itself has with a value (not our own stricter limits)."""
    return any(word in problem for word in ("NUL", "surrogate", "NaN or Infinity"))


@PROPERTY
@given(value=_json)
async def test_check_json_agrees_with_jsonb(conn: asyncpg.Connection, value: Any) -> None:
    problem = None
    try:
        storable.check_json(value, "value")
    except UnstorableValue as exc:
        problem = exc.problem
    refused = await postgresql_refuses(conn, "SELECT $1::jsonb", value)
    if problem is None:
        assert refused is None, (value, refused)
    elif _refused_by_postgresql(problem):
        assert refused is not None, (value, problem)


@PROPERTY
@given(text=_text)
async def test_text_problem_agrees_with_text(conn: asyncpg.Connection, text: str) -> None:
    refused = await postgresql_refuses(conn, "SELECT $1::text", text)
    assert (storable.text_problem(text) is None) == (refused is None), (text, refused)


async def test_the_edges_postgresql_does_store(conn: asyncpg.Connection) -> None:
    """What passes on the edge of the limits is stored and read back as sent."""
    edges = {
        "tiny": 5e-324,
        "huge": 1.7976931348623157e308,
        "int": 10**4299,
        "deep": json.loads("[" * 99 + "]" * 99),
        "astral": "\U0001f600",
        "escape text": "\\u0000",
    }
    storable.check_json(edges, "edges")
    stored = await conn.fetchval("SELECT $1::jsonb", edges)
    assert stored["astral"] == "\U0001f600" and stored["escape text"] == "\\u0000"
    assert stored["int"] == 10**4299 and math.isclose(stored["tiny"], 5e-324)
    text = storable.dump_json("x" * (storable.MAX_JSON_BYTES - 2), "result")
    assert await conn.fetchval("SELECT length($1::text::jsonb #>> '{}')", text) == len(text) - 2
