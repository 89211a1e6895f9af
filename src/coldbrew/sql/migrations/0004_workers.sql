-- Worker liveness: one row per running worker. The worker holds a session-level
-- advisory lock (key: schema and id) on a dedicated connection; when its process
-- dies, PostgreSQL ends that session and frees the lock at once, and the fleet
-- releases the worker's jobs without waiting out their leases (worker/liveness.py).
-- Independent of any other migration: it only adds this table.

CREATE TABLE workers (
    id              text PRIMARY KEY,
    instance        text NOT NULL,
    host            text NOT NULL,
    pid             integer NOT NULL,
    version         text NOT NULL,
    lanes           text[] NOT NULL,
    concurrency     integer NOT NULL,
    jobs_in_flight  integer NOT NULL DEFAULT 0,
    backend_pid     integer NOT NULL,
    server_started  timestamptz NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now()
);
