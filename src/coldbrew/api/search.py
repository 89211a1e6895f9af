"""The job search's query string: filters, a page cursor, checked with specific errors.

Pages are keyset pages: ``after`` is the last row's ``created_at`` and id, and
the next page is the rows before it in (created_at, id) order, so a page deep
into millions of rows costs what the first one does (an index range scan, no
OFFSET). A tenant's key searches only its tenant: the filter is forced to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from coldbrew.api.auth import Principal
from coldbrew.api.errors import ApiError
from coldbrew.model import NAME_RE, Status, check_job_id
from coldbrew.store import JobSummary, SearchFilter

PAGE_SIZE = 50
MAX_TEXT = 200
CURSOR_SEPARATOR = "~"
FIELDS = ("job_id", "type", "tenant", "status", "from", "to", "error", "after")


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A checked search: what to filter on, where the page starts, or a job id to open."""

    where: SearchFilter
    cursor: tuple[datetime, str] | None
    job_id: str | None
    query: dict[str, str]  # the filters as given (without ``after``), for the next page's link


def _invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "invalid_search", f"{field}: {message}")


def _instant(field: str, text: str) -> datetime:
    """A form's ``datetime-local`` (taken as UTC) or an ISO 8601 time with its offset."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _invalid(field, f"{text!r} is not a time like 2026-12-01T20:00") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _short(field: str, text: str) -> str:
    if len(text) > MAX_TEXT or "\x00" in text:
        raise _invalid(field, f"at most {MAX_TEXT} characters, without NUL")
    return text


def parse_search(params: Mapping[str, str], principal: Principal) -> SearchRequest:
    """The search form's fields, checked; 422 ``invalid_search`` names the field at fault."""
    # a blank field is an absent one; other text is taken as typed (" acme" is no tenant)
    given = {k: params[k] for k in FIELDS if params.get(k, "").strip()}
    status = given.get("status")
    if status is not None and status not in {s.value for s in Status}:
        raise _invalid("status", f"{status!r} is not one of {', '.join(s.value for s in Status)}")
    tenant = given.get("tenant")
    if tenant is not None and not NAME_RE.match(tenant):
        raise _invalid("tenant", f"{tenant!r} must match {NAME_RE.pattern}")
    if principal.tenant is not None:
        if tenant is not None and tenant != principal.tenant:
            raise ApiError(403, "tenant_mismatch", f"this session sees tenant {principal.tenant!r}")
        tenant = principal.tenant
    where = SearchFilter(
        tenant=tenant,
        status=status,
        type=_short("type", given["type"]) if "type" in given else None,
        created_from=_instant("from", given["from"]) if "from" in given else None,
        created_to=_instant("to", given["to"]) if "to" in given else None,
        error_text=_short("error", given["error"]) if "error" in given else None,
    )
    query = {k: v for k, v in given.items() if k != "after"}
    job_id = given.get("job_id")
    if job_id is not None:
        check_job_id(job_id)  # 422 invalid_job_id, as on every job route
    return SearchRequest(where, _cursor(given.get("after")), job_id, query)


def _cursor(text: str | None) -> tuple[datetime, str] | None:
    if text is None:
        return None
    at, separator, job_id = text.partition(CURSOR_SEPARATOR)
    if not separator or not job_id:
        raise _invalid("after", "not a page cursor (follow the page's own Next link)")
    return _instant("after", at), _short("after", job_id)


def next_cursor(rows: list[JobSummary], more: bool) -> str | None:
    """The cursor of the page after ``rows``; None when this page was the last (``more``:
    the store had a row beyond the page: it is asked for one more than it shows)."""
    if not more or not rows:
        return None
    last = rows[-1]
    return f"{last.created_at.isoformat()}{CURSOR_SEPARATOR}{last.id}"
