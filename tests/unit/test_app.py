"""Job registration on ``App``, argument validation from signatures, and ``load_app``.

This module uses ``from __future__ import annotations`` (the project requires
it), so every job below has string annotations that registration must resolve.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from coldbrew.app import App, JobSpec, load_app
from coldbrew.context import Context
from coldbrew.errors import ConfigurationError, InvalidArguments, UnknownJobType


class Rendition(BaseModel):
    """A module-level model: resolvable from a string annotation."""

    height: int
    codec: str = "h264"


@dataclass
class Crop:
    """A module-level dataclass used as an argument type."""

    width: int
    height: int


def make_app() -> tuple[App, JobSpec, JobSpec]:
    """An app with one coroutine job and one process-pool job, as in DESIGN §1."""
    app = App()

    @app.job()
    async def thumbnail(ctx: Context, video_id: str, size: int = 256) -> dict[str, Any]:
        return {}

    @app.job(queue="slow", timeout=1800)
    def transcode(ctx: Context, video_id: str, resolutions: list[str]) -> dict[str, Any]:
        return {}

    return app, app.get("thumbnail"), app.get("transcode")


def invalid_args_message(spec: JobSpec, args: dict[str, Any]) -> str:
    with pytest.raises(InvalidArguments) as caught:
        spec.validate_args(args)
    assert caught.value.reason == "invalid_args"
    return caught.value.detail


# --- registration ---------------------------------------------------------------------


def test_coroutine_and_plain_functions_are_told_apart() -> None:
    """Coroutine functions run on the event loop, plain functions in the process pool."""
    app, thumbnail, transcode = make_app()
    assert thumbnail.is_coroutine
    assert not thumbnail.runs_in_process
    assert not transcode.is_coroutine
    assert transcode.runs_in_process
    assert app.needs_process_pool


def test_an_app_of_coroutines_needs_no_pool() -> None:
    """Without plain-function jobs the worker starts no process pool."""
    app = App()

    @app.job()
    async def ping(ctx: Context) -> None:
        return None

    assert not app.needs_process_pool


def test_registration_records_the_spec() -> None:
    """Name, lane, timeout and retry budget are recorded as declared, and the function returned."""
    app = App()

    async def probe(ctx: Context) -> None:
        return None

    returned = app.job("probe.v2", queue="fast", timeout=5, max_attempts=2)(probe)
    spec = app.get("probe.v2")
    assert returned is probe
    assert (spec.name, spec.queue, spec.timeout, spec.max_attempts) == ("probe.v2", "fast", 5, 2)
    assert spec.func is probe


def test_default_lane_is_the_apps() -> None:
    """A job without a queue goes to the app's default lane."""
    app = App(default_queue="fast")

    @app.job()
    async def quick(ctx: Context) -> None:
        return None

    assert app.get("quick").queue == "fast"


def test_duplicate_name_is_rejected() -> None:
    """Registering a second job under a taken name is a configuration error."""
    app, _, _ = make_app()

    async def thumbnail(ctx: Context) -> None:
        return None

    with pytest.raises(ConfigurationError, match="registered twice"):
        app.job()(thumbnail)
    with pytest.raises(ConfigurationError, match="registered twice"):
        app.job("transcode")(thumbnail)


@pytest.mark.parametrize("queue", ["Slow", "a.b", "has space", "x" * 65, "slow!"])
def test_invalid_queue_name_is_rejected(queue: str) -> None:
    """A lane must match [a-z0-9_-]{1,64}: it is part of routing keys and queue names."""
    app = App()

    async def job(ctx: Context) -> None:
        return None

    with pytest.raises(ConfigurationError, match="queue"):
        app.job(queue=queue)(job)


@pytest.mark.parametrize("name", ["1st", "has space", "a/b", "x" * 129, "ünï"])
def test_invalid_type_name_is_rejected(name: str) -> None:
    """A job type must be a short identifier-like name."""
    app = App()

    async def job(ctx: Context) -> None:
        return None

    with pytest.raises(ConfigurationError, match="job type"):
        app.job(name)(job)


def test_invalid_default_queue_is_rejected() -> None:
    """The app's own default lane is checked too."""
    with pytest.raises(ConfigurationError, match="queue name"):
        App(default_queue="Default")


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_invalid_limits_are_rejected(options: dict[str, Any], problem: str) -> None:
    """A non-positive timeout or a retry budget below one is refused at registration."""
    app = App()

    async def job(ctx: Context) -> None:
        return None

    with pytest.raises(ConfigurationError, match=problem):
        app.job(**options)(job)


def test_job_without_ctx_parameter_is_rejected() -> None:
    """A job must take the Context as its first parameter."""
    app = App()

    async def no_ctx() -> None:
        return None

    with pytest.raises(ConfigurationError, match="Context"):
        app.job()(no_ctx)


def test_var_positional_and_positional_only_parameters_are_rejected() -> None:
    """Arguments arrive by name from JSON, so *args and positional-only ones cannot be filled."""
    app = App()

    async def star(ctx: Context, *items: int) -> None:
        return None

    async def positional(ctx: Context, item: int, /) -> None:
        return None

    with pytest.raises(ConfigurationError, match="items"):
        app.job()(star)
    with pytest.raises(ConfigurationError, match="item"):
        app.job()(positional)


def test_unknown_job_type_is_a_configuration_error() -> None:
    """Looking up an unregistered type raises UnknownJobType naming it."""
    app, _, _ = make_app()
    with pytest.raises(UnknownJobType, match="'resize'"):
        app.get("resize")
    assert issubclass(UnknownJobType, ConfigurationError)


# --- argument validation ------------------------------------------------------------------


def test_validate_args_accepts_good_args() -> None:
    """Arguments that fit the signature come back as a plain dict."""
    _, thumbnail, transcode = make_app()
    assert thumbnail.validate_args({"video_id": "v1", "size": 128}) == {
        "video_id": "v1",
        "size": 128,
    }
    assert transcode.validate_args({"video_id": "v1", "resolutions": ["720p"]}) == {
        "video_id": "v1",
        "resolutions": ["720p"],
    }


def test_validate_args_applies_defaults() -> None:
    """Parameters with defaults may be left out; the default is filled in."""
    _, thumbnail, _ = make_app()
    assert thumbnail.validate_args({"video_id": "v1"}) == {"video_id": "v1", "size": 256}


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"video_id": 5}, "video_id"),
        ({"video_id": "v1", "size": "big"}, "size"),
        ({"video_id": "v1", "size": [1]}, "size"),
        ({"video_id": None}, "video_id"),
    ],
)
def test_validate_args_rejects_wrong_types(args: dict[str, Any], field: str) -> None:
    """A value of the wrong type fails with InvalidArguments naming the field and the job."""
    _, thumbnail, _ = make_app()
    message = invalid_args_message(thumbnail, args)
    assert field in message
    assert message.startswith("thumbnail(")


def test_validate_args_rejects_missing_field() -> None:
    """A required parameter that is absent is named in the error."""
    _, _, transcode = make_app()
    message = invalid_args_message(transcode, {"video_id": "v1"})
    assert "resolutions" in message


def test_validate_args_rejects_extra_field() -> None:
    """An argument the signature does not take is named in the error."""
    _, thumbnail, _ = make_app()
    message = invalid_args_message(thumbnail, {"video_id": "v1", "colour": "red"})
    assert "colour" in message


def test_kwargs_jobs_accept_anything() -> None:
    """A job that takes ``**kwargs`` gets whatever object was sent, unchecked."""
    app = App()

    @app.job()
    async def anything(ctx: Context, **kwargs: Any) -> None:
        return None

    spec = app.get("anything")
    assert spec.args_model is None
    assert spec.validate_args({"a": 1, "b": [2], "c": {"d": None}}) == {
        "a": 1,
        "b": [2],
        "c": {"d": None},
    }


def test_unannotated_parameters_accept_any_value() -> None:
    """A parameter without an annotation accepts any JSON value."""
    app = App()

    @app.job()
    async def loose(ctx: Context, value=None) -> None:  # type: ignore[no-untyped-def]
        return None

    assert app.get("loose").validate_args({"value": {"x": [1]}}) == {"value": {"x": [1]}}


def test_string_annotations_are_resolved() -> None:
    """Annotations that are strings (future import) become real types, module classes included."""
    app = App()

    @app.job()
    def encode(ctx: Context, rendition: Rendition, crop: Crop, tags: list[str]) -> None:
        return None

    assert isinstance(inspect.signature(encode).parameters["tags"].annotation, str)
    spec = app.get("encode")
    assert spec.args_model is not None
    assert spec.args_model.model_fields["tags"].annotation == list[str]
    args = spec.validate_args(
        {"rendition": {"height": 720}, "crop": {"width": 4, "height": 3}, "tags": ["a"]}
    )
    assert args["rendition"] == Rendition(height=720, codec="h264")
    assert args["crop"] == Crop(width=4, height=3)
    assert "tags" in invalid_args_message(
        spec, {"rendition": {"height": 1}, "crop": {"width": 1, "height": 1}, "tags": "a"}
    )


def test_unresolvable_annotation_is_a_configuration_error() -> None:
    """A hint that names nothing importable fails at registration, naming the function."""
    app = App()

    async def broken(ctx: Context, value: int) -> None:
        return None

    broken.__annotations__ = {"ctx": "Context", "value": "NoSuchType"}
    with pytest.raises(ConfigurationError, match="broken"):
        app.job()(broken)


# --- lanes ------------------------------------------------------------------------------------


def test_queues_lists_the_default_lane_first() -> None:
    """App.queues is the default lane, then every other lane once, in registration order."""
    app = App()

    for lane in ("slow", "fast", "slow", "default"):

        async def job(ctx: Context) -> None:
            return None

        app.job(f"job_{len(app.jobs)}", queue=lane)(job)
    assert app.queues == ["default", "slow", "fast"]


def test_queues_of_an_empty_app_is_the_default_lane() -> None:
    """An app with no jobs still consumes its default lane."""
    assert App(default_queue="main").queues == ["main"]


# --- load_app -------------------------------------------------------------------------------


def test_load_app_returns_the_app_and_records_its_reference() -> None:
    """``MODULE:ATTR`` imports the module and returns its App, remembering the reference."""
    app = load_app("tests.apps:app")
    assert isinstance(app, App)
    assert app.ref == "tests.apps:app"
    assert "echo" in app.jobs


@pytest.mark.parametrize(
    ("ref", "problem"),
    [
        ("tests.apps", "MODULE:APP"),
        ("tests.apps:", "MODULE:APP"),
        (":app", "MODULE:APP"),
        ("no_such_module_for_coldbrew:app", "cannot import"),
        ("tests.no_such_module:app", "cannot import"),
        ("coldbrew.app:NAME_RE", "not a coldbrew App"),
        ("tests.apps:no_such_attribute", "not a coldbrew App"),
        ("coldbrew.app:App", "not a coldbrew App"),
    ],
)
def test_load_app_errors_are_configuration_errors(ref: str, problem: str) -> None:
    """Every way to name the app wrongly is a ConfigurationError that says what is wrong."""
    with pytest.raises(ConfigurationError, match=problem) as caught:
        load_app(ref)
    assert repr(ref) in str(caught.value)
