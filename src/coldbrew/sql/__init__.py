"""Loads ``queries.sql`` and ``queries/*.sql`` into one read-only mapping of named statements.

All of coldbrew's SQL lives in this folder: ``schema.sql`` (the latest
schema), ``migrations/NNNN_*.sql`` (how to get there), ``queries.sql`` (the
statements of the core: submit, claim, outcome, relay, reaper, ...) and
``queries/<concern>.sql`` (one file per later feature, so that features built
side by side do not edit one file). A name is defined once across all files.
The loader also counts each query's positional parameters so a test can check
every call site.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Final

_NAME_RE = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)
_PARAM_RE = re.compile(r"\$(\d+)")


@dataclass(frozen=True, slots=True)
class Query:
    """One named statement and what its description line says about it."""

    name: str
    description: str
    text: str

    @property
    def param_count(self) -> int:
        return max((int(n) for n in _PARAM_RE.findall(self.text)), default=0)


def parse_queries(source: str) -> dict[str, Query]:
    """Split a queries file into named blocks (``-- name: x`` + description + statement)."""
    queries: dict[str, Query] = {}
    matches = list(_NAME_RE.finditer(source))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(source)
        body = source[match.end() : end].strip().splitlines()
        if not body or not body[0].startswith("--"):
            raise ValueError(f"query {match.group(1)!r} lacks its description line")
        description = body[0].removeprefix("--").strip()
        text = "\n".join(body[1:]).strip()
        if match.group(1) in queries:
            raise ValueError(f"query {match.group(1)!r} is defined twice")
        queries[match.group(1)] = Query(match.group(1), description, text)
    return queries


def read_sql(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def migrations() -> list[tuple[int, str, str]]:
    """Every migration as ``(version, name, sql)``, in order."""
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [version for version, _, _ in found]
    # Numbers are handed out to features developed side by side (a branch may hold 0009
    # before 0005..0008 are merged), so a gap is allowed; a number used twice is not.
    if len(set(versions)) != len(versions) or (versions and versions[0] != 1):
        raise ValueError(f"migrations must be numbered from 0001, each number once: {versions}")
    return found


def all_queries() -> dict[str, Query]:
    """``queries.sql`` and every ``queries/*.sql``, merged; a name defined twice is an error."""
    merged = parse_queries(read_sql("queries.sql"))
    folder = resources.files(__package__).joinpath("queries")
    files = (
        sorted(
            (entry for entry in folder.iterdir() if entry.name.endswith(".sql")),
            key=lambda e: e.name,
        )
        if folder.is_dir()
        else []
    )
    for entry in files:
        for name, query in parse_queries(entry.read_text(encoding="utf-8")).items():
            if name in merged:
                raise ValueError(f"query {name!r} is defined twice (again in queries/{entry.name})")
            merged[name] = query
    return merged


QUERIES: Final = MappingProxyType(all_queries())
LATEST_VERSION: Final = max(version for version, _, _ in migrations())
