-- The webhook trigger's function (0012) names its tables with the namespace's schema
-- instead of carrying SET search_path FROM CURRENT. It runs for every job that reaches
-- a terminal status, mostly to find that neither the job nor its tenant has a URL, and
-- a function with a SET clause saves, sets and restores the setting at every call (and
-- the new search_path is looked up again): two thirds of the trigger's cost, ~6 µs of
-- PostgreSQL CPU per job of the ~10 the trigger costs an outcome batch
-- (bench/pg_cost.py --variants as-is,-webhook,-webhook-set). The guarantee the SET gave
-- stays: whatever the session's search_path (a caller's own connection, a psql
-- session), the function reads and writes this namespace's tables, because each name
-- is qualified here, when the migration runs with the namespace as current schema.
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
