"""The job registry: ``App`` and the ``@app.job()`` decorator.

Registering a job does no I/O: it records a ``JobSpec`` (name, lane, timeout,
retry budget, whether it runs on the event loop or in the process pool) and
builds the validator that checks a message's ``args`` against the function's
signature before the job runs.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from coldbrew.crontab import CatchUp, CronSpec, make_spec
from coldbrew.errors import ConfigurationError, InvalidArguments, UnknownJobType
from coldbrew.ratelimit import Rate, RateKey, parse_rate
from coldbrew.unique import UniqueError, UniqueOpts, unique_opts

NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")
JOB_TYPE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class JobSpec:
    """Everything the worker needs to know about one job type."""

    name: str
    func: Callable[..., Any]
    queue: str
    timeout: float | None
    max_attempts: int | None
    is_coroutine: bool
    retry_on: tuple[type[BaseException], ...]
    dont_retry_on: tuple[type[BaseException], ...]
    args_model: type[BaseModel] | None = field(repr=False)
    max_wall_seconds: float | None = None
    on_cancel: Callable[..., Any] | None = None
    unique: UniqueOpts | None = None
    """``@app.job(unique_for=...)``: which submissions are this job again (unique.py)."""
    rate_limit: Rate | None = None
    """``rate_limit=``: a fleet-wide rate per key (``rate_key``) or, without one, per type."""
    rate_key: RateKey | None = None
    arg_names: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # read once: pydantic's ``model_fields`` is a computed property, costly per job
        names = tuple(self.args_model.model_fields) if self.args_model is not None else ()
        object.__setattr__(self, "arg_names", names)

    @property
    def runs_in_process(self) -> bool:
        return not self.is_coroutine

    def validate_args(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``args`` against the signature; raise ``InvalidArguments`` naming the problem."""
        if self.args_model is None:
            return dict(args)
        if not args and not self.arg_names:
            return {}  # a job without parameters, called without arguments
        try:
            model = self.args_model.model_validate(args)
        except ValidationError as exc:
            raise InvalidArguments(_describe_validation(self.name, exc)) from None
        return {name: getattr(model, name) for name in self.arg_names}


def _job_rate(
    job: str, rate_limit: str | None, rate_burst: int | None, rate_key: RateKey | None
) -> Rate | None:
    """``@app.job``'s rate options, checked when the job is declared."""
    if rate_limit is None:
        if rate_burst is not None or rate_key is not None:
            raise ConfigurationError(f"job {job!r}: rate_burst and rate_key need a rate_limit")
        return None
    if not (rate_key is None or isinstance(rate_key, str) or callable(rate_key)):
        raise ConfigurationError(
            f"job {job!r}: rate_key must be an argument name or a function of the args"
        )
    try:
        return parse_rate(rate_limit, rate_burst, what="rate_limit")
    except ConfigurationError as exc:
        raise ConfigurationError(f"job {job!r}: {exc}") from None


def _describe_validation(job: str, exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "args"
        parts.append(f"{where}: {error['msg']}")
    return f"{job}({', '.join(parts)})"


class _ArgsConfig:
    """Shared pydantic config for argument models: no unknown keys, no coercion surprises."""

    config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


def _build_args_model(name: str, func: Callable[..., Any]) -> type[BaseModel] | None:
    """A pydantic model of the parameters after ``ctx``; None when the signature takes **kwargs."""
    params = list(inspect.signature(func).parameters.values())
    if not params:
        raise ConfigurationError(f"job {name!r} must take a Context as its first parameter")
    fields: dict[str, Any] = {}
    for param in params[1:]:
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            raise ConfigurationError(
                f"job {name!r}: parameter {param.name!r} cannot be passed by name from a message"
            )
        annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    hints = _resolved_hints(func)
    for key, (_annotation, default) in list(fields.items()):
        if key in hints:
            fields[key] = (hints[key], default)
    return create_model(f"{name}_args", __config__=_ArgsConfig.config, **fields)


def _resolved_hints(func: Callable[..., Any]) -> dict[str, Any]:
    """Resolve string annotations (``from __future__ import annotations`` in job modules)."""
    try:
        return dict(inspect.get_annotations(func, eval_str=True))
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve type hints of {func.__qualname__}: {exc}"
        ) from exc


class App:
    """A set of job types; a worker runs the jobs of one app."""

    def __init__(self, *, default_queue: str = "default") -> None:
        if not NAME_RE.match(default_queue):
            raise ConfigurationError(f"queue name {default_queue!r} must match {NAME_RE.pattern}")
        self.default_queue = default_queue
        self.jobs: dict[str, JobSpec] = {}
        self.schedules: dict[str, CronSpec] = {}
        """Cron schedules by name (``@app.cron``); each enqueues one of ``jobs``."""
        self.ref: str | None = None  # "module:attr", set by load_app; the process pool needs it
        self.app_dir: str | None = None  # where load_app imported it from; the pool children too

    def job(
        self,
        name: str | None = None,
        *,
        queue: str | None = None,
        timeout: float | None = None,
        max_attempts: int | None = None,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        dont_retry_on: tuple[type[BaseException], ...] = (),
        max_wall_seconds: float | None = None,
        on_cancel: Callable[..., Any] | None = None,
        unique_for: float | str | None = None,
        unique_by: tuple[str, ...] | None = None,
        unique_states: tuple[str, ...] | None = None,
        unique_keys: tuple[str, ...] | None = None,
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        rate_key: RateKey | None = None,
    ) -> Callable[[F], F]:
        """Register a job. Coroutine functions run on the event loop, plain ones in the pool.

        ``max_wall_seconds`` bounds the time from the first start to the last
        retry, whatever ``max_attempts`` allows. ``on_cancel(ctx, reason)`` is an
        async cleanup hook run on the worker after a cancelled job stopped (for
        pool jobs, after its child was killed).

        ``unique_for`` (seconds, ``"1h"``, or ``"infinity"``) makes a submission
        with the same key as a job created within that period, and still in one
        of ``unique_states``, return that job (README "Unique jobs";
        ``unique_by``: ``args``, ``tenant``, ``queue``; ``unique_keys``: the
        args' keys that count).

        ``rate_limit="50/s"`` (``N/s``, ``N/min``, ``N/h``) limits how often jobs of
        this type start, fleet-wide: per value of the argument named ``rate_key``
        (or of ``rate_key(args)``), or for the whole type without one; at most
        ``rate_burst`` at once beyond the steady rate (default: a tenth of a
        second's worth, at least 1).
        """

        def register(func: F) -> F:
            job_name = name or func.__name__
            lane = self.default_queue if queue is None else queue
            if not JOB_TYPE_RE.match(job_name):
                raise ConfigurationError(f"job type {job_name!r} must match {JOB_TYPE_RE.pattern}")
            if not NAME_RE.match(lane):
                raise ConfigurationError(
                    f"job {job_name!r}: queue {lane!r} must match {NAME_RE.pattern}"
                )
            if job_name in self.jobs:
                raise ConfigurationError(f"job type {job_name!r} is registered twice")
            if timeout is not None and timeout <= 0:
                raise ConfigurationError(f"job {job_name!r}: timeout must be positive")
            if max_attempts is not None and max_attempts < 1:
                raise ConfigurationError(f"job {job_name!r}: max_attempts must be at least 1")
            if max_wall_seconds is not None and max_wall_seconds <= 0:
                raise ConfigurationError(f"job {job_name!r}: max_wall_seconds must be positive")
            if on_cancel is not None and not inspect.iscoroutinefunction(on_cancel):
                raise ConfigurationError(f"job {job_name!r}: on_cancel must be an async function")
            try:
                unique = unique_opts(unique_for, unique_by, unique_states, unique_keys)
            except UniqueError as exc:
                raise ConfigurationError(f"job {job_name!r}: {exc}") from None
            rate = _job_rate(job_name, rate_limit, rate_burst, rate_key)
            spec = JobSpec(
                name=job_name,
                func=func,
                queue=lane,
                timeout=timeout,
                max_attempts=max_attempts,
                is_coroutine=inspect.iscoroutinefunction(func),
                retry_on=retry_on,
                dont_retry_on=dont_retry_on,
                args_model=_build_args_model(job_name, func),
                max_wall_seconds=max_wall_seconds,
                on_cancel=on_cancel,
                unique=unique,
                rate_limit=rate,
                rate_key=rate_key,
            )
            named = isinstance(rate_key, str) and spec.args_model is not None
            if named and rate_key not in spec.arg_names:
                raise ConfigurationError(
                    f"job {job_name!r}: rate_key {rate_key!r} is not one of its arguments"
                )
            self.jobs[job_name] = spec
            return func

        return register

    def cron(
        self,
        expression: str,
        *,
        tz: str = "UTC",
        args: Mapping[str, Any] | None = None,
        catch_up: CatchUp = "latest",
        max_catch_up: int = 10,
        name: str | None = None,
        tenant: str = "default",
        priority: int = 0,
    ) -> Callable[[F], F]:
        """Enqueue the job below on a schedule; stack it *above* that job's ``@app.job()``.

        ``expression`` is croniter's (5 fields, or 6 with seconds last), read in
        ``tz``. After an outage ``catch_up`` decides: ``latest`` runs the most
        recent missed tick once, ``all`` the latest ``max_catch_up`` of them,
        ``none`` none. ``name`` (default: the job type) identifies the schedule
        across deploys; two schedules of one type need names. Everything is
        checked here, at import: a bad expression, zone or policy fails naming
        the schedule.
        """

        def register(func: F) -> F:
            spec = next((s for s in self.jobs.values() if s.func is func), None)
            if spec is None:
                raise ConfigurationError(
                    f"@app.cron({expression!r}) must sit above the function's @app.job(...) "
                    f"({getattr(func, '__qualname__', func)!r} is not a registered job)"
                )
            self.add_schedule(
                make_spec(
                    name=spec.name if name is None else name,
                    expression=expression,
                    tz=tz,
                    type=spec.name,
                    args=dict(args or {}),
                    catch_up=catch_up,
                    max_catch_up=max_catch_up,
                    tenant=tenant,
                    priority=priority,
                )
            )
            return func

        return register

    def add_schedule(self, schedule: CronSpec) -> None:
        """Register a checked schedule (``@app.cron``, or one from ``COLDBREW_CRON``)."""
        where = f"cron schedule {schedule.name!r}"
        if schedule.name in self.schedules:
            raise ConfigurationError(
                f"{where} is declared twice (two schedules of one job type need name=)"
            )
        spec = self.jobs.get(schedule.type)
        if spec is None:
            raise ConfigurationError(f"{where}: job type {schedule.type!r} is not registered")
        try:
            spec.validate_args(schedule.args)
        except InvalidArguments as exc:
            raise ConfigurationError(f"{where}: args do not fit the job: {exc}") from None
        self.schedules[schedule.name] = schedule

    def extended(self) -> App:
        """A copy to add built-in jobs to (the worker's ``coldbrew.webhook``), so the user's
        app stays as written and two workers made from one app each add their own."""
        copy = App(default_queue=self.default_queue)
        copy.jobs = dict(self.jobs)
        copy.schedules = dict(self.schedules)
        copy.ref, copy.app_dir = self.ref, self.app_dir
        return copy

    def get(self, job_type: str) -> JobSpec:
        try:
            return self.jobs[job_type]
        except KeyError:
            raise UnknownJobType(f"unknown job type {job_type!r}") from None

    @property
    def queues(self) -> list[str]:
        """Every lane a job of this app is declared on, the default lane first."""
        lanes = [self.default_queue]
        for spec in self.jobs.values():
            if spec.queue not in lanes:
                lanes.append(spec.queue)
        return lanes

    @property
    def needs_process_pool(self) -> bool:
        return any(spec.runs_in_process for spec in self.jobs.values())


def load_app(ref: str, app_dir: str | os.PathLike[str] | None = None) -> App:
    """Import ``MODULE:ATTR`` and return the ``App`` it names.

    Why a directory: like uvicorn, celery and arq, ``coldbrew worker myapp:app``
    must find ``myapp.py`` in the folder it is run from, though a console
    script's ``sys.path[0]`` is its ``bin`` directory. ``app_dir`` (``--app-dir``;
    default the current directory) goes first on ``sys.path`` unless it is
    there already, and is kept on the app so the process-pool children import
    the app from the same place.
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"app reference {ref!r} must look like MODULE:APP")
    directory = _use_app_dir(app_dir)
    module = _import_app_module(ref, module_name, directory, app_dir is not None)
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigurationError(f"{ref!r} is not a coldbrew App (found {type(app).__name__})")
    app.ref = ref
    app.app_dir = directory
    return app


def _use_app_dir(app_dir: str | os.PathLike[str] | None) -> str:
    """``app_dir`` (default: the current directory) made absolute and put on ``sys.path``."""
    directory = os.path.abspath(os.fspath(app_dir) if app_dir is not None else os.getcwd())
    if app_dir is not None and not os.path.isdir(directory):
        raise ConfigurationError(f"--app-dir {os.fspath(app_dir)!r} is not a directory")
    known = {os.path.abspath(entry or os.curdir) for entry in sys.path}
    if directory not in known:
        sys.path.insert(0, directory)
    return directory


def _import_app_module(ref: str, module_name: str, directory: str, given: bool) -> ModuleType:
    """Import the app's module; tell "not found" apart from an error raised inside it."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and _names_the_target(module_name, exc.name):
            raise ConfigurationError(_not_found(ref, exc.name, directory, given)) from exc
        raise ConfigurationError(_inside(ref, exc)) from exc
    except Exception as exc:
        raise ConfigurationError(_inside(ref, exc)) from exc


def _names_the_target(module_name: str, missing: str) -> bool:
    """The missing module is ``module_name`` or one of its packages, not something it imports."""
    return module_name == missing or module_name.startswith(missing + ".")


def _not_found(ref: str, missing: str, directory: str, given: bool) -> str:
    """What was searched, in order, and how to point coldbrew elsewhere."""
    which = "--app-dir" if given else "the current directory"
    others = [
        entry or os.curdir for entry in sys.path if os.path.abspath(entry or os.curdir) != directory
    ]
    return (
        f"cannot import {ref!r}: no module named {missing!r}; searched {directory} ({which}), "
        f"then sys.path: {', '.join(others)}. Run coldbrew from the folder that holds "
        f"{missing.replace('.', '/')}.py, or pass --app-dir DIR"
    )


def _inside(ref: str, exc: BaseException) -> str:
    """The user's own error while importing: its kind, message, and where it was raised."""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}, line {exc.lineno}"
        detail = exc.msg
    else:
        frames = [
            frame
            for frame in traceback.extract_tb(exc.__traceback__)
            if not frame.filename.startswith("<frozen ")
        ]
        where = f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else "unknown place"
        detail = str(exc)
    return f"importing {ref!r} failed at {where}: {type(exc).__name__}: {detail}"
