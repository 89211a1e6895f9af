-- Bounded history (issue #19, item 2): what the prune service deletes by, and reads that do
-- not grow with the finished rows kept.
--
-- jobs_finished becomes (status, finished_at): the prune service deletes one status's
-- rows older than that status's retention in small batches, a range of this index; on
-- (finished_at) alone a batch of succeeded rows would first step over every failed or dead
-- row kept longer. `coldbrew stats --since` still reads it as a range per final status. The
-- index count is unchanged, so no write on the hot path does more than before.
--
-- jobs_unfinished: the gauges, `coldbrew stats` and the dashboard count waiting and running
-- jobs per lane and tenant; this partial index holds only unfinished rows, so that count is
-- an index-only scan of the backlog, however much history the table keeps.
--
-- job_tallies: how many jobs are dead and failed per lane and tenant, kept by triggers
-- (every writer that moves a row in or out of those statuses: completions, claims that
-- exhaust a budget, the reaper, replays, the pruner), as an append-only log of +1/-1 rows
-- that the prune service folds into one row per lane, tenant and status. Appending takes no
-- row lock, so failing jobs of one tenant on many workers never wait on a counter row; a
-- succeeded job fires nothing (the triggers' WHEN clauses).
--
-- job_prunable(jobs): the one rule for "may this row be pruned", whatever its age: only a
-- finished row (succeeded, failed, dead, cancelled) with no publish mark (nothing due). A
-- feature that must keep more (a batch's or a parent's rows) replaces this function in its
-- migration; every prune statement and the dry run call it.
--
-- rejected_received: rejected messages are pruned by age (COLDBREW_RETENTION_DEAD).
--
-- fleet_stats, fleet_stats_taken: the fleet's gauges, computed once per interval for the
-- whole fleet: the worker whose refresh finds the snapshot old takes a lock, recomputes
-- queue_stats and stores it here; every other worker reads these rows.

DROP INDEX jobs_finished;
CREATE INDEX jobs_finished ON jobs (status, finished_at) WHERE finished_at IS NOT NULL;

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

-- the rows already there (the trigger holds the table's lock from here to the commit)
INSERT INTO job_tallies (queue, tenant, status, n)
SELECT queue, tenant, status, count(*) FROM jobs
WHERE status IN ('dead', 'failed')
GROUP BY queue, tenant, status;

CREATE FUNCTION job_prunable(j jobs) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.status IN ('succeeded', 'failed', 'dead', 'cancelled')
           AND j.finished_at IS NOT NULL
           AND j.publish_after IS NULL
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
