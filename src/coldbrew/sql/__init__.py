"""Loads ``queries.sql`` into a read-only mapping of named statements.

All of coldbrew's SQL lives in this folder: ``schema.sql`` (the latest
schema), ``migrations/NNNN_*.sql`` (how to get there) and ``queries.sql``
(every statement the store sends). The loader also counts each query's
positional parameters so a test can check every call site.
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


QUERIES: Final = MappingProxyType(parse_queries(read_sql("queries.sql")))
LATEST_VERSION: Final = max(version for version, _, _ in migrations())
