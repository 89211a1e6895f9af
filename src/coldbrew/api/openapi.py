"""The OpenAPI 3.1 document served at ``/openapi.json``, built from the server's own validators.

Nothing the server checks is restated here by hand: the ``POST /jobs`` body
is ``SubmitBody``'s JSON schema (so a field added to the model is documented
by that change), the path id is ``model.JOB_ID_RE``, the wait cap is the
process's ``COLDBREW_API_MAX_WAIT_SECONDS``, header and reason limits are the
constants the routes use. ``tests/unit/test_openapi.py`` holds the document
to those validators, and ``tests/e2e/test_schemathesis.py`` holds the real
server to the document.

Responses: each operation lists what its route can answer, plus the two
answers the HTTP protocol layer can give on any route (408 ``header_timeout``
and 503 ``too_many_connections``, ``api.protocol``). A method a path does not
serve is 405 with ``Allow`` naming every one it does; a path no route has is
404 ``not_found``.
"""

from __future__ import annotations

from typing import Any, Final

from coldbrew.api.auth import DASHBOARD_COOKIE
from coldbrew.api.dashboard import FORM_BODY_LIMIT, FORM_MAX_FIELDS
from coldbrew.api.response_schemas import (
    BATCH_SCHEMA,
    DASHBOARD_SCHEMA,
    ERROR_SCHEMA,
    STATUS_SCHEMA,
)
from coldbrew.api.schemas import SubmitBody
from coldbrew.batches import BATCH_ID_RE
from coldbrew.client import MAX_REASON
from coldbrew.model import JOB_ID_RE, MAX_IDEMPOTENCY_KEY, Status

DEFAULT_MAX_WAIT_SECONDS: Final = 60.0
NO_NUL: Final = "^[^\\u0000]*$"
"""Text PostgreSQL can store: no NUL (a lone surrogate cannot travel in JSON text at all)."""

BEARER: Final[dict[str, list[str]]] = {"bearer": []}
COOKIE: Final[dict[str, list[str]]] = {"dashboardCookie": []}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


_JOB = {"application/json": {"schema": _ref("JobStatus")}}
_ERROR = {"application/json": {"schema": _ref("Error")}}
_HTML = {"text/html": {"schema": {"type": "string"}}}
_PROBE = {"application/json": {"schema": {"type": "object"}}}
_JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": JOB_ID_RE.pattern},
    "description": "1-128 printable ASCII characters (another id is 422 `invalid_job_id`)",
}
_BATCH_ID = {
    "name": "batch_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": BATCH_ID_RE.pattern},
    "description": "1-100 printable ASCII characters (another id is 422 `invalid_batch_id`)",
}
_RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}
}

_UNAVAILABLE = (
    "PostgreSQL (or RabbitMQ) is unreachable (`database_unavailable`, `broker_unavailable`), "
    "or this process holds COLDBREW_API_MAX_CONNECTIONS connections (`too_many_connections`); "
    "retry after Retry-After seconds."
)
_WAITERS_FULL = (
    " Also `too_many_waiters` when COLDBREW_API_MAX_WAITERS long polls and event streams are "
    "open: the request is refused rather than answered without waiting, so that a polling "
    "client backs off instead of looping."
)
_TEXTS: Final = {
    400: "The body is not JSON (`invalid_json`).",
    401: "Missing or invalid API key (`unauthorized`; see WWW-Authenticate).",
    403: "The body names another tenant than the key's (`tenant_mismatch`).",
    404: "No such job for this key's tenant (`not_found`).",
    408: "The request head did not arrive within COLDBREW_API_HEADER_TIMEOUT_SECONDS "
    "(`header_timeout`), or its body within COLDBREW_API_BODY_TIMEOUT_SECONDS (`body_timeout`); "
    "the connection is closed.",
    409: "The job already finished (`already_finished`; `job` holds its status).",
    413: "The body (or the message it becomes) is over COLDBREW_MAX_BODY_BYTES (`too_large`).",
    415: "The body is not application/json (`unsupported_media_type`).",
    422: "A field or parameter is missing, unknown or out of range; the message names it.",
    503: _UNAVAILABLE,
}


_CAP = (
    "A connection opened while this process holds COLDBREW_API_MAX_CONNECTIONS connections "
    "is answered 503 `too_many_connections` (JSON error, Retry-After) on its first request."
)


def _errors(*codes: int, waits: bool = False) -> dict[str, Any]:
    """Error responses by status; ``waits``: the route may hold a waiter slot."""
    responses: dict[str, Any] = {}
    for code in codes:
        text = _TEXTS[code] + (_WAITERS_FULL if code == 503 and waits else "")
        responses[str(code)] = {"description": text, "content": _ERROR}
    if 503 in codes:
        responses["503"]["headers"] = _RETRY_AFTER
    return responses


def _submit_schema() -> dict[str, Any]:
    """``SubmitBody``'s own JSON schema: the patterns and bounds the server enforces."""
    schema = SubmitBody.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    args = schema["properties"]["args"]
    args.update(
        description="the job's keyword arguments (JSON; strings without NUL, at most "
        "COLDBREW_MAX_BODY_BYTES as a message)",
        propertyNames={"pattern": NO_NUL},
        additionalProperties=_ref("JsonValue"),
    )
    return schema


# Any JSON value whose strings and keys hold no NUL (PostgreSQL cannot store one): what
# a job's args may nest, so that a generated valid body is one the server takes.
JSON_VALUE_SCHEMA: Final = {
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL},
            "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
        },
    ]
}


_SSE_EVENT: Final = {
    "type": "object",
    "description": "one server-sent event",
    "properties": {
        "event": {"enum": ["status", "error"]},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "status: the job's status JSON; error: `{kind, message}`",
        },
        "id": {"type": "string", "description": "the status's ETag (without quotes)"},
        "retry": {"type": "integer", "description": "reconnection delay, ms (first event)"},
    },
}


def _jobs_paths(max_wait_seconds: float) -> dict[str, Any]:
    return {
        "/jobs": {"post": _submit_operation()},
        "/jobs/{job_id}": {
            "get": _get_operation(max_wait_seconds),
            "delete": _cancel_operation(),
        },
        "/jobs/{job_id}/events": {
            "get": {
                "summary": "Server-sent events: a `status` event per change until terminal",
                "parameters": [
                    _JOB_ID,
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {
                        "description": "`event: status` with the status JSON as data; "
                        "`event: error` if the job store became unreachable (then the stream "
                        "ends: reconnect with Last-Event-ID)",
                        "content": {"text/event-stream": {"schema": _SSE_EVENT}},
                    },
                    **_errors(401, 404, 422, 503, waits=True),
                },
            }
        },
    }


def _batch_paths() -> dict[str, Any]:
    return {
        "/batches/{batch_id}": {
            "get": {
                "summary": "A batch's status: counts by status, progress, callbacks",
                "parameters": [_BATCH_ID],
                "responses": {
                    "200": {
                        "description": "The batch's status.",
                        "content": {"application/json": {"schema": _ref("BatchStatus")}},
                    },
                    **_errors(401, 404, 422, 503),
                },
            }
        }
    }


def _submit_operation() -> dict[str, Any]:
    return {
        "summary": "Submit a job",
        "parameters": [
            {
                "name": "Idempotency-Key",
                "in": "header",
                "schema": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_IDEMPOTENCY_KEY,
                    "pattern": NO_NUL,
                },
                "description": "the same key (per tenant) returns the same job",
            },
            # W3C Trace Context (README "Tracing"): the job's spans join the caller's trace.
            # Plain strings: a malformed value is ignored, never refused (the job is
            # submitted in a trace of its own), so the contract constrains nothing.
            {
                "name": "traceparent",
                "in": "header",
                "schema": _STRING,
                "description": "W3C Trace Context (00-<trace id>-<span id>-<flags>): the "
                "job's submit span becomes a child of the caller's span; a malformed value "
                "is ignored",
            },
            {
                "name": "tracestate",
                "in": "header",
                "schema": _STRING,
                "description": "W3C Trace Context vendor state, kept with traceparent "
                "(printable ASCII, at most 512 characters; otherwise ignored)",
            },
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref("Submit")}},
        },
        "responses": {
            "202": {
                "description": "Accepted; Location names the job.",
                "headers": {"Location": {"schema": {"type": "string"}}},
                "content": _JOB,
            },
            "200": {
                "description": "A unique duplicate: the existing job holding the key; "
                "Location names it, nothing new was accepted.",
                "headers": {"Location": {"schema": {"type": "string"}}},
                "content": _JOB,
            },
            **_errors(400, 401, 403, 408, 413, 415, 422, 503),
            "409": {
                "description": "A job of another tenant holds this job's unique key "
                "(`unique_conflict`: its unique_by has no tenant); nothing submitted.",
                "content": _ERROR,
            },
        },
    }


def _get_operation(max_wait_seconds: float) -> dict[str, Any]:
    return {
        "summary": "A job's status JSON; long-polls with ?wait",
        "parameters": [
            _JOB_ID,
            {
                "name": "wait",
                "in": "query",
                "schema": {"type": "number", "minimum": 0, "maximum": max_wait_seconds},
                "description": "seconds to wait for a change from If-None-Match's state (or "
                "from the current one); at most COLDBREW_API_MAX_WAIT_SECONDS "
                f"({max_wait_seconds:g} here)",
            },
            {"name": "If-None-Match", "in": "header", "schema": {"type": "string"}},
        ],
        "responses": {
            "200": {"description": "The job's status, with its ETag.", "content": _JOB},
            "304": {"description": "Unchanged from If-None-Match."},
            **_errors(401, 404, 422, 503, waits=True),
        },
    }


def _cancel_operation() -> dict[str, Any]:
    return {
        "summary": "Cancel a job",
        "parameters": [
            _JOB_ID,
            {
                "name": "reason",
                "in": "query",
                "schema": {"type": "string", "maxLength": MAX_REASON, "pattern": NO_NUL},
            },
        ],
        "responses": {
            "200": {"description": "Cancelled.", "content": _JOB},
            "202": {"description": "Running; its worker stops it.", "content": _JOB},
            **_errors(401, 404, 409, 422, 503),
        },
    }


def _service_paths() -> dict[str, Any]:
    """Probes, metrics and this document: no key needed."""
    return {
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "security": [],
                "responses": {"200": {"description": "alive", "content": _PROBE}},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness (PostgreSQL reachable)",
                "security": [],
                "responses": {
                    "200": {"description": "ready", "content": _PROBE},
                    "503": {
                        "description": "Not ready: PostgreSQL is unreachable.",
                        "content": _PROBE,
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics of this API process",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Text exposition 0.0.4, or OpenMetrics when Accept asks.",
                        "content": {
                            "text/plain": {"schema": {"type": "string"}},
                            "application/openmetrics-text": {"schema": {"type": "string"}},
                        },
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "security": [],
                "responses": {"200": {"description": "OpenAPI 3.1", "content": _PROBE}},
            }
        },
    }


_TO_LOGIN = {"303": {"description": "No valid key or cookie: redirect to /dashboard/login."}}
_BROWSER = [BEARER, COOKIE]


def _dashboard_paths() -> dict[str, Any]:
    return {
        "/": {
            "get": {
                "summary": "Redirect to /dashboard",
                "security": [],
                "responses": {"303": {"description": "See /dashboard."}},
            }
        },
        "/dashboard": {
            "get": {
                "summary": "The web dashboard (HTML): lanes, tenants, dead jobs, rejected "
                "messages, workers",
                "description": "Authenticated by the login cookie or a Bearer key; "
                "shows only the key's tenant. Reloads itself every 5 s.",
                "security": _BROWSER,
                "responses": {
                    "200": {"description": "The page.", "content": _HTML},
                    **_TO_LOGIN,
                    **_errors(503),
                },
            }
        },
        "/dashboard.json": {
            "get": {
                "summary": "The dashboard's data as JSON",
                "security": _BROWSER,
                "responses": {
                    "200": {
                        "description": "Scoped to the key's tenant.",
                        "content": {"application/json": {"schema": _ref("Dashboard")}},
                    },
                    **_errors(401, 503),
                },
            }
        },
        "/dashboard/login": {"get": _login_form_operation(), "post": _login_operation()},
        "/dashboard/logout": {
            "post": {
                "summary": "Sign out: revokes the session and clears the dashboard cookie",
                "security": [],
                "requestBody": _form({"csrf": _STRING}, required=False),
                "responses": {
                    "303": {"description": "Redirect to the login form."},
                    **_FORM_ERRORS,
                    "403": {
                        "description": "Posted from another origin, or a wrong CSRF token.",
                        "content": _ERROR,
                    },
                },
            }
        },
        **_acting_paths(),
        "/dashboard/jobs/{job_id}": {
            "get": {
                "summary": "One job's page: status, progress, attempts, checkpoint, audit, "
                "live through its event stream",
                "security": _BROWSER,
                "parameters": [_JOB_ID],
                "responses": {
                    "200": {"description": "The page.", "content": _HTML},
                    **_TO_LOGIN,
                    **_errors(404, 422, 503),
                },
            }
        },
    }


_STRING = {"type": "string"}
_HTML_OR_ERROR = {**_HTML, **_ERROR}
_FORM_ERRORS = {
    "400": {"description": "A field the form does not have (`invalid_form`).", "content": _ERROR},
    "413": {"description": "The form is over the limit.", "content": _ERROR},
    "415": {"description": "Not a urlencoded form.", "content": _ERROR},
}
_SEARCH_FIELDS = ("job_id", "type", "tenant", "status", "from", "to", "error", "after")
_ACTION_FIELDS = ("action", "job_id", "tenant", "reason", "weight", "max_running")


def _query(*names: str, schemas: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [
        {"name": n, "in": "query", "required": False, "schema": (schemas or {}).get(n, _STRING)}
        for n in names
    ]


# What api/search.py accepts, exactly (schemathesis checks that valid input is taken):
# a time as a form's datetime-local or ISO 8601 with an offset (days to 28: always real).
_INSTANT = (
    r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])T([01]\d|2[0-3]):[0-5]\d"
    r"(:[0-5]\d(\.\d{6})?)?(Z|[+-](0\d|1[0-3]):[0-5]\d)?"
)
_TEXT = {"type": "string", "maxLength": 200, "pattern": NO_NUL}
# A blank field (the form sends every input) is the same as an absent one.
_SEARCH_SCHEMAS = {
    "job_id": {"type": "string", "pattern": "^([\\x21-\\x7e]{1,128})?$"},
    "type": _TEXT,
    "error": _TEXT,
    "tenant": {"type": "string", "pattern": "^([a-z0-9_-]{1,64})?$"},
    "status": {"type": "string", "enum": ["", *(s.value for s in Status)]},
    "from": {"type": "string", "pattern": f"^({_INSTANT})?$"},
    "to": {"type": "string", "pattern": f"^({_INSTANT})?$"},
    "after": {"type": "string", "pattern": f"^({_INSTANT}~[\\x21-\\x7e]{{1,128}})?$"},
}


def _form(properties: dict[str, Any], *, required: bool = True) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    return {
        "required": required,
        "content": {"application/x-www-form-urlencoded": {"schema": schema}},
    }


def _page(summary: str, *codes: int, parameters: list[Any] | None = None) -> dict[str, Any]:
    """A dashboard page: 200 HTML, 303 to the login form, and the given error codes."""
    operation: dict[str, Any] = {
        "summary": summary,
        "security": _BROWSER,
        "responses": {
            "200": {"description": "The page.", "content": _HTML},
            **_TO_LOGIN,
            **_errors(*codes),
        },
    }
    if parameters:
        operation["parameters"] = parameters
    return {"get": operation}


def _acting_paths() -> dict[str, Any]:
    """Search, events, the script, tenants, audit, and the two steps of an action."""
    confirm = _page(
        "Step one of an action: checks it and asks (changes nothing)",
        403,
        404,
        503,
        parameters=_query(*_ACTION_FIELDS),
    )
    confirm["get"]["responses"]["400"] = {"description": "Unknown action.", "content": _ERROR}
    confirm["get"]["responses"]["422"] = {
        "description": "Invalid input, with the CLI's message.",
        "content": _HTML_OR_ERROR,
    }
    confirm["get"]["responses"]["403"]["content"] = _HTML_OR_ERROR
    search = _page(
        "Job search, keyset paged",
        403,
        422,
        503,
        parameters=_query(*_SEARCH_FIELDS, schemas=_SEARCH_SCHEMAS),
    )
    search["get"]["responses"]["303"]["description"] += " Or a job id given: its page."
    return {
        "/dashboard/jobs": search,
        "/dashboard/jobs/{job_id}/events": {
            "get": {
                "summary": "The job page's event stream (the session cookie's)",
                "security": _BROWSER,
                "parameters": [_JOB_ID],
                "responses": {
                    "200": {
                        "description": "Server-sent events, as GET /jobs/{job_id}/events.",
                        "content": {"text/event-stream": {"schema": _SSE_EVENT}},
                    },
                    **_errors(401, 404, 422, 503, waits=True),
                },
            }
        },
        "/dashboard/static/job.js": {
            "get": {
                "summary": "The job page's script (same origin, for the strict CSP)",
                "security": [],
                "responses": {
                    "200": {
                        "description": "JavaScript.",
                        "content": {"text/javascript": {"schema": _STRING}},
                    }
                },
            }
        },
        "/dashboard/tenants/{name}": _page(
            "A tenant's settings and the form to change them",
            404,
            503,
            parameters=[{"name": "name", "in": "path", "required": True, "schema": _STRING}],
        ),
        "/dashboard/audit": _page("The audit log of dashboard actions", 503),
        "/dashboard/confirm": confirm,
        "/dashboard/act": {
            "post": {
                "summary": "Step two of an action: carries it out (CSRF-checked) and audits it",
                "security": [COOKIE],
                "requestBody": _form({n: _STRING for n in ("csrf", *_ACTION_FIELDS)}),
                "responses": {
                    "303": {"description": "Done: redirect to the job, dead jobs or overview."},
                    **_FORM_ERRORS,
                    "403": {
                        "description": "No session, another origin, or a forged or missing "
                        "CSRF token (`csrf_failed`), or another tenant's.",
                        "content": _ERROR,
                    },
                    **_errors(404),
                    "422": {
                        "description": "Invalid input, with the CLI's message.",
                        "content": _HTML_OR_ERROR,
                    },
                },
            }
        },
    }


def _login_form_operation() -> dict[str, Any]:
    return {
        "summary": "The API-key form",
        "security": [],
        "responses": {
            "200": {"description": "The form.", "content": _HTML},
            "303": {"description": "Auth is off (COLDBREW_API_INSECURE_NO_AUTH): the dashboard."},
        },
    }


def _login_operation() -> dict[str, Any]:
    form = {
        "type": "object",
        "required": ["key"],
        "properties": {"key": {"type": "string"}},
        "additionalProperties": False,
    }
    return {
        "summary": "Sign in: sets the HTTP-only dashboard cookie",
        "security": [],
        "requestBody": {
            "required": True,
            "content": {"application/x-www-form-urlencoded": {"schema": form}},
        },
        "responses": {
            "303": {
                "description": "Signed in (Set-Cookie: a session token); redirect to /dashboard."
            },
            "400": {
                "description": f"A field other than `key`, or more than {FORM_MAX_FIELDS} "
                "(`invalid_form`).",
                "content": _ERROR,
            },
            "401": {"description": "Wrong or missing key: the form again.", "content": _HTML},
            "403": {"description": "Posted from another origin.", "content": _ERROR},
            "413": {
                "description": f"The form is over {FORM_BODY_LIMIT} bytes.",
                "content": _ERROR,
            },
            "415": {"description": "Not a urlencoded form.", "content": _ERROR},
        },
    }


def _with_protocol_answers(paths: dict[str, Any]) -> dict[str, Any]:
    """Add to every operation what ``api.protocol`` may answer before any route runs."""
    for operations in paths.values():
        for operation in operations.values():
            responses = operation["responses"]
            responses.setdefault("408", {"description": _TEXTS[408], "content": _ERROR})
            unavailable = responses.setdefault("503", {"description": "", "content": _ERROR})
            if "headers" not in unavailable:  # not yet the connection cap's: say it
                unavailable["description"] = (unavailable["description"] + " " + _CAP).strip()
                unavailable["headers"] = _RETRY_AFTER
    return paths


_DESCRIPTION = (
    "Submit long-running jobs and follow them. Authenticate with "
    "`Authorization: Bearer <API key>` (the dashboard also takes its login cookie); "
    "a key sees only its tenant's jobs.\n\n"
    "Limits, on every route: a request head not complete within "
    "COLDBREW_API_HEADER_TIMEOUT_SECONDS of the connection's opening (or of a later "
    "request's first byte) is answered 408 `header_timeout` and the connection closed "
    "(closed without an answer if nothing was sent); a body not complete within "
    "COLDBREW_API_BODY_TIMEOUT_SECONDS gets 408 `body_timeout`; an idle kept-alive "
    "connection is closed after COLDBREW_API_KEEPALIVE_SECONDS. A connection opened while "
    "the process holds COLDBREW_API_MAX_CONNECTIONS gets 503 `too_many_connections` with "
    "Retry-After on its first request, then is closed. A method a path does not serve is "
    "405 `method_not_allowed` with `Allow`; a path no route has is 404 `not_found`. Errors "
    'are `{"error": {"kind", "message"}}`.'
)


def build_spec(*, max_wait_seconds: float = DEFAULT_MAX_WAIT_SECONDS) -> dict[str, Any]:
    """The document for a process whose long polls wait at most ``max_wait_seconds``."""
    paths = {
        **_jobs_paths(max_wait_seconds),
        **_batch_paths(),
        **_service_paths(),
        **_dashboard_paths(),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "coldbrew", "version": "1", "description": _DESCRIPTION},
        "security": [BEARER],
        "paths": _with_protocol_answers(paths),
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "dashboardCookie": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": DASHBOARD_COOKIE,
                    "description": "set by POST /dashboard/login (HTTP-only, path /dashboard); "
                    "accepted by the dashboard's routes only",
                },
            },
            "schemas": {
                "JsonValue": JSON_VALUE_SCHEMA,
                "JobStatus": STATUS_SCHEMA,
                "BatchStatus": BATCH_SCHEMA,
                "Submit": _submit_schema(),
                "Error": ERROR_SCHEMA,
                "Dashboard": DASHBOARD_SCHEMA,
            },
        },
    }


SPEC: Final[dict[str, Any]] = build_spec()
"""The document with the default settings (what a process without overrides serves)."""
