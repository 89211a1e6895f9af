-- Failover (issue #14): a promoted standby is a new server for everything that asks
-- "did PostgreSQL restart?" (the claim's and the reaper's hold after a restart, the
-- liveness rule for locks taken on an earlier run, the asynchronous claims' durability
-- check). pg_postmaster_start_time() alone does not show a promotion: the standby's
-- postmaster may have started days ago. Promotion starts a new timeline, so coldbrew
-- records when it first met each timeline as the primary, and server_started() is the
-- later of the postmaster's start and, after a promotion, that first meeting.

CREATE TABLE server_epochs (
    timeline    integer PRIMARY KEY,
    first_seen  timestamptz NOT NULL DEFAULT now()
);

-- The primary's current timeline (the first 8 hex digits of its WAL file name); NULL on a
-- standby, which has no insert position.
CREATE FUNCTION server_timeline() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN NULL
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
           END
$$;

-- When this server began to serve as coldbrew's primary: its postmaster's start, or, on a
-- timeline that follows one already recorded (a promotion), when coldbrew first met it
-- (now() until note_server_epoch records it: the safe side, as a restart this instant).
-- The first timeline ever recorded is no promotion: a fresh schema holds nothing back.
CREATE FUNCTION server_started() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT EXISTS (SELECT 1 FROM server_epochs WHERE timeline < server_timeline())
            THEN pg_postmaster_start_time()
        ELSE greatest(pg_postmaster_start_time(),
                      coalesce((SELECT first_seen FROM server_epochs
                                WHERE timeline = server_timeline()), now()))
    END
$$;

-- Record the current timeline once (the reaper's clock reading calls this every few
-- seconds on every worker, so a promotion is recorded within one reaper interval); an
-- INSERT that finds its row writes nothing.
CREATE FUNCTION note_server_epoch() RETURNS void
LANGUAGE sql VOLATILE AS $$
    INSERT INTO server_epochs (timeline)
    SELECT server_timeline()
    WHERE server_timeline() IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM server_epochs WHERE timeline = server_timeline())
    ON CONFLICT DO NOTHING
$$;
