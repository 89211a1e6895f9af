-- The whole schema as of the latest migration. tests/integration/test_migrations.py
-- checks that applying sql/migrations/* in order produces exactly this catalog.

-- 'scheduled' came last, in migration 0005; it is in the type here because a value added
-- by ALTER TYPE cannot be used in the same transaction (jobs_unfinished names it)
CREATE TYPE job_status AS ENUM (
    'queued', 'running', 'retrying', 'succeeded', 'failed', 'dead', 'cancelled', 'scheduled'
);

CREATE TABLE jobs (
    id                text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    type              text NOT NULL,
    queue             text NOT NULL,
    tenant            text NOT NULL,
    args              jsonb NOT NULL DEFAULT '{}'::jsonb,
    status            job_status NOT NULL DEFAULT 'queued',
    priority          smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    attempt           integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts      integer NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds   double precision CHECK (timeout_seconds > 0),
    idempotency_key   text,
    progress          real CHECK (progress BETWEEN 0 AND 1),
    progress_message  text,
    checkpoint        jsonb,
    result            jsonb,
    error_kind        text,
    error_message     text,
    dead_reason       text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    run_at            timestamptz NOT NULL DEFAULT now(),
    publish_after     timestamptz,
    lease_expires_at  timestamptz,
    worker_id         text,
    cancel_requested  boolean NOT NULL DEFAULT false,
    cancel_reason     text,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    published_at      timestamptz
);

CREATE INDEX jobs_publish_due ON jobs (publish_after) WHERE publish_after IS NOT NULL;
CREATE INDEX jobs_lease_expiry ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_waiting ON jobs (queue, tenant, created_at)
    WHERE status IN ('queued', 'retrying');
CREATE INDEX jobs_dead ON jobs (finished_at) WHERE status = 'dead';
CREATE INDEX jobs_running ON jobs (tenant, type) WHERE status = 'running';
CREATE INDEX jobs_published_waiting ON jobs (queue, tenant, published_at)
    WHERE status IN ('queued', 'retrying') AND publish_after IS NULL;

CREATE TABLE job_once (
    job_id      text NOT NULL,
    name        text NOT NULL,
    attempt     integer NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);

CREATE TABLE tenant_queues (
    queue       text NOT NULL,
    tenant      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, tenant)
);

CREATE TABLE tenants (
    name         text PRIMARY KEY,
    weight       real NOT NULL DEFAULT 1 CHECK (weight > 0),
    max_running  integer CHECK (max_running >= 0),
    paused       boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE job_types (
    name         text PRIMARY KEY,
    max_running  integer CHECK (max_running >= 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE queue_counters (
    queue     text NOT NULL,
    tenant    text NOT NULL,
    finished  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, tenant)
);

CREATE TABLE rejected_messages (
    id           bigserial PRIMARY KEY,
    reason       text NOT NULL,
    detail       text NOT NULL,
    message_id   text,
    routing_key  text NOT NULL,
    headers      jsonb,
    body         bytea NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE queue_looks (
    queue      text NOT NULL,
    tenant     text NOT NULL,
    looked_at  timestamptz NOT NULL,
    counted_at timestamptz,
    ready      integer,
    consumers  integer,
    waiting    integer NOT NULL,
    deficit    integer,
    suspects   timestamptz,
    PRIMARY KEY (queue, tenant)
);

CREATE TABLE queue_holds (
    worker_id    text NOT NULL,
    queue        text NOT NULL,
    tenant       text NOT NULL,
    held         integer NOT NULL CHECK (held > 0),
    reported_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, queue, tenant)
);

CREATE TABLE reconcile_workers (
    worker_id    text PRIMARY KEY,
    prefetch     integer NOT NULL CHECK (prefetch >= 0),
    keep         integer NOT NULL CHECK (keep >= 0),
    reported_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE queue_sweeps (
    worker_id   text NOT NULL,
    queue       text NOT NULL,
    tenant      text NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    taking      integer NOT NULL CHECK (taking >= 0),
    PRIMARY KEY (worker_id, queue, tenant)
);

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

-- Unique jobs (0008_unique.sql)
CREATE TABLE job_unique (
    key         text PRIMARY KEY,
    job_id      text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_unique_job ON job_unique (job_id);

CREATE TABLE job_aliases (
    id          text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    job_id      text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_aliases_job ON job_aliases (job_id);
-- cron (migration 0006) ------------------------------------------------------

CREATE TABLE cron_schedules (
    name              text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    expression        text NOT NULL,
    tz                text NOT NULL,
    type              text NOT NULL,
    args              jsonb NOT NULL DEFAULT '{}'::jsonb,
    queue             text NOT NULL,
    tenant            text NOT NULL,
    priority          smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    max_attempts      integer NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds   double precision CHECK (timeout_seconds > 0),
    catch_up          text NOT NULL CHECK (catch_up IN ('latest', 'all', 'none')),
    max_catch_up      integer NOT NULL CHECK (max_catch_up BETWEEN 1 AND 1000),
    paused            boolean NOT NULL DEFAULT false,
    last_tick         timestamptz NOT NULL,
    last_job_id       text,
    seen_at           timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
-- --- the first hour (issue #18): registered job types, finished jobs by time -------------

CREATE TABLE registered_types (
    name             text PRIMARY KEY,
    queue            text NOT NULL,
    max_attempts     integer CHECK (max_attempts >= 1),
    timeout_seconds  double precision CHECK (timeout_seconds > 0),
    is_process       boolean NOT NULL,
    worker_id        text NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- (status, finished_at) since 0013: the pruner's batches are a range of one status
CREATE INDEX jobs_finished ON jobs (status, finished_at) WHERE finished_at IS NOT NULL;
-- --- rate limits (issue #15; migration 0007) ---

ALTER TABLE tenants
    ADD COLUMN rate_per_second double precision CHECK (rate_per_second > 0),
    ADD COLUMN rate_burst integer CHECK (rate_burst >= 1);

ALTER TABLE job_types
    ADD COLUMN rate_per_second double precision CHECK (rate_per_second > 0),
    ADD COLUMN rate_burst integer CHECK (rate_burst >= 1);

CREATE TABLE rate_buckets (
    key  text PRIMARY KEY,
    tat  timestamptz NOT NULL
);
-- --- scheduled jobs and snooze (migration 0005) ---------------------------------------
-- 'scheduled': waiting for run_at, with publish_after = run_at (jobs_publish_due serves
-- the relay). snoozes: times the job snoozed; its attempt budget is attempt - snoozes.
-- (the value 'scheduled' is in CREATE TYPE job_status above)

ALTER TABLE jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0 CHECK (snoozes >= 0);
-- --- bounded history (issue #19; migration 0013): see the migration for why -----------
CREATE INDEX jobs_unfinished ON jobs (queue, tenant, status, created_at)
    WHERE status IN ('queued', 'running', 'retrying', 'scheduled');

CREATE INDEX rejected_received ON rejected_messages (received_at);

-- a tenant's newest dead jobs (the dashboard of a tenant's key): on jobs_dead alone, a
-- tenant with none scanned every dead job kept (0.9 s at 100K dead rows). Written only
-- when a job dies.
CREATE INDEX jobs_dead_tenant ON jobs (tenant, finished_at) WHERE status = 'dead';

CREATE TABLE job_tallies (
    queue   text NOT NULL,
    tenant  text NOT NULL,
    status  job_status NOT NULL,
    n       bigint NOT NULL
);

CREATE FUNCTION tally_job_status() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.status IN ('dead', 'failed') THEN
        INSERT INTO job_tallies (queue, tenant, status, n)
        VALUES (OLD.queue, OLD.tenant, OLD.status, -1);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.status IN ('dead', 'failed') THEN
        INSERT INTO job_tallies (queue, tenant, status, n)
        VALUES (NEW.queue, NEW.tenant, NEW.status, 1);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_tally_insert AFTER INSERT ON jobs FOR EACH ROW
    WHEN (NEW.status IN ('dead', 'failed'))
    EXECUTE FUNCTION tally_job_status();
CREATE TRIGGER jobs_tally_update AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          AND (OLD.status IN ('dead', 'failed') OR NEW.status IN ('dead', 'failed')))
    EXECUTE FUNCTION tally_job_status();
CREATE TRIGGER jobs_tally_delete AFTER DELETE ON jobs FOR EACH ROW
    WHEN (OLD.status IN ('dead', 'failed'))
    EXECUTE FUNCTION tally_job_status();

CREATE FUNCTION job_prunable(j jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.status IN ('succeeded', 'failed', 'dead', 'cancelled')
           AND j.finished_at IS NOT NULL
           AND j.publish_after IS NULL
$$;

CREATE TABLE fleet_stats (
    queue                   text NOT NULL,
    tenant                  text NOT NULL,
    queued                  bigint NOT NULL,
    running                 bigint NOT NULL,
    retrying                bigint NOT NULL,
    dead                    bigint NOT NULL,
    failed                  bigint NOT NULL,
    scheduled               bigint NOT NULL,
    oldest_waiting_seconds  double precision NOT NULL,
    finished                bigint NOT NULL,
    PRIMARY KEY (queue, tenant)
);

CREATE TABLE fleet_stats_taken (
    one       boolean PRIMARY KEY DEFAULT true CHECK (one),
    taken_at  timestamptz NOT NULL
);
