"""The named queries, their call sites in the store, and the migrations folder."""

from __future__ import annotations

import ast
import re
import typing
from collections import defaultdict
from importlib import resources
from pathlib import Path

import pytest

import coldbrew.sql
import coldbrew.store
from coldbrew.sql import LATEST_VERSION, QUERIES, migrations, parse_queries, read_sql
from coldbrew.store import ClaimConfig, DeadLetterStore

STORE_PACKAGE = Path(coldbrew.store.__file__).parent
STORE_SOURCES = {
    path.name: path.read_text(encoding="utf-8") for path in sorted(STORE_PACKAGE.glob("*.py"))
}
SRC = STORE_PACKAGE.parent
STORE_HELPERS = {"_fetch", "_batch_fetch", "_fetchrow", "_fetchval", "_execute"}
# Call sites whose argument count cannot be read from the call itself (executemany
# takes rows; the claim queries take a built tuple); each one is checked another way below.
UNCOUNTED = {
    "insert_rejected",
    "claim_batch",
    "register_waiting",
    "complete_batch",
    "insert_children",
}


def _queries_subscript(node: ast.AST) -> str | None:
    """The name in ``QUERIES["name"]`` or ``QUERIES["name"].text``, else None."""
    if isinstance(node, ast.Attribute) and node.attr == "text":
        node = node.value
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == "QUERIES"
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
    ):
        return node.slice.value
    return None


ROW_FIELDS = 8
"""What ``*request.row_fields()`` passes (``JobFields.row_fields``)."""


def _countable(args: list[ast.expr]) -> int | None:
    """How many parameters ``args`` pass, or None when a star-argument hides it; the one
    star-argument counted is ``*<job>.row_fields()``."""
    total = 0
    for arg in args:
        if not isinstance(arg, ast.Starred):
            total += 1
        elif (
            isinstance(arg.value, ast.Call)
            and isinstance(arg.value.func, ast.Attribute)
            and arg.value.func.attr == "row_fields"
        ):
            total += ROW_FIELDS
        else:
            return None
    return total


def call_sites(source: str) -> tuple[dict[str, list[int]], set[str]]:
    """Argument counts per query name at each countable call, and every name referenced."""
    counted: dict[str, list[int]] = defaultdict(list)
    referenced: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        name = _queries_subscript(node)
        if name is not None:
            referenced.add(name)
        if not isinstance(node, ast.Call) or not node.args:
            continue
        first = node.args[0]
        helper = isinstance(node.func, ast.Attribute) and node.func.attr in STORE_HELPERS
        if helper and isinstance(first, ast.Constant) and isinstance(first.value, str):
            name = first.value
            referenced.add(name)
        else:
            name = _queries_subscript(first)
        if name is not None:
            count = _countable(node.args[1:])
            if count is not None:
                counted[name].append(count)
    return counted, referenced


def _store_call_sites() -> tuple[dict[str, list[int]], set[str]]:
    """``call_sites`` over every module of the store package, merged."""
    counted: dict[str, list[int]] = defaultdict(list)
    referenced: set[str] = set()
    for source in STORE_SOURCES.values():
        file_counted, file_referenced = call_sites(source)
        for name, counts in file_counted.items():
            counted[name].extend(counts)
        referenced |= file_referenced
    return counted, referenced


COUNTED, REFERENCED = _store_call_sites()


def _description_params(description: str) -> list[int]:
    """The ``$k`` numbers of the last parenthesised group that lists parameters, in order."""
    groups = [group for group in re.findall(r"\(([^()]*)\)", description) if "$" in group]
    return [int(n) for n in re.findall(r"\$(\d+)", groups[-1])] if groups else []


# --- queries and the store --------------------------------------------------------------


def test_every_query_is_used_by_the_store() -> None:
    """Each named query is referenced by the store: an unused query is dead SQL."""
    unused = set(QUERIES) - REFERENCED
    assert not unused, f"queries never used in the store: {sorted(unused)}"


def test_every_query_name_the_store_uses_exists() -> None:
    """Each name the store passes to a helper or QUERIES[...] is defined in queries.sql."""
    missing = REFERENCED - set(QUERIES)
    assert not missing, f"the store uses undefined queries: {sorted(missing)}"


def test_only_store_uses_queries() -> None:
    """No other module reaches for QUERIES: the store is the only code that talks to PostgreSQL."""
    for path in SRC.rglob("*.py"):
        if STORE_PACKAGE in path.parents:
            continue
        names_from_queries = {
            name
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if (name := _queries_subscript(node)) is not None
        }
        assert not names_from_queries, f"{path.relative_to(SRC)} uses {sorted(names_from_queries)}"


@pytest.mark.parametrize("name", sorted(set(QUERIES) - UNCOUNTED))
def test_call_sites_pass_the_right_number_of_parameters(name: str) -> None:
    """Every countable call passes exactly as many arguments as the query has placeholders."""
    query = QUERIES[name]
    assert COUNTED.get(name), f"no countable call site for {name}"
    for count in COUNTED[name]:
        assert count == query.param_count, f"{name}: a call passes {count} of {query.param_count}"


def test_claim_argument_tuples_match_their_queries() -> None:
    """claim_batch and register_waiting get built tuples: one value per placeholder."""
    from coldbrew.store import ClaimRequest
    from coldbrew.store.caps import _waiting_args

    request = ClaimRequest("j1", "t", "default", "default", {}, 0, 3, None, None)
    assert len(ClaimConfig().claim_args([request])) == QUERIES["claim_batch"].param_count
    assert len(_waiting_args(request)) == QUERIES["register_waiting"].param_count


def test_outcome_argument_tuples_match_their_queries() -> None:
    """complete_batch and insert_children get built tuples: one value per placeholder."""
    from coldbrew.model import Status
    from coldbrew.store import ClaimRequest, Outcome
    from coldbrew.store.claims import children_args, complete_args

    child = ClaimRequest("c1", "t", "default", "default", {}, 0, 3, None, None)
    outcome = Outcome("j1", 1, Status.SUCCEEDED, children=[child])
    assert len(complete_args([outcome])) == QUERIES["complete_batch"].param_count
    assert len(children_args([("j1", child)])) == QUERIES["insert_children"].param_count


def test_insert_rejected_rows_have_one_value_per_parameter() -> None:
    """insert_rejected's rows are tuples with exactly the query's parameter count."""
    hints = typing.get_type_hints(DeadLetterStore.insert_rejected)
    (row_type,) = typing.get_args(hints["rows"])
    assert len(typing.get_args(row_type)) == QUERIES["insert_rejected"].param_count


def test_call_site_counter_reads_helpers_and_subscripts() -> None:
    """The AST scan counts arguments after the name, for helpers and QUERIES[...] alike."""
    counted, referenced = call_sites(
        "async def f(self, conn):\n"
        "    await self._fetch('a', 1, 2)\n"
        "    await conn.fetchval(QUERIES['b'].text, 1)\n"
        "    await self._execute('c', *rows)\n"
        "    query = QUERIES['d'].text\n"
    )
    assert dict(counted) == {"a": [2], "b": [1]}
    assert referenced == {"a", "b", "c", "d"}


def test_uncounted_call_sites_are_the_known_ones() -> None:
    """A query used without a countable call must be one of the few checked another way."""
    uncounted = set(QUERIES) - set(COUNTED)
    assert uncounted == UNCOUNTED


# --- the queries file ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_description_lists_each_parameter_in_order(name: str) -> None:
    """The description's parameter list is ``($1 ..., $2 ..., ...)``, one per placeholder."""
    query = QUERIES[name]
    assert _description_params(query.description) == list(range(1, query.param_count + 1))


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_placeholders_have_no_gaps(name: str) -> None:
    """A query uses every placeholder from $1 to its highest, so none is silently unbound."""
    query = QUERIES[name]
    used = {int(n) for n in re.findall(r"\$(\d+)", query.text)}
    assert used == set(range(1, query.param_count + 1))


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_query_has_a_description_and_a_statement(name: str) -> None:
    """Each block has a non-empty description line and statement text."""
    query = QUERIES[name]
    assert query.description
    assert query.text
    assert not query.text.startswith("--")


def test_every_name_line_is_parsed() -> None:
    """Each ``-- name:`` line in queries.sql and queries/*.sql became a query (a bad name
    would merge blocks)."""
    folder = Path(coldbrew.sql.__file__).parent / "queries"
    source = read_sql("queries.sql") + "".join(
        path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.sql"))
    )
    declared = re.findall(r"^-- name:\s*(\S+)\s*$", source, re.MULTILINE)
    assert sorted(declared) == sorted(QUERIES)


def test_queries_mapping_is_read_only() -> None:
    """QUERIES cannot be changed at run time."""
    with pytest.raises(TypeError):
        QUERIES["get_job"] = QUERIES["get_job"]  # type: ignore[index]


# --- parse_queries -------------------------------------------------------------------------


def test_parse_queries_splits_named_blocks() -> None:
    """Blocks become queries with their description, statement and parameter count."""
    parsed = parse_queries(
        "-- preamble\n\n"
        "-- name: one\n-- First ($1 id)\nSELECT * FROM t WHERE id = $1;\n\n"
        "-- name: two\n-- Second\nSELECT 2;\n"
    )
    assert list(parsed) == ["one", "two"]
    assert parsed["one"].description == "First ($1 id)"
    assert parsed["one"].text == "SELECT * FROM t WHERE id = $1;"
    assert parsed["one"].param_count == 1
    assert parsed["two"].param_count == 0


def test_param_count_is_the_highest_placeholder() -> None:
    """``$10`` counts as ten parameters, not one."""
    parsed = parse_queries("-- name: many\n-- Ten ($1 ... $10)\nSELECT $10, $2, $1;\n")
    assert parsed["many"].param_count == 10


def test_parse_queries_rejects_a_duplicate_name() -> None:
    """Two blocks with the same name are refused."""
    source = "-- name: dup\n-- One\nSELECT 1;\n-- name: dup\n-- Two\nSELECT 2;\n"
    with pytest.raises(ValueError, match="'dup' is defined twice"):
        parse_queries(source)


def test_parse_queries_rejects_a_block_without_description() -> None:
    """A block whose first line is not a comment lacks its description and is refused."""
    with pytest.raises(ValueError, match="'bare' lacks its description"):
        parse_queries("-- name: bare\nSELECT 1;\n")


def test_parse_queries_rejects_an_empty_block() -> None:
    """A name followed by nothing is refused too."""
    with pytest.raises(ValueError, match="'empty' lacks its description"):
        parse_queries("-- name: empty\n")


# --- migrations ------------------------------------------------------------------------------


def test_migrations_are_numbered_once_each() -> None:
    """Migrations start at 0001, use each number once (a branch may hold a later number
    before the ones between are merged), and the latest is LATEST_VERSION."""
    found = migrations()
    versions = [version for version, _, _ in found]
    assert versions == sorted(set(versions)) and versions[0] == 1
    assert versions[-1] == LATEST_VERSION
    for _, name, sql in found:
        assert re.fullmatch(r"[a-z0-9_]+", name)
        assert sql.strip()


def test_every_sql_file_in_migrations_is_a_migration() -> None:
    """No .sql file in migrations/ is silently skipped for a malformed name."""
    folder = resources.files("coldbrew.sql").joinpath("migrations")
    names = [entry.name for entry in folder.iterdir() if entry.name.endswith(".sql")]
    assert names
    for name in names:
        assert re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", name), name
    assert len(names) == len(migrations())


def test_a_name_defined_in_two_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two feature files that define one name fail at import, not by one silently winning."""
    import importlib.resources

    (tmp_path / "queries").mkdir()
    (tmp_path / "queries.sql").write_text("-- name: a_query\n-- does a\nSELECT 1;\n")
    (tmp_path / "queries" / "x.sql").write_text("-- name: a_query\n-- does a again\nSELECT 2;\n")
    monkeypatch.setattr(importlib.resources, "files", lambda _package: tmp_path)
    with pytest.raises(ValueError, match="defined twice"):
        coldbrew.sql.all_queries()


def test_row_fields_is_as_long_as_test_sql_counts_it() -> None:
    """``ROW_FIELDS`` above is ``JobFields.row_fields``' length."""
    from coldbrew.model import JobFields

    job = JobFields("i", "t", "q", "n", {}, 0, None, None, None)
    assert len(job.row_fields()) == ROW_FIELDS
