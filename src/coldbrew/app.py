"""The job registry: ``App`` and the ``@app.job()`` decorator.

Registering a job does no I/O: it records a ``JobSpec`` (name, lane, timeout,
retry budget, whether it runs on the event loop or in the process pool) and
builds the validator that checks a message's ``args`` against the function's
signature before the job runs.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from coldbrew.errors import ConfigurationError, InvalidArguments, UnknownJobType
from coldbrew.ratelimit import Rate, RateKey, parse_rate

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
        self.ref: str | None = None  # "module:attr", set by load_app; the process pool needs it

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
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        rate_key: RateKey | None = None,
    ) -> Callable[[F], F]:
        """Register a job. Coroutine functions run on the event loop, plain ones in the pool.

        ``max_wall_seconds`` bounds the time from the first start to the last
        retry, whatever ``max_attempts`` allows. ``on_cancel(ctx, reason)`` is an
        async cleanup hook run on the worker after a cancelled job stopped (for
        pool jobs, after its child was killed).

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


def load_app(ref: str) -> App:
    """Import ``MODULE:ATTR`` and return the ``App`` it names."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"app reference {ref!r} must look like MODULE:APP")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r} for {ref!r}: {type(exc).__name__}: {exc}"
        ) from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigurationError(f"{ref!r} is not a coldbrew App (found {type(app).__name__})")
    app.ref = ref
    return app
