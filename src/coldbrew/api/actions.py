"""The dashboard's actions: parsed and checked, authorised, carried out, and audited.

Each action goes through the same functions as its CLI command: ``Client.cancel``
(``coldbrew cancel``), ``TenantStore.set_tenant`` (``coldbrew tenants
pause|resume|set``), ``TenantStore.set_lane_paused`` (``coldbrew lanes
pause|resume``), the checks of ``coldbrew.operations`` (weights, caps,
replay reasons: the same messages), and, for what the CLI scopes to no tenant,
the dashboard store's tenant-scoped twins of ``dlq replay`` (``retry_job``,
``replay_dead``). A tenant's key acts on its own jobs and tenant only; changing
a weight (a share against the other tenants) or pausing a lane (every
tenant's jobs in it) needs every-tenant access.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coldbrew.api.auth import BrowserUser
from coldbrew.api.errors import ApiError
from coldbrew.errors import ConfigurationError, JobNotFound
from coldbrew.model import NAME_RE, Status, check_job_id
from coldbrew.operations import check_budget, check_reason_text, parse_cap, parse_weight
from coldbrew.topology import Topology

if TYPE_CHECKING:
    from coldbrew.client import Client

JOB_ACTIONS = frozenset({"cancel", "retry"})
TENANT_ACTIONS = frozenset({"pause", "resume", "tenant_set"})
LANE_ACTIONS = frozenset({"lane_pause", "lane_resume"})
ACTIONS = JOB_ACTIONS | TENANT_ACTIONS | LANE_ACTIONS | {"replay"}
REPLAY_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Action:
    """One checked action, as the confirmation page shows it and the form posts it back."""

    name: str
    job_id: str | None = None
    tenant: str | None = None
    lane: str | None = None
    reason: str | None = None
    weight: float | None = None
    max_running: int | None = None
    uncap: bool = False
    fields: dict[str, str] = field(default_factory=dict)  # the form's fields, for the confirm

    def describe(self) -> str:
        """What the confirmation page asks, in words."""
        if self.name == "cancel":
            return f"Cancel job {self.job_id}?"
        if self.name == "retry":
            return f"Run job {self.job_id} again with a fresh budget of attempts?"
        if self.name == "replay":
            return f"Replay up to {REPLAY_LIMIT} dead jobs whose reason or error contains " + (
                f"{self.reason!r}?"
            )
        if self.name in ("pause", "resume"):
            return f"{self.name.capitalize()} tenant {self.tenant}?"
        if self.name in LANE_ACTIONS:
            verb = self.name.removeprefix("lane_").capitalize()
            return f"{verb} lane {self.lane} on every worker, for every tenant?"
        changes = []
        if self.weight is not None:
            changes.append(f"weight {self.weight:g}")
        if self.uncap:
            changes.append("no cap on running jobs")
        elif self.max_running is not None:
            changes.append(f"max running {self.max_running}")
        return f"Set tenant {self.tenant}: {', '.join(changes)}?"

    @property
    def audit_target(self) -> str:
        if self.job_id is not None:
            return f"job {self.job_id}"
        if self.tenant is not None:
            return f"tenant {self.tenant}"
        if self.lane is not None:
            return f"lane {self.lane}"
        return f"dead jobs matching {self.reason!r}"

    def audit_detail(self) -> dict[str, Any]:
        detail: dict[str, Any] = {}
        for name in ("reason", "weight", "max_running"):
            if (value := getattr(self, name)) is not None:
                detail[name] = value
        if self.uncap:
            detail["max_running"] = "none"
        return detail


def _text(form: Mapping[str, str], name: str) -> str | None:
    value = form.get(name, "").strip()
    return value or None


def parse_action(form: Mapping[str, str], user: BrowserUser) -> Action:
    """The action a form asks for, checked and authorised; raises what the CLI would."""
    name = form.get("action", "")
    if name not in ACTIONS:
        raise ApiError(400, "invalid_action", f"unknown action {name!r}; one of {sorted(ACTIONS)}")
    fields = {k: v for k, v in form.items() if k != "csrf"}
    if name in JOB_ACTIONS:
        job_id = form.get("job_id", "")
        check_job_id(job_id)
        reason = _text(form, "reason")
        return Action(name, job_id=job_id, reason=reason, fields=fields)
    if name == "replay":
        return Action(name, reason=check_reason_text(form.get("reason")), fields=fields)
    if name in LANE_ACTIONS:
        return _lane_action(name, form, user, fields)
    tenant = form.get("tenant", "")
    if not NAME_RE.match(tenant):
        raise ConfigurationError(f"tenant name {tenant!r} must match {NAME_RE.pattern}")
    if not user.principal.may_see(tenant):
        raise ApiError(403, "tenant_mismatch", f"this session may not change tenant {tenant!r}")
    if name != "tenant_set":
        return Action(name, tenant=tenant, fields=fields)
    return _tenant_set(tenant, form, user, fields)


def _lane_action(
    name: str, form: Mapping[str, str], user: BrowserUser, fields: dict[str, str]
) -> Action:
    lane = form.get("lane", "")
    if not NAME_RE.fullmatch(lane):
        raise ConfigurationError(f"lane name {lane!r} must match {NAME_RE.pattern}")
    if user.principal.tenant is not None:
        raise ApiError(
            403,
            "lane_needs_every_tenant",
            "a lane holds every tenant's jobs: only an operator with every tenant's access "
            "(auth off, or `coldbrew lanes pause|resume`) may pause or resume it",
        )
    return Action(name, lane=lane, fields=fields)


def _tenant_set(
    tenant: str, form: Mapping[str, str], user: BrowserUser, fields: dict[str, str]
) -> Action:
    weight_text, cap_text = _text(form, "weight"), _text(form, "max_running")
    if weight_text is None and cap_text is None:
        raise ConfigurationError("tenants set needs --weight or --max-running")
    weight = parse_weight(weight_text) if weight_text is not None else None
    if weight is not None and user.principal.tenant is not None:
        raise ApiError(
            403,
            "weight_needs_every_tenant",
            "a tenant's weight is its share against the other tenants: only an operator "
            "with every tenant's access (auth off, or `coldbrew tenants set`) may change it",
        )
    cap = parse_cap(cap_text) if cap_text is not None else None
    return Action(
        "tenant_set",
        tenant=tenant,
        weight=weight,
        max_running=cap,
        uncap=cap_text is not None and cap is None,
        fields=fields,
    )


async def carry_out(action: Action, client: Client, user: BrowserUser) -> str:
    """Do it, record it in the audit log, and say what came of it."""
    if action.job_id is not None:
        record = await client.get(action.job_id)
        if not user.principal.may_see(record.tenant):
            raise JobNotFound(action.job_id)  # as for a missing job: ids do not leak
    outcome = await _do(action, client, user)
    await client.store.dashboard.record(
        actor=user.actor,
        tenant=user.principal.tenant,
        action=action.name,
        job_id=action.job_id,
        target=action.audit_target,
        detail=action.audit_detail(),
        outcome=outcome,
    )
    return outcome


async def _do(action: Action, client: Client, user: BrowserUser) -> str:
    store, tenant = client.store, user.principal.tenant
    budget = check_budget(client.settings.max_attempts)
    if action.name == "cancel":
        assert action.job_id is not None
        reason = action.reason or f"cancelled from the dashboard by {user.actor}"
        record = await client.cancel(action.job_id, reason)
        if record.status is Status.CANCELLED:
            return "cancelled"
        if record.status is Status.RUNNING:
            return "cancel requested: the running job stops within a heartbeat"
        return f"nothing to cancel: the job is already {record.status}"
    if action.name == "retry":
        assert action.job_id is not None
        if await store.dashboard.retry_job(action.job_id, budget, tenant):
            return f"queued again with {budget} fresh attempt(s)"
        return "nothing to retry: the job is not failed or dead"
    if action.name == "replay":
        assert action.reason is not None
        ids = await store.dashboard.replay_dead(action.reason, tenant, REPLAY_LIMIT, budget)
        return f"replayed {len(ids)} dead job(s) with {budget} fresh attempt(s)"
    if action.lane is not None:
        paused = action.name == "lane_pause"
        channel = Topology(client.settings.namespace).tenant_channel
        await store.tenants.set_lane_paused(action.lane, paused, channel=channel)
        return "paused" if paused else "resumed"
    assert action.tenant is not None
    await store.tenants.set_tenant(
        action.tenant,
        weight=action.weight,
        paused={"pause": True, "resume": False}.get(action.name),
        max_running=action.max_running,
        uncap=action.uncap,
        channel=Topology(client.settings.namespace).tenant_channel,
    )
    return {"pause": "paused", "resume": "resumed"}.get(action.name, "settings changed")
