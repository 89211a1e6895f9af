"""The OpenAPI 3.1 document served at ``/openapi.json``.

Hand-written, because the routes are plain Starlette handlers; a test checks
that every route and method is documented here, so the two cannot drift.
"""

from __future__ import annotations

from typing import Any, Final

from coldbrew.durations import MAX_SCHEDULE_SECONDS
from coldbrew.model import MAX_PRIORITY, MAX_TIMEOUT_SECONDS, MIN_TIMEOUT_SECONDS


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{name}"}


_JOB = {"application/json": {"schema": _ref("schemas/JobStatus")}}
_ERROR = {"application/json": {"schema": _ref("schemas/Error")}}
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}


_RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}
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


def _errors(*codes: int, waits: bool = False) -> dict[str, Any]:
    """Error responses by status; ``waits``: the route may hold a waiter slot."""
    texts = {
        400: "The body is not JSON.",
        401: "Missing or invalid API key (see WWW-Authenticate).",
        403: "The body names another tenant than the key's.",
        404: "No such job for this key's tenant.",
        408: "The body did not arrive within COLDBREW_API_BODY_TIMEOUT_SECONDS of the head "
        "(`body_timeout`); the connection is closed.",
        409: "The job already finished.",
        413: "The body is over COLDBREW_MAX_BODY_BYTES.",
        415: "The body is not application/json.",
        422: "A field is missing, unknown or out of range; the message names it.",
        503: _UNAVAILABLE + (_WAITERS_FULL if waits else ""),
    }
    responses: dict[str, Any] = {
        str(code): {"description": texts[code], "content": _ERROR} for code in codes
    }
    if 503 in codes:
        responses["503"]["headers"] = _RETRY_AFTER
    return responses


_STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string"},
        "queue": {"type": "string"},
        "tenant": {"type": "string"},
        "status": {
            "enum": [
                "queued",
                "running",
                "retrying",
                "succeeded",
                "failed",
                "dead",
                "cancelled",
                "scheduled",
            ]
        },
        "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY},
        "attempt": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "progress": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "progress_message": {"type": ["string", "null"]},
        "result": {},
        "error": {
            "type": ["object", "null"],
            "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
        },
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": {"type": ["string", "null"], "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "run_at": {"type": "string", "format": "date-time"},
        "cancel_requested": {"type": "boolean"},
        "snoozes": {"type": "integer", "minimum": 0, "description": "times the job snoozed"},
    },
}

_STATUS_SCHEMA["required"] = list(_STATUS_SCHEMA["properties"])  # every key, always present

_SUBMIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["type"],
    "properties": {
        "type": {"type": "string", "description": "a job type the workers register"},
        "args": {"type": "object", "description": "the job's keyword arguments"},
        "tenant": {"type": "string", "description": "defaults to the API key's tenant"},
        "queue": {"type": "string", "description": "the lane; defaults to the job type's"},
        "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY, "default": 0},
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": 1000},
        "timeout_seconds": {
            "type": "number",
            "minimum": MIN_TIMEOUT_SECONDS,
            "exclusiveMaximum": MAX_TIMEOUT_SECONDS,
        },
        "run_at": {
            "type": "string",
            "format": "date-time",
            "description": "run at this time (ISO 8601 with its offset); not with delay_seconds",
        },
        "delay_seconds": {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_SCHEDULE_SECONDS,
            "description": "run after this many seconds; not with run_at",
        },
    },
}

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["kind", "message"],
            "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}

_PROBE = {"application/json": {"schema": {"type": "object"}}}
_HTML = {"text/html": {"schema": {"type": "string"}}}
_TO_LOGIN = {"303": {"description": "No valid key or cookie: redirect to /dashboard/login."}}

_LANE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One lane (queue) of one tenant; depth = queued + retrying.",
    "properties": {
        "queue": {"type": "string"},
        "tenant": {"type": "string"},
        "queued": {"type": "integer"},
        "running": {"type": "integer"},
        "retrying": {"type": "integer"},
        "scheduled": {"type": "integer", "description": "waiting for run_at: not in depth"},
        "dead": {"type": "integer"},
        "failed": {"type": "integer"},
        "oldest_waiting_seconds": {"type": "number"},
        "finished": {"type": "integer", "description": "jobs finished so far (a counter)"},
        "depth": {"type": "integer"},
        "drain_rate_per_second": {
            "type": ["number", "null"],
            "description": "null until the dashboard has been loaded twice",
        },
        "estimated_wait_seconds": {
            "type": ["number", "null"],
            "description": "depth / drain rate; null when unknown or when nothing drains",
        },
    },
}

_DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "tenant",
        "generated_at",
        "lanes",
        "tenants",
        "dead_jobs",
        "rejected",
        "workers",
    ],
    "properties": {
        "tenant": {
            "type": ["string", "null"],
            "description": "the key's tenant; null when auth is off (every tenant)",
        },
        "generated_at": {"type": "string", "format": "date-time"},
        "lanes": {"type": "array", "items": _LANE_SCHEMA},
        "tenants": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "weight": {"type": "number"},
                    "paused": {"type": "boolean"},
                    "max_running": {"type": ["integer", "null"]},
                },
            },
        },
        "dead_jobs": {
            "type": "array",
            "description": "the newest dead jobs (at most 20)",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "type": {"type": "string"},
                    "queue": {"type": "string"},
                    "tenant": {"type": "string"},
                    "reason": {"type": "string"},
                    "error": {"type": "string", "description": "kind: message (truncated)"},
                    "attempt": {"type": "integer"},
                    "max_attempts": {"type": "integer"},
                    "finished_at": {"type": ["string", "null"], "format": "date-time"},
                },
            },
        },
        "rejected": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "description": "rejected messages by reason (for a key: routed to its tenant)",
        },
        "workers": {
            "type": "array",
            "description": "the live workers (their liveness lock is held), oldest first; "
            "jobs_in_flight only when auth is off (a key sees no other tenant's load)",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "host": {"type": "string"},
                    "pid": {"type": "integer"},
                    "version": {"type": "string"},
                    "lanes": {"type": "array", "items": {"type": "string"}},
                    "concurrency": {"type": "integer"},
                    "jobs_in_flight": {"type": "integer"},
                    "started_at": {"type": "string", "format": "date-time"},
                    "heartbeat_at": {"type": "string", "format": "date-time"},
                    "heartbeat_age_seconds": {"type": "number"},
                    "alive": {"type": "boolean"},
                },
            },
        },
    },
}

_DASHBOARD_PATHS: dict[str, Any] = {
    "/": {
        "get": {
            "summary": "Redirect to /dashboard",
            "security": [],
            "responses": {"303": {"description": "See /dashboard."}},
        }
    },
    "/dashboard": {
        "get": {
            "summary": "The web dashboard (HTML): lanes, tenants, dead jobs, rejected messages, "
            "workers",
            "description": "Authenticated by the login cookie or a Bearer key; "
            "shows only the key's tenant. Reloads itself every 5 s.",
            "responses": {"200": {"description": "The page.", "content": _HTML}, **_TO_LOGIN},
        }
    },
    "/dashboard.json": {
        "get": {
            "summary": "The dashboard's data as JSON",
            "responses": {
                "200": {
                    "description": "Scoped to the key's tenant.",
                    "content": {"application/json": {"schema": _ref("schemas/Dashboard")}},
                },
                **_errors(401, 503),
            },
        }
    },
    "/dashboard/login": {
        "get": {
            "summary": "The API-key form",
            "security": [],
            "responses": {"200": {"description": "The form.", "content": _HTML}},
        },
        "post": {
            "summary": "Sign in: sets the HTTP-only dashboard cookie",
            "security": [],
            "requestBody": {
                "required": True,
                "content": {
                    "application/x-www-form-urlencoded": {
                        "schema": {
                            "type": "object",
                            "required": ["key"],
                            "properties": {"key": {"type": "string"}},
                        }
                    }
                },
            },
            "responses": {
                "303": {"description": "Signed in (Set-Cookie); redirect to /dashboard."},
                "401": {"description": "Wrong or missing key: the form again.", "content": _HTML},
                "403": {"description": "Posted from another origin.", "content": _ERROR},
                "413": {"description": "The form is too large.", "content": _ERROR},
                "415": {"description": "Not a urlencoded form.", "content": _ERROR},
            },
        },
    },
    "/dashboard/logout": {
        "post": {
            "summary": "Sign out: clears the dashboard cookie",
            "security": [],
            "responses": {"303": {"description": "Redirect to the login form."}},
        }
    },
    "/dashboard/jobs/{job_id}": {
        "get": {
            "summary": "One job's status JSON as a page (the dashboard's link target)",
            "parameters": [_JOB_ID],
            "responses": {
                "200": {"description": "The page.", "content": _HTML},
                **_TO_LOGIN,
                **_errors(404, 503),
            },
        }
    },
}

SPEC: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {
        "title": "coldbrew",
        "version": "1",
        "description": "Submit long-running jobs and follow them. Authenticate with "
        "`Authorization: Bearer <API key>`; a key sees only its tenant's jobs.\n\n"
        "Limits, on every route: a request head not complete within "
        "COLDBREW_API_HEADER_TIMEOUT_SECONDS of the connection's opening (or of a later "
        "request's first byte) is answered 408 `header_timeout` and the connection closed "
        "(closed without an answer if nothing was sent); a body not complete within "
        "COLDBREW_API_BODY_TIMEOUT_SECONDS gets 408 `body_timeout`; an idle kept-alive "
        "connection is closed after COLDBREW_API_KEEPALIVE_SECONDS. A connection opened while "
        "the process holds COLDBREW_API_MAX_CONNECTIONS gets 503 `too_many_connections` with "
        "Retry-After on its first request, then is closed. Errors are "
        '`{"error": {"kind", "message"}}`.',
    },
    "security": [{"bearer": []}],
    "paths": {
        "/jobs": {
            "post": {
                "summary": "Submit a job",
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "schema": {"type": "string", "maxLength": 256},
                        "description": "the same key (per tenant) returns the same job",
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("schemas/Submit")}},
                },
                "responses": {
                    "202": {
                        "description": "Accepted; Location names the job.",
                        "headers": {"Location": {"schema": {"type": "string"}}},
                        "content": _JOB,
                    },
                    **_errors(400, 401, 403, 408, 413, 415, 422, 503),
                },
            }
        },
        "/jobs/{job_id}": {
            "get": {
                "summary": "A job's status JSON; long-polls with ?wait",
                "parameters": [
                    _JOB_ID,
                    {
                        "name": "wait",
                        "in": "query",
                        "schema": {"type": "number", "minimum": 0},
                        "description": "seconds to wait for a change from If-None-Match's "
                        "state (or from the current one); capped by COLDBREW_API_MAX_WAIT_SECONDS",
                    },
                    {"name": "If-None-Match", "in": "header", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {"description": "The job's status, with its ETag.", "content": _JOB},
                    "304": {"description": "Unchanged from If-None-Match."},
                    **_errors(401, 404, 422, 503, waits=True),
                },
            },
            "delete": {
                "summary": "Cancel a job",
                "parameters": [
                    _JOB_ID,
                    {"name": "reason", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": {"description": "Cancelled.", "content": _JOB},
                    "202": {"description": "Running; its worker stops it.", "content": _JOB},
                    **_errors(401, 404, 409, 503),
                },
            },
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
                        "description": "`event: status` with the status JSON as data",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}},
                    },
                    **_errors(401, 404, 503, waits=True),
                },
            }
        },
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
                    "503": {"description": "not ready", "content": _PROBE},
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
        **_DASHBOARD_PATHS,
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "JobStatus": _STATUS_SCHEMA,
            "Submit": _SUBMIT_SCHEMA,
            "Error": _ERROR_SCHEMA,
            "Dashboard": _DASHBOARD_SCHEMA,
        },
    },
}
