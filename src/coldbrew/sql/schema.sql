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

-- --- flow: child jobs and chains (issue #16; migration 0010) ---------------------------
ALTER TABLE jobs
    ADD COLUMN parent_id text,
    ADD COLUMN chain_id text,
    ADD COLUMN chain_step integer CHECK (chain_step >= 0);

CREATE INDEX jobs_parent ON jobs (parent_id, status) WHERE parent_id IS NOT NULL;
CREATE INDEX jobs_chain ON jobs (chain_id, chain_step) WHERE chain_id IS NOT NULL;

CREATE TABLE chains (
    id              text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    tenant          text NOT NULL,
    steps           jsonb NOT NULL CHECK (jsonb_typeof(steps) = 'array'),
    current_step    integer NOT NULL DEFAULT 0 CHECK (current_step >= 0),
    status          text NOT NULL DEFAULT 'running'
                    CHECK (status IN ('running', 'succeeded', 'failed', 'dead', 'cancelled')),
    stopped_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);

CREATE FUNCTION chain_step_finished() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    steps  jsonb;
    nxt    jsonb;
    args   jsonb;
BEGIN
    SELECT c.steps INTO steps FROM chains AS c WHERE c.id = NEW.chain_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'succeeded' THEN
        IF NEW.chain_step + 1 >= jsonb_array_length(steps) THEN
            UPDATE chains
            SET status = 'succeeded', current_step = NEW.chain_step, stopped_reason = NULL,
                finished_at = now(), updated_at = now()
            WHERE id = NEW.chain_id;
            RETURN NULL;
        END IF;
        nxt := steps -> (NEW.chain_step + 1);
        args := nxt -> 'args';
        IF nxt ->> 'result_arg' IS NOT NULL THEN
            args := args || jsonb_build_object(nxt ->> 'result_arg',
                                               coalesce(NEW.result, 'null'::jsonb));
        END IF;
        INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts,
                          timeout_seconds, status, run_at, publish_after, chain_id, chain_step)
        VALUES (nxt ->> 'id', nxt ->> 'type', nxt ->> 'queue', nxt ->> 'tenant', args,
                (nxt ->> 'priority')::int2, (nxt ->> 'max_attempts')::int4,
                (nxt ->> 'timeout')::float8, 'queued', now(), now(), NEW.chain_id,
                NEW.chain_step + 1)
        ON CONFLICT (id) DO NOTHING;
        UPDATE chains
        SET status = 'running', current_step = NEW.chain_step + 1, stopped_reason = NULL,
            finished_at = NULL, updated_at = now()
        WHERE id = NEW.chain_id;
        PERFORM pg_notify(TG_TABLE_SCHEMA || '.relay', 'chain');
    ELSE
        UPDATE chains
        SET status = NEW.status::text, current_step = NEW.chain_step,
            stopped_reason = format('step %s (%s, job %s) %s: %s', NEW.chain_step, NEW.type,
                                    NEW.id, NEW.status,
                                    coalesce(NEW.error_message, NEW.dead_reason, 'no reason')),
            finished_at = now(), updated_at = now()
        WHERE id = NEW.chain_id;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_chain_step_finished
    AFTER UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (NEW.chain_id IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status
          AND NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled'))
    EXECUTE FUNCTION chain_step_finished();

-- --- batches (issue #16; migration 0011) ---------------------------------------------
CREATE TABLE batches (
    id                text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 100),
    tenant            text NOT NULL,
    description       text,
    total             integer NOT NULL CHECK (total >= 0),
    pending           integer NOT NULL CHECK (pending >= 0),
    succeeded         integer NOT NULL DEFAULT 0 CHECK (succeeded >= 0),
    failed            integer NOT NULL DEFAULT 0 CHECK (failed >= 0),
    dead              integer NOT NULL DEFAULT 0 CHECK (dead >= 0),
    cancelled         integer NOT NULL DEFAULT 0 CHECK (cancelled >= 0),
    on_success        jsonb,
    on_complete       jsonb,
    on_death          jsonb,
    collect_results   boolean NOT NULL DEFAULT false,
    cancel_requested  boolean NOT NULL DEFAULT false,
    created_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE jobs ADD COLUMN batch_id text;
CREATE INDEX jobs_batch ON jobs (batch_id) WHERE batch_id IS NOT NULL;

-- Insert one callback job of batch `b` for `event` ('success', 'complete', 'death'), once.
CREATE FUNCTION batch_fire(b batches, event text, callback jsonb) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    info jsonb := jsonb_build_object(
        'id', b.id, 'event', event, 'description', b.description, 'total', b.total,
        'succeeded', b.succeeded, 'failed', b.failed, 'dead', b.dead,
        'cancelled', b.cancelled);
BEGIN
    IF b.collect_results THEN
        info := info || jsonb_build_object('results', (
            SELECT coalesce(jsonb_object_agg(m.id, m.result), '{}'::jsonb)
            FROM jobs AS m WHERE m.batch_id = b.id AND m.status = 'succeeded'));
    END IF;
    INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                      status, run_at, publish_after)
    VALUES (b.id || ':on_' || event, callback->>'type', callback->>'queue',
            callback->>'tenant',
            coalesce(callback->'args', '{}'::jsonb) || jsonb_build_object('batch', info),
            coalesce((callback->>'priority')::smallint, 0),
            (callback->>'max_attempts')::integer,
            (callback->>'timeout_seconds')::double precision,
            'queued', now(), now())
    ON CONFLICT (id) DO NOTHING;
END $$;

-- A member left or reached a terminal status: move the batch's counters; fire callbacks.
CREATE FUNCTION batch_member_moved() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    was_done boolean := OLD.status IN ('succeeded', 'failed', 'dead', 'cancelled');
    is_done boolean := NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled');
    b batches;
BEGIN
    UPDATE batches
    SET pending = pending + was_done::int - is_done::int,
        succeeded = succeeded + (NEW.status = 'succeeded')::int - (OLD.status = 'succeeded')::int,
        failed = failed + (NEW.status = 'failed')::int - (OLD.status = 'failed')::int,
        dead = dead + (NEW.status = 'dead')::int - (OLD.status = 'dead')::int,
        cancelled = cancelled + (NEW.status = 'cancelled')::int - (OLD.status = 'cancelled')::int,
        finished_at = CASE WHEN pending + was_done::int - is_done::int = 0
                           THEN coalesce(finished_at, now()) END,
        updated_at = now()
    WHERE id = NEW.batch_id
    RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'dead' AND b.on_death IS NOT NULL THEN
        PERFORM batch_fire(b, 'death', b.on_death);
    END IF;
    IF b.pending = 0 THEN
        IF b.on_complete IS NOT NULL THEN
            PERFORM batch_fire(b, 'complete', b.on_complete);
        END IF;
        IF b.on_success IS NOT NULL AND b.succeeded = b.total THEN
            PERFORM batch_fire(b, 'success', b.on_success);
        END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_batch_member AFTER UPDATE OF status ON jobs
FOR EACH ROW
WHEN (NEW.batch_id IS NOT NULL AND OLD.status IS DISTINCT FROM NEW.status
      AND (OLD.status IN ('succeeded', 'failed', 'dead', 'cancelled')
           OR NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled')))
EXECUTE FUNCTION batch_member_moved();

-- --- durable webhooks (issue #16; migration 0012: the why is there) ---

ALTER TABLE jobs ADD COLUMN webhook_url text;
ALTER TABLE tenants ADD COLUMN webhook_url text;

CREATE FUNCTION coldbrew_enqueue_webhook() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    target text := NEW.webhook_url;
    lane text;
    attempts integer;
    limit_seconds double precision;
    snapshot jsonb;
BEGIN
    IF target IS NULL THEN
        SELECT t.webhook_url INTO target FROM tenants AS t WHERE t.name = NEW.tenant;
        IF target IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT r.queue, r.max_attempts, r.timeout_seconds INTO lane, attempts, limit_seconds
    FROM registered_types AS r WHERE r.name = 'coldbrew.webhook';
    snapshot := to_jsonb(NEW) - ARRAY['args', 'checkpoint', 'idempotency_key', 'webhook_url',
                                      'lease_expires_at', 'worker_id', 'publish_after',
                                      'published_at', 'updated_at', 'cancel_reason'];
    IF octet_length(NEW.result::text) > 65536 THEN
        snapshot := snapshot || jsonb_build_object('result', NULL, 'result_omitted', true);
    END IF;
    INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                      status, run_at, publish_after)
    VALUES (md5(concat_ws(E'\x1f', 'webhook', NEW.id, NEW.status::text, NEW.attempt::text,
                          coalesce(NEW.finished_at, now())::text))::uuid::text,
            'coldbrew.webhook', coalesce(lane, 'default'), NEW.tenant,
            jsonb_build_object('url', target, 'job', snapshot), NEW.priority,
            coalesce(attempts, 8), coalesce(limit_seconds, 60), 'queued', now(), now())
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_webhook_on_finish
AFTER UPDATE OF status ON jobs
FOR EACH ROW
WHEN (NEW.status IN ('succeeded', 'failed', 'dead', 'cancelled')
      AND OLD.status IS DISTINCT FROM NEW.status
      AND NEW.type <> 'coldbrew.webhook')
EXECUTE FUNCTION coldbrew_enqueue_webhook();

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

-- (0015: a member of an open batch is kept)
CREATE FUNCTION job_prunable(j jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.status IN ('succeeded', 'failed', 'dead', 'cancelled')
           AND j.finished_at IS NOT NULL
           AND j.publish_after IS NULL
           AND (j.batch_id IS NULL
                OR NOT EXISTS (SELECT 1 FROM batches AS b
                               WHERE b.id = j.batch_id AND b.pending > 0))
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

-- --- the acting dashboard (migration 0014): sessions, audit, attempts, search -------
CREATE TABLE dashboard_sessions (
    token_hash   bytea PRIMARY KEY,
    tenant       text,
    actor        text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    revoked_at   timestamptz
);

CREATE INDEX dashboard_sessions_expiry ON dashboard_sessions (expires_at);

CREATE TABLE audit_log (
    id        bigserial PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text NOT NULL,
    tenant    text,
    action    text NOT NULL,
    job_id    text,
    target    text NOT NULL,
    detail    jsonb NOT NULL DEFAULT '{}'::jsonb,
    outcome   text NOT NULL
);

CREATE INDEX audit_log_job ON audit_log (job_id, at) WHERE job_id IS NOT NULL;
CREATE INDEX audit_log_at ON audit_log (at);

CREATE TABLE job_attempts (
    job_id         text NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt        integer NOT NULL,
    outcome        text NOT NULL,
    error_kind     text,
    error_message  text,
    started_at     timestamptz,
    ended_at       timestamptz NOT NULL DEFAULT now(),
    worker_id      text,
    PRIMARY KEY (job_id, attempt, ended_at)
);

CREATE FUNCTION record_job_attempt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_attempts (job_id, attempt, outcome, error_kind, error_message,
                              started_at, worker_id)
    VALUES (NEW.id, OLD.attempt, NEW.status::text, NEW.error_kind,
            left(NEW.error_message, 2000), OLD.started_at, OLD.worker_id)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_attempt_ended AFTER UPDATE OF status ON jobs
    FOR EACH ROW
    WHEN (OLD.status = 'running' AND NEW.status <> 'running' AND NEW.status <> 'succeeded')
    EXECUTE FUNCTION record_job_attempt();

CREATE INDEX jobs_search_created ON jobs (created_at, id);
CREATE INDEX jobs_search_tenant ON jobs (tenant, created_at, id);
CREATE INDEX jobs_search_status ON jobs (status, created_at, id);

-- Paused lanes, the shared CSRF secret and the error-text trigram index (0016: see
-- the migration for why pg_trgm lives in its own schema).
CREATE TABLE lanes (
    name        text PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    changed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE dashboard_secrets (
    name        text PRIMARY KEY,
    secret      bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

DO $$
DECLARE
    ext_schema name;
BEGIN
    SELECT n.nspname INTO ext_schema
    FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
    WHERE e.extname = 'pg_trgm';
    IF ext_schema IS NULL THEN
        BEGIN
            CREATE SCHEMA IF NOT EXISTS coldbrew_extensions;
            CREATE EXTENSION IF NOT EXISTS pg_trgm SCHEMA coldbrew_extensions;
        EXCEPTION WHEN OTHERS THEN
            -- another namespace's migration may have created it meanwhile: use that one
            SELECT n.nspname INTO ext_schema
            FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
            WHERE e.extname = 'pg_trgm';
            IF ext_schema IS NULL THEN
                RAISE EXCEPTION 'coldbrew migration 0016 needs the PostgreSQL extension pg_trgm '
                    '(the dashboard''s error-text search) and could not create it: %', SQLERRM
                    USING HINT = 'as a role that may, run in this database: CREATE SCHEMA IF NOT '
                        'EXISTS coldbrew_extensions; CREATE EXTENSION pg_trgm SCHEMA '
                        'coldbrew_extensions; (Debian and Ubuntu ship it in postgresql-contrib) '
                        'then run coldbrew migrate again';
            END IF;
        END;
        SELECT n.nspname INTO ext_schema
        FROM pg_extension AS e JOIN pg_namespace AS n ON n.oid = e.extnamespace
        WHERE e.extname = 'pg_trgm';
    END IF;
    BEGIN
        EXECUTE format(
            'CREATE INDEX jobs_search_error ON jobs USING gin ('
            '(lower(coalesce(error_kind, '''') || '' '' || coalesce(error_message, '''') '
            '|| '' '' || coalesce(dead_reason, ''''))) %I.gin_trgm_ops) '
            'WITH (fastupdate = off) '
            'WHERE error_kind IS NOT NULL OR error_message IS NOT NULL OR dead_reason IS NOT NULL',
            ext_schema);
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'coldbrew migration 0016 needs the PostgreSQL extension pg_trgm '
            '(installed in schema %) and this role may not use it: %', ext_schema, SQLERRM
            USING HINT = format('as a role that may, run in this database: GRANT USAGE ON '
                'SCHEMA %I TO %I; then run coldbrew migrate again', ext_schema, current_user);
    END;
END;
$$;

-- --- Failover (0019): a promoted standby counts as a server start -----------------

CREATE TABLE server_epochs (
    timeline    integer PRIMARY KEY,
    first_seen  timestamptz NOT NULL DEFAULT now()
);

-- The primary's current timeline (the first 8 hex digits of its WAL file name); NULL on a
-- standby, which has no insert position.
CREATE FUNCTION server_timeline() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END
$$;

-- When this server began to serve as coldbrew's primary: its postmaster's start, or, on a
-- timeline that follows one already recorded (a promotion), when coldbrew first met it
-- (now() until note_server_epoch records it: the safe side, as a restart this instant).
-- The first timeline ever recorded is no promotion: a fresh schema holds nothing back.
CREATE FUNCTION server_started() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM server_epochs WHERE timeline < server_timeline())
            THEN pg_postmaster_start_time()
        ELSE greatest(pg_postmaster_start_time(),
                      coalesce((SELECT first_seen FROM server_epochs
                                WHERE timeline = server_timeline()), now()))
    END
$$;

-- Record the current timeline once (the reaper's clock reading calls this every few
-- seconds on every worker, so a promotion is recorded within one reaper interval); an
-- INSERT that finds its row writes nothing.
CREATE FUNCTION note_server_epoch() RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO server_epochs (timeline)
    SELECT server_timeline()
    WHERE server_timeline() IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM server_epochs WHERE timeline = server_timeline())
    ON CONFLICT DO NOTHING
$$;

-- --- trace context (migration 0017): a job's W3C trace context, and a retry's link -----
ALTER TABLE jobs
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate text,
    ADD COLUMN trace_previous_span text;

-- --- the webhook trigger's function without SET search_path (migration 0023) ------------
DO $migration$
BEGIN
    EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$I.coldbrew_enqueue_webhook() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    target text := NEW.webhook_url;
    lane text;
    attempts integer;
    limit_seconds double precision;
    snapshot jsonb;
BEGIN
    IF target IS NULL THEN
        SELECT t.webhook_url INTO target FROM %1$I.tenants AS t WHERE t.name = NEW.tenant;
        IF target IS NULL THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT r.queue, r.max_attempts, r.timeout_seconds INTO lane, attempts, limit_seconds
    FROM %1$I.registered_types AS r WHERE r.name = 'coldbrew.webhook';
    snapshot := to_jsonb(NEW) - ARRAY['args', 'checkpoint', 'idempotency_key', 'webhook_url',
                                      'lease_expires_at', 'worker_id', 'publish_after',
                                      'published_at', 'updated_at', 'cancel_reason'];
    IF octet_length(NEW.result::text) > 65536 THEN
        snapshot := snapshot || jsonb_build_object('result', NULL, 'result_omitted', true);
    END IF;
    INSERT INTO %1$I.jobs (id, type, queue, tenant, args, priority, max_attempts,
                           timeout_seconds, status, run_at, publish_after)
    VALUES (md5(concat_ws(E'\x1f', 'webhook', NEW.id, NEW.status::text, NEW.attempt::text,
                          coalesce(NEW.finished_at, now())::text))::uuid::text,
            'coldbrew.webhook', coalesce(lane, 'default'), NEW.tenant,
            jsonb_build_object('url', target, 'job', snapshot), NEW.priority,
            coalesce(attempts, 8), coalesce(limit_seconds, 60), 'queued', now(), now())
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END
$$
$function$, current_schema());
END
$migration$;

-- --- the per-minute rollup of finished jobs (migration 0024): `coldbrew stats --since` ---

-- bucket 0: under 0.1 ms (negatives too); bucket k >= 1: [0.1 ms * 2^((k-1)/8),
-- 0.1 ms * 2^(k/8)), up to 320 (open-ended); store/rollup.py holds the same constants
CREATE FUNCTION duration_bucket(seconds float8) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- float8 constants: a numeric one (0.0001) makes the arithmetic numeric, 10x slower
    SELECT CASE WHEN seconds < 1e-4::float8 THEN 0
                ELSE least(320::float8,
                           1::float8 + floor(8::float8 * log(seconds / 1e-4::float8)
                                             / log(2::float8)))
           END::smallint
$$;

-- the sum of two sparse histograms (bucket numbers ascending, counts)
CREATE FUNCTION histogram_add(b1 smallint[], n1 bigint[], b2 smallint[], n2 bigint[],
                              OUT buckets smallint[], OUT counts bigint[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(b ORDER BY b), '{}'), coalesce(array_agg(n ORDER BY b), '{}')
    FROM (SELECT b, sum(n)::int8 AS n
          FROM (SELECT * FROM unnest(b1, n1) UNION ALL SELECT * FROM unnest(b2, n2)) AS u(b, n)
          GROUP BY b) AS s
$$;

-- per minute of finish time, lane and tenant: counts per final status, and the sparse
-- histograms (bucket numbers ascending, counts) of the started jobs' run and wait times;
-- folded (the current minute in parts) by one worker per interval (worker/rollup.py),
-- pruned by COLDBREW_RETENTION_ROLLUP
CREATE TABLE finished_minutes (
    minute        timestamptz NOT NULL,
    queue         text NOT NULL,
    tenant        text NOT NULL,
    succeeded     bigint NOT NULL,
    failed        bigint NOT NULL,
    cancelled     bigint NOT NULL,
    dead          bigint NOT NULL,
    run_buckets   smallint[] NOT NULL,
    run_counts    bigint[] NOT NULL,
    wait_buckets  smallint[] NOT NULL,
    wait_counts   bigint[] NOT NULL,
    PRIMARY KEY (minute, queue, tenant)
);

-- every minute before folded_to is in finished_minutes; readers take the raw rows from it on
CREATE TABLE finished_minutes_folded (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    folded_to  timestamptz NOT NULL
);
