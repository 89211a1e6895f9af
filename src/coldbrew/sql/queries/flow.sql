-- Flow (issue #16): submissions in the caller's transaction, child jobs, chains.

-- name: flow_enter_schema
-- On a caller's connection, inside its transaction: search the namespace's schema until the transaction (or our savepoint) ends; returns the search_path to restore ($1 quoted schema name)
SELECT current_setting('search_path') AS previous, set_config('search_path', $1, true) AS now;

-- name: flow_leave_schema
-- Restore the caller's search_path for the rest of its transaction ($1 the search_path flow_enter_schema returned)
SELECT set_config('search_path', $1, true);

-- name: insert_job_in_transaction
-- Submit a job on a caller's connection, in its transaction: queued and due at once (publish_after = now(), the transaction's start, so past when it commits), or scheduled for its run_at; NOTIFY "<schema>.relay" so that the relays wake at commit (a rollback sends nothing); json travels as text, since the caller's connection may have no jsonb codec ($1 id, $2 type, $3 queue, $4 tenant, $5 args json text, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 run_at or null, $11 delay seconds or null, $12 webhook_url or null, $13 traceparent or null, $14 tracestate or null)
WITH due AS MATERIALIZED (
    SELECT coalesce($10::timestamptz, now() + make_interval(secs => coalesce($11::float8, 0)))
           AS at
),
inserted AS (
    INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                      idempotency_key, status, run_at, publish_after, webhook_url,
                      traceparent, tracestate)
    VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7, $8, $9,
            CASE WHEN (SELECT at FROM due) > now() THEN 'scheduled'::job_status
                 ELSE 'queued'::job_status END,
            greatest((SELECT at FROM due), now()),
            greatest((SELECT at FROM due), now()), $12, $13, $14)
    ON CONFLICT (id) DO NOTHING
    RETURNING *
)
SELECT i.id, i.type, i.queue, i.tenant, i.status::text AS status, i.priority, i.attempt,
       i.max_attempts, i.progress, i.progress_message, i.result::text AS result, i.error_kind,
       i.error_message, i.dead_reason, i.created_at, i.started_at, i.finished_at, i.run_at,
       i.cancel_requested, i.args::text AS args, i.snoozes,
       pg_notify(current_schema() || '.relay', 'submit') AS notified
FROM inserted AS i;

-- name: get_job_in_transaction
-- One job by id on a caller's connection (an existing job a transactional submission hit), json as text ($1 id)
SELECT j.id, j.type, j.queue, j.tenant, j.status::text AS status, j.priority, j.attempt,
       j.max_attempts, j.progress, j.progress_message, j.result::text AS result, j.error_kind,
       j.error_message, j.dead_reason, j.created_at, j.started_at, j.finished_at, j.run_at,
       j.cancel_requested, j.args::text AS args, j.snoozes
FROM jobs AS j WHERE j.id = $1;

-- name: insert_children
-- A succeeded parent's child jobs, in the transaction of its outcome: queued and due at once for the relay (woken by NOTIFY "<schema>.relay" at commit); an id that exists already (a retried parent's, or a duplicate) is left alone; returns the ids inserted ($1 ids, $2 types, $3 queues, $4 tenants, $5 args, $6 priorities, $7 max_attempts, $8 timeouts, $9 parent ids, $10 traceparents: the parent run span or null, $11 tracestates)
WITH inserted AS (
    INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                      status, run_at, publish_after, parent_id, traceparent, tracestate)
    SELECT c.id, c.type, c.queue, c.tenant, c.args, c.priority, c.max_attempts,
           c.timeout_seconds, 'queued', now(), now(), c.parent_id, c.traceparent, c.tracestate
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int2[],
                $7::int4[], $8::float8[], $9::text[], $10::text[], $11::text[])
         AS c(id, type, queue, tenant, args, priority, max_attempts, timeout_seconds, parent_id,
              traceparent, tracestate)
    ORDER BY c.id
    ON CONFLICT (id) DO NOTHING
    RETURNING id
)
SELECT id, pg_notify(current_schema() || '.relay', 'children') AS notified
FROM inserted;

-- name: insert_chain
-- A chain's record with its resolved steps; nothing when the id exists (a resubmission) ($1 id, $2 tenant, $3 steps)
INSERT INTO chains (id, tenant, steps) VALUES ($1, $2, $3)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: insert_chain_job
-- A chain's first step as a queued, unpublished job, in the chain record's transaction ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 relay grace seconds, $10 chain id)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  status, publish_after, chain_id, chain_step)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'queued', now() + make_interval(secs => $9), $10, 0)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: get_chain
-- A chain's record and the jobs of the steps it reached, in step order ($1 id)
SELECT c.*,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('step', j.chain_step, 'id', j.id,
                                                     'status', j.status)
                                  ORDER BY j.chain_step), '[]'::jsonb)
        FROM jobs AS j WHERE j.chain_id = c.id) AS jobs
FROM chains AS c WHERE c.id = $1;

-- name: children_of
-- The child jobs of one job, oldest first ($1 parent id)
SELECT * FROM jobs WHERE parent_id = $1 ORDER BY created_at, id;

-- name: find_jobs
-- Jobs for coldbrew.testing's assertions: of a type (null: any), whose args contain the given ones (null: any), of a tenant and queue (null: any), in one of the statuses (null: any), oldest first ($1 type, $2 args subset, $3 tenant, $4 queue, $5 statuses)
SELECT * FROM jobs
WHERE ($1::text IS NULL OR type = $1)
  AND ($2::jsonb IS NULL OR args @> $2::jsonb)
  AND ($3::text IS NULL OR tenant = $3)
  AND ($4::text IS NULL OR queue = $4)
  AND ($5::text[] IS NULL OR status::text = ANY($5::text[]))
ORDER BY created_at, id
LIMIT 1000;

-- name: count_unsettled
-- coldbrew.testing's drain: jobs still to run -- queued or running, or retrying or scheduled and due within the horizon ($1 horizon seconds)
SELECT count(*) FROM jobs
WHERE status IN ('queued', 'running')
   OR (status IN ('retrying', 'scheduled') AND run_at <= now() + make_interval(secs => $1));
