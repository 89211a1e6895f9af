"""Flow values: the ids of spawned jobs, and chains (issue #16). Pure: no I/O.

A child job's id is derived from its parent's id and the name the job gives
it (``ctx.submit(..., name=)``), and a chain step's id from the chain's id and
its position, so a retried parent or a re-run trigger computes the same ids
and the insert (``ON CONFLICT DO NOTHING``) makes each exactly once.

``chain(a, b, c)`` describes jobs that run one after another: each step runs
once the previous one succeeded, and receives that step's result as the
keyword argument its ``result_arg`` names (``"previous"`` by default; None:
not passed). ``Client.submit_chain`` resolves every step (lane, defaults,
validation) at submission and writes the chain's record; a trigger on
``jobs`` spawns each next step in the transaction that records the previous
one's success (migration 0010).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Chain", "Step", "chain", "chain_step_id", "child_job_id", "step"]

FLOW_NAMESPACE = uuid.UUID("5b0f3c1e-6f0e-4b8a-9a57-0c01db4e7f16")
"""The UUID-5 namespace of derived job ids (fixed forever: changing it changes ids)."""

MAX_STEPS = 100
"""Most steps one chain may have (its record holds them all)."""

DEFAULT_RESULT_ARG = "previous"


def child_job_id(parent_id: str, name: str) -> str:
    """The id of the child ``name`` of job ``parent_id``: the same for every attempt."""
    # the parent's length first: no (parent, name) pair can spell another's
    return str(uuid.uuid5(FLOW_NAMESPACE, f"child:{len(parent_id)}:{parent_id}:{name}"))


def chain_step_id(chain_id: str, index: int) -> str:
    """The job id of step ``index`` (0-based) of chain ``chain_id``."""
    return str(uuid.uuid5(FLOW_NAMESPACE, f"chain:{len(chain_id)}:{chain_id}:{index}"))


@dataclass(frozen=True, slots=True)
class Step:
    """One job of a chain: its type, args and submission options.

    ``result_arg``: the keyword under which this step receives the previous step's
    result (ignored for the first step); None: this step does not receive it.
    """

    type: str
    args: Mapping[str, Any] = field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    max_attempts: int | None = None
    timeout: float | None = None
    result_arg: str | None = DEFAULT_RESULT_ARG


def step(type: str, args: Mapping[str, Any] | None = None, **options: Any) -> Step:
    """``Step(type, args, **options)``: ``queue``, ``priority``, ``max_attempts``,
    ``timeout``, ``result_arg``."""
    return Step(type, dict(args or {}), **options)


@dataclass(frozen=True, slots=True)
class Chain:
    """Steps that run one after another; submit with ``Client.submit_chain``."""

    steps: tuple[Step, ...]
    tenant: str = "default"
    chain_id: str | None = None


def chain(
    *steps: Step | tuple[str, Mapping[str, Any]] | str,
    tenant: str = "default",
    chain_id: str | None = None,
) -> Chain:
    """A chain of ``steps`` (a ``Step``, a ``(type, args)`` pair, or a bare type).

    ``chain_id`` makes the submission idempotent (the same id: the same chain);
    a ``ValueError`` for an empty chain, more than ``MAX_STEPS`` steps, or a
    ``result_arg`` that is also one of its step's own args.
    """
    built = tuple(_as_step(s) for s in steps)
    if not built:
        raise ValueError("a chain needs at least one step")
    if len(built) > MAX_STEPS:
        raise ValueError(f"a chain has at most {MAX_STEPS} steps, not {len(built)}")
    for index, s in enumerate(built[1:], start=1):
        if s.result_arg is not None and s.result_arg in s.args:
            raise ValueError(
                f"step {index} ({s.type}) has an argument {s.result_arg!r}, the name under "
                "which it would receive the previous result: rename one (result_arg=)"
            )
    return Chain(built, tenant, chain_id)


def _as_step(value: Step | tuple[str, Mapping[str, Any]] | str) -> Step:
    if isinstance(value, Step):
        return value
    if isinstance(value, str):
        return Step(value)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str):
        return Step(value[0], dict(value[1]))
    raise TypeError(f"a chain step is a Step, a (type, args) pair or a type, not {value!r}")
