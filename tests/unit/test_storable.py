"""``storable``: what PostgreSQL's text and jsonb refuse, named by field and problem.

tests/integration/test_storable_pg.py checks the same verdicts against a real
PostgreSQL; these are the exact cases and the lossy conversions.
"""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coldbrew import storable
from coldbrew.errors import UnstorableData, UnstorableValue


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def problem_of(value: Any) -> UnstorableValue:
    with pytest.raises(UnstorableValue) as caught:
        storable.check_json(value, "args")
    return caught.value


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    __slots__ = ()


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"text": "plain", "n": 3, "f": 1.5, "ok": True, "none": None},
        {"unicode": "café ☕ 𝄞 中文", "emoji key 🎉": [1, 2]},
        {"tiny": 5e-324, "huge": 1e308, "negative zero": -0.0},
        {"big int": 10**4299, "negative": -(10**4299)},
        {"tuple": (1, "two")},
        {"subclasses": [Colour.RED, Name("x"), OrderedDict(a=1)]},
        {"int keys": {1: "a", 2.5: "b", None: "c", False: "d"}},
        nested(storable.MAX_DEPTH),
        "a bare string",
        [1, [2, [3]]],
    ],
)
def test_storable_values_pass(value: Any) -> None:
    """Unicode outside the BMP, extreme finite floats, 4,299-digit integers, 100 levels."""
    storable.check_json(value, "args")


@pytest.mark.parametrize(
    ("value", "where", "problem"),
    [
        ({"name": "a\x00b"}, "args.name", "NUL (U+0000)"),
        ({"a\x00": 1}, "args['a\\x00']", "as a key contains NUL"),
        ({"list": [0, 1, "\x00"]}, "args.list[2]", "NUL"),
        ({"x": {"y z": "\ud800"}}, "args.x['y z']", "lone surrogate (U+D800)"),
        ({"x": "ok \udfff"}, "args.x", "lone surrogate (U+DFFF)"),
        ({"\udc80": 1}, "args['\\udc80']", "as a key contains a lone surrogate"),
        ({"f": math.nan}, "args.f", "nan"),
        ({"f": [math.inf]}, "args.f[0]", "inf"),
        ({"f": -math.inf}, "args.f", "-inf"),
        ({"k": {math.nan: 1}}, "args.k.nan", "as a key is nan"),
        ({"n": 10**4300}, "args.n", "more than 4300 digits"),
        ({"n": -(10**5000)}, "args.n", "more than 4300 digits"),
        ({"d": nested(storable.MAX_DEPTH)}, "args.d", "deeper than 100 levels"),
        ({"e": [Name("a\x00")]}, "args.e[0]", "NUL"),
        ({1: "\x00"}, "args[1]", "NUL"),
    ],
)
def test_unstorable_values_name_the_field_and_the_problem(
    value: Any, where: str, problem: str
) -> None:
    """Each refusal says where the value sits and what PostgreSQL would refuse in it."""
    error = problem_of(value)
    assert error.field.startswith(where), error.field
    assert problem in error.problem, error.problem
    assert isinstance(error, UnstorableData)
    assert isinstance(error, ValueError)


def test_a_deep_path_is_shortened_and_the_message_is_itself_storable() -> None:
    """A nesting error's path keeps its start and end; no message carries a raw NUL."""
    error = problem_of({"k x": nested(500)})
    assert error.field.startswith("args['k x'][0][0]")
    assert "\u2026" in error.field and len(error.field) < 80
    assert storable.text_problem(str(error)) is None
    error = problem_of({"k\x00": {"x": "\x00"}})
    assert error.field == "args['k\\x00']"
    assert storable.text_problem(str(error)) is None


def test_a_cycle_is_refused_as_too_deep_not_a_recursion_error() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    assert "deeper than" in problem_of(cycle).problem


def test_check_text_refuses_nul_surrogates_and_over_long_text() -> None:
    storable.check_text("fine ☕", "key", max_chars=6)
    for text, problem in (("a\x00", "NUL"), ("\ud83d", "surrogate"), ("x" * 7, "limit is 6")):
        with pytest.raises(UnstorableValue, match=problem) as caught:
            storable.check_text(text, "key", max_chars=6)
        assert caught.value.field == "key"


def test_dump_json_is_what_jsonb_accepts_within_the_size_limit() -> None:
    assert json.loads(storable.dump_json({"a": [1, "é"]}, "result")) == {"a": [1, "é"]}
    with pytest.raises(UnstorableValue, match="NaN or Infinity"):
        storable.dump_json(math.nan, "result")
    with pytest.raises(UnstorableValue, match=r"bytes as JSON; the limit is 100 \(0 KiB\)"):
        storable.dump_json("x" * 100, "result", max_bytes=100)
    assert storable.dump_json("x" * 98, "result", max_bytes=100) == '"' + "x" * 98 + '"'
    with pytest.raises(UnstorableValue, match="limit is 1048576"):
        storable.dump_json(["y" * 1000] * 1100, "result")
    with pytest.raises(TypeError):  # not JSON at all: json.dumps' own error
        storable.dump_json({1, 2}, "result")


def test_clean_text_replaces_and_says_so() -> None:
    """Messages keep their text: bad characters become U+FFFD and a note counts them."""
    assert storable.clean_text("all good ☕") == "all good ☕"
    cleaned = storable.clean_text("a\x00b\ud800c")
    assert cleaned.startswith("a\ufffdb\ufffdc [coldbrew: 2 character(s)")
    assert storable.text_problem(cleaned) is None
    assert storable.clean_text("k\x00", say=False) == "k\ufffd"


json_ish = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**5000), max_value=10**5000)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, exclude_categories=()))
    | st.binary(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.integers(), children, max_size=4)
        | st.tuples(children)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, database=None)
@given(json_ish)
def test_storable_json_always_gives_what_jsonb_accepts(value: Any) -> None:
    """Whatever a rejected message's headers hold, their stored copy passes check_json."""
    copy = storable.storable_json(value)
    storable.check_json(copy, "headers")
    json.dumps(copy, allow_nan=False)


def test_storable_json_keeps_what_it_can() -> None:
    headers = {
        "x-key\x00": "v\x00",
        "n": 5,
        "f": math.nan,
        "b": b"\xff ok",
        "t": {"nested": [1, math.inf]},
        "big": 10**5000,
        "odd": object,
        "deep": nested(300),
    }
    copy = storable.storable_json(headers)
    assert copy["x-key\ufffd"] == "v\ufffd"
    assert (copy["n"], copy["f"], copy["b"]) == (5, "nan", "\ufffd ok")
    assert copy["t"] == {"nested": [1, "inf"]}
    assert copy["big"].startswith("<integer of")
    assert copy["odd"] == "<class 'object'>"
    storable.check_json(copy, "headers")


def test_storable_rejected_makes_every_field_storable() -> None:
    row = (
        "not_json",
        "detail \x00" + "d" * 5000,
        "id\x00",
        "default.a\x00",
        {"h": "\x00"},
        b"\x00",
    )
    reason, detail, message_id, routing_key, headers, body = storable.storable_rejected(row)
    assert reason == "not_json"
    assert len(detail) < 4100 and storable.text_problem(detail) is None
    assert (message_id, routing_key, headers, body) == (
        "id\ufffd",
        "default.a\ufffd",
        {"h": "\ufffd"},
        b"\x00",  # bytea holds any bytes: the message is kept exactly
    )
    assert storable.storable_rejected(("r", "d", None, "", None, b""))[2:5] == (None, "", None)
