-- Fleet-wide caps per job type (per-tenant caps live in tenants.max_running),
-- the index the capped claim counts running jobs with, and per-(lane, tenant)
-- completion counters from which the stats loop derives the drain rate.

CREATE TABLE job_types (
    name         text PRIMARY KEY,
    max_running  integer CHECK (max_running >= 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX jobs_running ON jobs (tenant, type) WHERE status = 'running';

CREATE TABLE queue_counters (
    queue     text NOT NULL,
    tenant    text NOT NULL,
    finished  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, tenant)
);
