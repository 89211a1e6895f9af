-- Flow (issue #16, part 1): jobs spawned by jobs, and chains.
--
-- parent_id: a child job's parent (ctx.submit). The children are inserted in the same
-- transaction as the parent's succeeded outcome, with ids derived from the parent's id
-- and the name the job gave them, so a retried parent inserts the same ids (ON CONFLICT
-- DO NOTHING). jobs_parent serves the status JSON's children summary (an index probe).
--
-- chain_id, chain_step: a job that is step N of a chain (coldbrew.flow.chain). The chain's
-- record holds every step, resolved at submission; the trigger below inserts step N+1 in
-- the transaction that writes step N's succeeded status, whichever path writes it (a
-- worker's outcome, a replayed dead job that later succeeds), and records on the chain a
-- step that failed, died or was cancelled (the reaper's and cancel's paths too). The
-- next job is due at once (publish_after = now()) and a NOTIFY on "<schema>.relay"
-- wakes the relays at commit.

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
