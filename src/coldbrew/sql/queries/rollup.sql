-- The per-minute rollup of finished jobs (migration 0024): folded by one worker per interval
-- (worker/rollup.py), read by `coldbrew stats --since`, pruned by the prune service.
-- Durations are date_part('epoch', interval) (float8): extract() computes a numeric.

-- name: rollup_no_jit
-- For the rest of this transaction, no JIT compilation: `stats --since` is a short read whose plan PostgreSQL may cost high enough to spend a second compiling it (no parameters)
SET LOCAL jit = off;

-- name: rollup_lock
-- One folder per namespace at a time: try the namespace's rollup lock for the rest of this transaction (no parameters)
SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '.finished_rollup')) AS held;

-- name: rollup_bounds
-- Where the fold stands (null: never folded) and how far it may go now: $1 seconds ago, and not past the start of the oldest open transaction of this database (its finishing writes would carry that time), unless that began over $2 seconds ago ($1 settle seconds, $2 longest wait for an open transaction)
SELECT (SELECT folded_to FROM finished_minutes_folded) AS folded_to,
       least(now() - make_interval(secs => $1),
             greatest(now() - make_interval(secs => $2),
                      coalesce((SELECT min(xact_start) FROM pg_stat_activity
                                WHERE datname = current_database()
                                  AND backend_type = 'client backend'
                                  AND pid <> pg_backend_pid()), 'infinity'))) AS frontier;

-- name: oldest_finished
-- The oldest finish time among the kept rows of final status (where a first fold starts), or null; one probe of jobs_finished per status (no parameters)
SELECT least((SELECT min(finished_at) FROM jobs
              WHERE status = 'succeeded' AND finished_at IS NOT NULL),
             (SELECT min(finished_at) FROM jobs
              WHERE status = 'failed' AND finished_at IS NOT NULL),
             (SELECT min(finished_at) FROM jobs
              WHERE status = 'cancelled' AND finished_at IS NOT NULL),
             (SELECT min(finished_at) FROM jobs
              WHERE status = 'dead' AND finished_at IS NOT NULL)) AS oldest;

-- name: fold_finished_minutes
-- Fold the jobs that finished in [$1, $2) into the rollup row of their minute, lane and tenant (added to a row a fold of the minute's earlier part wrote): counts per final status and the sparse run and wait histograms of the jobs that started; returns the rows written ($1 from, $2 to)
WITH done AS (
    SELECT date_trunc('minute', finished_at) AS minute, queue, tenant, status,
           CASE WHEN started_at IS NOT NULL
                THEN duration_bucket(date_part('epoch', finished_at - started_at))
           END AS run_b,
           CASE WHEN started_at IS NOT NULL
                THEN duration_bucket(date_part('epoch', started_at - created_at))
           END AS wait_b
    FROM jobs
    WHERE status IN ('succeeded', 'failed', 'cancelled', 'dead')
      AND finished_at IS NOT NULL
      AND finished_at >= $1::timestamptz AND finished_at < $2::timestamptz
),
counts AS (
    SELECT minute, queue, tenant,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE status = 'dead') AS dead
    FROM done GROUP BY minute, queue, tenant
),
run AS (
    SELECT minute, queue, tenant, array_agg(b ORDER BY b) AS buckets, array_agg(n ORDER BY b) AS counts
    FROM (SELECT minute, queue, tenant, run_b AS b, count(*) AS n FROM done
          WHERE run_b IS NOT NULL GROUP BY minute, queue, tenant, run_b) AS x
    GROUP BY minute, queue, tenant
),
wait AS (
    SELECT minute, queue, tenant, array_agg(b ORDER BY b) AS buckets, array_agg(n ORDER BY b) AS counts
    FROM (SELECT minute, queue, tenant, wait_b AS b, count(*) AS n FROM done
          WHERE wait_b IS NOT NULL GROUP BY minute, queue, tenant, wait_b) AS x
    GROUP BY minute, queue, tenant
),
folded AS (
    INSERT INTO finished_minutes (minute, queue, tenant, succeeded, failed, cancelled, dead,
                                  run_buckets, run_counts, wait_buckets, wait_counts)
    SELECT c.minute, c.queue, c.tenant, c.succeeded, c.failed, c.cancelled, c.dead,
           coalesce(r.buckets, '{}'), coalesce(r.counts, '{}'),
           coalesce(w.buckets, '{}'), coalesce(w.counts, '{}')
    FROM counts AS c
    LEFT JOIN run AS r USING (minute, queue, tenant)
    LEFT JOIN wait AS w USING (minute, queue, tenant)
    ON CONFLICT (minute, queue, tenant) DO UPDATE
    SET succeeded = finished_minutes.succeeded + excluded.succeeded,
        failed = finished_minutes.failed + excluded.failed,
        cancelled = finished_minutes.cancelled + excluded.cancelled,
        dead = finished_minutes.dead + excluded.dead,
        (run_buckets, run_counts) = (
            SELECT buckets, counts FROM histogram_add(
                finished_minutes.run_buckets, finished_minutes.run_counts,
                excluded.run_buckets, excluded.run_counts)),
        (wait_buckets, wait_counts) = (
            SELECT buckets, counts FROM histogram_add(
                finished_minutes.wait_buckets, finished_minutes.wait_counts,
                excluded.wait_buckets, excluded.wait_counts))
    RETURNING 1
)
SELECT count(*) FROM folded;

-- name: folded_to
-- Every minute before this is folded; null if never folded (no parameters)
SELECT folded_to FROM finished_minutes_folded;

-- name: count_finished_minutes
-- How many rollup rows are kept (no parameters)
SELECT count(*) FROM finished_minutes;

-- name: reset_rollup
-- Forget the rollup and where the fold stands: the next fold starts from the oldest kept row (no parameters)
WITH gone AS (DELETE FROM finished_minutes_folded)
DELETE FROM finished_minutes;

-- name: set_folded_to
-- Record that every minute before $1 is folded ($1 the new frontier)
INSERT INTO finished_minutes_folded (one, folded_to) VALUES (true, $1::timestamptz)
ON CONFLICT (one) DO UPDATE SET folded_to = excluded.folded_to;

-- name: rollup_window
-- The start of the window of the last $1 seconds and where the fold stands (null: never folded), read in the snapshot of the stats read that follows ($1 seconds)
SELECT now() - make_interval(secs => $1) AS since,
       (SELECT folded_to FROM finished_minutes_folded) AS folded_to;

-- name: finished_rollup_stats
-- `coldbrew stats --since`: per lane and tenant, the jobs that finished in the window by final status, and the summed run and wait histograms of those that started: the rollup rows of minutes [$1, $2), plus the raw rows of [$3, $4) and from $5 on, minus those of [$6, $7) (store/rollup.py's WindowPlan says which; empty ranges are (x, x)); as values so that the planner sees how few rows they span ($1 rollup from, $2 rollup to, $3 add from, $4 add to, $5 tail from, $6 subtract from, $7 subtract to, $8 tenant or null)
WITH rolled AS (
    SELECT m.* FROM finished_minutes AS m
    WHERE m.minute >= $1::timestamptz AND m.minute < $2::timestamptz
      AND ($8::text IS NULL OR m.tenant = $8)
),
raw AS (  -- one pass over the raw rows: a signed count per lane, tenant, status, buckets
    SELECT queue, tenant, status, run_b, wait_b, sum(sign)::int8 AS n
    FROM (
        SELECT j.queue, j.tenant, j.status, j.started_at, j.finished_at, j.created_at, 1 AS sign
        FROM jobs AS j
        WHERE j.status IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND j.finished_at IS NOT NULL
          AND j.finished_at >= $3::timestamptz AND j.finished_at < $4::timestamptz
          AND ($8::text IS NULL OR j.tenant = $8)
        UNION ALL
        SELECT j.queue, j.tenant, j.status, j.started_at, j.finished_at, j.created_at, 1 AS sign
        FROM jobs AS j
        WHERE j.status IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND j.finished_at IS NOT NULL
          AND j.finished_at >= $5::timestamptz
          AND ($8::text IS NULL OR j.tenant = $8)
        UNION ALL
        SELECT j.queue, j.tenant, j.status, j.started_at, j.finished_at, j.created_at, -1 AS sign
        FROM jobs AS j
        WHERE j.status IN ('succeeded', 'failed', 'cancelled', 'dead')
          AND j.finished_at IS NOT NULL
          AND j.finished_at >= $6::timestamptz AND j.finished_at < $7::timestamptz
          AND ($8::text IS NULL OR j.tenant = $8)
    ) AS x,
    LATERAL (
        SELECT CASE WHEN x.started_at IS NOT NULL
                    THEN duration_bucket(date_part('epoch', x.finished_at - x.started_at))
               END AS run_b,
               CASE WHEN x.started_at IS NOT NULL
                    THEN duration_bucket(date_part('epoch', x.started_at - x.created_at))
               END AS wait_b
    ) AS d
    GROUP BY queue, tenant, status, run_b, wait_b
),
counts AS (
    -- at least 0: a row subtracted that the rollup lacks (pruned, replayed) takes nothing
    SELECT queue, tenant, greatest(sum(succeeded), 0)::int8 AS succeeded,
           greatest(sum(failed), 0)::int8 AS failed,
           greatest(sum(cancelled), 0)::int8 AS cancelled, greatest(sum(dead), 0)::int8 AS dead
    FROM (
        SELECT queue, tenant, succeeded, failed, cancelled, dead FROM rolled
        UNION ALL
        SELECT queue, tenant,
               coalesce(sum(n) FILTER (WHERE status = 'succeeded'), 0),
               coalesce(sum(n) FILTER (WHERE status = 'failed'), 0),
               coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0),
               coalesce(sum(n) FILTER (WHERE status = 'dead'), 0)
        FROM raw GROUP BY queue, tenant
    ) AS c
    GROUP BY queue, tenant
),
buckets AS (  -- kind 0: run time, 1: wait
    SELECT queue, tenant, kind, b, sum(n)::int8 AS n
    FROM (
        SELECT m.queue, m.tenant, 0 AS kind, u.b, u.n
        FROM rolled AS m, unnest(m.run_buckets, m.run_counts) AS u(b, n)
        UNION ALL
        SELECT m.queue, m.tenant, 1, u.b, u.n
        FROM rolled AS m, unnest(m.wait_buckets, m.wait_counts) AS u(b, n)
        UNION ALL
        SELECT queue, tenant, 0, run_b, n FROM raw WHERE run_b IS NOT NULL
        UNION ALL
        SELECT queue, tenant, 1, wait_b, n FROM raw WHERE wait_b IS NOT NULL
    ) AS x
    GROUP BY queue, tenant, kind, b
    HAVING sum(n) > 0  -- a subtracted row's buckets net to zero
),
hist AS (
    SELECT queue, tenant,
           array_agg(b ORDER BY b) FILTER (WHERE kind = 0) AS run_buckets,
           array_agg(n ORDER BY b) FILTER (WHERE kind = 0) AS run_counts,
           array_agg(b ORDER BY b) FILTER (WHERE kind = 1) AS wait_buckets,
           array_agg(n ORDER BY b) FILTER (WHERE kind = 1) AS wait_counts
    FROM buckets GROUP BY queue, tenant
)
SELECT c.queue, c.tenant, c.succeeded, c.failed, c.cancelled, c.dead,
       coalesce(h.run_buckets, '{}') AS run_buckets, coalesce(h.run_counts, '{}') AS run_counts,
       coalesce(h.wait_buckets, '{}') AS wait_buckets,
       coalesce(h.wait_counts, '{}') AS wait_counts
FROM counts AS c
LEFT JOIN hist AS h USING (queue, tenant)
WHERE c.succeeded + c.failed + c.cancelled + c.dead > 0
ORDER BY c.queue, c.tenant;

-- name: prune_finished_minutes
-- Delete up to $2 rollup rows of minutes that ended more than $1 seconds ago, oldest first ($1 retention seconds, $2 batch size)
DELETE FROM finished_minutes
WHERE (minute, queue, tenant) IN (
    SELECT minute, queue, tenant FROM finished_minutes
    WHERE minute < now() - make_interval(secs => $1) - interval '1 minute'
    ORDER BY minute
    LIMIT $2
    FOR UPDATE SKIP LOCKED
);

-- name: count_prunable_finished_minutes
-- The dry run of prune_finished_minutes ($1 retention seconds)
SELECT count(*) FROM finished_minutes
WHERE minute < now() - make_interval(secs => $1) - interval '1 minute';
