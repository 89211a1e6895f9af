-- `coldbrew stats --since` bounded (issue #19, item 2): a per-minute rollup of finished jobs.
--
-- finished_stats computed the median and 95th percentile of run and wait time over every
-- row finished in the window: at 500 jobs/s an hour is 1.8M rows to sort. This table holds,
-- per minute of finish time, lane and tenant, how many jobs finished in each final status
-- and two histograms (run time: first start to finish; wait: submission to first start)
-- over fixed log-scale buckets, so a window's percentiles come from summed buckets: a read
-- of one row per minute, lane and tenant, plus the raw rows of the minutes not folded yet.
--
-- Kept off the hot path: no trigger and no extra write per job. One worker per interval
-- (the namespace's rollup lock) folds the finish times that can no longer change: every
-- finishing statement sets finished_at = now(), its transaction's start, so the fold goes
-- up to COLDBREW_STATS_ROLLUP_SETTLE_SECONDS ago, and not past the start of the oldest
-- open transaction of this database (pg_stat_activity; one open longer than five minutes
-- no longer holds it back). It adds what finished since the last fold to the rows of their
-- minutes (histogram_add merges two histograms), so the current minute is folded in
-- parts. finished_minutes_folded says up to where (exclusive); a reader takes, in one
-- snapshot, the rollup rows of the minutes before it and the raw rows from it on.
--
-- The buckets (duration_bucket): bucket 0 holds durations under 0.1 ms (negative ones
-- too); bucket k >= 1 holds [0.1 ms * 2^((k-1)/8), 0.1 ms * 2^(k/8)), eight per doubling,
-- up to bucket 320 (over 3 years, open-ended). A percentile read from them is the bucket's
-- geometric middle (interpolated between two buckets as percentile_cont interpolates
-- between two rows), within 2^(1/16) - 1 = 4.4% of the exact value, or 0.05 ms in bucket 0.
-- Python (coldbrew/rollup.py) holds the same constants; a test compares them.
--
-- The rollup counts finishing events: a dead job replayed and finished again counts at
-- both finishes (the raw rows keep only the last), and pruning the rows does not remove
-- them from it. COLDBREW_RETENTION_ROLLUP says how long its rows are kept.

CREATE FUNCTION duration_bucket(seconds float8) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    -- float8 constants: a numeric one (0.0001) makes the arithmetic numeric, 10x slower
    SELECT CASE WHEN seconds < 1e-4::float8 THEN 0
                ELSE least(320::float8,
                           1::float8 + floor(8::float8 * log(seconds / 1e-4::float8)
                                             / log(2::float8)))
           END::smallint
$$;

-- the sum of two sparse histograms (bucket numbers ascending, counts)
CREATE FUNCTION histogram_add(b1 smallint[], n1 bigint[], b2 smallint[], n2 bigint[],
                              OUT buckets smallint[], OUT counts bigint[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(b ORDER BY b), '{}'), coalesce(array_agg(n ORDER BY b), '{}')
    FROM (SELECT b, sum(n)::int8 AS n
          FROM (SELECT * FROM unnest(b1, n1) UNION ALL SELECT * FROM unnest(b2, n2)) AS u(b, n)
          GROUP BY b) AS s
$$;

CREATE TABLE finished_minutes (
    minute        timestamptz NOT NULL,
    queue         text NOT NULL,
    tenant        text NOT NULL,
    succeeded     bigint NOT NULL,
    failed        bigint NOT NULL,
    cancelled     bigint NOT NULL,
    dead          bigint NOT NULL,
    -- the sparse histograms: bucket numbers ascending, and how many jobs fell in each
    run_buckets   smallint[] NOT NULL,
    run_counts    bigint[] NOT NULL,
    wait_buckets  smallint[] NOT NULL,
    wait_counts   bigint[] NOT NULL,
    PRIMARY KEY (minute, queue, tenant)
);

CREATE TABLE finished_minutes_folded (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    folded_to  timestamptz NOT NULL
);
