-- Durable webhooks (issue #16): the delivery jobs themselves are inserted by the trigger
-- jobs_webhook_on_finish (migration 0012); these are the statements around it.

-- name: record_webhook_job
-- A raw delivery names x-webhook-url: record its job's row (as insert_job does: queued and due for the relay after the grace, or scheduled at its run_at) with the URL before the claim, so the claim finds the row and the outcome's trigger the URL; an existing row without a URL gets this one; returns the row's id ($1 id, $2 type, $3 queue, $4 tenant, $5 args, $6 priority, $7 max_attempts, $8 timeout_seconds, $9 idempotency_key, $10 relay grace seconds, $11 run_at or null, $12 delay seconds or null, $13 webhook url, $14 traceparent or null, $15 tracestate or null)
WITH due AS MATERIALIZED (
    SELECT coalesce($11::timestamptz, now() + make_interval(secs => coalesce($12::float8, 0)))
           AS at
)
INSERT INTO jobs AS j (id, type, queue, tenant, args, priority, max_attempts, timeout_seconds,
                       idempotency_key, status, run_at, publish_after, webhook_url,
                       traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
        CASE WHEN (SELECT at FROM due) > now() THEN 'scheduled'::job_status
             ELSE 'queued'::job_status END,
        greatest((SELECT at FROM due), now()),
        CASE WHEN (SELECT at FROM due) > now() THEN (SELECT at FROM due)
             ELSE now() + make_interval(secs => $10) END,
        $13, $14, $15)
ON CONFLICT (id) DO UPDATE SET webhook_url = excluded.webhook_url
WHERE j.webhook_url IS NULL AND NOT j.status IN ('succeeded', 'failed', 'dead', 'cancelled')
RETURNING id;

-- name: attach_webhook
-- A raw delivery of a unique type names x-webhook-url: give its admitted row the URL, unless it has one or has finished ($1 id, $2 webhook url)
UPDATE jobs SET webhook_url = $2
WHERE id = $1 AND webhook_url IS NULL
  AND NOT status IN ('succeeded', 'failed', 'dead', 'cancelled');

-- name: set_tenant_webhook
-- Set (or, with null, remove) a tenant's webhook URL, creating the tenant when new ($1 name, $2 url or null)
INSERT INTO tenants (name, webhook_url) VALUES ($1, $2)
ON CONFLICT (name) DO UPDATE SET webhook_url = excluded.webhook_url
RETURNING name, weight, max_running, paused, created_at, rate_per_second, rate_burst,
          webhook_url;
