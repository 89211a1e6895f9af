-- Durable webhooks (issue #16): a webhook is a job, enqueued with the outcome.
--
-- jobs.webhook_url: the URL a submission named (client, POST /jobs, the AMQP header
-- x-webhook-url); tenants.webhook_url: the tenant's URL for its jobs that name none
-- (`coldbrew tenants set T --webhook-url URL`).
--
-- jobs_webhook_on_finish: when a job reaches a terminal status (succeeded, failed, dead,
-- cancelled) and has a URL (its own, else its tenant's), a delivery job of the built-in
-- type coldbrew.webhook is inserted in the same statement, so in the same transaction,
-- as the outcome: every path that ends a job (group-committed outcomes, the reaper,
-- cancel, dead letters, the claim that finds the budget spent) enqueues it, and an
-- outcome that rolls back enqueues nothing. Its id is derived from (job, status,
-- attempt, finished_at), so one transition is one delivery; it is due now
-- (publish_after), and the relay publishes it. Its lane, attempts and timeout are the
-- ones the workers registered for coldbrew.webhook (registered_types), else
-- 'default', 8 and 60 s. Its args carry a snapshot of the job's record at the
-- transition (what the webhook announces); a result over 64 KiB is left out of it
-- (result_omitted), so the delivery's own message stays small.
--
-- SET search_path FROM CURRENT: the function runs with the namespace's schema whatever
-- the session's search_path (a caller's own connection, a psql session).

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
