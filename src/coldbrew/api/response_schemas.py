"""The JSON schemas of what the API answers: a job's status, an error, the dashboard's data.

Kept apart from ``openapi.py`` (which builds the document around them) because
they describe values built elsewhere (``JobRecord.to_status_json``,
``errors.error_document``, ``overview.Overview.to_json``); the tests check real
answers against them through schemathesis's response-schema check.
"""

from __future__ import annotations

from typing import Any

from coldbrew.model import MAX_PRIORITY, Status

STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"type": "string"},
        "queue": {"type": "string"},
        "tenant": {"type": "string"},
        "status": {"enum": [status.value for status in Status]},
        "priority": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY},
        "attempt": {"type": "integer"},
        "max_attempts": {"type": "integer"},
        "progress": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "progress_message": {"type": ["string", "null"]},
        "result": {},
        "error": {
            "type": ["object", "null"],
            "properties": {
                "kind": {"type": "string"},
                "message": {"type": "string"},
                "dead_reason": {"type": "string", "description": "only when dead"},
            },
        },
        "created_at": {"type": "string", "format": "date-time"},
        "started_at": {"type": ["string", "null"], "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "run_at": {"type": "string", "format": "date-time"},
        "cancel_requested": {"type": "boolean"},
        "snoozes": {"type": "integer", "minimum": 0, "description": "times the job snoozed"},
        "batch_id": {"type": ["string", "null"], "description": "the job's batch, if any"},
        "parent_id": {
            "type": ["string", "null"],
            "description": "the job that spawned this one with ctx.submit",
        },
        "chain_id": {"type": ["string", "null"], "description": "the chain this job is a step of"},
        "chain_step": {"type": ["integer", "null"], "minimum": 0},
        "children": {
            "type": "object",
            "description": "the jobs this one spawned (ctx.submit), counted by status",
            "required": ["total", "by_status"],
            "properties": {
                "total": {"type": "integer", "minimum": 0},
                "by_status": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
        },
    },
}

BATCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "tenant": {"type": "string"},
        "description": {"type": ["string", "null"]},
        "status": {"enum": ["running", "succeeded", "completed", "cancelled"]},
        "total": {"type": "integer", "minimum": 0},
        "pending": {"type": "integer", "minimum": 0},
        "counts": {
            "type": "object",
            "description": "members by status",
            "additionalProperties": {"type": "integer", "minimum": 0},
        },
        "progress": {"type": "number", "minimum": 0, "maximum": 1},
        "callbacks": {
            "type": "object",
            "description": "on_success / on_complete / on_death: its type, job id and the "
            "status of its job once enqueued (null before)",
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "type": {"type": "string"},
                    "job_id": {"type": "string"},
                    "status": {"type": ["string", "null"]},
                },
            },
        },
        "collect_results": {"type": "boolean"},
        "cancel_requested": {"type": "boolean"},
        "created_at": {"type": "string", "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
    },
}
BATCH_SCHEMA["required"] = list(BATCH_SCHEMA["properties"])

STATUS_SCHEMA["required"] = list(STATUS_SCHEMA["properties"])  # every key, always present

ERROR_SCHEMA: dict[str, Any] = {
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

_LANE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "One lane (queue) of one tenant; depth = queued + retrying.",
    "properties": {
        "queue": {"type": "string"},
        "tenant": {"type": "string"},
        "queued": {"type": "integer"},
        "running": {"type": "integer"},
        "retrying": {"type": "integer"},
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

DASHBOARD_SCHEMA: dict[str, Any] = {
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
        "paused_lanes": {
            "type": "array",
            "items": {"type": "string"},
            "description": "lanes paused fleet-wide (`coldbrew lanes pause`): their jobs wait",
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
