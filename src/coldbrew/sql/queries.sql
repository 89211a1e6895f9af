-- Every statement coldbrew sends to PostgreSQL, by name. Each block starts with
-- "-- name: <name>", then one comment line that says what it does and lists
-- its positional parameters in order. The pool's search_path is the
-- namespace's schema, so no statement names a schema.

-- name: insert_job
-- Submit a job as queued and unpublished, or as scheduled when its run_at (or now + delay) is still ahead: publish_after is then that time, when the relay publishes it ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 relay grace seconds, $11 run_at or null, $12 delay seconds or null)
WITH due AS MATERIALIZED (
    SELECT coalesce($11::timestamptz, now() + make_interval(secs => coalesce($12::float8, 0)))
           AS at
)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  idempotency_key, status, run_at, publish_after)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
        CASE WHEN (SELECT at FROM due) > now() THEN 'scheduled'::job_status
             ELSE 'queued'::job_status END,
        greatest((SELECT at FROM due), now()),
        CASE WHEN (SELECT at FROM due) > now() THEN (SELECT at FROM due)
             ELSE now() + make_interval(secs => $10) END)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: get_job
-- One job by id ($1 id)
SELECT * FROM jobs WHERE id = $1;

-- name: get_finished_jobs
-- Those of the given jobs that reached a terminal status, for webhooks ($1 ids)
SELECT * FROM jobs
WHERE id = ANY($1::text[]) AND status IN ('succeeded', 'failed', 'dead', 'cancelled');

-- name: mark_published
-- Clear the publish mark of rows whose publish was confirmed, unless it was re-set meanwhile, and record when (reconciliation counts a waiting row's message as in its queue from then on); rows another transaction holds (a worker claiming the job just published) are skipped, not waited for: waiting deadlocked against claim batches locking the same rows in another order, and a skipped mark is cleared by clear_stale_publish_marks once the job is no longer waiting ($1 ids, $2 publish_after values read)
UPDATE jobs AS j SET publish_after = NULL, published_at = now()
FROM unnest($1::text[], $2::timestamptz[]) AS u(id, publish_after)
WHERE j.id = u.id AND j.publish_after = u.publish_after
  AND j.id IN (SELECT id FROM jobs WHERE id = ANY($1::text[]) FOR UPDATE SKIP LOCKED);

-- name: claim_batch
-- Upsert delivered jobs and claim the claimable ones, one attempt each; a scheduled row is claimable once its run_at has come, and an early delivery of one is refused like a duplicate ($1 ids, $2 types, $3 queues, $4 tenants, $5 args, $6 priorities, $7 max_attempts, $8 timeouts, $9 idempotency keys, $10 lease seconds, $11 worker id)
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int2[],
                $7::int4[], $8::float8[], $9::text[])
         AS i(id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
              idempotency_key)
),
inserted AS (
    INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                      idempotency_key, status, attempt, started_at, lease_expires_at, worker_id)
    SELECT id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
           idempotency_key, 'running', 1, now(), now() + make_interval(secs => $10), $11
    FROM input
    ON CONFLICT (id) DO NOTHING
    RETURNING id, attempt, max_attempts, timeout_seconds, checkpoint, started_at, snoozes
),
claimed AS (
    UPDATE jobs AS j
    SET status = 'running', attempt = j.attempt + 1, started_at = coalesce(j.started_at, now()),
        lease_expires_at = now() + make_interval(secs => $10), worker_id = $11,
        publish_after = NULL, updated_at = now()
    FROM input AS i
    WHERE j.id = i.id
      -- snoozes gave back the attempts their claims took (attempt itself only grows)
      AND j.attempt - j.snoozes < j.max_attempts
      AND NOT j.cancel_requested
      AND (j.status = 'queued'
           OR (j.status IN ('retrying', 'scheduled') AND j.run_at <= now())
           OR (j.status = 'running' AND j.lease_expires_at < now()
               -- a lease that expired while PostgreSQL was down is its worker's for one
               -- more lease: alive, it extends it as soon as it reconnects
               AND pg_postmaster_start_time() <= now() - make_interval(secs => $10)))
    RETURNING j.id, j.attempt, j.max_attempts, j.timeout_seconds, j.checkpoint, j.started_at,
              j.snoozes
),
exhausted AS (
    UPDATE jobs AS j
    SET status = 'dead', dead_reason = 'max_attempts', finished_at = now(),
        publish_after = NULL, lease_expires_at = NULL, worker_id = NULL, updated_at = now()
    FROM input AS i
    WHERE j.id = i.id AND j.attempt - j.snoozes >= j.max_attempts
      AND (j.status IN ('queued', 'retrying')
           OR (j.status = 'scheduled' AND j.run_at <= now()))
    RETURNING j.id
)
SELECT id, attempt, max_attempts, timeout_seconds, checkpoint, started_at, snoozes,
       true AS claimed, 'running' AS status
FROM inserted
UNION ALL
SELECT id, attempt, max_attempts, timeout_seconds, checkpoint, started_at, snoozes,
       true AS claimed, 'running' AS status
FROM claimed
UNION ALL
SELECT j.id, j.attempt, j.max_attempts, j.timeout_seconds, j.checkpoint, j.started_at,
       j.snoozes, false AS claimed,
       CASE WHEN j.id IN (SELECT id FROM exhausted) THEN 'dead' ELSE j.status::text END
FROM jobs AS j
JOIN input AS i ON i.id = j.id
WHERE j.id NOT IN (SELECT id FROM claimed);

-- name: server_started
-- When the PostgreSQL server started: a change means it restarted, and what it had not flushed to disk may be gone (no parameters)
SELECT pg_postmaster_start_time() AS server_started;

-- name: durability_barrier
-- A tiny transaction that writes a commit record, so that its synchronous commit flushes the WAL past every asynchronous claim committed before it; returns the server's start time (no parameters)
SELECT txid_current() AS xid, pg_postmaster_start_time() AS server_started;

-- name: verify_claims
-- After a PostgreSQL restart: the rows of claims that were not known durable, to tell those that survived from those lost ($1 ids)
SELECT id, attempt, status::text AS status, worker_id FROM jobs WHERE id = ANY($1::text[]);

-- name: complete_batch
-- Write outcomes fenced by attempt (a snooze: 'scheduled' after $7 seconds, one more snooze), with progress not yet flushed, count finished jobs per lane and tenant for the drain rate, and NOTIFY "<schema>.caps" with each capped tenant and type that freed a place; returns the rows written ($1 ids, $2 attempts, $3 statuses, $4 results, $5 error kinds, $6 error messages, $7 retry delays, $8 dead reasons, $9 progress fractions, $10 progress messages)
WITH written AS (
    UPDATE jobs AS j
    SET status = u.status::job_status,
        result = u.result,
        error_kind = u.error_kind,
        error_message = u.error_message,
        dead_reason = u.dead_reason,
        finished_at = CASE WHEN u.status IN ('retrying', 'scheduled') THEN NULL ELSE now() END,
        run_at = CASE WHEN u.status IN ('retrying', 'scheduled')
                      THEN now() + make_interval(secs => u.delay) ELSE j.run_at END,
        publish_after = CASE WHEN u.status IN ('retrying', 'scheduled')
                             THEN now() + make_interval(secs => u.delay) ELSE NULL END,
        snoozes = j.snoozes + CASE WHEN u.status = 'scheduled' THEN 1 ELSE 0 END,
        progress = CASE WHEN u.status = 'succeeded' THEN 1
                        ELSE coalesce(u.progress, j.progress) END,
        progress_message = coalesce(u.progress_message, j.progress_message),
        lease_expires_at = NULL,
        worker_id = NULL,
        updated_at = now()
    FROM unnest($1::text[], $2::int4[], $3::text[], $4::jsonb[], $5::text[], $6::text[],
                $7::float8[], $8::text[], $9::float4[], $10::text[])
         AS u(id, attempt, status, result, error_kind, error_message, delay, dead_reason,
              progress, progress_message)
    WHERE j.id = u.id AND j.attempt = u.attempt AND j.status = 'running'
    RETURNING j.id, j.queue, j.tenant, j.type, j.status
),
counted AS (
    -- sorted, so that concurrent batches lock counter rows in one order (no deadlock)
    INSERT INTO queue_counters AS c (queue, tenant, finished)
    SELECT queue, tenant, count(*) FROM written WHERE status NOT IN ('retrying', 'scheduled')
    GROUP BY queue, tenant ORDER BY queue, tenant
    ON CONFLICT (queue, tenant) DO UPDATE SET finished = c.finished + excluded.finished
),
freed AS (
    -- every row written left 'running': a place of its tenant's and its type's cap freed.
    -- Tell the fleet's waiting workers (channel "<schema>.caps", delivered at commit), one
    -- notification per capped scope; a batch without a capped tenant or type costs one
    -- primary-key probe per distinct tenant and type, and sends nothing.
    SELECT pg_notify(current_schema() || '.caps', 'tenant:' || t.name)
    FROM tenants AS t
    WHERE t.name IN (SELECT tenant FROM written) AND t.max_running IS NOT NULL
    UNION ALL
    SELECT pg_notify(current_schema() || '.caps', 'type:' || y.name)
    FROM job_types AS y
    WHERE y.name IN (SELECT type FROM written) AND y.max_running IS NOT NULL
)
-- the count makes PostgreSQL run "freed" (a plain SELECT in WITH runs only when read), once
SELECT id FROM written WHERE (SELECT count(*) FROM freed) >= 0;

-- name: extend_leases
-- Heartbeat: extend the leases of jobs still held; returns them with their cancel flag ($1 ids, $2 attempts, $3 lease seconds)
UPDATE jobs AS j
SET lease_expires_at = now() + make_interval(secs => $3), updated_at = now()
FROM unnest($1::text[], $2::int4[]) AS u(id, attempt)
WHERE j.id = u.id AND j.attempt = u.attempt AND j.status = 'running'
RETURNING j.id, j.cancel_requested, j.cancel_reason;

-- name: write_progress
-- Record progress of held jobs, fenced by attempt ($1 ids, $2 attempts, $3 fractions or null, $4 messages or null)
UPDATE jobs AS j
SET progress = coalesce(u.progress, j.progress),
    progress_message = coalesce(u.message, j.progress_message),
    updated_at = now()
FROM unnest($1::text[], $2::int4[], $3::float4[], $4::text[]) AS u(id, attempt, progress, message)
WHERE j.id = u.id AND j.attempt = u.attempt AND j.status = 'running'
RETURNING j.id;

-- name: release_jobs
-- Graceful drain: hand held jobs back as queued so they run elsewhere at once; the relay republishes those whose delivery was acked early ($1 ids, $2 attempts, $3 republish flags)
UPDATE jobs AS j
SET status = 'queued', lease_expires_at = NULL, worker_id = NULL, updated_at = now(),
    publish_after = CASE WHEN u.republish THEN now() ELSE NULL END
FROM unnest($1::text[], $2::int4[], $3::bool[]) AS u(id, attempt, republish)
WHERE j.id = u.id AND j.attempt = u.attempt AND j.status = 'running'
RETURNING j.id;

-- name: reap_expired
-- Make running jobs whose lease expired due again (or dead, or cancelled), one reaper per row, and NOTIFY "<schema>.caps" with each capped tenant and type that freed a place, as complete_batch does; nothing is reaped while PostgreSQL started less than a lease ago, or when this reaper's last contact (the server time it read just before) is older than the longest gap: after an outage, live workers first get a lease to extend what they hold ($1 limit, $2 lease seconds, $3 server time of the reaper's last contact, $4 longest gap in seconds)
WITH reaped AS (
    UPDATE jobs AS j
    SET status = CASE WHEN j.cancel_requested THEN 'cancelled'::job_status
                      WHEN j.attempt - j.snoozes >= j.max_attempts THEN 'dead'::job_status
                      ELSE 'retrying'::job_status END,
        dead_reason = CASE WHEN NOT j.cancel_requested AND j.attempt - j.snoozes >= j.max_attempts
                           THEN 'max_attempts' ELSE j.dead_reason END,
        error_kind = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'lease_expired' END,
        error_message = CASE WHEN j.cancel_requested THEN j.cancel_reason
                             ELSE 'worker ' || coalesce(j.worker_id, '?')
                                  || ' stopped renewing its lease'
                        END,
        finished_at = CASE WHEN j.cancel_requested OR j.attempt - j.snoozes >= j.max_attempts THEN now() END,
        run_at = now(),
        publish_after = CASE WHEN j.cancel_requested OR j.attempt - j.snoozes >= j.max_attempts THEN NULL
                             ELSE now() END,
        lease_expires_at = NULL,
        worker_id = NULL,
        updated_at = now()
    WHERE j.id IN (
        SELECT id FROM jobs
        WHERE status = 'running' AND lease_expires_at < now()
          AND pg_postmaster_start_time() <= now() - make_interval(secs => $2)
          AND now() - $3::timestamptz <= make_interval(secs => $4)
        ORDER BY lease_expires_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING j.id, j.type, j.queue, j.tenant, j.args, j.status::text AS status, j.attempt,
              j.error_message
),
freed AS (
    -- a reaped job left 'running': a place of its capped tenant and type freed; without
    -- this, waiting workers found out only at their 0.5 s re-check
    SELECT pg_notify(current_schema() || '.caps', 'tenant:' || t.name)
    FROM tenants AS t
    WHERE t.name IN (SELECT tenant FROM reaped) AND t.max_running IS NOT NULL
    UNION ALL
    SELECT pg_notify(current_schema() || '.caps', 'type:' || y.name)
    FROM job_types AS y
    WHERE y.name IN (SELECT type FROM reaped) AND y.max_running IS NOT NULL
)
-- the count makes PostgreSQL run "freed" (a plain SELECT in WITH runs only when read), once
SELECT * FROM reaped WHERE (SELECT count(*) FROM freed) >= 0;

-- name: take_due_publishes
-- Relay: lease up to $1 rows that are due for publishing, pushing their mark $2 seconds ahead; a due scheduled row becomes queued in the same statement (should the publish never be confirmed, the pushed mark makes the relay publish it again: never lost); returns each row's status before ($1 limit, $2 retry-after seconds)
WITH due AS (
    SELECT id, status AS was FROM jobs
    WHERE publish_after <= now() AND status IN ('queued', 'retrying', 'scheduled')
    ORDER BY publish_after
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs AS j
SET publish_after = now() + make_interval(secs => $2),
    status = CASE WHEN j.status = 'scheduled' THEN 'queued'::job_status ELSE j.status END
FROM due
WHERE j.id = due.id
RETURNING j.id, j.type, j.queue, j.tenant, j.args, j.priority, j.max_attempts,
          j.timeout_seconds, j.idempotency_key, j.attempt, j.publish_after,
          due.was::text AS was;

-- name: clear_stale_publish_marks
-- Drop publish marks left on rows that no longer wait (claimed or finished) ($1 limit)
UPDATE jobs SET publish_after = NULL
WHERE id IN (
    SELECT id FROM jobs
    WHERE publish_after <= now() AND status NOT IN ('queued', 'retrying', 'scheduled')
    LIMIT $1
    FOR UPDATE SKIP LOCKED
);

-- name: request_cancel
-- Cancel a waiting (queued, retrying or scheduled) job at once, or flag a running one for its worker ($1 id, $2 reason)
UPDATE jobs
SET status = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN 'cancelled'::job_status
                  ELSE status END,
    finished_at = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN now() ELSE finished_at END,
    error_kind = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN 'cancelled' ELSE error_kind END,
    error_message = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN $2 ELSE error_message END,
    publish_after = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN NULL ELSE publish_after END,
    cancel_requested = true,
    cancel_reason = $2,
    updated_at = now()
WHERE id = $1 AND status IN ('queued', 'retrying', 'scheduled', 'running')
RETURNING *;

-- name: claim_once
-- Take the at-most-once guard for a side effect, if this attempt still holds the job ($1 job id, $2 name, $3 attempt)
WITH holder AS (
    SELECT 1 FROM jobs WHERE id = $1 AND attempt = $3 AND status = 'running'
),
taken AS (
    INSERT INTO job_once (job_id, name, attempt)
    SELECT $1, $2, $3 WHERE EXISTS (SELECT 1 FROM holder)
    ON CONFLICT (job_id, name) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM holder) AS holds, EXISTS (SELECT 1 FROM taken) AS taken;

-- name: save_checkpoint
-- Save a job's resumable state, fenced by attempt ($1 id, $2 attempt, $3 state)
UPDATE jobs SET checkpoint = $3, updated_at = now()
WHERE id = $1 AND attempt = $2 AND status = 'running'
RETURNING id;

-- name: list_tenant_queues
-- Every (lane, tenant) pair that has a broker queue
SELECT queue, tenant FROM tenant_queues ORDER BY queue, tenant;

-- name: add_tenant_queue
-- Record a provisioned (lane, tenant) queue and its tenant; true when it is new ($1 queue, $2 tenant)
WITH tenant AS (
    INSERT INTO tenants (name) VALUES ($2) ON CONFLICT (name) DO NOTHING
),
added AS (
    INSERT INTO tenant_queues (queue, tenant) VALUES ($1, $2)
    ON CONFLICT (queue, tenant) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM added) AS added;

-- name: list_tenants
-- Every tenant with its scheduling settings
SELECT name, weight, max_running, paused, created_at FROM tenants ORDER BY name;

-- name: set_tenant
-- Create or change a tenant; a null leaves that setting as it is ($1 name, $2 weight or null, $3 paused or null, $4 max running or null, $5 true to remove the cap)
INSERT INTO tenants (name, weight, paused, max_running)
VALUES ($1, coalesce($2::real, 1), coalesce($3::bool, false),
        CASE WHEN $5::bool THEN NULL ELSE $4::int4 END)
ON CONFLICT (name) DO UPDATE
SET weight = coalesce($2::real, tenants.weight), paused = coalesce($3::bool, tenants.paused),
    max_running = CASE WHEN $5::bool THEN NULL ELSE coalesce($4::int4, tenants.max_running) END
RETURNING name, weight, max_running, paused, created_at;

-- name: list_job_types
-- Every job type with a fleet-wide setting
SELECT name, max_running, created_at FROM job_types ORDER BY name;

-- name: set_job_type
-- Create or change a job type's fleet-wide cap ($1 name, $2 max running, or null for no cap)
INSERT INTO job_types (name, max_running) VALUES ($1, $2::int4)
ON CONFLICT (name) DO UPDATE SET max_running = $2::int4
RETURNING name, max_running, created_at;

-- name: try_lock_cap_scopes
-- Without waiting, take the advisory lock of a capped job's tenant, then of its type (always in that order), each only if that scope has a cap; a lock another transaction holds reads false and the type's is then not tried (null). Held until the transaction ends; the key includes the schema because advisory locks are database-wide ($1 tenant, $2 type)
WITH caps AS MATERIALIZED (
    SELECT (SELECT max_running FROM tenants WHERE name = $1) AS tenant_cap,
           (SELECT max_running FROM job_types WHERE name = $2) AS type_cap
),
tenant_lock AS MATERIALIZED (
    SELECT tenant_cap, type_cap,
           CASE WHEN tenant_cap IS NULL THEN true
                ELSE pg_try_advisory_xact_lock(
                         hashtextextended(current_schema() || ':cap:tenant:' || $1, 0))
           END AS tenant_locked
    FROM caps
)
SELECT tenant_cap, type_cap, tenant_locked,
       CASE WHEN NOT tenant_locked THEN NULL
            WHEN type_cap IS NULL THEN true
            ELSE pg_try_advisory_xact_lock(hashtextextended(current_schema() || ':cap:type:' || $2, 0))
       END AS type_locked
FROM tenant_lock;

-- name: cap_room
-- After try_lock_cap_scopes, in a statement of its own so that its snapshot is taken under the locks: how many jobs of the tenant and of the type run now, fleet-wide; a null scope is not counted (0) ($1 tenant or null, $2 type or null)
SELECT CASE WHEN $1::text IS NULL THEN 0
            ELSE (SELECT count(*) FROM jobs WHERE status = 'running' AND tenant = $1::text)
       END AS tenant_running,
       CASE WHEN $2::text IS NULL THEN 0
            ELSE (SELECT count(*) FROM jobs WHERE status = 'running' AND type = $2::text)
       END AS type_running;

-- name: register_waiting
-- A capped job waits: record it as queued if it has no row yet, so that status and stats see it; its message exists (it is held here), so it counts as published ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  idempotency_key, published_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now())
ON CONFLICT (id) DO NOTHING;

-- name: claimability
-- Whether a delivered job could be claimed now (else it is a duplicate), with what a claim result reports ($1 id)
SELECT id, attempt, max_attempts, timeout_seconds, checkpoint, started_at, snoozes,
       status::text AS status,
       (NOT cancel_requested
        AND (status = 'queued'
             OR (status IN ('retrying', 'scheduled') AND run_at <= now())
             OR (status = 'running' AND lease_expires_at < now()))) AS claimable
FROM jobs WHERE id = $1;

-- name: notify
-- Tell the fleet something through LISTEN/NOTIFY: a new (lane, tenant) queue, changed tenant settings, freed cap places ($1 channel, $2 payload)
SELECT pg_notify($1, $2);

-- name: insert_rejected
-- Keep a message that broke the contract, with its original bytes ($1 reason, $2 detail, $3 message id, $4 routing key, $5 headers, $6 body)
INSERT INTO rejected_messages (reason, detail, message_id, routing_key, headers, body)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id;

-- name: dlq_list
-- Dead jobs, newest first, optionally whose reason or error contains a text ($1 text or null, $2 limit)
SELECT * FROM jobs
WHERE status = 'dead'
  AND ($1::text IS NULL
       OR position(lower($1) IN lower(coalesce(dead_reason, '') || ' ' || coalesce(error_kind, '')
                                      || ' ' || coalesce(error_message, ''))) > 0)
ORDER BY finished_at DESC
LIMIT $2;

-- name: recent_dead
-- The newest dead jobs, optionally of one tenant, for the dashboard ($1 tenant or null, $2 limit)
SELECT * FROM jobs
WHERE status = 'dead' AND ($1::text IS NULL OR tenant = $1)
ORDER BY finished_at DESC
LIMIT $2;

-- name: dlq_replay
-- Give dead jobs a fresh budget of attempts and make them due now; attempt keeps counting up so fencing still holds ($1 reason text or null, $2 job id or null, $3 limit, $4 fresh attempts)
UPDATE jobs AS j
SET status = 'queued', max_attempts = j.attempt - j.snoozes + $4, dead_reason = NULL,
    finished_at = NULL, run_at = now(), publish_after = now(), cancel_requested = false,
    updated_at = now()
WHERE j.id IN (
    SELECT id FROM jobs
    WHERE status = 'dead'
      AND ($2::text IS NULL OR id = $2)
      AND ($1::text IS NULL
           OR position(lower($1) IN lower(coalesce(dead_reason, '') || ' '
                                          || coalesce(error_kind, '') || ' '
                                          || coalesce(error_message, ''))) > 0)
    ORDER BY finished_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
RETURNING j.id;

-- name: list_rejected
-- Messages that broke the contract, newest first ($1 reason text or null, $2 limit)
SELECT id, reason, detail, message_id, routing_key, received_at, length(body) AS size
FROM rejected_messages
WHERE $1::text IS NULL OR position(lower($1) IN lower(reason || ' ' || detail)) > 0
ORDER BY id DESC
LIMIT $2;

-- name: rejected_counts
-- How many rejected messages are kept, by reason, optionally only those whose routing key (<queue>.<tenant>) names a tenant ($1 tenant or null)
SELECT reason, count(*) AS count FROM rejected_messages
WHERE $1::text IS NULL OR split_part(routing_key, '.', 2) = $1
GROUP BY reason ORDER BY reason;

-- name: queue_stats
-- Per lane and tenant: counts by status (scheduled apart: not backlog), the oldest waiting job's age in seconds, and how many jobs have finished so far (the drain rate is its change over time), optionally for one tenant ($1 tenant or null)
SELECT queue, tenant,
       count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'retrying') AS retrying,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
       coalesce(extract(epoch FROM now() - min(created_at)
                        FILTER (WHERE status IN ('queued', 'retrying'))), 0)::float8
           AS oldest_waiting_seconds,
       coalesce((SELECT finished FROM queue_counters AS c
                 WHERE c.queue = j.queue AND c.tenant = j.tenant), 0) AS finished
FROM jobs AS j
WHERE status IN ('queued', 'running', 'retrying', 'dead', 'failed', 'scheduled')
  AND ($1::text IS NULL OR tenant = $1)
GROUP BY queue, tenant
ORDER BY queue, tenant;

-- name: schema_version
-- The latest applied migration's version, or null
SELECT max(version) FROM schema_migrations;

-- name: ping
-- Whether the server answers at all, for readiness (no parameters)
SELECT 1;

-- The statements of `coldbrew migrate` (store/schema.py) run on a connection of
-- their own, before the namespace's schema exists, so they name it. A schema or
-- database cannot be bound to a placeholder: {schema} and {database} are filled
-- in with the quoted identifier, and nothing else is ever formatted into SQL.

-- name: create_database
-- Create a missing database, through the "postgres" database ({database} its quoted name; no parameters)
CREATE DATABASE {database};

-- name: lock_migrations
-- Serialize the migration runs of one namespace across processes, until the transaction ends ($1 namespace)
SELECT pg_advisory_xact_lock(hashtext('coldbrew.migrate.' || $1));

-- name: create_schema
-- The namespace's schema, unless it exists ({schema} its quoted name; no parameters)
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: use_schema
-- Search the namespace's schema for the rest of the transaction, as SET LOCAL search_path does ($1 quoted schema name)
SELECT set_config('search_path', $1, true);

-- name: create_migrations_table
-- The record of applied migrations, unless it exists (no parameters)
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: migration_applied
-- Whether a migration was applied already: a row, or none ($1 version)
SELECT 1 FROM schema_migrations WHERE version = $1;

-- name: record_migration
-- Record a migration as applied, in its own transaction ($1 version, $2 name)
INSERT INTO schema_migrations (version, name) VALUES ($1, $2);

-- name: drop_schema
-- Drop a namespace's schema and everything in it ({schema} its quoted name; no parameters)
DROP SCHEMA IF EXISTS {schema} CASCADE;
-- --- reconciliation (worker/reconcile.py) and rejected rows (worker/dead_letters.py) ---

-- name: reconcile_lock
-- Without waiting, take the namespace's reconcile lock for this transaction (one pass at a time across the fleet; the key includes the schema because advisory locks are database-wide), read the clock (the instant this look began) and when the fleet's latest look was (no parameters)
SELECT pg_try_advisory_xact_lock(hashtextextended(current_schema() || ':reconcile', 0)) AS locked,
       clock_timestamp() AS started,
       (SELECT max(looked_at) FROM queue_looks) AS last_look;

-- name: reconcile_pairs
-- The (lane, tenant) queues a pass looks at: those with waiting jobs whose publish was confirmed, and one recorded queue per lane, whose consumers stand for the lane's (no parameters)
SELECT queue, tenant FROM jobs
WHERE status IN ('queued', 'retrying') AND publish_after IS NULL
GROUP BY queue, tenant
UNION
(SELECT DISTINCT ON (queue) queue, tenant FROM tenant_queues ORDER BY queue, tenant);

-- name: reconcile_counts
-- Per (lane, tenant), read after the broker's counts: the waiting rows whose message was confirmed by $1 (this look's start) and by the previous look, their highest priority, the deliveries workers reported holding unclaimed since the previous look counted the queue (without one: in the last $2 seconds), the messages aging sweeps begun since $3 seconds before that look (or this one) may hold, that look, and the largest prefetch and keep any worker reported in the last $2 seconds ($1 this look's start, $2 seconds, $3 seconds)
WITH waiting AS (
    SELECT j.queue, j.tenant,
           count(*) FILTER (WHERE j.published_at <= $1::timestamptz) AS waiting,
           count(*) FILTER (WHERE j.published_at <= l.looked_at) AS waiting_before,
           max(j.priority)::int4 AS top_priority
    FROM jobs AS j
    LEFT JOIN queue_looks AS l ON l.queue = j.queue AND l.tenant = j.tenant
    WHERE j.status IN ('queued', 'retrying') AND j.publish_after IS NULL
      AND (j.status = 'queued' OR j.run_at <= now()) AND NOT j.cancel_requested
    GROUP BY j.queue, j.tenant
)
SELECT w.queue, w.tenant, w.waiting, w.waiting_before, w.top_priority,
       l.looked_at AS previous_look, l.ready AS previous_ready, l.deficit AS previous_deficit,
       l.suspects AS previous_suspects,
       coalesce((SELECT sum(h.held) FROM queue_holds AS h
                 WHERE h.queue = w.queue AND h.tenant = w.tenant
                   AND h.reported_at >= coalesce(l.counted_at, l.looked_at,
                                                 now() - make_interval(secs => $2))),
                0)::int8 AS held,
       coalesce((SELECT sum(s.taking) FROM queue_sweeps AS s
                 WHERE s.queue = w.queue AND s.tenant = w.tenant
                   AND s.started_at >= coalesce(l.looked_at, $1::timestamptz)
                                       - make_interval(secs => $3)),
                0)::int8 AS sweeping,
       (SELECT max(r.prefetch) FROM reconcile_workers AS r
        WHERE r.reported_at >= now() - make_interval(secs => $2)) AS fleet_prefetch,
       (SELECT max(r.keep) FROM reconcile_workers AS r
        WHERE r.reported_at >= now() - make_interval(secs => $2)) AS fleet_keep
FROM waiting AS w
LEFT JOIN queue_looks AS l ON l.queue = w.queue AND l.tenant = w.tenant;

-- name: reconcile_republish
-- Make due again, for the relay, the waiting rows of one (lane, tenant) whose message cannot be in its queue: those confirmed longest ago first ($1 queue, $2 tenant, $3 confirmed by, $4 limit)
UPDATE jobs AS j SET publish_after = clock_timestamp()
WHERE j.id IN (
    SELECT id FROM jobs
    WHERE queue = $1 AND tenant = $2 AND status IN ('queued', 'retrying')
      AND publish_after IS NULL AND published_at <= $3::timestamptz
      AND (status = 'queued' OR run_at <= now()) AND NOT cancel_requested
    ORDER BY published_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
  AND j.status IN ('queued', 'retrying') AND j.publish_after IS NULL
RETURNING j.id;

-- name: save_queue_looks
-- Record this pass's look at each queue in place of the previous one; a null ready count: the queue was missing ($1 queues, $2 tenants, $3 look start, $4 ready counts, $5 consumer counts, $6 waiting counts, $7 deficits, $8 suspects' latest confirms, $9 instants just after each count)
INSERT INTO queue_looks AS l (queue, tenant, looked_at, counted_at, ready, consumers, waiting,
                              deficit, suspects)
SELECT u.queue, u.tenant, $3::timestamptz, u.counted_at, u.ready, u.consumers, u.waiting,
       u.deficit, u.suspects
FROM unnest($1::text[], $2::text[], $4::int4[], $5::int4[], $6::int4[], $7::int4[],
            $8::timestamptz[], $9::timestamptz[])
     AS u(queue, tenant, ready, consumers, waiting, deficit, suspects, counted_at)
ON CONFLICT (queue, tenant) DO UPDATE
SET looked_at = excluded.looked_at, counted_at = excluded.counted_at, ready = excluded.ready,
    consumers = excluded.consumers, waiting = excluded.waiting, deficit = excluded.deficit,
    suspects = excluded.suspects;

-- name: reconcile_suspects
-- When the $3-th oldest confirmed waiting row of one (lane, tenant) was confirmed (its message may be lost, as may be every older one); $4 when it has fewer ($1 queue, $2 tenant, $3 rank, $4 look start)
SELECT coalesce(
    (SELECT published_at FROM jobs
     WHERE queue = $1 AND tenant = $2 AND status IN ('queued', 'retrying')
       AND publish_after IS NULL AND published_at <= $4::timestamptz
       AND (status = 'queued' OR run_at <= now()) AND NOT cancel_requested
     ORDER BY published_at
     OFFSET $3::int8 - 1
     LIMIT 1),
    $4::timestamptz) AS suspects;

-- name: prune_queue_looks
-- Forget looks at queues no pass looked at for $1 seconds (nothing waits there any more), and the reports of workers silent as long (gone: the broker requeued what they held) ($1 seconds)
WITH holds AS (
    DELETE FROM queue_holds WHERE reported_at < now() - make_interval(secs => $1)
),
workers AS (
    DELETE FROM reconcile_workers WHERE reported_at < now() - make_interval(secs => $1)
),
sweeps AS (
    DELETE FROM queue_sweeps WHERE started_at < now() - make_interval(secs => $1)
)
DELETE FROM queue_looks WHERE looked_at < now() - make_interval(secs => $1);

-- name: list_queue_looks
-- The latest look at each queue, with its age in seconds, for the lane-consumers gauge and `coldbrew stats` (no parameters)
SELECT queue, tenant, ready, consumers, waiting, deficit,
       extract(epoch FROM now() - looked_at)::float8 AS age_seconds
FROM queue_looks
ORDER BY queue, tenant;

-- name: report_holds
-- Replace this worker's report: the deliveries it holds unclaimed per (lane, tenant), and what one of its consumers can hold unacked ($1 worker id, $2 queues, $3 tenants, $4 counts, $5 prefetch, $6 keep)
WITH worker AS (
    INSERT INTO reconcile_workers AS r (worker_id, prefetch, keep, reported_at)
    VALUES ($1, $5, $6, now())
    ON CONFLICT (worker_id) DO UPDATE
    SET prefetch = excluded.prefetch, keep = excluded.keep, reported_at = excluded.reported_at
),
gone AS (
    DELETE FROM queue_holds AS h
    WHERE h.worker_id = $1
      AND (h.queue, h.tenant) NOT IN (SELECT u.queue, u.tenant
                                      FROM unnest($2::text[], $3::text[]) AS u(queue, tenant))
)
INSERT INTO queue_holds AS h (worker_id, queue, tenant, held, reported_at)
SELECT $1, u.queue, u.tenant, u.held, now()
FROM unnest($2::text[], $3::text[], $4::int4[]) AS u(queue, tenant, held)
ON CONFLICT (worker_id, queue, tenant) DO UPDATE
SET held = excluded.held, reported_at = excluded.reported_at;

-- name: record_sweep
-- An aging sweep of one (lane, tenant) queue begins and may take up to $4 of its ready messages for a moment; committed before it takes any. The row keeps the largest taking of this worker's sweeps of the queue in the last $5 seconds, which a look overlapping any of them subtracts ($1 worker id, $2 queue, $3 tenant, $4 taking, $5 seconds)
INSERT INTO queue_sweeps AS s (worker_id, queue, tenant, started_at, taking)
VALUES ($1, $2, $3, now(), $4)
ON CONFLICT (worker_id, queue, tenant) DO UPDATE
SET started_at = excluded.started_at,
    taking = CASE WHEN s.started_at >= now() - make_interval(secs => $5)
                  THEN greatest(s.taking, excluded.taking)
                  ELSE excluded.taking END;

-- name: fail_rejected_jobs
-- Rejected messages whose job has a row still waiting (unclaimed): the row fails with the rejection's reason and counts as finished for the drain rate; returns the rows failed ($1 ids, $2 reasons, $3 details)
WITH failed AS (
    UPDATE jobs AS j
    SET status = 'failed', error_kind = u.reason, error_message = u.detail,
        finished_at = now(), publish_after = NULL, lease_expires_at = NULL, worker_id = NULL,
        updated_at = now()
    FROM (SELECT DISTINCT ON (r.id) r.id, r.reason, r.detail
          FROM unnest($1::text[], $2::text[], $3::text[]) AS r(id, reason, detail)
          ORDER BY r.id) AS u
    WHERE j.id = u.id AND j.status IN ('queued', 'retrying', 'scheduled')
    RETURNING j.id, j.queue, j.tenant
),
counted AS (
    -- sorted, so that concurrent writers lock counter rows in one order (no deadlock)
    INSERT INTO queue_counters AS c (queue, tenant, finished)
    SELECT queue, tenant, count(*) FROM failed GROUP BY queue, tenant ORDER BY queue, tenant
    ON CONFLICT (queue, tenant) DO UPDATE SET finished = c.finished + excluded.finished
)
SELECT id FROM failed;
-- --- worker liveness (worker/liveness.py) -------------------------------------------
-- A worker holds a session-level advisory lock, keyed by schema and worker id
-- (advisory locks are database-wide), on a dedicated connection: PostgreSQL frees
-- it the moment that session ends, which is when the worker's process dies. A
-- lock held as (classid, objid) in pg_locks is the bigint key's high and low half.

-- name: take_worker_lock
-- Try to take this worker's liveness lock in this session; returns whether it is held now, the server pid of the session that holds it otherwise, this session's server pid and the server's start time ($1 worker id)
WITH key AS MATERIALIZED (
    SELECT hashtextextended(current_schema() || ':worker:' || $1, 0) AS k
),
got AS MATERIALIZED (
    SELECT pg_try_advisory_lock(k) AS locked FROM key
)
SELECT got.locked,
       (SELECT l.pid FROM pg_locks AS l, key
        WHERE NOT got.locked AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND (l.classid::int8 << 32) | l.objid::int8 = key.k
        LIMIT 1) AS holder,
       pg_backend_pid() AS backend_pid,
       pg_postmaster_start_time() AS server_started
FROM got;

-- name: terminate_backend
-- End this worker's own earlier liveness session that the server still keeps (a network outage left it behind, holding the lock); it exits, and frees the lock, a moment later ($1 server pid)
SELECT pg_terminate_backend($1::int) AS terminated;

-- name: register_worker
-- Record this worker under its lock, or refresh its row after a reconnect: who it is, where its liveness session lives, a fresh heartbeat; returns when it started ($1 id, $2 instance, $3 host, $4 pid, $5 version, $6 lanes, $7 concurrency, $8 jobs in flight)
INSERT INTO workers AS w (id, instance, host, pid, version, lanes, concurrency, jobs_in_flight,
                          backend_pid, server_started)
VALUES ($1, $2, $3, $4, $5, $6::text[], $7, $8, pg_backend_pid(), pg_postmaster_start_time())
ON CONFLICT (id) DO UPDATE
SET instance = excluded.instance, host = excluded.host, pid = excluded.pid,
    version = excluded.version, lanes = excluded.lanes, concurrency = excluded.concurrency,
    jobs_in_flight = excluded.jobs_in_flight, backend_pid = excluded.backend_pid,
    server_started = excluded.server_started, heartbeat_at = now(),
    started_at = CASE WHEN w.instance = excluded.instance THEN w.started_at ELSE now() END
RETURNING started_at;

-- name: worker_heartbeat
-- Each liveness tick, in one statement: refresh this worker's heartbeat, say whether its row still exists and this session still holds its lock, and list the other workers that look dead: no session holds their lock, their heartbeat is older than the grace, and they took their lock on this run of the server (after a restart every lock is gone; a worker gets until a lease after the restart to take it again) ($1 id, $2 instance, $3 jobs in flight, $4 grace seconds, $5 lease seconds)
WITH me AS (
    UPDATE workers SET heartbeat_at = now(), jobs_in_flight = $3
    WHERE id = $1 AND instance = $2
    RETURNING id
),
held AS MATERIALIZED (
    SELECT l.pid, (l.classid::int8 << 32) | l.objid::int8 AS key
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT EXISTS (SELECT 1 FROM me) AS registered,
       EXISTS (SELECT 1 FROM held
               WHERE held.pid = pg_backend_pid()
                 AND held.key = hashtextextended(current_schema() || ':worker:' || $1, 0))
           AS locked,
       ARRAY(
           SELECT w.id FROM workers AS w
           WHERE w.id <> $1
             AND w.heartbeat_at < now() - make_interval(secs => $4)
             AND (w.server_started = pg_postmaster_start_time()
                  OR pg_postmaster_start_time() < now() - make_interval(secs => $5))
             AND NOT EXISTS (
                 SELECT 1 FROM held
                 WHERE held.key = hashtextextended(current_schema() || ':worker:' || w.id, 0))
           ORDER BY w.id
       ) AS dead;

-- name: liveness_lock_timeout
-- Bound how long the release of a dead worker's jobs waits for a row another transaction holds (a cycle is a deadlock PostgreSQL breaks; the release is retried next tick) ($1 timeout, e.g. 5s)
SELECT set_config('lock_timeout', $1, true);

-- name: remove_dead_workers
-- Delete the rows of workers found dead, checking again under their row locks that no session holds their lock and their heartbeat is still stale (one that came back keeps its row); one remover per row ($1 ids, $2 grace seconds, $3 lease seconds)
WITH held AS MATERIALIZED (
    SELECT (l.classid::int8 << 32) | l.objid::int8 AS key
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
),
gone AS (
    SELECT w.id FROM workers AS w
    WHERE w.id = ANY($1::text[])
      AND w.heartbeat_at < now() - make_interval(secs => $2)
      AND (w.server_started = pg_postmaster_start_time()
           OR pg_postmaster_start_time() < now() - make_interval(secs => $3))
      AND NOT EXISTS (
          SELECT 1 FROM held
          WHERE held.key = hashtextextended(current_schema() || ':worker:' || w.id, 0))
    FOR UPDATE OF w SKIP LOCKED
)
DELETE FROM workers AS w USING gone WHERE w.id = gone.id
RETURNING w.id, w.host, w.pid, w.heartbeat_at;

-- name: release_worker_jobs
-- Make the running jobs of dead workers due again at once (or dead, or cancelled), as reap_expired does for expired leases, and NOTIFY "<schema>.caps" for the capped tenants and types they free ($1 worker ids)
WITH released AS (
    UPDATE jobs AS j
    SET status = CASE WHEN j.cancel_requested THEN 'cancelled'::job_status
                      WHEN j.attempt - j.snoozes >= j.max_attempts THEN 'dead'::job_status
                      ELSE 'retrying'::job_status END,
        dead_reason = CASE WHEN NOT j.cancel_requested AND j.attempt - j.snoozes >= j.max_attempts
                           THEN 'max_attempts' ELSE j.dead_reason END,
        error_kind = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'worker_lost' END,
        error_message = CASE WHEN j.cancel_requested THEN j.cancel_reason
                             ELSE 'worker ' || coalesce(j.worker_id, '?')
                                  || ' died (its PostgreSQL session ended)'
                        END,
        finished_at = CASE WHEN j.cancel_requested OR j.attempt - j.snoozes >= j.max_attempts THEN now() END,
        run_at = now(),
        publish_after = CASE WHEN j.cancel_requested OR j.attempt - j.snoozes >= j.max_attempts THEN NULL
                             ELSE now() END,
        lease_expires_at = NULL,
        worker_id = NULL,
        updated_at = now()
    WHERE j.id IN (
        SELECT id FROM jobs
        WHERE status = 'running' AND worker_id = ANY($1::text[])
        ORDER BY id
        FOR UPDATE
    )
    RETURNING j.id, j.type, j.queue, j.tenant, j.args, j.status::text AS status, j.attempt,
              j.error_message
),
freed AS (
    SELECT pg_notify(current_schema() || '.caps', 'tenant:' || t.name)
    FROM tenants AS t
    WHERE t.name IN (SELECT tenant FROM released) AND t.max_running IS NOT NULL
    UNION ALL
    SELECT pg_notify(current_schema() || '.caps', 'type:' || y.name)
    FROM job_types AS y
    WHERE y.name IN (SELECT type FROM released) AND y.max_running IS NOT NULL
)
-- the count makes PostgreSQL run "freed" (a plain SELECT in WITH runs only when read), once
SELECT * FROM released WHERE (SELECT count(*) FROM freed) >= 0;

-- name: unregister_worker
-- A worker that stops cleanly removes its own row ($1 id, $2 instance)
DELETE FROM workers WHERE id = $1 AND instance = $2;

-- name: list_workers
-- Every registered worker, with whether a session holds its liveness lock now and its heartbeat's age in seconds, oldest first (no parameters)
WITH held AS MATERIALIZED (
    SELECT (l.classid::int8 << 32) | l.objid::int8 AS key
    FROM pg_locks AS l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT w.id, w.host, w.pid, w.version, w.lanes, w.concurrency, w.jobs_in_flight,
       w.started_at, w.heartbeat_at,
       extract(epoch FROM now() - w.heartbeat_at)::float8 AS heartbeat_age_seconds,
       EXISTS (SELECT 1 FROM held
               WHERE held.key = hashtextextended(current_schema() || ':worker:' || w.id, 0))
           AS alive
FROM workers AS w
ORDER BY w.started_at, w.id;

-- name: server_clock
-- The server's time and start time: the reaper's contact with PostgreSQL, and whether the server restarted (no parameters)
SELECT now() AS now, pg_postmaster_start_time() AS server_started;

-- --- scheduled jobs and snooze (worker/runner.py, worker/relay.py) -------------------

-- name: defer_job
-- A delivery asks for a later start (x-run-at / x-delay-seconds): record its job as scheduled if it has no row yet and is not due, so the relay publishes it then; returns the id when recorded, nothing when the row exists or the job is due now ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 run_at or null, $11 delay seconds or null)
WITH due AS MATERIALIZED (
    SELECT coalesce($10::timestamptz, now() + make_interval(secs => coalesce($11::float8, 0)))
           AS at
)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  idempotency_key, status, run_at, publish_after)
SELECT $1::text, $2::text, $3::text, $4::text, $5::jsonb, $6::int2, $7::int4, $8::float8,
       $9::text, 'scheduled', due.at, due.at
FROM due
WHERE due.at > now()
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: next_publish_due
-- Relay: seconds until the earliest publish mark still ahead (one probe of jobs_publish_due), null when there is none ($1 horizon seconds: marks further ahead read as null)
SELECT extract(epoch FROM min(publish_after) - now())::float8 AS seconds
FROM jobs
WHERE publish_after > now() AND publish_after <= now() + make_interval(secs => $1);
