"""Process pool for CPU-bound jobs, driven from the asyncio event loop.

Why not ``concurrent.futures.ProcessPoolExecutor``: when one of its children
dies the whole executor breaks (every pending future fails and the pool must be
rebuilt), and it cannot stop one job that runs past its timeout. Here each
child is supervised on its own: a job that times out or is cancelled has its
child SIGKILLed and replaced, a child that crashes fails only its own job, and
the jobs in the other children carry on.

The package, one concern per module; each imports only modules listed before
it (an import-linter contract in pyproject.toml checks that):

* ``errors``   -- ``PoolClosed``, ``RemoteJobError``;
* ``protocol`` -- the frames on a child's socketpair, and exceptions on the wire;
* ``child``    -- what runs inside a child: load the app, run jobs, ``ProcessContext``;
* ``futures``  -- settling futures that several parties may settle;
* ``job``      -- one job in flight (``PoolJob``) and its ``ContextHost``;
* ``wire``     -- the parent's non-blocking end of one child's socket;
* ``handle``   -- the parent's view of one child: spawn, frames, RSS, kill, exit;
* ``roster``   -- the pool's children and the FIFO hand-off of free ones;
* ``memory``   -- the per-child memory limit (``COLDBREW_PROCESS_MAX_MEMORY_MB``);
* ``keeper``   -- boot, reap, replace and recycle (``COLDBREW_PROCESS_MAX_JOBS``);
* ``pool``     -- ``ProcessPool``: ``run()``, timeouts, ``cancel()``, start and close.

Import the public names from here (``from coldbrew.procpool import ProcessPool``);
the modules are the package's own.
"""

from __future__ import annotations

from coldbrew.procpool.child import ProcessContext
from coldbrew.procpool.errors import PoolClosed, RemoteJobError
from coldbrew.procpool.job import ContextHost
from coldbrew.procpool.keeper import REPLACE_REASONS
from coldbrew.procpool.pool import ProcessPool

__all__ = [
    "REPLACE_REASONS",
    "ContextHost",
    "PoolClosed",
    "ProcessContext",
    "ProcessPool",
    "RemoteJobError",
]
