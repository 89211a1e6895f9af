-- Batches (issue #16; store/batches.py). The counters and callbacks move in the trigger of
-- migration 0011 (batch_member_moved), not here: every path that ends a job fires it.

-- name: insert_batch
-- Create a batch with its member count and resolved callbacks, unless its id exists ($1 id, $2 tenant, $3 description, $4 member count, $5 on_success, $6 on_complete, $7 on_death, $8 collect results)
INSERT INTO batches (id, tenant, description, total, pending, on_success, on_complete,
                     on_death, collect_results)
VALUES ($1, $2, $3, $4, $4, $5, $6, $7, $8)
ON CONFLICT (id) DO NOTHING
RETURNING *;

-- name: insert_batch_members
-- Insert a batch's members as queued and unpublished (publish_after = now + grace, as insert_job); returns the ids inserted (an id that exists already is not) ($1 ids, $2 types, $3 queues, $4 tenants, $5 args, $6 priorities, $7 max_attempts, $8 timeouts, $9 batch id, $10 relay grace seconds, $11 traceparent or null: the submission's trace, which every member joins, $12 tracestate or null)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  batch_id, status, run_at, publish_after, traceparent, tracestate)
SELECT u.id, u.type, u.queue, u.tenant, u.args, u.priority, u.max_attempts, u.timeout,
       $9, 'queued', now(), now() + make_interval(secs => $10), $11::text, $12::text
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::jsonb[], $6::int2[],
            $7::int4[], $8::float8[])
     AS u(id, type, queue, tenant, args, priority, max_attempts, timeout)
ON CONFLICT (id) DO NOTHING
RETURNING id, publish_after;

-- name: get_batch
-- One batch by id ($1 id)
SELECT * FROM batches WHERE id = $1;

-- name: batch_member_counts
-- A batch's members by status, with the sum of their progress (a terminal member counts 1, one without progress 0) ($1 batch id)
SELECT status::text AS status, count(*) AS members,
       sum(CASE WHEN status IN ('succeeded', 'failed', 'dead', 'cancelled') THEN 1
                ELSE coalesce(progress, 0) END)::float8 AS progress
FROM jobs WHERE batch_id = $1
GROUP BY status;

-- name: batch_member_ids
-- Up to $2 member ids of a batch, oldest first ($1 batch id, $2 limit)
SELECT id FROM jobs WHERE batch_id = $1 ORDER BY created_at, id LIMIT $2;

-- name: flag_batch_cancel
-- Mark a batch cancelled: from now on no member can be added (ctx.batch.add); returns the batch ($1 id)
UPDATE batches SET cancel_requested = true, updated_at = now() WHERE id = $1 RETURNING *;

-- name: unfinished_member_ids
-- The ids of a batch's members that a cancel still touches (waiting or running); request_cancel cancels them ($1 batch id)
SELECT id FROM jobs
WHERE batch_id = $1 AND status IN ('queued', 'retrying', 'scheduled', 'running');

-- name: lock_adding_member
-- ctx.batch.add: the adding member's batch, if this attempt still holds the member; locks the member (so it cannot finish meanwhile) and the batch row (so a cancel or the last member's completion waits for the add) ($1 member id, $2 attempt)
SELECT b.id, b.tenant, b.cancel_requested
FROM jobs AS j JOIN batches AS b ON b.id = j.batch_id
WHERE j.id = $1 AND j.attempt = $2 AND j.status = 'running'
FOR SHARE OF j FOR UPDATE OF b;

-- name: insert_added_member
-- Insert one member added from inside a member, due for the relay now; returns its id unless it existed (a retry of the adding job) ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 batch id, $10 traceparent or null: the adding member's run span, $11 tracestate or null)
INSERT INTO jobs (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                  batch_id, status, run_at, publish_after, traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'queued', now(), now(), $10, $11)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: grow_batch
-- One more member in a batch, pending (in the adding member's transaction, before it finishes) ($1 batch id)
UPDATE batches SET total = total + 1, pending = pending + 1, updated_at = now() WHERE id = $1;
