-- Every statement coldbrew sends to PostgreSQL, by name. Each block starts with
-- "-- name: <name>", then one comment line that says what it does and lists
-- its positional parameters in order. The pool's search_path is the
-- namespace's schema, so no statement names a schema.

-- name: insert_job
-- Submit a job as queued and unpublished, or as scheduled when its run_at (or now + delay) is still ahead: publish_after is then that time, when the relay publishes it ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 relay grace seconds, $11 run_at or null, $12 delay seconds or null, $13 webhook url or null, $14 traceparent or null, $15 tracestate or null)
WITH due AS MATERIALIZED (
    SELECT coalesce($11::timestamptz, now() + make_interval(secs => coalesce($12::float8, 0)))
           AS at
)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  idempotency_key, status, run_at, publish_after, webhook_url,
                  traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
        CASE WHEN (SELECT at FROM due) > now() THEN 'scheduled'::job_status
             ELSE 'queued'::job_status END,
        greatest((SELECT at FROM due), now()),
        CASE WHEN (SELECT at FROM due) > now() THEN (SELECT at FROM due)
             ELSE now() + make_interval(secs => $10) END,
        $13, $14, $15)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: get_job
-- One job by id, with its children's counts by status (a probe of jobs_parent; null when it has none) ($1 id)
SELECT j.*,
       (SELECT jsonb_object_agg(s.status, s.n)
        FROM (SELECT c.status, count(*) AS n FROM jobs AS c
              WHERE c.parent_id = j.id GROUP BY c.status) AS s) AS children
FROM jobs AS j WHERE j.id = $1;

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
-- Upsert delivered jobs and claim the claimable ones, one attempt each, with the seconds each claimed one waited since it became due (run_at: its creation, its schedule or its retry; 0 for a row the claim inserts); a scheduled row is claimable once its run_at has come, and an early delivery of one is refused like a duplicate; a row without a trace context takes the delivery's, so a raw producer's traceparent is in its row from the first claim on ($1 ids, $2 types, $3 queues, $4 tenants, $5 args, $6 priorities, $7 max_attempts, $8 timeouts, $9 idempotency keys, $10 lease seconds, $11 worker id, $12 traceparents or nulls, $13 tracestates or nulls)
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int2[],
                $7::int4[], $8::float8[], $9::text[], $12::text[], $13::text[])
         AS i(id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
              idempotency_key, traceparent, tracestate)
),
inserted AS (
    INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                      idempotency_key, status, attempt, started_at, lease_expires_at, worker_id,
                      traceparent, tracestate)
    SELECT id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
           idempotency_key, 'running', 1, now(), now() + make_interval(secs => $10), $11,
           traceparent, tracestate
    FROM input
    ON CONFLICT (id) DO NOTHING
    RETURNING id, attempt, max_attempts, timeout_seconds, checkpoint, started_at, snoozes,
              0::float8 AS waited
),
moved AS (
    -- one UPDATE (one probe of jobs_pkey per delivery) moves both kinds of row it may
    -- find: a claimable one with attempts left is claimed ('running', one attempt more), a
    -- waiting one whose attempts are spent is dead ('max_attempts'); SET reads the row as it
    -- was, so "attempts left" tells the two apart. Two UPDATEs (claimed, exhausted) did
    -- this before: the second cost each batch another probe per delivery and another
    -- ModifyTable's start (bench/pg_cost.py: ~5 µs of PostgreSQL CPU per job)
    UPDATE jobs AS j
    SET status = CASE WHEN j.attempt - j.snoozes < j.max_attempts
                      THEN 'running'::job_status ELSE 'dead'::job_status END,
        attempt = j.attempt + CASE WHEN j.attempt - j.snoozes < j.max_attempts THEN 1 ELSE 0 END,
        started_at = CASE WHEN j.attempt - j.snoozes < j.max_attempts
                          THEN coalesce(j.started_at, now()) ELSE j.started_at END,
        lease_expires_at = CASE WHEN j.attempt - j.snoozes < j.max_attempts
                                THEN now() + make_interval(secs => $10) END,
        worker_id = CASE WHEN j.attempt - j.snoozes < j.max_attempts THEN $11 END,
        dead_reason = CASE WHEN j.attempt - j.snoozes < j.max_attempts
                           THEN j.dead_reason ELSE 'max_attempts' END,
        finished_at = CASE WHEN j.attempt - j.snoozes < j.max_attempts
                           THEN j.finished_at ELSE now() END,
        progress_message = CASE WHEN j.attempt - j.snoozes < j.max_attempts
                                THEN j.progress_message END,
        publish_after = NULL, updated_at = now(),
        traceparent = CASE WHEN j.attempt - j.snoozes < j.max_attempts
                           THEN coalesce(j.traceparent, i.traceparent) ELSE j.traceparent END,
        tracestate = CASE WHEN j.attempt - j.snoozes < j.max_attempts AND j.traceparent IS NULL
                          THEN i.tracestate ELSE j.tracestate END
    FROM input AS i
    WHERE j.id = i.id
      AND ((-- claimable: snoozes gave back the attempts their claims took (attempt itself
            -- only grows)
            j.attempt - j.snoozes < j.max_attempts
            AND NOT j.cancel_requested
            AND (j.status = 'queued'
                 OR (j.status IN ('retrying', 'scheduled') AND j.run_at <= now())
                 OR (j.status = 'running' AND j.lease_expires_at < now()
                     -- a lease that expired while PostgreSQL was down is its worker's for
                     -- one more lease: alive, it extends it as soon as it reconnects
                     AND server_started() <= now() - make_interval(secs => $10))))
           OR (-- spent, and waiting (or due)
               j.attempt - j.snoozes >= j.max_attempts
               AND (j.status IN ('queued', 'retrying')
                    OR (j.status = 'scheduled' AND j.run_at <= now()))))
    RETURNING j.id, j.attempt, j.max_attempts, j.timeout_seconds, j.checkpoint, j.started_at,
              j.snoozes, greatest(extract(epoch FROM now() - j.run_at), 0)::float8 AS waited,
              j.status = 'running' AS took
)
SELECT id, attempt, max_attempts, timeout_seconds, checkpoint, started_at, snoozes,
       true AS claimed, 'running' AS status, waited
FROM inserted
UNION ALL
SELECT id, attempt, max_attempts, timeout_seconds, checkpoint, started_at, snoozes,
       true AS claimed, 'running' AS status, waited
FROM moved WHERE took
UNION ALL
SELECT j.id, j.attempt, j.max_attempts, j.timeout_seconds, j.checkpoint, j.started_at,
       j.snoozes, false AS claimed,
       CASE WHEN j.id IN (SELECT id FROM moved WHERE NOT took) THEN 'dead'
            ELSE j.status::text END,
       NULL::float8 AS waited
FROM jobs AS j
JOIN input AS i ON i.id = j.id
WHERE j.id NOT IN (SELECT id FROM moved WHERE took);

-- name: server_started
-- When the PostgreSQL server started: a change means it restarted, and what it had not flushed to disk may be gone (no parameters)
SELECT server_started() AS server_started;

-- name: durability_barrier
-- A tiny transaction that writes WAL (a transactional logical message: an xid and a WAL record, no table, no lock), so that its synchronous commit flushes the WAL past every asynchronous claim committed before it and waits for a synchronous standby; an xid alone (txid_current()) writes no WAL before the commit record, and PostgreSQL then commits asynchronously (xact.c, RecordTransactionCommit: wrote_xlog); returns the server's start time (no parameters)
SELECT pg_logical_emit_message(true, 'coldbrew.barrier', '') AS lsn,
       server_started() AS server_started;

-- name: verify_claims
-- After a PostgreSQL restart: the rows of claims that were not known durable, to tell those that survived from those lost ($1 ids)
SELECT id, attempt, status::text AS status, worker_id FROM jobs WHERE id = ANY($1::text[]);

-- name: complete_batch
-- Write outcomes fenced by attempt (a snooze: 'scheduled' after $7 seconds, one more snooze), with progress not yet flushed, count finished jobs per lane and tenant for the drain rate, and NOTIFY "<schema>.caps" with each capped tenant and type that freed a place; a finished job's progress message is cleared (a succeeded one's progress is 1); returns the rows written ($1 ids, $2 attempts, $3 statuses, $4 results, $5 error kinds, $6 error messages, $7 retry delays, $8 dead reasons, $9 progress fractions, $10 progress messages)
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
        -- a finished job's record tells the truth: no "rendering" after it succeeded (its
        -- status is the final word); a retrying one keeps where its attempt stopped
        progress_message = CASE WHEN u.status = 'retrying'
                                THEN coalesce(u.progress_message, j.progress_message) END,
        lease_expires_at = NULL,
        worker_id = NULL,
        updated_at = now()
    FROM unnest($1::text[], $2::int4[], $3::text[], $4::jsonb[], $5::text[], $6::text[],
                $7::float8[], $8::text[], $9::float4[], $10::text[])
         AS u(id, attempt, status, result, error_kind, error_message, delay, dead_reason,
              progress, progress_message)
    -- the fence compares status as text on purpose: 'status = running' matches the
    -- predicates of the partial indexes of running rows (jobs_running, jobs_lease_expiry),
    -- and on a jobs table not analyzed yet (a new namespace, until autoanalyze) the cached
    -- generic plan walked all of them and joined every batch against each (bench/pg_cost.py:
    -- 157 µs of PostgreSQL CPU per job instead of 50 with 300 jobs in flight); as text it
    -- matches no index, so the only plan left is one primary-key probe per outcome
    WHERE j.id = u.id AND j.attempt = u.attempt AND j.status::text = 'running'
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
        progress_message = CASE WHEN j.cancel_requested OR j.attempt - j.snoozes >= j.max_attempts
                                THEN NULL ELSE j.progress_message END,
        run_at = now(),
        publish_after = CASE WHEN j.cancel_requested OR j.attempt - j.snoozes >= j.max_attempts THEN NULL
                             ELSE now() END,
        lease_expires_at = NULL,
        worker_id = NULL,
        updated_at = now()
    WHERE j.id IN (
        SELECT id FROM jobs
        WHERE status = 'running' AND lease_expires_at < now()
          AND server_started() <= now() - make_interval(secs => $2)
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
          due.was::text AS was, j.traceparent, j.tracestate, j.trace_previous_span;

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
-- Cancel waiting (queued, retrying or scheduled) jobs at once, flag running ones for their workers; rows locked in id order, so two cancels of overlapping sets (a job's, a batch's) cannot deadlock; returns the rows it changed ($1 ids, $2 reason)
UPDATE jobs
SET status = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN 'cancelled'::job_status
                  ELSE status END,
    finished_at = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN now() ELSE finished_at END,
    error_kind = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN 'cancelled' ELSE error_kind END,
    error_message = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN $2 ELSE error_message END,
    publish_after = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN NULL ELSE publish_after END,
    progress_message = CASE WHEN status IN ('queued', 'retrying', 'scheduled') THEN NULL
                            ELSE progress_message END,
    cancel_requested = true,
    cancel_reason = $2,
    updated_at = now()
WHERE id IN (SELECT id FROM jobs
             WHERE id = ANY($1::text[]) AND status IN ('queued', 'retrying', 'scheduled', 'running')
             ORDER BY id FOR UPDATE)
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
SELECT name, weight, max_running, paused, created_at, rate_per_second, rate_burst,
       webhook_url
FROM tenants ORDER BY name;

-- name: set_tenant
-- Create or change a tenant; a null leaves that setting as it is ($1 name, $2 weight or null, $3 paused or null, $4 max running or null, $5 true to remove the cap)
INSERT INTO tenants (name, weight, paused, max_running)
VALUES ($1, coalesce($2::real, 1), coalesce($3::bool, false),
        CASE WHEN $5::bool THEN NULL ELSE $4::int4 END)
ON CONFLICT (name) DO UPDATE
SET weight = coalesce($2::real, tenants.weight), paused = coalesce($3::bool, tenants.paused),
    max_running = CASE WHEN $5::bool THEN NULL ELSE coalesce($4::int4, tenants.max_running) END
RETURNING name, weight, max_running, paused, created_at, rate_per_second, rate_burst,
          webhook_url;

-- name: list_job_types
-- Every job type with a fleet-wide setting
SELECT name, max_running, created_at, rate_per_second, rate_burst FROM job_types ORDER BY name;

-- name: set_job_type
-- Create or change a job type's fleet-wide cap ($1 name, $2 max running, or null for no cap)
INSERT INTO job_types (name, max_running) VALUES ($1, $2::int4)
ON CONFLICT (name) DO UPDATE SET max_running = $2::int4
RETURNING name, max_running, created_at, rate_per_second, rate_burst;

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
-- Per lane and tenant: counts by status (scheduled apart: not backlog), the oldest waiting job's age in seconds, and how many jobs have finished so far (the drain rate is its change over time), optionally for one tenant; unfinished rows are an index-only scan of jobs_unfinished, dead and failed ones are counted from job_tallies (migration 0013), so no part reads the history ($1 tenant or null)
WITH unfinished AS (
    SELECT queue, tenant,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'retrying') AS retrying,
           count(*) FILTER (WHERE status = 'scheduled') AS scheduled,
           min(created_at) FILTER (WHERE status IN ('queued', 'retrying')) AS oldest
    FROM jobs
    WHERE status IN ('queued', 'running', 'retrying', 'scheduled')
      AND ($1::text IS NULL OR tenant = $1)
    GROUP BY queue, tenant
),
tallied AS (
    SELECT queue, tenant,
           coalesce(sum(n) FILTER (WHERE status = 'dead'), 0) AS dead,
           coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed
    FROM job_tallies
    WHERE $1::text IS NULL OR tenant = $1
    GROUP BY queue, tenant
)
SELECT queue, tenant,
       coalesce(u.queued, 0) AS queued,
       coalesce(u.running, 0) AS running,
       coalesce(u.retrying, 0) AS retrying,
       coalesce(t.dead, 0)::int8 AS dead,
       coalesce(t.failed, 0)::int8 AS failed,
       coalesce(u.scheduled, 0) AS scheduled,
       coalesce(extract(epoch FROM now() - u.oldest), 0)::float8 AS oldest_waiting_seconds,
       coalesce((SELECT finished FROM queue_counters AS c
                 WHERE c.queue = q.queue AND c.tenant = q.tenant), 0) AS finished
FROM (SELECT queue, tenant FROM unfinished UNION SELECT queue, tenant FROM tallied) AS q
LEFT JOIN unfinished AS u USING (queue, tenant)
LEFT JOIN tallied AS t USING (queue, tenant)
WHERE u.queue IS NOT NULL OR t.dead > 0 OR t.failed > 0
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
-- Per (lane, tenant), read after the broker's counts: the waiting rows whose message was confirmed by $1 (this look's start) and by the previous look, their highest priority, the deliveries workers reported holding unclaimed since the previous look counted the queue (without one: in the last $2 seconds), the messages aging sweeps begun since $3 seconds before that look (or this one) may hold, that look, the largest prefetch and keep any worker reported in the last $2 seconds, and the sum of those prefetches ($1 this look's start, $2 seconds, $3 seconds)
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
       (SELECT sum(r.prefetch) FROM reconcile_workers AS r
        WHERE r.reported_at >= now() - make_interval(secs => $2))::int8 AS fleet_prefetch_sum,
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
        progress_message = NULL, finished_at = now(), publish_after = NULL, lease_expires_at = NULL, worker_id = NULL,
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
       server_started() AS server_started
FROM got;

-- name: terminate_backend
-- End this worker's own earlier liveness session that the server still keeps (a network outage left it behind, holding the lock); it exits, and frees the lock, a moment later ($1 server pid)
SELECT pg_terminate_backend($1::int) AS terminated;

-- name: register_worker
-- Record this worker under its lock, or refresh its row after a reconnect: who it is, where its liveness session lives, a fresh heartbeat; returns when it started ($1 id, $2 instance, $3 host, $4 pid, $5 version, $6 lanes, $7 concurrency, $8 jobs in flight)
INSERT INTO workers AS w (id, instance, host, pid, version, lanes, concurrency, jobs_in_flight,
                          backend_pid, server_started)
VALUES ($1, $2, $3, $4, $5, $6::text[], $7, $8, pg_backend_pid(), server_started())
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
             AND (w.server_started = server_started()
                  OR server_started() < now() - make_interval(secs => $5))
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
      AND (w.server_started = server_started()
           OR server_started() < now() - make_interval(secs => $3))
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
        progress_message = CASE WHEN j.cancel_requested OR j.attempt - j.snoozes >= j.max_attempts
                                THEN NULL ELSE j.progress_message END,
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
-- The server's time and start time: the reaper's contact with PostgreSQL, and whether the server restarted or a standby was promoted (server_started(), 0019); records a new timeline first (no parameters)
WITH noted AS MATERIALIZED (SELECT note_server_epoch())
SELECT now() AS now, server_started() AS server_started FROM noted;

-- --- Unique jobs (issue #15; 0008_unique.sql) -------------------------------------

-- name: insert_unique_job
-- Submit a job unique for its key, in one statement: unless a job with its id exists (an idempotency key wins), take the key when it is free, or its holder was created before the period or is in none of the states, and insert the job queued and unpublished; returns the new row, or nothing when the key's holder (find_unique_holder) or the id's job stands ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 relay grace seconds, $11 unique key, $12 unique states, $13 period seconds or NULL for ever, $14 webhook url or null, $15 traceparent or null, $16 tracestate or null)
WITH taken AS (
    INSERT INTO job_unique AS u (key, job_id)
    SELECT $11, $1
    WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE id = $1)
    ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, created_at = now()
    WHERE ($13::float8 IS NOT NULL AND u.created_at <= now() - make_interval(secs => $13::float8))
       OR EXISTS (SELECT 1 FROM jobs AS j
                  WHERE j.id = u.job_id AND NOT (j.status::text = ANY ($12::text[])))
    RETURNING u.job_id
)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  idempotency_key, publish_after, webhook_url, traceparent, tracestate)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, now() + make_interval(secs => $10), $14, $15, $16
FROM taken
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: find_unique_holder
-- After a submission that did not insert: the job its id names if it exists, else the job holding its unique key; "duplicate" says which ($1 id, $2 unique key)
SELECT j.*, false AS duplicate FROM jobs AS j WHERE j.id = $1
UNION ALL
SELECT j.*, true AS duplicate
FROM job_unique AS u JOIN jobs AS j ON j.id = u.job_id
WHERE u.key = $2 AND NOT EXISTS (SELECT 1 FROM jobs WHERE id = $1)
LIMIT 1;

-- name: admit_unique_delivery
-- A delivery of a unique type whose row may not exist (a raw AMQP producer): if its id names a job or an alias, report it; else take the key as insert_unique_job does and insert the row queued (the claim that follows runs it); "known" is the id's job or alias target, "taken" our id when we inserted ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 unique key, $11 unique states, $12 period seconds or NULL for ever, $13 traceparent or null, $14 tracestate or null)
WITH known AS (
    SELECT id FROM jobs WHERE id = $1
    UNION ALL
    SELECT job_id FROM job_aliases WHERE id = $1
),
taken AS (
    INSERT INTO job_unique AS u (key, job_id)
    SELECT $10, $1
    WHERE NOT EXISTS (SELECT 1 FROM known)
    ON CONFLICT (key) DO UPDATE SET job_id = excluded.job_id, created_at = now()
    WHERE ($12::float8 IS NOT NULL AND u.created_at <= now() - make_interval(secs => $12::float8))
       OR EXISTS (SELECT 1 FROM jobs AS j
                  WHERE j.id = u.job_id AND NOT (j.status::text = ANY ($11::text[])))
    RETURNING u.job_id
),
inserted AS (
    INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                      idempotency_key, traceparent, tracestate)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $13, $14
    FROM taken
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
SELECT (SELECT id FROM known LIMIT 1) AS known, (SELECT id FROM inserted) AS taken;

-- name: alias_unique_duplicate
-- A raw delivery that is a duplicate: map its message id to the job holding its unique key, and return that job's id (NULL: the key has no holder now; try again) ($1 message id, $2 unique key)
WITH holder AS (
    SELECT job_id FROM job_unique WHERE key = $2
),
aliased AS (
    INSERT INTO job_aliases (id, job_id)
    SELECT $1, job_id FROM holder WHERE job_id <> $1
    ON CONFLICT (id) DO NOTHING
)
SELECT job_id FROM holder;

-- name: get_job_by_alias
-- The job a duplicate's message id was mapped to ($1 message id)
SELECT j.* FROM job_aliases AS a JOIN jobs AS j ON j.id = a.job_id WHERE a.id = $1;
-- cron (worker/cron.py, store/cron.py) ---------------------------------------------------

-- name: cron_upsert
-- Declare a schedule at a worker's start-up: a new one starts its watermark now (no tick before it runs); a changed expression or time zone moves the watermark to now, so no tick that already ran (or was decided) runs again; returns the row and the expression and time zone it had before, null for a new one ($1 name, $2 expression, $3 tz, $4 type, $5 args, $6 queue, $7 tenant, $8 priority, $9 max_attempts, $10 timeout_seconds, $11 catch_up, $12 max_catch_up)
WITH old AS (SELECT expression, tz FROM cron_schedules WHERE name = $1)
INSERT INTO cron_schedules AS s (name, expression, tz, type, args, queue, tenant, priority,
                                 max_attempts, timeout_seconds, catch_up, max_catch_up,
                                 last_tick)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, now())
ON CONFLICT (name) DO UPDATE SET
    last_tick = CASE WHEN (s.expression, s.tz) IS DISTINCT FROM (EXCLUDED.expression, EXCLUDED.tz)
                     THEN greatest(s.last_tick, now()) ELSE s.last_tick END,
    updated_at = CASE WHEN (s.expression, s.tz, s.type, s.args, s.queue, s.tenant, s.priority,
                            s.max_attempts, s.timeout_seconds, s.catch_up, s.max_catch_up)
                           IS DISTINCT FROM
                           (EXCLUDED.expression, EXCLUDED.tz, EXCLUDED.type, EXCLUDED.args,
                            EXCLUDED.queue, EXCLUDED.tenant, EXCLUDED.priority,
                            EXCLUDED.max_attempts, EXCLUDED.timeout_seconds, EXCLUDED.catch_up,
                            EXCLUDED.max_catch_up)
                      THEN now() ELSE s.updated_at END,
    expression = EXCLUDED.expression, tz = EXCLUDED.tz, type = EXCLUDED.type,
    args = EXCLUDED.args, queue = EXCLUDED.queue, tenant = EXCLUDED.tenant,
    priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
    timeout_seconds = EXCLUDED.timeout_seconds, catch_up = EXCLUDED.catch_up,
    max_catch_up = EXCLUDED.max_catch_up, seen_at = now()
RETURNING s.*, (SELECT expression FROM old) AS old_expression, (SELECT tz FROM old) AS old_tz;

-- name: cron_watermarks
-- The declared schedules' watermarks and pause flags, with PostgreSQL's clock: the one clock that says which tick is due ($1 names)
SELECT name, expression, tz, paused, last_tick, now() AS now
FROM cron_schedules WHERE name = ANY($1::text[]);

-- name: cron_advance
-- Move a schedule's watermark forward if it is still where this worker read it (compare-and-swap: one worker decides each tick), its definition is the one this worker fires, it is not paused and the new watermark is not in the future; null when another worker decided first ($1 name, $2 watermark read, $3 new watermark, $4 expression, $5 tz, $6 last job id, or null to keep it)
UPDATE cron_schedules
SET last_tick = $3, last_job_id = coalesce($6, last_job_id), updated_at = now()
WHERE name = $1 AND last_tick = $2 AND $3 > $2 AND $3 <= now()
  AND expression = $4 AND tz = $5 AND NOT paused
RETURNING now() AS now;

-- name: cron_seen
-- Record that a live worker still declares these schedules (an undeclared one shows as orphaned) ($1 names)
UPDATE cron_schedules SET seen_at = now() WHERE name = ANY($1::text[]);

-- name: cron_list
-- Every schedule with its last tick's job status, whether no worker declared it within the given seconds, and the server's clock, by name ($1 orphan seconds)
SELECT s.*, j.status::text AS last_status, now() AS now,
       s.seen_at < now() - make_interval(secs => $1) AS orphaned
FROM cron_schedules AS s
LEFT JOIN jobs AS j ON j.id = s.last_job_id
ORDER BY s.name;

-- name: cron_get
-- One schedule by name, for a manual run ($1 name)
SELECT * FROM cron_schedules WHERE name = $1;

-- name: cron_set_paused
-- Pause or resume a schedule; resuming moves the watermark to now, so the paused time's ticks are not caught up ($1 name, $2 paused)
UPDATE cron_schedules
SET last_tick = CASE WHEN paused AND NOT $2 THEN greatest(last_tick, now()) ELSE last_tick END,
    paused = $2, updated_at = now()
WHERE name = $1
RETURNING *;

-- name: cron_delete
-- Delete a schedule's row (a running worker that still declares it declares it again, from now) ($1 name)
DELETE FROM cron_schedules WHERE name = $1 RETURNING name;
-- --- the first hour (issue #18): registered job types, finished jobs, watching jobs ---

-- name: register_types
-- A worker's app at start-up: record each job type's lane and defaults, the newest registration winning; returns the previous registrations, by another worker, that said otherwise (two apps disagree), sorted by type ($1 names, $2 lanes, $3 max attempts or null, $4 timeouts or null, $5 process-pool flags, $6 worker id)
WITH input AS (
    SELECT *
    FROM unnest($1::text[], $2::text[], $3::int4[], $4::float8[], $5::bool[])
         AS u(name, queue, max_attempts, timeout_seconds, is_process)
),
previous AS (
    -- every statement of a WITH sees one snapshot: these are the rows before the upsert
    SELECT r.name, r.queue, r.max_attempts, r.timeout_seconds, r.is_process, r.worker_id,
           r.updated_at
    FROM registered_types AS r
    JOIN input AS i ON i.name = r.name
    WHERE r.worker_id <> $6
      AND (r.queue, r.max_attempts, r.timeout_seconds, r.is_process)
          IS DISTINCT FROM (i.queue, i.max_attempts, i.timeout_seconds, i.is_process)
),
upserted AS (
    -- sorted, so that workers starting together lock the rows in one order (no deadlock)
    INSERT INTO registered_types AS r (name, queue, max_attempts, timeout_seconds, is_process,
                                       worker_id, updated_at)
    SELECT name, queue, max_attempts, timeout_seconds, is_process, $6, now()
    FROM input ORDER BY name
    ON CONFLICT (name) DO UPDATE
    SET queue = excluded.queue, max_attempts = excluded.max_attempts,
        timeout_seconds = excluded.timeout_seconds, is_process = excluded.is_process,
        worker_id = excluded.worker_id, updated_at = excluded.updated_at
)
SELECT name, queue, max_attempts, timeout_seconds, is_process, worker_id, updated_at
FROM previous ORDER BY name;

-- name: registered_type
-- The fleet's registration of one job type, for a submitter without the app: none when no worker registered it ($1 type)
SELECT name, queue, max_attempts, timeout_seconds, is_process, worker_id, updated_at
FROM registered_types WHERE name = $1;

-- name: list_registered_types
-- Every job type a worker registered, with its lane and defaults, for `coldbrew types list` (no parameters)
SELECT name, queue, max_attempts, timeout_seconds, is_process, worker_id, updated_at
FROM registered_types ORDER BY name;

-- name: finished_stats
-- Per lane and tenant, the jobs that finished in the last $1 seconds, by final status, with the median and 95th percentile of their run time (first start to finish) and their median wait (submission to first start); a range scan of jobs_finished ($1 seconds, $2 tenant or null)
SELECT queue, tenant,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       (percentile_cont(0.5) WITHIN GROUP (
            ORDER BY extract(epoch FROM finished_at - started_at))
        FILTER (WHERE started_at IS NOT NULL))::float8 AS run_p50_seconds,
       (percentile_cont(0.95) WITHIN GROUP (
            ORDER BY extract(epoch FROM finished_at - started_at))
        FILTER (WHERE started_at IS NOT NULL))::float8 AS run_p95_seconds,
       (percentile_cont(0.5) WITHIN GROUP (
            ORDER BY extract(epoch FROM started_at - created_at))
        FILTER (WHERE started_at IS NOT NULL))::float8 AS wait_p50_seconds
FROM jobs
WHERE finished_at IS NOT NULL
  AND finished_at >= now() - make_interval(secs => $1)
  AND status IN ('succeeded', 'failed', 'cancelled', 'dead')
  AND ($2::text IS NULL OR tenant = $2)
GROUP BY queue, tenant
ORDER BY queue, tenant;

-- name: get_jobs
-- The rows of several jobs in one statement, one primary-key lookup each, for following them from the command line and the demo ($1 ids)
SELECT j.* FROM unnest($1::text[]) AS u(id) JOIN jobs AS j ON j.id = u.id;
-- === rate limits (issue #15) ==========================================================

-- name: set_tenant_rate
-- Create a tenant or change its rate limit: a null leaves that setting as it is, $4 true removes both ($1 name, $2 starts per second or null, $3 burst or null, $4 true to remove the limit)
INSERT INTO tenants (name, rate_per_second, rate_burst)
VALUES ($1, CASE WHEN $4::bool THEN NULL ELSE $2::float8 END,
        CASE WHEN $4::bool THEN NULL ELSE $3::int4 END)
ON CONFLICT (name) DO UPDATE
SET rate_per_second = CASE WHEN $4::bool THEN NULL
                           ELSE coalesce($2::float8, tenants.rate_per_second) END,
    rate_burst = CASE WHEN $4::bool THEN NULL ELSE coalesce($3::int4, tenants.rate_burst) END
RETURNING name, weight, max_running, paused, created_at, rate_per_second, rate_burst,
          webhook_url;

-- name: set_job_type_rate
-- Create a job type's settings or change its rate limit: a null leaves that setting as it is, $4 true removes both ($1 name, $2 starts per second or null, $3 burst or null, $4 true to remove the limit)
INSERT INTO job_types (name, rate_per_second, rate_burst)
VALUES ($1, CASE WHEN $4::bool THEN NULL ELSE $2::float8 END,
        CASE WHEN $4::bool THEN NULL ELSE $3::int4 END)
ON CONFLICT (name) DO UPDATE
SET rate_per_second = CASE WHEN $4::bool THEN NULL
                           ELSE coalesce($2::float8, job_types.rate_per_second) END,
    rate_burst = CASE WHEN $4::bool THEN NULL ELSE coalesce($3::int4, job_types.rate_burst) END
RETURNING name, max_running, created_at, rate_per_second, rate_burst;

-- name: lock_rate_buckets
-- A rate-limited claim's first statement: lock its GCRA buckets (creating missing ones, full), in the order given -- the caller sorts the keys, so two claims cannot deadlock -- and read how far each one's theoretical arrival time lies ahead of now, in seconds (0: none); the locks hold until the claim's transaction ends ($1 bucket keys)
INSERT INTO rate_buckets AS b (key, tat)
SELECT k, now() FROM unnest($1::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n
ON CONFLICT (key) DO UPDATE SET tat = b.tat
RETURNING b.key, greatest(extract(epoch FROM b.tat - now()), 0)::float8 AS backlog;

-- name: take_rate_tokens
-- The rate-limited claim claimed its job: store each bucket's new theoretical arrival time, as seconds from now ($1 bucket keys, $2 backlogs in seconds)
UPDATE rate_buckets AS b SET tat = now() + make_interval(secs => u.backlog)
FROM unnest($1::text[], $2::float8[]) AS u(key, backlog)
WHERE b.key = u.key;

-- name: peek_rate_bucket
-- Before a contested single-limit claim, without a lock or a transaction: how far the bucket's theoretical arrival time lies ahead of now, in seconds (0: none, or no bucket yet). A read that finds no token is a safe refusal (claims only move the time on), so a lost race costs this read and not a claim rolled back ($1 bucket key)
SELECT coalesce((SELECT greatest(extract(epoch FROM tat - now()), 0)::float8
                 FROM rate_buckets WHERE key = $1), 0)::float8 AS backlog;

-- name: take_rate_token_first
-- A contested single-limit claim's first statement in its transaction, before claim_batch: lock the bucket's row unless another claim holds it (SKIP LOCKED: a claim taking this bucket's token right now), take one token if one is due, and read the backlogs: taken_backlog (null: not taken), mine_backlog (null: the row is locked by another claim), seen_backlog (the last committed one; null: no bucket yet), in seconds ($1 bucket key, $2 emission interval in seconds, $3 tolerance in seconds)
WITH mine AS (
    SELECT key, tat FROM rate_buckets WHERE key = $1 FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE rate_buckets AS b SET tat = greatest(mine.tat, now()) + make_interval(secs => $2)
    FROM mine
    WHERE b.key = mine.key AND mine.tat - now() <= make_interval(secs => $3)
    RETURNING greatest(extract(epoch FROM b.tat - now()), 0)::float8 AS backlog
)
SELECT (SELECT backlog FROM taken) AS taken_backlog,
       (SELECT greatest(extract(epoch FROM tat - now()), 0)::float8 FROM mine) AS mine_backlog,
       (SELECT greatest(extract(epoch FROM tat - now()), 0)::float8
        FROM rate_buckets WHERE key = $1) AS seen_backlog;

-- name: take_rate_token
-- The claim of a job with one rate limit, after claim_batch in the same transaction: take one token of its GCRA bucket if one is due -- the upsert moves the theoretical arrival time on only when the bucket conforms, atomically under its row lock -- and read the backlog it left (taken_backlog, null: refused) and the backlog seen before (seen_backlog), in seconds ($1 bucket key, $2 emission interval in seconds, $3 tolerance in seconds)
WITH taken AS (
    INSERT INTO rate_buckets AS b (key, tat) VALUES ($1, now() + make_interval(secs => $2))
    ON CONFLICT (key) DO UPDATE
    SET tat = greatest(b.tat, now()) + make_interval(secs => $2)
    WHERE b.tat - now() <= make_interval(secs => $3)
    RETURNING greatest(extract(epoch FROM b.tat - now()), 0)::float8 AS backlog
)
SELECT (SELECT backlog FROM taken) AS taken_backlog,
       (SELECT greatest(extract(epoch FROM tat - now()), 0)::float8
        FROM rate_buckets WHERE key = $1) AS seen_backlog;
-- --- scheduled jobs and snooze (worker/runner.py, worker/relay.py) -------------------

-- name: defer_job
-- A delivery asks for a later start (x-run-at / x-delay-seconds): record its job as scheduled if it has no row yet and is not due, so the relay publishes it then; returns the id when recorded, nothing when the row exists or the job is due now ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 run_at or null, $11 delay seconds or null, $12 traceparent or null, $13 tracestate or null)
WITH due AS MATERIALIZED (
    SELECT coalesce($10::timestamptz, now() + make_interval(secs => coalesce($11::float8, 0)))
           AS at
)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  idempotency_key, status, run_at, publish_after, traceparent, tracestate)
SELECT $1::text, $2::text, $3::text, $4::text, $5::jsonb, $6::int2, $7::int4, $8::float8,
       $9::text, 'scheduled', due.at, due.at, $12::text, $13::text
FROM due
WHERE due.at > now()
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: next_publish_due
-- Relay: seconds until the earliest publish mark still ahead (one probe of jobs_publish_due), null when there is none ($1 horizon seconds: marks further ahead read as null)
SELECT extract(epoch FROM min(publish_after) - now())::float8 AS seconds
FROM jobs
WHERE publish_after > now() AND publish_after <= now() + make_interval(secs => $1);
