"""/openapi.json says what the server checks: its patterns and bounds are the validators' own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route

from coldbrew.api.app import ROUTES, PathRoute
from coldbrew.api.auth import DASHBOARD_COOKIE
from coldbrew.api.openapi import NO_NUL, SPEC, build_spec
from coldbrew.api.schemas import SubmitBody
from coldbrew.app import JOB_TYPE_RE
from coldbrew.client import MAX_REASON
from coldbrew.model import (
    JOB_ID_RE,
    MAX_ATTEMPTS,
    MAX_IDEMPOTENCY_KEY,
    MAX_PRIORITY,
    MAX_TIMEOUT_SECONDS,
    MIN_TIMEOUT_SECONDS,
    NAME_RE,
)

API_SOURCES = Path(__file__).parents[2] / "src" / "coldbrew" / "api"
METHODS = ("get", "put", "post", "delete", "patch")


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def non_null(schema: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of an optional field's ``anyOf``."""
    if "anyOf" not in schema:
        return schema
    (branch,) = [s for s in schema["anyOf"] if s.get("type") != "null"]
    return dict(branch)


def parameter(path: str, method: str, name: str) -> dict[str, Any]:
    params = SPEC["paths"][path][method]["parameters"]
    (found,) = [p for p in params if p["name"] == name]
    return dict(found)


def test_submit_schema_patterns_and_bounds_are_the_validators() -> None:
    """The body schema carries the very patterns and limits the server enforces."""
    submit = SPEC["components"]["schemas"]["Submit"]
    props = submit["properties"]
    assert props["type"]["pattern"] == JOB_TYPE_RE.pattern
    assert non_null(props["queue"])["pattern"] == NAME_RE.pattern
    assert non_null(props["tenant"])["pattern"] == NAME_RE.pattern
    assert (props["priority"]["minimum"], props["priority"]["maximum"]) == (0, MAX_PRIORITY)
    attempts = non_null(props["max_attempts"])
    assert (attempts["minimum"], attempts["maximum"]) == (1, MAX_ATTEMPTS)
    timeout = non_null(props["timeout_seconds"])
    assert (timeout["minimum"], timeout["exclusiveMaximum"]) == (
        MIN_TIMEOUT_SECONDS,
        MAX_TIMEOUT_SECONDS,
    )
    assert submit["additionalProperties"] is False
    assert submit["required"] == ["type"]


def test_submit_schema_follows_the_model() -> None:
    """Every field of SubmitBody is documented, and nothing else: adding a field to the
    model documents it (run_at, delay_seconds... arrive with no edit here)."""
    assert set(SPEC["components"]["schemas"]["Submit"]["properties"]) == set(
        SubmitBody.model_fields
    )


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/jobs/{job_id}", "get"),
        ("/jobs/{job_id}", "delete"),
        ("/jobs/{job_id}/events", "get"),
        ("/dashboard/jobs/{job_id}", "get"),
    ],
)
def test_job_id_pattern_is_the_servers(path: str, method: str) -> None:
    assert parameter(path, method, "job_id")["schema"]["pattern"] == JOB_ID_RE.pattern


def test_wait_cap_is_the_process_setting() -> None:
    """`wait`'s maximum is COLDBREW_API_MAX_WAIT_SECONDS of the serving process."""
    assert parameter("/jobs/{job_id}", "get", "wait")["schema"] == {
        "type": "number",
        "minimum": 0,
        "maximum": 60.0,
    }
    custom = build_spec(max_wait_seconds=7.5)
    (wait,) = [
        p for p in custom["paths"]["/jobs/{job_id}"]["get"]["parameters"] if p["name"] == "wait"
    ]
    assert wait["schema"]["maximum"] == 7.5


def test_header_and_reason_limits_are_the_servers() -> None:
    key = parameter("/jobs", "post", "Idempotency-Key")["schema"]
    assert (key["minLength"], key["maxLength"]) == (1, MAX_IDEMPOTENCY_KEY)
    reason = parameter("/jobs/{job_id}", "delete", "reason")["schema"]
    assert reason["maxLength"] == MAX_REASON
    assert key["pattern"] == reason["pattern"] == NO_NUL
    assert re.fullmatch(NO_NUL, "any text") and not re.fullmatch(NO_NUL, "a\x00b")


def test_every_route_and_method_is_documented_and_nothing_else() -> None:
    served = {
        (route.path, method.lower())
        for route in ROUTES
        if isinstance(route, Route)
        for method in (route.methods or ()) - {"HEAD"}
    }
    documented = {(path, method) for path, method, _ in operations(SPEC)}
    assert served == documented


def test_one_route_per_path_so_405_names_every_method() -> None:
    paths = [route.path for route in ROUTES if isinstance(route, Route)]
    assert len(paths) == len(set(paths))
    assert all(isinstance(route, PathRoute) for route in ROUTES)


def test_every_operation_documents_the_protocol_layers_answers() -> None:
    """408 (head/body timeout) and 503 (connection cap, with Retry-After) can answer any route."""
    for path, method, operation in operations(SPEC):
        responses = operation["responses"]
        assert "408" in responses, (path, method)
        assert "Retry-After" in responses["503"]["headers"], (path, method)


def test_every_status_the_routes_raise_is_documented() -> None:
    """Each ``ApiError(status, ...)`` in api/ is a documented response of some operation."""
    raised = {
        int(code)
        for source in API_SOURCES.glob("*.py")
        for code in re.findall(r"ApiError\(\s*(\d{3})", source.read_text())
    }
    documented = {int(code) for _, _, op in operations(SPEC) for code in op["responses"]}
    assert raised, "no ApiError found: the pattern is stale"
    assert raised - {405} <= documented, raised - documented  # 405: not an operation


def test_dashboard_cookie_is_a_security_scheme() -> None:
    schemes = SPEC["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer"}
    cookie = schemes["dashboardCookie"]
    assert (cookie["type"], cookie["in"], cookie["name"]) == ("apiKey", "cookie", DASHBOARD_COOKIE)
    for path in ("/dashboard", "/dashboard.json", "/dashboard/jobs/{job_id}"):
        assert SPEC["paths"][path]["get"]["security"] == [{"bearer": []}, {"dashboardCookie": []}]
    assert SPEC["security"] == [{"bearer": []}]


def test_login_form_documents_its_only_field_and_its_400() -> None:
    post = SPEC["paths"]["/dashboard/login"]["post"]
    form = post["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]
    assert form["properties"].keys() == {"key"} and form["additionalProperties"] is False
    assert {"303", "400", "401", "403", "413", "415"} <= post["responses"].keys()


def test_schemathesis_config_turns_off_only_use_after_free_on_the_job_reads() -> None:
    """tests/e2e/schemathesis.toml keeps every check on everywhere but one: a cancelled
    job stays readable (DELETE cancels), so use_after_free is off on the four reads of
    a job (the dashboard's event stream is the fourth), and on nothing else."""
    schemathesis = pytest.importorskip("schemathesis")
    from schemathesis.checks import CHECKS
    from schemathesis.config import SchemathesisConfig

    toml = Path(__file__).parents[1] / "e2e" / "schemathesis.toml"
    schema = schemathesis.openapi.from_dict(
        build_spec(), config=SchemathesisConfig.from_path(str(toml))
    )
    off = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        for phase in ("coverage", "fuzzing", "stateful"):
            checks = schema.config.checks_config_for(operation=operation, phase=phase)
            for name in CHECKS.get_all_names():
                if not checks.get_by_name(name=name).enabled:
                    off.add((operation.label, name))
    reads = (
        "GET /jobs/{job_id}",
        "GET /jobs/{job_id}/events",
        "GET /dashboard/jobs/{job_id}",
        "GET /dashboard/jobs/{job_id}/events",
    )
    assert off == {(read, "use_after_free") for read in reads}


def test_the_submit_body_names_the_unique_parts_and_states_unique_py_accepts() -> None:
    """The HTTP body's enums are unique.py's lists (a status added there must appear here)."""
    from typing import get_args

    from coldbrew import unique
    from coldbrew.api.schemas import UniquePart, UniqueState

    assert get_args(UniquePart) == unique.PARTS
    assert get_args(UniqueState) == unique.KNOWN_STATES
