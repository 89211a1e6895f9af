"""The worker daemon: a supervisor (supervisor.py) of background services, one file each.

| module | owns |
|---|---|
| supervisor | ``Worker``: the lifespan, the list of services, the drain |
| lifecycle | the phase (starting -> ready -> draining -> stopped), health, the fatal error |
| service | the ``Service`` protocol, ``Periodic``, the one backoff for outages |
| intake | a delivery's route: hold -> parse -> schedule -> dispatch |
| runner | one job: claim -> ack -> run -> fenced outcome |
| relay, reaper, heartbeat, dead_letters, health, aging_sweep, tenant_watch | one service each |
"""

from __future__ import annotations

from coldbrew.worker.supervisor import Worker

__all__ = ["Worker"]
