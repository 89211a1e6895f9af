-- Batches (issue #16): a group of member jobs with callbacks that run once when the group
-- is done (Sidekiq Pro's batches).
--
-- batches: one row per batch. `pending` counts members not yet terminal; the trigger
-- below moves it and the per-status counters in the same transaction as the member's own
-- status change, so the batch row's lock serialises members finishing on different workers
-- at the same moment, and the callback jobs are inserted in that transaction too: a worker
-- killed before its outcome commits changes nothing, the one that commits fires the
-- callbacks. Each callback is a resolved job description (type, args, queue, tenant,
-- priority, max_attempts, timeout_seconds) stored at creation; its job id is
-- "<batch id>:on_<event>", inserted ON CONFLICT DO NOTHING, so it exists at most once
-- however often the condition is met again (a dead member replayed from the DLQ reopens
-- the batch; on_complete does not fire a second time, on_success may fire later if every
-- member succeeds in the end).
--
-- jobs.batch_id: the batch a job is a member of; NULL for every other job, and the
-- trigger's WHEN clause is false for those (no function call, nothing queued).

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
